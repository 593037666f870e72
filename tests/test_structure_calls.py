"""The package's shape checked by what its code reaches and calls, not by the text of named files
(#60): no module reaches into another package's private names (resolved over the whole package
by AST), every search runs the one public decoder step (by instrumenting it while the searches
run), and the attention layer knows one cache form.

A "package" here is a sub-package of `keras_transformer` (`layers`, `models`, `decoding`, ...)
or one of its top-level modules (`fast_paths.py`, ...).
"""

import ast
import contextlib
import pathlib

import numpy as np
import pytest
from keras import ops

from keras_transformer.decoding import translate_ids
from keras_transformer.decoding.beam_cache import BeamCache
from keras_transformer.export import litert_graphs
from keras_transformer.fast_paths import Kernels
from keras_transformer.layers import MultiHeadAttention, TransformerDecoderBlock
from keras_transformer.layers.attention import OwnedCache
from keras_transformer.layers.embedding import SinusoidalPositionalEncoding, TokenEmbedding
from keras_transformer.models import Transformer

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_transformer"

# Private names of other projects that the package reaches, each with the reason (no public way
# does the job). A name of ours is never here: it follows the package rule.
THIRD_PARTY_PRIVATE = {
    # argparse: the CLI reference and `--help` walk the parser's subcommands and their help;
    # argparse keeps them in private attributes and classes only.
    "_actions": "argparse: a parser's actions (cli.py's reference of subcommands)",
    "_choices_actions": "argparse: the subcommands' help lines",
    "_mutually_exclusive_groups": "argparse: needed by `HelpFormatter.add_usage`",
    "_SubParsersAction": "argparse: the type of the subcommands' action",
    "_HelpAction": "argparse: the type of `--help`, left out of the reference",
    "_exit": "os._exit: the documented way out of a forked worker (public despite the name)",
    # TensorFlow
    "_in_multi_worker_mode": "tf.distribute: no public query whether a strategy spans workers",
    "_trackable_children": "tf.train.Checkpoint: which objects a checkpoint holds (the data "
    "iterator or not), to restore older checkpoints",
    # Keras 3 (each pinned by a test that fails if Keras renames it)
    "_symbolic_build": "keras.Model: builds the compiled metrics and the optimizer before the "
    "accumulation loop (no variable may be created inside it)",
    "_compute_loss": "keras.Model: Keras's own loss of a micro-batch (gradient accumulation)",
    "_loss_tracker": "keras.Model: the `loss` log's running mean, updated by our train steps",
    "_compile_metrics": "keras.Model: the compiled metrics, updated with the loss's statistics",
    "_distribute_strategy": "keras.Model: the strategy a model was built under (multi-worker "
    "workaround of keras-team/keras#20585)",
    "_get_variable_index": "keras Adam: the slot index of a variable (fused Adam update)",
    "_momentums": "keras Adam: the first moments (no public accessor)",
    "_velocities": "keras Adam: the second moments (no public accessor)",
    "_model_variables_moving_average": "keras optimizer: the EMA weights (`use_ema`)",
    "_trainable_variables": "keras optimizer: the variables the EMA weights pair with",
    "_learning_rate": "keras optimizer: its schedule object (the time-based schedule's clock)",
    "_value": "keras Variable: the backend variable behind it (tf.distribute's)",
}


def _is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _package_of(relative):
    """`layers` for `layers/attention.py`, `fast_paths` for `fast_paths.py`."""
    return pathlib.PurePosixPath(relative).parts[0].removesuffix(".py")


def _definitions(trees):
    """`{private name: {packages that define it}}`: functions, classes, `self._x` / `cls._x`
    assignments, and module-level or class-level names (a module's `_x` is reached as
    `module._x`). An assignment `obj._x = ...` to another object is a reach, not a
    definition."""
    defined = {}
    for relative, tree in trees.items():
        names = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.append(node.name)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.append(node.attr)
        bodies = [tree.body] + [c.body for c in ast.walk(tree) if isinstance(c, ast.ClassDef)]
        for statement in (s for body in bodies for s in body):
            if isinstance(statement, ast.Assign):
                targets = statement.targets
            elif isinstance(statement, ast.AnnAssign):
                targets = [statement.target]
            else:
                continue
            names += [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        for name in filter(_is_private, names):
            defined.setdefault(name, set()).add(_package_of(relative))
    return defined


def _private_reaches(trees, defined):
    """`(where, what, why)` for every access of a private name that leaves its package:

    - `x._name` (or `getattr(x, "_name")`, `setattr`, `hasattr`) where `_name` is not defined
      in the accessing module's package (so it belongs to another package, or to another
      project); on `self`/`cls`/`super()` too (a private inherited from another package);
    - `from keras_transformer.P... import _name` or from a private module (`P._mod`) of
      another package `P`.
    """
    found = []
    for relative, tree in trees.items():
        package = _package_of(relative)
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) in ("getattr", "setattr", "hasattr", "delattr")
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
            ):
                name = node.args[1].value
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                parts = node.module.split(".")
                if parts[0] != "keras_transformer" or len(parts) < 2:
                    continue
                if parts[1] != package:
                    names = parts[2:] + [alias.name for alias in node.names]
                    if any(map(_is_private, names)):
                        what = f"from {node.module} import {', '.join(a.name for a in node.names)}"
                        found.append((f"{relative}:{node.lineno}", what, "private, of " + parts[1]))
                continue
            if name is None or not _is_private(name):
                continue
            owners = defined.get(name, set())
            if package in owners:
                continue
            why = f"defined in {', '.join(sorted(owners))}" if owners else "not ours"
            if not owners and name in THIRD_PARTY_PRIVATE:
                continue
            found.append((f"{relative}:{node.lineno}", ast.unparse(node), why))
    return found


def _parse(sources):
    return {relative: ast.parse(text) for relative, text in sources.items()}


def _package_trees():
    return _parse(
        {
            path.relative_to(PACKAGE).as_posix(): path.read_text()
            for path in sorted(PACKAGE.rglob("*.py"))
        }
    )


def test_no_module_reaches_another_packages_private_names():
    """Decoding and the LiteRT export ran the decoder through `Transformer._decode_step_with`,
    `_init_cache`, `_embed_target`, `_project`, `TransformerDecoderBlock._sublayers`,
    `MultiHeadAttention._attend_with` and `TransformerDecoder._finish`, and the models imported
    from `layers._blocks` and `layers._fast_paths`: a rename in one package silently broke two
    others. Other projects' private names are listed above, each with its reason."""
    trees = _package_trees()
    found = _private_reaches(trees, _definitions(trees))
    assert not found, "\n".join(f"{where}: {what} ({why})" for where, what, why in found)


def test_the_allow_list_names_only_what_is_reached_and_not_ours():
    trees = _package_trees()
    defined = _definitions(trees)
    assert not set(THIRD_PARTY_PRIVATE) & set(defined), set(THIRD_PARTY_PRIVATE) & set(defined)
    reached = {node.attr for tree in trees.values() for node in ast.walk(tree) if isinstance(
        node, ast.Attribute)} | {
        node.args[1].value
        for tree in trees.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and ast.unparse(node.func) == "getattr"
        and isinstance(node.args[1], ast.Constant)
    }  # fmt: skip
    assert set(THIRD_PARTY_PRIVATE) <= reached, set(THIRD_PARTY_PRIVATE) - reached


def test_the_private_name_check_finds_reaches():
    """The checker on a small package: each planted reach is found, the legitimate accesses
    (a package's own privates, dunders, allow-listed names of other projects) are not, and
    moving the reaching code to a third package does not hide it."""
    sources = {
        "layers/attention.py": (
            "class MultiHeadAttention:\n"
            "    def _attend_with(self, f):\n"
            "        return self._project(f)\n"  # its own: fine
            "    def _project(self, f):\n"
            "        self._cache = f\n"
            "        return self.__class__\n"  # a dunder: fine
        ),
        "layers/_helpers.py": "def clone():\n    return 1\n_TABLE = {}\n",
        "layers/decoder.py": (
            "from keras_transformer.layers._helpers import clone\n"  # its own package: fine
            "def run(layer):\n    return layer._attend_with(clone) or layer._cache\n"
        ),
        "decoding/beam_cache.py": (
            "from keras_transformer.layers._helpers import clone\n"  # 1: private module
            "from keras_transformer.layers import _helpers\n"  # 2: private module
            "def attend(layer, parser):\n"
            "    layer._attend_with(None)\n"  # 3
            "    parser._actions\n"  # another project's, allow-listed: fine
            "    parser._secret\n"  # 4: another project's, not allowed
            "    getattr(layer, '_cache')\n"  # 5
            "    layer._TABLE = _helpers._TABLE\n"  # 6, 7: a store on another's object, a read
            "class Mine(object):\n"
            "    def go(self):\n"
            "        return self._project(1)\n"  # 8: inherited from another package
        ),
        "export/graphs.py": "def step(layer):\n    return layer._attend_with(None)\n",  # 9
    }
    trees = _parse(sources)
    found = sorted(_private_reaches(trees, _definitions(trees)))
    assert [where for where, _, _ in found] == [
        "decoding/beam_cache.py:1", "decoding/beam_cache.py:11", "decoding/beam_cache.py:2",
        "decoding/beam_cache.py:4", "decoding/beam_cache.py:6", "decoding/beam_cache.py:7",
        "decoding/beam_cache.py:8", "decoding/beam_cache.py:8", "export/graphs.py:2",
    ], found  # fmt: skip
    assert found[4][1:] == ("parser._secret", "not ours")
    assert found[3][1:] == ("layer._attend_with", "defined in layers")


# --------------------------------------------------------------------------- the decoder step


@contextlib.contextmanager
def _inside(monkeypatch, outer, inner):
    """Counts the calls of `outer` and `inner` (each `(class, method name)`) while the block
    runs, and those of `inner` made outside any call of `outer`: `{"outer", "inner", "stray"}`."""
    counts = {"outer": 0, "inner": 0, "stray": 0}
    depth = [0]
    (outer_cls, outer_name), (inner_cls, inner_name) = outer, inner
    original_outer = getattr(outer_cls, outer_name)
    original_inner = getattr(inner_cls, inner_name)

    def counted_outer(*args, **kwargs):
        counts["outer"] += 1
        depth[0] += 1
        try:
            return original_outer(*args, **kwargs)
        finally:
            depth[0] -= 1

    def counted_inner(*args, **kwargs):
        counts["inner"] += 1
        counts["stray"] += depth[0] == 0
        return original_inner(*args, **kwargs)

    monkeypatch.setattr(outer_cls, outer_name, counted_outer)
    monkeypatch.setattr(inner_cls, inner_name, counted_inner)
    try:
        yield counts
    finally:
        monkeypatch.setattr(outer_cls, outer_name, original_outer)
        monkeypatch.setattr(inner_cls, inner_name, original_inner)


@pytest.fixture(scope="module")
def tiny_model():
    model = Transformer(vocab_size=20, num_layers=2, d_model=16, num_heads=2, d_ff=32, dropout=0.0)
    source_ids = np.array([[5, 6, 7, 3], [8, 9, 3, 0]], "int32")
    return model, source_ids


def _litert_step(model, beams=2, positions=3):
    """The LiteRT export's decoder step, built and run once eagerly on zero caches."""
    step = litert_graphs.step_function(model, beams, top_k=4, banned_ids=(0, 2), eos_id=3)
    batch, heads, size, source = 1, model.num_heads, model.head_dim, 4
    caches = {}
    for i in range(model.num_decoder_layers or model.num_layers):
        for kind in ("keys", "values"):
            caches[f"self_{kind}_{i}"] = np.zeros((batch, heads, beams * positions, size), "f")
            caches[f"cross_{kind}_{i}"] = np.zeros((batch, heads, source, size), "f")
    self_bias = np.zeros((batch, 1, beams, beams * positions), "float32")
    cross_bias = np.zeros((batch, 1, 1, source), "float32")
    ids = np.full((batch * beams,), 2, "int32")
    return step(ids, np.zeros((1,), "int32"), self_bias, cross_bias, caches)


def _searches(model, source_ids):
    """Every search that decodes with the model's caches, each as a function."""
    per_beam = Kernels.get("all").without("shared_beam_caches")
    return {
        "greedy": lambda: translate_ids(model, source_ids, beam_size=1, max_extra_length=2),
        "beam, per-beam caches": lambda: translate_ids(
            model, source_ids, beam_size=2, max_extra_length=2, kernels=per_beam
        ),
        "beam, caches shared by the beams": lambda: translate_ids(
            model, source_ids, beam_size=2, max_extra_length=2, kernels=Kernels.get("all")
        ),
        "LiteRT decoder step": lambda: _litert_step(model),
    }


@pytest.mark.parametrize(
    "search",
    ["greedy", "beam, per-beam caches", "beam, caches shared by the beams", "LiteRT decoder step"],
)
def test_every_search_runs_the_one_decoder_step(tiny_model, monkeypatch, search):
    """Each search runs `Transformer.decoder_step`, and no decoder block runs outside it (the
    beam caches and the LiteRT graphs wired the blocks by themselves, through private hooks).
    Counted by calling the searches, whatever module their code lives in."""
    model, source_ids = tiny_model
    run = _searches(model, source_ids)[search]
    outer = (Transformer, "decoder_step")
    with _inside(monkeypatch, outer, (TransformerDecoderBlock, "step")) as blocks:
        run()
    assert blocks["outer"] >= 1 and blocks["stray"] == 0, blocks
    assert blocks["inner"] == blocks["outer"] * len(model.decoder.blocks), blocks
    # The target's embedding, scale and positions come from `embed_target` alone, and the
    # output projection from `project` alone.
    with _inside(monkeypatch, (Transformer, "embed_target"), (SinusoidalPositionalEncoding,
                                                             "call")) as positions:  # fmt: skip
        run()
    assert positions["outer"] >= 1 and positions["stray"] <= 1, positions  # 1: the source's
    with _inside(monkeypatch, (Transformer, "project"), (TokenEmbedding, "call")) as lookups:
        run()
    assert lookups["outer"] >= 1, lookups


def test_the_model_is_wired_through_its_public_steps(tiny_model, monkeypatch):
    """The figure-1 wiring is written once: the functional graph, `decode_step` and
    `attention_scores` all make the decoder's input with `embed_target` (the only caller of the
    positional encoding for the target) and the logits with `project`."""
    model, source_ids = tiny_model
    target = (Transformer, "embed_target")
    with _inside(monkeypatch, target, (SinusoidalPositionalEncoding, "call")) as built:
        Transformer(vocab_size=20, num_layers=1, d_model=16, num_heads=2, d_ff=32)
    assert built == {"outer": 1, "inner": 2, "stray": 1}  # the source's, in `encode`
    memory, mask = model.encode(source_ids)
    cache = model.init_cache(memory, max_length=3)
    with _inside(monkeypatch, target, (Transformer, "decoder_step")) as steps:
        model.decode_step(np.full((2, 1), 2, "int32"), 0, cache, mask)
    assert steps == {"outer": 1, "inner": 1, "stray": 1}  # decoder_step after embed_target
    with _inside(monkeypatch, target, (SinusoidalPositionalEncoding, "call")) as scores:
        model.attention_scores(source_ids, np.full((2, 3), 2, "int32"))
    assert scores == {"outer": 1, "inner": 2, "stray": 1}


def test_decoder_step_equals_decode_step(tiny_model):
    """The public protocol by hand (the decoder's own attentions on the model's caches) gives
    `decode_step`'s logits and caches."""
    model, source_ids = tiny_model
    memory, mask = model.encode(source_ids)
    cache = model.init_cache(memory, max_length=3)
    ids = np.array([[2], [2]], "int32")
    expected, expected_cache = model.decode_step(ids, 0, cache, mask)
    self_attentions, cross_attentions = model.decoder.attentions(
        encoder_padding_mask=mask,
        self_attention_cache=cache["self_attention"],
        cache_update_index=0,
        cross_attention_cache=cache["cross_attention"],
    )
    y = model.embed_target(ids, start_index=0)
    logits, caches = model.decoder_step(y, self_attentions, cross_attentions)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), atol=1e-5)
    for got, want in zip(caches, expected_cache["self_attention"]):
        np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), atol=1e-6)
    with pytest.raises(ValueError, match="2 layers but `self_attentions` holds 1"):
        model.decoder.step(y, self_attentions[:1], cross_attentions)


# --------------------------------------------------------------------------- one cache form


def test_multi_head_attention_takes_one_cache_form():
    """The attention layer takes a `(keys, values)` pair (or its `OwnedCache`), and refuses beam
    search's caches shared by the beams (`BeamCache`), which decoding attends itself through
    `MultiHeadAttention.attend_with`: the layer never picks a computation by a cache's type."""
    mha = MultiHeadAttention(num_heads=2, key_dim=4)
    x = np.ones((2, 1, 8), "float32")
    pair = (np.zeros((2, 2, 3, 4), "float32"), np.zeros((2, 2, 3, 4), "float32"))
    plain = mha(x, None, cache=pair, cache_update_index=0)
    owned = mha(x, None, cache=OwnedCache(*pair), cache_update_index=0)
    np.testing.assert_allclose(np.asarray(plain[0]), np.asarray(owned[0]), atol=1e-6)
    shared = BeamCache(*pair, np.ones((1, 1, 2, 6), bool))
    for cache_update_index in (0, None):
        with pytest.raises(ValueError, match="one form of cache"):
            mha(x, None, cache=shared, cache_update_index=cache_update_index)


def test_beam_cache_types_are_known_to_decoding_only():
    """The classes of decoding's beam caches (`decoding/beam_cache.py`) are named by no module
    outside `decoding/`: the layers and the models keep one cache form."""
    home = ast.parse((PACKAGE / "decoding" / "beam_cache.py").read_text())
    classes = {node.name for node in home.body if isinstance(node, ast.ClassDef)}
    assert {"BeamCache", "SharedByBeams"} <= classes
    named = [
        f"{relative}:{node.lineno}"
        for relative, tree in _package_trees().items()
        if _package_of(relative) != "decoding"
        for node in ast.walk(tree)
        if (isinstance(node, ast.Name) and node.id in classes)
        or (isinstance(node, ast.Attribute) and node.attr in classes)
        or (isinstance(node, ast.alias) and node.name in classes)
    ]
    assert not named, named


def test_a_decoder_step_is_an_ops_function():
    """`decoder_step`'s logits are float32 whatever the attentions' shapes: `[rows, d_model]`
    (the LiteRT step's) as well as `[rows, 1, d_model]`."""
    model = Transformer(vocab_size=20, num_layers=1, d_model=8, num_heads=2, d_ff=16)
    block = model.decoder.blocks[0]

    def zero_attention(h):
        return ops.zeros_like(h), None, None

    logits, caches = model.decoder_step(
        np.ones((3, 8), "float32"), [zero_attention], [lambda h: zero_attention(h)[:2]]
    )
    assert tuple(logits.shape) == (3, 20) and "float32" in str(logits.dtype)
    assert caches == [None] and block.decoder_only is False
