"""The LiteRT runtime's numpy search (`keras_transformer.litert.search`) gives `translate_ids`'
answers from a step that returns each row's top-K next tokens, and imports no TensorFlow."""

import ast
import os
import subprocess
import sys

import numpy as np
import pytest
from keras import ops

from keras_transformer import constraint_rules, search_rules
from keras_transformer.config import BOS_ID, EOS_ID, PAD_ID, DecodingSettings
from keras_transformer.decoding import search as graph_search
from keras_transformer.decoding import translate_ids
from keras_transformer.layers.attention import NEG_INF
from keras_transformer.litert import search as litert_search
from keras_transformer.models import Transformer

# Numerically sensitive: CI runs this module again with oneDNN off and with one thread.
pytestmark = pytest.mark.numerics

VOCAB = 30
SEARCH_PATH = litert_search.__file__


class ModelStep:
    """The LiteRT decoder step's contract computed with the Keras model, eagerly: the row's
    top-K next tokens after the log-softmax with padding and BOS banned (as `translate_ids`'
    `_log_probs_step`), and log p(EOS); the caches repeated per beam and reordered with them."""

    def __init__(self, model, source_ids, buffer, k, top_k):
        encoder_output, source_mask = model.encode(source_ids, training=False)
        cache = model.init_cache(encoder_output, buffer)
        repeat = lambda x: ops.repeat(x, k, axis=0)  # noqa: E731 [batch * k, ...]
        self.self_attention = [tuple(map(repeat, pair)) for pair in cache["self_attention"]]
        self.cross_attention = [tuple(map(repeat, pair)) for pair in cache["cross_attention"]]
        self.output_kernel = cache.get("output_kernel")
        self.source_mask = repeat(source_mask)
        self.model, self.k, self.top_k = model, k, top_k
        self.banned = np.isin(np.arange(model.vocab_size), (PAD_ID, BOS_ID))  # [vocab]
        self.calls, self.reorders, self.kept = 0, 0, []

    def __call__(self, ids, index):
        assert ids.dtype == np.int32 and ids.shape == (ops.shape(self.source_mask)[0],)
        cache = {"self_attention": self.self_attention, "cross_attention": self.cross_attention}
        if self.output_kernel is not None:
            cache["output_kernel"] = self.output_kernel
        index_tensor = ops.convert_to_tensor(index, dtype="int32")
        logits, cache = self.model.decode_step(ids[:, None], index_tensor, cache, self.source_mask)
        self.self_attention = cache["self_attention"]
        log_probs = ops.log_softmax(ops.cast(logits[:, 0], "float32"), axis=-1)
        log_probs = np.asarray(ops.where(self.banned, NEG_INF, log_probs))  # [rows, vocab]
        self.log_probs = log_probs
        top_ids = np.argsort(-log_probs, axis=1, kind="stable")[:, : self.top_k]  # ties: low id
        self.calls += 1
        top = np.take_along_axis(log_probs, top_ids, axis=1)
        return top, top_ids.astype(np.int32), log_probs[:, EOS_ID]

    def reorder(self, origin):
        assert not np.array_equal(origin, np.arange(len(origin))), "identity reorders are skipped"
        self.reorders += 1
        self.self_attention = [
            tuple(ops.take(x, origin, axis=0) for x in pair) for pair in self.self_attention
        ]


class DroppingStep(ModelStep):
    """A step that can leave finished sentences (the optional `keep`)."""

    def keep(self, sentences):
        assert np.all(np.diff(sentences) > 0), "sorted sentence indices"
        self.kept.append(len(sentences))
        rows = (np.asarray(sentences)[:, None] * self.k + np.arange(self.k)).reshape(-1)
        take = lambda x: ops.take(x, rows, axis=0)  # noqa: E731
        self.self_attention = [tuple(map(take, pair)) for pair in self.self_attention]
        self.cross_attention = [tuple(map(take, pair)) for pair in self.cross_attention]
        self.source_mask = take(self.source_mask)


class WantedStep(DroppingStep):
    """The constrained step's contract: also the log p of each row's wanted ids."""

    def __call__(self, ids, index, wanted):
        assert wanted.dtype == np.int32 and wanted.shape[0] == ids.shape[0]
        found = super().__call__(ids, index)
        return found + (np.take_along_axis(self.log_probs, wanted, axis=1),)


def _model(eos_bias):
    """A random tiny model; `eos_bias` raises EOS's logit so outputs end early."""
    import keras

    keras.utils.set_random_seed(7)
    model = Transformer(
        vocab_size=VOCAB, num_layers=1, d_model=16, num_heads=2, d_ff=32,
        tie_output_projection=False,
    )  # fmt: skip
    bias = np.zeros(VOCAB, "float32")
    bias[EOS_ID] = eos_bias
    model.output_projection.bias.assign(bias)
    return model


@pytest.fixture(scope="module")
def models():
    # "long" outputs run to their limits (EOS forced), "eos" ones end after a few tokens (the
    # search stops early), "random" ones do either.
    return {"random": _model(0.0), "long": _model(-1.0), "eos": _model(0.3)}


def _sources(seed, batch=5, longest=6):
    """Random 0-padded sources ending in EOS (lengths 1 .. longest, the longest always there)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, longest + 1, size=batch)
    lengths[0] = longest
    ids = np.zeros((batch, longest), "int32")
    for row, length in enumerate(lengths):
        ids[row, : length - 1] = rng.integers(4, VOCAB, size=length - 1)
        ids[row, length - 1] = EOS_ID
    return ids


def _prefixes(seed, caps, extra):
    """Random 0-padded prefixes leaving room for EOS; some rows have none."""
    rng = np.random.default_rng(seed + 100)
    room = np.minimum(caps - 1, extra)  # [batch]
    lengths = rng.integers(0, room + 1)
    lengths[1] = 0
    prefix = np.zeros((len(caps), max(1, int(lengths.max()))), "int32")
    for row, length in enumerate(lengths):
        prefix[row, :length] = rng.integers(4, VOCAB, size=length)
    return prefix


def _both(model, source_ids, k, alpha, extra, max_length=None, return_all=False, prefix=None,
          drop=True, step_class=DroppingStep, top_k=None):  # fmt: skip
    """`(translate_ids' answer, the numpy search's answer, the step)` for the same inputs."""
    settings = DecodingSettings(beam_size=k, alpha=alpha, max_extra_length=extra)
    expected = translate_ids(
        model, source_ids, settings, max_length=max_length, return_all=return_all,
        prefix_ids=prefix, kernels="none",
    )  # fmt: skip
    buffer = source_ids.shape[1] + extra
    buffer = buffer if max_length is None else min(buffer, max_length)
    caps = (source_ids != 0).sum(1) + extra
    step = step_class(model, source_ids, buffer, k, top_k or 2 * k)
    got = litert_search.search(
        step, litert_search.Settings(k, alpha), buffer, caps, prefix=prefix,
        return_all=return_all, drop_finished=drop,
    )  # fmt: skip
    return tuple(np.asarray(x) for x in expected), got, step


def _assert_same(expected, got):
    ids, scores, token_scores = got
    assert ids.dtype == np.int32 and scores.dtype == token_scores.dtype == np.float32
    np.testing.assert_array_equal(ids, expected[0])
    np.testing.assert_allclose(scores, expected[1], rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(token_scores, expected[2], rtol=1e-6, atol=1e-4)


CASES = {
    # name: (model, beam, alpha, max_extra_length, max_length, return_all, prefix)
    "greedy": ("random", 1, 0.6, 4, None, False, False),
    "greedy-limits-nbest-prefix": ("long", 1, 1.0, 3, None, True, True),
    "greedy-early-stop": ("eos", 1, 0.0, 8, None, False, False),
    "beam2-alpha0": ("random", 2, 0.0, 4, None, False, False),
    "beam2-limits-prefix-short-buffer": ("long", 2, 0.6, 5, 7, False, True),
    "beam2-nbest-early-stop": ("eos", 2, 1.0, 8, None, True, False),
    "beam4-alpha0.6": ("random", 4, 0.6, 8, None, False, False),
    "beam4-alpha1-short-buffer": ("random", 4, 1.0, 5, 6, False, False),
    "beam4-limits-nbest": ("long", 4, 0.6, 3, None, True, False),
    "beam4-nbest-prefix": ("random", 4, 0.6, 4, None, True, True),
    "beam4-early-stop-prefix": ("eos", 4, 0.6, 8, None, True, True),
    "beam3-alpha0-early-stop-short-buffer": ("eos", 3, 0.0, 8, 9, False, False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_search_gives_translate_ids_answers(models, name):
    model_name, k, alpha, extra, max_length, return_all, with_prefix = CASES[name]
    for seed in range(2):
        source_ids = _sources(seed)
        prefix = None
        if with_prefix:
            buffer = source_ids.shape[1] + extra if max_length is None else max_length
            caps = np.minimum((source_ids != 0).sum(1) + extra, buffer)
            prefix = _prefixes(seed, caps, extra)
        expected, got, _ = _both(
            models[model_name], source_ids, k, alpha, extra, max_length, return_all, prefix
        )
        _assert_same(expected, got)


@pytest.mark.parametrize("k", [1, 4])
def test_dropping_settled_sentences_changes_no_answer(models, k):
    source_ids = _sources(11, batch=6)
    runs = {
        drop: _both(models["eos"], source_ids, k, 0.6, 8, return_all=True, drop=drop)
        for drop in (True, False)
    }
    (expected, dropped, step), (_, kept, full_step) = runs[True], runs[False]
    assert step.kept and not full_step.kept, "sentences were dropped only when asked"
    assert step.calls == full_step.calls and step.kept[-1] < len(source_ids)
    # The same searches; the model's rows in a smaller batch may round differently.
    _assert_same(kept, dropped)
    _assert_same(expected, dropped)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_prefixes_past_the_limit_or_with_eos_give_the_graphs_answers(models, k):
    """Prefixes as `translate_ids` refuses to be given: up to the limit (no room for EOS: the
    graph answers with its alive beams, filled with the lowest ids at NEG_INF) or holding EOS."""
    source_ids = _sources(4)
    caps = (source_ids != 0).sum(1) + 3
    prefix = np.zeros((len(caps), caps.max()), "int32")
    for row, cap in enumerate(caps):
        prefix[row, : cap - row % 2] = 5 + row
    prefix[-1, :2] = (7, EOS_ID)
    expected, got, _ = _both(
        models["random"], source_ids, k, 0.6, 3, return_all=True, prefix=prefix
    )
    _assert_same(expected, got)
    assert np.all(got[1][0] < -1e8), "no room for EOS: no finished hypothesis"


def test_a_step_without_keep_is_stepped_whole(models):
    source_ids = _sources(3)
    expected, got, step = _both(models["eos"], source_ids, 2, 0.6, 8, step_class=ModelStep)
    _assert_same(expected, got)
    assert step.reorders > 0


def test_more_top_tokens_than_needed_give_the_same_answers(models):
    source_ids = _sources(5)
    expected, got, _ = _both(models["random"], source_ids, 3, 0.6, 4, top_k=VOCAB)
    _assert_same(expected, got)


def test_a_step_with_too_few_top_tokens_is_refused(models):
    step = DroppingStep(models["random"], _sources(0), 10, 2, top_k=3)
    with pytest.raises(ValueError, match="K >= 4"):
        litert_search.search(step, litert_search.Settings(2, 0.6), 10, np.full(5, 10))


def test_constants_are_the_packages():
    """The numpy search's numbers are `search_rules`' (the graph search's), in float32."""
    assert NEG_INF == search_rules.NEG_INF and graph_search.NEG_INF == search_rules.NEG_INF
    assert litert_search.NEG_INF == np.float32(NEG_INF)
    assert litert_search.HALF_NEG_INF == np.float32(graph_search.HALF_NEG_INF)
    assert (litert_search.BOS_ID, litert_search.EOS_ID) == (BOS_ID, EOS_ID)
    lengths = np.arange(1, 300)
    for alpha in (0.0, 0.6, 1.0):
        np.testing.assert_allclose(
            litert_search.length_penalty(lengths, alpha),
            graph_search.length_penalty(lengths, alpha),
            rtol=1e-6,
        )


# The package's modules the search may import: they import only numpy and the standard library.
_RULES = {
    "keras_transformer",
    "keras_transformer.search_rules",
    "keras_transformer.special_ids",
    "keras_transformer.constraint_rules",
}


def _imports(path):
    tree = ast.parse(open(path).read())
    imported = {
        alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):  # the module, and what may be a module in it
            imported |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return imported


def test_search_module_imports_only_numpy_and_the_standard_library():
    """The search and the rules it shares with the graph search (`search_rules`,
    `constraint_rules`) import numpy, the standard library, each other and nothing else (the
    package's `__init__` is lazy)."""
    imported = _imports(SEARCH_PATH)
    ours = {name for name in imported if name.startswith("keras_transformer.")}
    assert ours - _RULES <= {f"{m}.{n}" for m in _RULES for n in ("BOS_ID", "EOS_ID")}, ours
    tops = {name.split(".")[0] for name in imported - ours - _RULES}
    assert tops - sys.stdlib_module_names == {"numpy"}, sorted(imported)
    assert {"keras_transformer.search_rules", "keras_transformer.special_ids"} <= imported
    for module in (search_rules, constraint_rules, sys.modules["keras_transformer.special_ids"]):
        imported = _imports(module.__file__)
        imported -= {f"{m}.{n}" for m in _RULES for n in dir(sys.modules[m])} | _RULES
        tops = {name.split(".")[0] for name in imported}
        assert tops - sys.stdlib_module_names <= {"numpy"}, (module.__name__, imported)


def test_search_module_runs_without_tensorflow_or_keras():
    script = (
        "import sys\n"
        "for name in ('tensorflow', 'keras', 'jax'):\n"
        "    sys.modules[name] = None\n"
        "from keras_transformer.litert import search as module\n"
        "print(module.search.__name__)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "search"


def _constraints():
    """int32 `[5, 2, 3]` constraints for `_sources`' five inputs: two, an overlapping pair (one
    the other's prefix), a three-piece one, none, an unmeetable one (BOS is never generated)."""
    constraints = np.zeros((5, 2, 3), "int32")
    constraints[0] = [[7, 8, 0], [12, 0, 0]]
    constraints[1] = [[9, 0, 0], [9, 10, 0]]
    constraints[2, 0] = [11, 12, 13]
    constraints[4, 0, 0] = BOS_ID
    return constraints


@pytest.mark.parametrize(
    "model_name,k,alpha,extra", [("random", 1, 0.6, 5), ("random", 3, 0.6, 6),
                                 ("long", 2, 1.0, 4), ("eos", 4, 0.0, 8)],
)  # fmt: skip
def test_constrained_search_gives_the_graphs_answers(models, model_name, k, alpha, extra):
    """The numpy search with constraints (`constraint_rules` on numpy, over the constrained
    step's contract) against the graph's `constrained_beam_search` (the same rules on
    `keras.ops`, over the whole vocabulary): the same `met` flags, and where met the same
    hypotheses, each holding its constraints contiguously; settled sentences dropped."""
    model, source_ids, constraints = models[model_name], _sources(5), _constraints()
    settings = DecodingSettings(beam_size=k, alpha=alpha, max_extra_length=extra)
    expected = translate_ids(
        model, source_ids, settings, return_all=True, kernels="none", constraints=constraints
    )
    buffer, caps = source_ids.shape[1] + extra, (source_ids != 0).sum(1) + extra
    step = WantedStep(model, source_ids, buffer, k, 2 * k + 1)
    *got, met = litert_search.search(
        step, litert_search.Settings(k, alpha), buffer, caps, return_all=True,
        constraints=constraints,
    )  # fmt: skip
    np.testing.assert_array_equal(met, np.asarray(expected.constraints_met))
    assert met.tolist()[3:] == [True, False]  # no constraint: met; BOS: never
    assert step.kept, "settled sentences were dropped"
    rows = np.flatnonzero(met)
    _assert_same([np.asarray(x)[rows] for x in expected[:3]], [x[rows] for x in got])
    for row in rows:
        output = list(got[0][row, 0])
        for term in constraints[row]:
            term = [int(t) for t in term if t]
            assert not term or any(output[i : i + len(term)] == term for i in range(len(output))), (
                row,
                term,
                output,
            )
