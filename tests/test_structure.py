"""The package's shape, checked from its source: imports flow one way (no circles), the layer
and loss modules hold no switches, and functions stay short enough to read.

Layering, bottom to top: errors, config, workdir, fast paths; layers, data; models, decoding;
export, evaluation; training; commands; cli. A module may import from its own level or below.
"""

import ast
import collections
import dataclasses
import os
import pathlib
import re

import pytest

from keras_transformer.config import SECTIONS

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_transformer"

LEVELS = {
    # The package's __init__ holds `__version__` and the lazy top-level API, which imports its
    # names by string on first use (so no module here depends on it, and it is no import edge).
    "keras_transformer": 0,
    "keras_transformer.errors": 0,
    "keras_transformer.config": 0,
    "keras_transformer.workdir": 0,
    "keras_transformer.fast_paths": 0,
    "keras_transformer.tf_utils": 0,
    "keras_transformer.local_files": 0,
    "keras_transformer.stopping": 0,
    # Tags carried through a translation by its alignment: the standard library, numpy and
    # `markup_rules` (whose level is the package's).
    "keras_transformer.markup": 0,
    # The LiteRT runtime imports nothing of the package but itself (and no TensorFlow or Keras:
    # tests/test_litert.py runs it where they cannot be imported).
    "keras_transformer.litert": 0,
    "keras_transformer.layers": 1,
    "keras_transformer.data": 1,
    "keras_transformer.models": 2,
    "keras_transformer.decoding": 2,
    "keras_transformer.export": 3,
    "keras_transformer.evaluation": 3,
    "keras_transformer.alignment": 3,
    "keras_transformer.final_model": 3,
    "keras_transformer.file_translation": 3,
    "keras_transformer.distillation": 3,
    "keras_transformer.training": 4,
    "keras_transformer.commands": 5,
    "keras_transformer.cli": 6,
}


def _modules():
    """`{dotted name: path}` of every module of the package."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(path, name, modules):
    """The package modules `path` imports anywhere (module level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            candidates = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for candidate in candidates:
            # `from keras_transformer.layers import attention` names a module; `... import X`
            # names something inside one: take the longest module prefix.
            while candidate and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                targets.add(candidate)
    return targets


def _graph():
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


def _level(name):
    while name not in LEVELS:
        name = name.rpartition(".")[0]
    return LEVELS[name]


def test_no_import_circles():
    graph = _graph()
    # A package's __init__ re-exports its submodules: that edge is the package, not a circle.
    edges = {
        name: {t for t in targets if not t.startswith(name + ".")}
        for name, targets in graph.items()
    }
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                cycle = stack[stack.index(target) :] + [target]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_imports_flow_one_way():
    upward = [
        f"{name} (level {_level(name)}) imports {target} (level {_level(target)})"
        for name, targets in _graph().items()
        for target in targets
        if _level(target) > _level(name)
    ]
    assert not upward, "\n".join(upward)


def _module_level_switches(path):
    """Module-level names bound to booleans, `threading.local()` objects or rebound by
    `global` statements: mutable switches."""
    tree = ast.parse(path.read_text())
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            value = node.value
            is_bool = isinstance(value, ast.Constant) and isinstance(value.value, bool)
            is_local = (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr == "local"
            )
            if is_bool or is_local:
                found += [ast.unparse(target) for target in node.targets]
    found += [
        f"global {', '.join(node.names)}" for node in ast.walk(tree) if isinstance(node, ast.Global)
    ]
    return found


# The packages whose code runs while a graph is traced (every module, wherever it moves).
_TRACED_PACKAGES = ("layers", "models", "decoding", "training", "export")


def test_no_module_level_switches():
    found = {
        str(path.relative_to(PACKAGE)): switches
        for package in _TRACED_PACKAGES
        for path in sorted((PACKAGE / package).rglob("*.py"))
        for switches in [_module_level_switches(path)]
        if switches
    }
    assert not found


def _op_counts(concrete):
    """`Counter` of op types in a concrete function's graph and in every function of its
    library (the search's loop bodies, nested `tf.function`s, custom gradients)."""
    graph_def = concrete.graph.as_graph_def()
    counts = collections.Counter(node.op for node in graph_def.node)
    for function in graph_def.library.function:
        counts.update(node.op for node in function.node_def)
    return counts


def _traced_graphs(model, spm_model):
    """`{road: op counts}` of the graphs traced now for `model`: the export's searches (a
    `Translator`'s `serving_default`, beam and greedy), the train step `compile_model` sets up,
    and the loss function as a user's own step calls it."""
    import tensorflow as tf

    from keras_transformer.config import from_dict
    from keras_transformer.export import Translator
    from keras_transformer.training import compile_model
    from keras_transformer.training.recipe.losses import masked_token_cross_entropy

    graphs = {}
    for beam_size in (4, 1):
        translator = Translator(
            model, spm_model, beam_size=beam_size, max_extra_length=3, max_source_length=8
        )
        graphs[f"Translator beam {beam_size}"] = _op_counts(
            translator.serve.get_concrete_function()
        )
    compile_model(model, from_dict({}))
    ids = tf.TensorSpec([2, 5], tf.int32)
    step = tf.function(lambda x, y: model.train_step((x, y)), autograph=False)
    inputs = {"source_ids": tf.TensorSpec([2, 6], tf.int32), "target_ids": ids}
    graphs["train step"] = _op_counts(step.get_concrete_function(inputs, ids))
    loss = tf.function(
        lambda y, logits: masked_token_cross_entropy(y, logits, 0.1), autograph=False
    )
    logits = tf.TensorSpec([2, 5, model.vocab_size], tf.float32)
    graphs["masked_token_cross_entropy"] = _op_counts(loss.get_concrete_function(ids, logits))
    return graphs


@pytest.mark.scenario
def test_no_setting_is_read_while_a_graph_is_traced(toy_spm_bytes):
    """The fast paths come in as the `Kernels` a model (and its loss, optimizer, search and
    export) was built with, never from the process-wide setting: the graphs traced after the
    setting was switched off hold the ops of those traced before, op for op."""
    from keras_transformer import fast_paths
    from keras_transformer.models import Transformer

    with fast_paths.fast_paths("all"):
        model = Transformer.from_preset("transformer_tiny", vocab_size=40)
        built = _traced_graphs(model, toy_spm_bytes)
    with fast_paths.fast_paths("none"):
        flipped = _traced_graphs(model, toy_spm_bytes)
    changed = {
        road: {
            op: (built[road][op], flipped[road][op])
            for op in sorted(built[road].keys() | flipped[road].keys())
            if built[road][op] != flipped[road][op]
        }
        for road in built
    }
    assert not {road: ops for road, ops in changed.items() if ops}
    # The graphs hold the model's fast paths, so a setting read would show: the search's
    # in-place cache writes and Adam's one-kernel update.
    assert built["Translator beam 4"]["InplaceUpdate"] > 0
    assert built["train step"]["ResourceApplyAdam"] > 0


def _function_lengths(path):
    """`[(lines, name)]` of every function in `path`, docstrings not counted; `name` is
    `file:Class.method` (nested functions: `file:outer.inner`)."""

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            qualified = f"{prefix}{getattr(child, 'name', '')}"
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = child.end_lineno - child.lineno + 1
                first = child.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    if isinstance(first.value.value, str):
                        lines -= first.end_lineno - first.lineno + 1
                yield lines, f"{path.relative_to(PACKAGE)}:{qualified}"
                yield from visit(child, qualified + ".")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, qualified + ".")
            else:
                yield from visit(child, prefix)

    yield from visit(ast.parse(path.read_text()), "")


@pytest.mark.parametrize("package, limit", [("layers", 50), ("decoding", 80)])
def test_functions_are_short(package, limit):
    lengths = [
        item for path in (PACKAGE / package).glob("*.py") for item in _function_lengths(path)
    ]
    too_long = [f"{name}: {lines} lines" for lines, name in lengths if lines >= limit]
    assert lengths and not too_long, too_long


MAX_FUNCTION_LINES = 60
# Functions allowed over MAX_FUNCTION_LINES, with their length: each may only shrink (and leaves
# the list once it is short enough). Empty: keep it so (split a long function into named steps).
LONG_FUNCTIONS = {}


def test_no_function_is_over_sixty_lines():
    lengths = {}
    for path in PACKAGE.rglob("*.py"):
        for lines, name in _function_lengths(path):  # a property's setter shares its name
            lengths[name] = max(lines, lengths.get(name, 0))
    too_long = [
        f"{name}: {lines} lines (limit {LONG_FUNCTIONS.get(name, MAX_FUNCTION_LINES)})"
        for name, lines in sorted(lengths.items())
        if lines > LONG_FUNCTIONS.get(name, MAX_FUNCTION_LINES)
    ]
    assert not too_long, "\n".join(too_long)
    # An allow-listed function that got short enough (or was renamed) leaves the list.
    stale = [name for name in LONG_FUNCTIONS if lengths.get(name, 0) <= MAX_FUNCTION_LINES]
    assert not stale, f"remove from LONG_FUNCTIONS: {stale}"


def test_the_config_is_not_changed_after_validation():
    """Only the config package builds configs; elsewhere a changed config is a new one
    (`dataclasses.replace`, or `load_config` with overrides), so a value in use has passed
    validation: every section, and the config holding them, refuses an assignment."""
    from keras_transformer.config import load_config

    config = load_config(None)
    for section in SECTIONS:
        value = getattr(config, section)
        for field in dataclasses.fields(value):
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(value, field.name, getattr(value, field.name))
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(config, section, value)
    changed = dataclasses.replace(config, train=dataclasses.replace(config.train, steps=7))
    assert (changed.train.steps, config.train.steps) == (7, load_config(None).train.steps)


def test_the_checks_see_what_they_look_for(tmp_path):
    """The checks above find what they are meant to find (so passing means something)."""
    switch = tmp_path / "switchy.py"
    switch.write_text(
        "import threading\nFUSE = True\n_STATE = threading.local()\n"
        "def f():\n    global FUSE\n    FUSE = False\n"
    )
    assert _module_level_switches(switch) == ["FUSE", "_STATE", "global FUSE"]
    lengths = {name: lines for lines, name in _function_lengths(PACKAGE / "workdir.py")}
    assert lengths["workdir.py:Workdir.of"] >= 2
    assert os.path.basename(str(PACKAGE)) == "keras_transformer"
    graph = _graph()
    assert "keras_transformer.errors" in graph["keras_transformer.cli"]
    assert "keras_transformer.commands" in graph["keras_transformer.cli"]
    # Function-level imports count: commands.export imports final_model inside a function.
    assert "keras_transformer.final_model" in graph["keras_transformer.commands.export"]


# Each decoding default is declared once: in config/sections.py (`DecodeConfig`, the special
# ids), read by `DecodingSettings`. These are the literals that used to be copied around the
# package.
_DECODING_DEFAULTS = {
    "beam_size": "4",
    "alpha": "0.6",
    "max_extra_length": "50",
    "sampling_temperature": "1.0",
    "sampling_topp": "1.0",
    "bos_id": "2",
    "eos_id": "3",
    "pad_id": "0",
}


def _copied_defaults(text):
    """`[(line, match)]` where `text` writes a decoding default as a keyword default or
    argument (`alpha=0.6`), or as the fallback of a lookup (`getattr(c, "alpha", 0.6)`,
    `c.get("alpha", 0.6)`)."""
    import re

    found = []
    for name, value in _DECODING_DEFAULTS.items():
        literal = re.escape(value) + r"(?![\w.])"
        patterns = (rf"\b{name}\s*=\s*{literal}", rf"[\"']{name}[\"']\s*,\s*{literal}")
        for pattern in patterns:
            for match in re.finditer(pattern, text):
                found.append((text.count("\n", 0, match.start()) + 1, match.group(0)))
    return found


def test_each_decoding_default_is_written_once():
    copies = [
        f"{path.relative_to(PACKAGE)}:{line}: {match}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, match in _copied_defaults(path.read_text())
    ]
    assert not copies, "decoding defaults written again (read DecodingSettings):\n" + "\n".join(
        copies
    )


def test_the_default_check_finds_copies():
    text = (
        "def f(beam_size=4, alpha=0.6, max_extra_length=50, bos_id=2):\n"
        "    return getattr(config, 'eos_id', 3), d.get(\"pad_id\", 0), g(alpha=0.65, n=50)\n"
    )
    assert [m for _, m in _copied_defaults(text)] == [
        "beam_size=4", "alpha=0.6", "max_extra_length=50", "bos_id=2", "'eos_id', 3",
        '"pad_id", 0',
    ]  # fmt: skip


def _sources():
    return {path: path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


# The primitive layers' own arguments of those names, defaults as Keras's own layers have them:
# `MultiHeadAttention(dropout=0.0)`, `PositionwiseFeedForward(activation="relu", dropout=0.0)`
# (the blocks pass them the model's `attention_dropout`, `activation` and `activation_dropout`).
_OWN_ARGUMENTS = {"layers/attention.py", "layers/feed_forward.py"}


def _model_defaults(text):
    """`[(line, name)]` where `text` gives a key of the `model:` section (`ModelConfig`) a
    literal default: a parameter's (`layer_norm_epsilon=1e-6`) or a dataclass field's
    (`dropout: float = key(0.1, ...)`); `ModelConfig.dropout` as a default is a reference."""
    from keras_transformer.config import ModelConfig

    names = {f.name for f in dataclasses.fields(ModelConfig)}
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            defaults = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
            defaults += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d]
            literal = [(a, d) for a, d in defaults if isinstance(d, ast.Constant)]
            found += [(d.lineno, a.arg) for a, d in literal if d.value is not None]  # None: unset
        elif isinstance(node, ast.AnnAssign) and isinstance(node.value, (ast.Constant, ast.Call)):
            value = node.value
            if isinstance(value, ast.Call):  # `key(default, ...)`, `field(default=...)`
                given = value.args[:1] + [k.value for k in value.keywords if k.arg == "default"]
                value = given[0] if given else None
            if isinstance(value, ast.Constant):
                found.append((node.lineno, getattr(node.target, "id", "")))
    return [(line, name) for line, name in found if name in names]


def test_each_model_hyper_parameter_default_is_declared_once():
    """`keras_transformer.hyper_parameters` declares the model's hyper-parameters and their
    defaults (below the layers and the config, which both read it); `ModelConfig` has its keys
    and defaults, the models take them and the blocks and stacks default to them. They were
    declared three times (config, `Transformer.__init__`, the blocks; and a fourth time in
    `DecoderOnlyTransformer`), joined by `inspect.signature` and `_arguments(locals())`."""
    from keras_transformer import hyper_parameters
    from keras_transformer.config import ModelConfig

    declared = [
        (str(path.relative_to(PACKAGE)), name)
        for path, text in _sources().items()
        if str(path.relative_to(PACKAGE)) not in _OWN_ARGUMENTS
        for _, name in _model_defaults(text)
    ]
    home = pathlib.Path(hyper_parameters.__file__).relative_to(PACKAGE)
    names = [f.name for f in dataclasses.fields(ModelConfig)]
    assert sorted(declared) == sorted((str(home), name) for name in names), declared
    epsilons = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path, text in _sources().items()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Constant) and node.value == 1e-6
    ]
    assert [e.split(":")[0] for e in epsilons] == [str(home)], epsilons
    joins = [
        f"{path.relative_to(PACKAGE)}: {pattern}"
        for path, text in _sources().items()
        for pattern in ("inspect.signature(", "locals()")
        if pattern in text
    ]
    assert not joins, joins


def test_the_model_default_check_finds_copies():
    text = (
        "class Block:\n"
        "    def __init__(self, num_heads, dropout=0.1, *, norm_first=False, d_ff=Config.d_ff,\n"
        "                 d_model=None):\n"
        "        pass\n"
        "@dataclass\nclass Sizes:\n    d_model: int = 512\n"
        "    layer_norm_epsilon: float = field(default=1e-6)\n    other: int = 3\n"
    )
    assert [name for _, name in _model_defaults(text)] == [
        "dropout", "norm_first", "d_model", "layer_norm_epsilon"
    ]  # fmt: skip


def test_one_finite_minus_infinity():
    """`-1e9` (masked logits, impossible tokens, empty n-best slots) is `NEG_INF`, defined once
    in `search_rules.py`, which the layers, the graph search and the LiteRT runtime's numpy
    search (which must not import Keras) all read; it was written three times, then copied."""
    copies = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path, text in _sources().items()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Constant) and node.value in (1e9, -1e9)
    ]
    homes = ["search_rules.py"]
    assert sorted(copy.split(":")[0] for copy in copies) == homes, copies


def test_the_first_line_of_an_error_is_taken_in_one_place():
    """`errors.first_line(e)`, not the `str(e).strip().splitlines()[0] if ... else` idiom (it
    was written seven times, two of them without the empty-message case)."""
    pattern = re.compile(r"str\((?:e|error)\)[^\n]*splitlines\(\)\[0\]")
    copies = [
        f"{path.relative_to(PACKAGE)}:{text.count(chr(10), 0, m.start()) + 1}"
        for path, text in _sources().items()
        for m in pattern.finditer(text)
    ]
    assert not copies, copies


# Dead code: a public (no leading underscore) module-level function or class of the package
# that nothing refers to outside the tests. A reference is a name or attribute in code, resolved
# through its module's imports (anywhere in the module), the package's re-exports and the lazy
# `_EXPORTS` of `keras_transformer/__init__.py` to the definition it names; an import alone (a
# re-export, `__all__`) is no use, nor is a definition's reference to itself. The code that
# counts: the package's modules, `benchmarks/*.py` and `docs/tools/*.py`; beside it, the
# console-script entry points of `setup.py` and the manual's API reference (a `::: dotted.name`
# line in `docs/`, which documents that name, or every public name of that module, as public API).
# Names are resolved module-wide, not per scope: a local variable named as a definition of its
# module counts as a use of it.

# Public names that only the tests use, kept on purpose (with the reason each).
_KEPT_FOR_USERS = {
    "keras_transformer.cli: cli_reference": "the generator that docs/reference/cli.md names as "
    "its source; tests/test_docs.py regenerates the page with it and compares",
    "keras_transformer.layers.masks: causal_mask": "a helper for users' own models, documented "
    "in docs/guides/layers.md and docs/reference/api/layers.md (the layers' causal masking is "
    "`MultiHeadAttention(use_causal_mask=True)`)",
}


def _module_names(package_dir):
    """`{dotted name: path}` of every module under `package_dir` (a package directory)."""
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _bindings(tree, name, is_package):
    """`{local name: (module, [attributes])}` of every import in a module (module level or
    inside functions): `from m import a as b` binds `b` to `("m", ["a"])`, `import m.n` binds
    `m` to `("m", [])`; `name` is the module's dotted name (None for a script)."""
    package = name if is_package else (name or "").rpartition(".")[0]
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = (alias.name, [])
                else:
                    bound[alias.name.split(".")[0]] = (alias.name.split(".")[0], [])
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                bound[alias.asname or alias.name] = (base, [alias.name])
    return bound


class _References:
    """A package's modules, what each defines and imports, and the definition that a module
    and a chain of attributes resolve to (as Python's imports and attribute lookups would)."""

    def __init__(self, package_dir):
        self.paths = _module_names(package_dir)
        self.trees = {name: ast.parse(path.read_text()) for name, path in self.paths.items()}
        self.defined = {
            name: {
                node.name
                for node in tree.body
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            }
            for name, tree in self.trees.items()
        }
        self.bound = {
            name: _bindings(tree, name, self.paths[name].name == "__init__.py")
            for name, tree in self.trees.items()
        }
        for name, tree in self.trees.items():  # PEP 562 lazy exports: `_EXPORTS = {name: module}`
            for node in tree.body:
                if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "_EXPORTS":
                    exports = ast.literal_eval(node.value)
                    self.bound[name].update({k: (v, [k]) for k, v in exports.items()})

    def resolve(self, module, attributes, depth=0):
        """`(module, name)` of the definition that `module` (a dotted module path, as imports
        find it) and then `attributes` name, `(module, None)` for a module, or None (outside the
        package, or not found). A module's attribute is its definition, else what it imported
        under that name, else its submodule."""
        if module not in self.paths or depth > 50:
            return None
        for index, part in enumerate(attributes, 1):
            if part in self.defined[module]:
                return module, part  # what follows is the definition's own attribute
            target = self.bound[module].get(part)
            if target and target != (module, [part]):  # `from pkg import sub` in pkg: sub
                base, names = target
                return self.resolve(base, names + list(attributes[index:]), depth + 1)
            if f"{module}.{part}" not in self.paths:
                return None
            module = f"{module}.{part}"
        return module, None

    def resolve_dotted(self, dotted):
        """`resolve` for a dotted name as documentation writes it (attributes from the top)."""
        top, *attributes = dotted.split(".")
        return self.resolve(top, attributes)

    def used_by(self, tree, name=None):
        """The definitions `(module, name)` that the code of `tree` refers to (`name`: its
        dotted name when it is a module of the package)."""
        bound = self.bound[name] if name else _bindings(tree, None, False)
        own = self.defined.get(name, set())
        for statement in tree.body:
            owner = getattr(statement, "name", None)
            for node in ast.walk(statement):
                chain = []
                while isinstance(node, ast.Attribute):
                    chain.insert(0, node.attr)
                    node = node.value
                if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load):
                    continue
                if node.id in bound:
                    base, names = bound[node.id]
                    target = self.resolve(base, names + chain)
                elif node.id in own and node.id != owner:
                    target = (name, node.id)
                else:
                    continue
                if target and target[1]:
                    yield target


def _documented(root):
    """The dotted names the manual documents as API: its `::: dotted.name` lines."""
    pattern = re.compile(r"^:::\s+([\w.]+)", re.M)
    return [
        m.group(1)
        for path in sorted((root / "docs").rglob("*.md"))
        for m in pattern.finditer(path.read_text())
    ]


def _entry_points(root):
    """`(module, attribute)` of each `name = module:attribute` string in `root/setup.py`."""
    setup = root / "setup.py"
    if not setup.exists():
        return []
    pattern = re.compile(r"^[\w.-]+\s*=\s*([\w.]+):(\w+)$")
    return [
        m.groups()
        for node in ast.walk(ast.parse(setup.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        for m in [pattern.match(node.value.strip())]
        if m
    ]


def _dead_definitions(root, package):
    """`module: name` of every public module-level function or class of `root/package` that
    nothing refers to (see the comment above `_KEPT_FOR_USERS`)."""
    references = _References(root / package)
    used = set()
    for name, tree in references.trees.items():
        used.update(references.used_by(tree, name))
    for script in sorted([*root.glob("benchmarks/*.py"), *root.glob("docs/tools/*.py")]):
        used.update(references.used_by(ast.parse(script.read_text())))
    roots = [references.resolve_dotted(dotted) for dotted in _documented(root)]
    roots += [references.resolve(module, [name]) for module, name in _entry_points(root)]
    for target in roots:
        if target and target[1] is None:  # a documented module: every public name in it
            used.update((target[0], n) for n in references.defined[target[0]])
        elif target:
            used.add(target)
    return [
        f"{module}: {name}"
        for module, names in sorted(references.defined.items())
        for name in sorted(names)
        if not name.startswith("_") and (module, name) not in used
    ]


def test_no_dead_public_functions():
    """No public function or class is used by the tests alone (`trainer.resolve_workdir`, the
    `disk_full` alias, `load_last_checkpoints` were dead; a test calling one kept it alive)."""
    dead = _dead_definitions(PACKAGE.parent, PACKAGE.name)
    assert sorted(set(dead) - set(_KEPT_FOR_USERS)) == [], "dead (no use outside the tests)"
    kept = [name for name in _KEPT_FOR_USERS if name not in dead]
    assert not kept, f"used now, remove from _KEPT_FOR_USERS: {kept}"


def test_the_dead_code_check_resolves_references(tmp_path):
    """Uses resolved through imports, re-exports, relative and lazy imports, attribute chains,
    the manual's API reference and the entry points count; a test's call, a re-export, an
    `__all__` entry and a function's call of itself do not."""
    files = {
        "pkg/__init__.py": "from pkg.core import helper, used\n__all__ = ['helper', 'used']\n"
        "_EXPORTS = {'lazy': 'pkg.core'}\n",
        "pkg/core.py": "def used():\n    return _private() + inner()\n"
        "def inner():\n    return 1\ndef _private():\n    return 0\n"
        "def helper():\n    return 2\ndef recursive(n):\n    return recursive(n - 1) if n else 0\n"
        "def lazy():\n    pass\ndef by_script():\n    pass\n"
        "class Base:\n    pass\nclass Documented(Base):\n    pass\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/mod.py": "from .. import core\ndef run():\n    return core.used()\n",
        "pkg/cli.py": "import pkg.sub.mod as m\ndef main():\n    m.run()\n",
        "benchmarks/bench.py": "import pkg\nfrom pkg.core import by_script as b\npkg.lazy(), b()\n",
        "docs/api.md": "# API\n\n::: pkg.core.Documented\n",
        "setup.py": "setup(entry_points={'console_scripts': ['tool = pkg.cli:main']})\n",
        "tests/test_core.py": "from pkg.core import helper, recursive\nhelper(), recursive(2)\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _dead_definitions(tmp_path, "pkg") == ["pkg.core: helper", "pkg.core: recursive"]


# Where a config's decoding settings are made (`config.decoding_settings`): the config package,
# the commands, and once at the top of the training run (its `Run`, on either engine). The
# modules below get `DecodingSettings` values (#48).
_MAKES_DECODING_SETTINGS = {"training/run/setup.py": {"Run"}}


def _decoding_settings_calls(text):
    """`[(line, top-level definition)]` where `text` calls `decoding_settings(...)`."""
    found = []
    for top in ast.parse(text).body:
        for node in ast.walk(top):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("decoding_settings"):
                found.append((node.lineno, getattr(top, "name", None)))
    return found


def test_the_decoding_settings_are_made_once_at_the_top():
    """`train()` resolves its run once at the top and hands each lower module what it needs:
    the end's reserve, the final model's choice and the JAX trainer's callbacks made the
    decoding settings again from the whole config they were given."""
    found = [
        f"{name}:{line} (in {where})"
        for path, text in _sources().items()
        for name in [str(path.relative_to(PACKAGE))]
        if not name.startswith(("config/", "commands/"))
        for line, where in _decoding_settings_calls(text)
        if where not in _MAKES_DECODING_SETTINGS.get(name, ())
    ]
    assert not found, "\n".join(found)
    setup = (PACKAGE / "training" / "run" / "setup.py").read_text()
    assert [where for _, where in _decoding_settings_calls(setup)] == ["Run", "Run"]
    text = (
        "def f(c):\n    return config.decoding_settings(c)\n"
        "class R:\n    d = decoding_settings(1)\n"
    )
    assert _decoding_settings_calls(text) == [(2, "f"), (4, "R")]


def _name_lists(text, names):
    """Lines where `text` lists more than half of `names`: a signature's parameters, a call's
    keywords, a dict's keys, or a tuple's or list's strings (a sub-layer built with three of
    them is no list of them)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            listed = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
        elif isinstance(node, ast.Call):
            listed = [k.arg for k in node.keywords]
        elif isinstance(node, (ast.Dict, ast.Tuple, ast.List)):
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            listed = [i.value for i in items if isinstance(i, ast.Constant)]
        else:
            continue
        if len(set(listed) & set(names)) > len(names) / 2:
            found.append(node.lineno)
    return found


def test_the_hyper_parameters_are_listed_once():
    """The model's hyper-parameters are listed once, as the fields of
    `hyper_parameters.ModelHyperParameters` (with their roles: the blocks', the decoder-only
    model's, those that shape the weights), which everything else reads: no module lists most
    of them, or most of any role's, in a signature, a call, a dict, a tuple or a list. The
    blocks (`BlockBase`, `StackBase`: a signature, a config, the arguments passed on), the
    decoder-only model, fine-tuning and `Transformer` each listed them (#60). `ModelConfig`,
    whose keys carry the config's help and valid values, is checked against them on import."""
    from keras_transformer import hyper_parameters

    roles = {
        "all": hyper_parameters.ALL,
        "block": hyper_parameters.BLOCK,
        "decoder_only": hyper_parameters.DECODER_ONLY,
        "weights": hyper_parameters.WEIGHTS,
    }
    found = [
        f"{path.relative_to(PACKAGE)}:{line} lists the {role} hyper-parameters"
        for path, text in _sources().items()
        for role, names in roles.items()
        for line in _name_lists(text, names)
    ]
    assert not found, found
    copy = "def f(num_heads, d_ff, dropout, activation, norm_first):\n    return dict(d_ff=1)\n"
    assert _name_lists(copy, hyper_parameters.BLOCK) == [1]


# The one module that looks at a strategy's type: it chooses the run's input object per kind.
STRATEGY_MODULE = PACKAGE / "training" / "engines" / "strategies.py"


def _strategy_type_tests(text):
    """`[(line, code)]` where `text` asks which `tf.distribute` strategy it has:
    `isinstance`/`issubclass` against a `tf.distribute` type, or a comparison of a type's
    `__name__` with a strategy's name."""
    found = []
    for node in ast.walk(ast.parse(text)):
        asks = False
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
            "isinstance",
            "issubclass",
        ):
            asks = len(node.args) == 2 and "distribute" in ast.unparse(node.args[1])
        elif isinstance(node, (ast.Call, ast.Compare)):
            code = ast.unparse(node)
            asks = "__name__" in code and re.search(r"[\"'][^\"']*Strategy", code) is not None
        if asks:
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_only_the_strategy_module_looks_at_a_strategy_type():
    """What differs between strategies is decided once, in `training/engines/strategies.py` (one
    input object per kind); the trainer decided it with `isinstance` in three functions and
    `models/_train_step.py` with its own."""
    found = [
        f"{path.relative_to(PACKAGE)}:{line}: {code}"
        for path, text in _sources().items()
        if path != STRATEGY_MODULE
        for line, code in _strategy_type_tests(text)
    ]
    assert not found, "\n".join(found)
    assert _strategy_type_tests(STRATEGY_MODULE.read_text())  # the check sees what it looks for


def test_the_strategy_check_finds_type_tests():
    text = (
        "def f(strategy, tf, s):\n"
        "    a = isinstance(strategy, tf.distribute.MirroredStrategy)\n"
        "    b = isinstance(s, (int, tf.distribute.TPUStrategy))\n"
        "    c = type(strategy).__name__.startswith('TPUStrategy')\n"
        "    d = type(s).__name__ == 'MultiWorkerMirroredStrategy'\n"
        "    e = isinstance(s, dict) and s.__name__ == 'x'\n"
    )
    assert [line for line, _ in _strategy_type_tests(text)] == [2, 3, 4, 5]


def _lines_of_code(path):
    """Lines of `path` that are code: not blank, not comments, not docstrings."""
    text = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(
        1
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#") and number not in docstrings
    )


def test_no_module_is_over_500_lines_of_code():
    """A module holds one job: none is over 500 lines of code (docstrings and comments not
    counted); a bigger one is split by job, as `data/prepare.py` and `commands` were."""
    sizes = {str(p.relative_to(PACKAGE)): _lines_of_code(p) for p in PACKAGE.rglob("*.py")}
    assert not {name: n for name, n in sizes.items() if n > 500}
    assert sizes["workdir.py"] > 100  # the count counts
