"""The package's shape, checked from its source: imports flow one way (no circles), the layer
and loss modules hold no switches, and functions stay short enough to read.

Layering, bottom to top: errors, config, workdir, fast paths; layers, data; models, decoding;
export, evaluation; training; commands; cli. A module may import from its own level or below.
"""

import ast
import dataclasses
import os
import pathlib
import re
import sys

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
    # The LiteRT runtime imports nothing of the package but itself (and no TensorFlow or Keras:
    # tests/test_litert.py runs it where they cannot be imported).
    "keras_transformer.litert": 0,
    "keras_transformer.layers": 1,
    "keras_transformer.data": 1,
    "keras_transformer.models": 2,
    "keras_transformer.decoding": 2,
    "keras_transformer.export": 3,
    "keras_transformer.evaluation": 3,
    "keras_transformer.final_model": 3,
    "keras_transformer.file_translation": 3,
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


@pytest.mark.parametrize(
    "path",
    sorted((PACKAGE / "layers").glob("*.py")) + [PACKAGE / "training" / "recipe" / "losses.py"],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_no_module_level_switches(path):
    assert not _module_level_switches(path)


# Where a graph is traced: the layers' and losses' `call`s, the train and decode steps, the
# kernels themselves and the search (decoding/ runs inside a `tf.function`).
_TRACED_NAMES = {"call", "__call__", "train_step", "test_step", "update_step", "decode_step"}
_TRACED_MODULES = ("layers", "models", "decoding", "training", "export/translator.py")


def _setting_reads(path):
    """`function: expression` for every read of a process-wide setting inside a traced function
    of `path` (all of `path`'s functions for the kernel modules and decoding/): the fast-path
    setting (`fast_paths.enabled(...)`, `_Settings`, `Kernels.get()` with no argument), a
    thread-local, or a module-level dict, list or set of `path`."""
    tree = ast.parse(path.read_text())
    mutable = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp))
        for target in node.targets
        if isinstance(target, ast.Name) and target.id != "__all__"
    }
    every = path.name == "_fast_paths.py" or path.parent.name == "decoding"
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if not every and function.name not in _TRACED_NAMES:
            continue
        for node in ast.walk(function):
            attribute = isinstance(node, ast.Attribute) and ast.unparse(node)
            call = isinstance(node, ast.Call) and ast.unparse(node)
            read = (
                (isinstance(node, ast.Name) and node.id in mutable | {"_Settings"})
                or attribute in ("fast_paths.enabled", "fast_paths.enabled_names")
                or (attribute and node.attr in ("_Settings", "local"))
                or (attribute and node.attr.startswith("inside_"))
                or call in ("Kernels.get()", "Kernels.get(None)")
            )
            if read:
                found.append(f"{function.name}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize(
    "path",
    sorted(
        path
        for part in _TRACED_MODULES
        for path in ([PACKAGE / part] if part.endswith(".py") else (PACKAGE / part).glob("*.py"))
    ),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_no_setting_is_read_while_a_graph_is_traced(path):
    """The fast paths come in as the `Kernels` a layer, loss, optimizer, search or export was
    built with (its `kernels=` argument), never from a switch read inside `call` or a step."""
    assert not _setting_reads(path)


def test_the_setting_check_finds_reads(tmp_path):
    (tmp_path / "decoding").mkdir()
    search = tmp_path / "decoding" / "search.py"
    search.write_text(
        "CACHES = {}\n"
        "def step(x):\n    if fast_paths.enabled('shared_beam_caches'):\n        return x\n"
        "    return CACHES, Kernels.get(), fast_paths.inside_inplace_cache_writes()\n"
    )
    assert sorted(_setting_reads(search)) == [
        "step: CACHES",
        "step: Kernels.get()",
        "step: fast_paths.enabled",
        "step: fast_paths.inside_inplace_cache_writes",
    ]


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


def _config_assignments(path):
    """Assignments that change a config after it was validated: `config.<section>.<key> = ...`
    (on any object named `...config`), `<section>_config.<key> = ...` and `setattr` on either."""
    sections = set(SECTIONS)

    def name_of(node):
        return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")

    def changes_a_section(target):  # `target` is the object whose attribute is set
        if isinstance(target, ast.Attribute) and target.attr in sections:
            return name_of(target.value).endswith("config")
        return name_of(target) in {f"{section}_config" for section in sections}

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            attributes = [
                t for target in targets for t in ast.walk(target) if isinstance(t, ast.Attribute)
            ]
            found += [ast.unparse(t) for t in attributes if changes_a_section(t.value)]
        elif isinstance(node, ast.Call) and name_of(node.func) == "setattr" and node.args:
            if changes_a_section(node.args[0]):
                found.append(ast.unparse(node))
    return found


def test_the_config_is_not_changed_after_validation():
    """Only the config package builds configs; elsewhere a changed config is a new one
    (`dataclasses.replace`), so a value in use has passed validation."""
    found = [
        f"{path.relative_to(PACKAGE)}: {assignment}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if PACKAGE / "config" not in path.parents
        for assignment in _config_assignments(path)
    ]
    assert not found, "\n".join(found)


def test_the_checks_see_what_they_look_for(tmp_path):
    """The checks above find what they are meant to find (so passing means something)."""
    switch = tmp_path / "switchy.py"
    switch.write_text(
        "import threading\nFUSE = True\n_STATE = threading.local()\n"
        "def f():\n    global FUSE\n    FUSE = False\n"
    )
    assert _module_level_switches(switch) == ["FUSE", "_STATE", "global FUSE"]
    changes = tmp_path / "changes.py"
    changes.write_text(
        "def f(config, run, data_config, self):\n"
        "    config.runtime.workdir = 'w'\n    run.config.train.steps += 1\n"
        "    data_config.seed = 2\n    setattr(config.model, 'd_ff', 8)\n"
        "    self.model.stop_training = True\n    config.name = 'x'\n"
    )
    assert _config_assignments(changes) == [
        "config.runtime.workdir",
        "run.config.train.steps",
        "data_config.seed",
        "setattr(config.model, 'd_ff', 8)",
    ]
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
    """`ModelConfig` (config/sections.py) declares the model's hyper-parameters and their
    defaults; the models take its keys and the blocks and stacks default to its values. They
    were declared three times (config, `Transformer.__init__`, the blocks; and a fourth time in
    `DecoderOnlyTransformer`), joined by `inspect.signature` and `_arguments(locals())`."""
    from keras_transformer.config import ModelConfig

    declared = [
        (str(path.relative_to(PACKAGE)), name)
        for path, text in _sources().items()
        if str(path.relative_to(PACKAGE)) not in _OWN_ARGUMENTS
        for _, name in _model_defaults(text)
    ]
    home = pathlib.Path(sys.modules[ModelConfig.__module__].__file__).relative_to(PACKAGE)
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
    in `layers/attention.py`; it was written three times. The LiteRT runtime's search, which
    must not import Keras, holds a copy (`tests/test_litert_search.py` checks it agrees)."""
    copies = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path, text in _sources().items()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Constant) and node.value in (1e9, -1e9)
    ]
    homes = ["layers/attention.py", "litert/search.py"]
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


# Public module-level names that nothing in the package calls, kept on purpose.
_KEPT_FOR_USERS = {
    "enabled_names": "fast_paths' documented API (the tests restore the switches with it)",
    "masked_token_cross_entropy": "the plain form of the fused loss, which tests compare it with",
    "cli_reference": "the generator of docs/reference/cli.md (tests/test_docs.py keeps it in sync)",
}


def test_no_dead_public_functions():
    """A public function or class of a module that is in no `__all__` and that nothing in the
    package (or the benchmarks) uses is dead code (`trainer.resolve_workdir`, the `disk_full`
    alias, `load_last_checkpoints` were)."""
    sources = _sources()
    exported = set()
    for text in sources.values():
        for node in ast.parse(text).body:
            if isinstance(node, ast.Assign) and any(
                getattr(target, "id", None) == "__all__" for target in node.targets
            ):
                exported |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    benchmarks = PACKAGE.parent / "benchmarks"
    code = "\n".join(sources.values()) + "\n".join(
        p.read_text() for p in sorted(benchmarks.glob("*.py"))
    )
    dead = [
        f"{path.relative_to(PACKAGE)}: {node.name}"
        for path, text in sources.items()
        for node in ast.parse(text).body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
        and not node.name.startswith("_")
        and node.name not in exported | set(_KEPT_FOR_USERS)
        and len(re.findall(rf"\b{node.name}\b", code)) <= 1
    ]
    assert not dead, dead


def _identifiers(tree):
    """Every name a module's code binds or reads: names, attributes, arguments, definitions and
    imported names (strings and comments are not code)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.arg):
            yield node.arg
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, ast.alias):
            yield node.asname or node.name


def _method(tree, class_name, name):
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    return next(n for n in classes[0].body if isinstance(n, ast.FunctionDef) and n.name == name)


def test_multi_head_attention_has_one_cache_form():
    """`MultiHeadAttention.call` takes one form of cache, `(keys, values)` (as KerasHub's): beam
    search's caches shared by the beams of an input (`BeamCache`, `SharedByBeams`, the
    beam-masked attention, `init_cache(beams=)`) are decoding's, in `decoding/beam_cache.py`;
    the public layers and the model neither name beams nor pick a computation by the cache's
    type (#48)."""
    public = ["layers/attention.py", "layers/decoder.py", "models/transformer.py"]
    beams = {
        f"{path}: {name}"
        for path in public
        for name in _identifiers(ast.parse((PACKAGE / path).read_text()))
        if "beam" in name.lower()
    }
    assert not beams, sorted(beams)
    attention = ast.parse((PACKAGE / "layers" / "attention.py").read_text())
    call = _method(attention, "MultiHeadAttention", "call")
    dispatch = [
        ast.unparse(node)
        for node in ast.walk(call)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "isinstance"
    ]
    assert not dispatch, dispatch
    home = ast.parse((PACKAGE / "decoding" / "beam_cache.py").read_text())
    defined = {node.name for node in home.body if isinstance(node, ast.ClassDef)}
    assert {"BeamCache", "SharedByBeams"} <= defined


def test_figure_1_is_wired_once():
    """The model's wiring (embeddings, positions, the output projection) is written once, in
    the methods that the functional graph, `encode`, `decode_step` and `attention_scores` all
    call, not once per entry point; and the decoder-only model's, in the methods that its
    functional graph and `decode_step` call."""
    tree = ast.parse((PACKAGE / "models" / "transformer.py").read_text())
    calls = [ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)]
    assert calls.count("self.positional_encoding") == 1
    assert calls.count("embedding") == 1  # in `_embed`, for the source and the target
    assert calls.count("self.output_projection") == 1 and calls.count("ops.matmul") == 1
    assert (
        sum(
            "reverse=True" in ast.unparse(node)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
        )
        == 1
    )
    # The decoder-only model likewise: its functional graph and `decode_step` both call
    # `_embed` and `_project` (it wired its embedding, positions and projection twice).
    tree = ast.parse((PACKAGE / "models" / "decoder_only.py").read_text())
    calls = [
        ast.unparse(node.func).removeprefix("self.")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    ]
    assert calls.count("positional_encoding") == 1
    assert calls.count("token_embedding") == 2  # in `_embed`, and reversed in `_project`
    assert calls.count("to_float32") == 1
    reversed_calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and any(k.arg == "reverse" for k in node.keywords)
    ]
    assert len(reversed_calls) == 1


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


def test_the_block_arguments_are_listed_once():
    """The blocks' arguments are listed once, in `_blocks.BLOCK_ARGUMENTS`, which serves the
    blocks and the stacks (their arguments, defaults and configs); `BlockBase` and `StackBase`
    each listed them twice (a signature, a config or the arguments passed on)."""
    from keras_transformer.layers import _blocks

    text = (PACKAGE / "layers" / "_blocks.py").read_text()
    names = _blocks.BLOCK_ARGUMENTS
    tuple_line = next(
        node.lineno
        for node in ast.parse(text).body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "BLOCK_ARGUMENTS"
    )
    assert _name_lists(text, names) == [tuple_line]
    copy = "def f(num_heads, d_ff, dropout, activation, norm_first):\n    return dict(d_ff=1)\n"
    assert _name_lists(copy, names) == [1]


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
