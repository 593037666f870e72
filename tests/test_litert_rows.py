"""A row's answer is its own, in the LiteRT runtime too: over a vocabulary shortlist, each row of a
chunk gets the translation, score, token scores and n-best it gets alone, whatever shortlists
the other rows carry (each row masked to its own columns inside the chunk's), for every
shortlist step kind the exports hold (the float step's columns, the int8 gathered head, the
int8 constrained step's mask), greedy and beam search, with a prefix on one row and
constraints on another. Skipped only when the `litert` extra (ai-edge-litert) is missing."""

import _inference_fixtures as fx
import numpy as np
import pytest
from _shortlist_tables import table as _table

from keras_transformer.data.shortlist import batch_shortlist

pytest.importorskip("ai_edge_litert")

from keras_transformer import litert  # noqa: E402

pytestmark = pytest.mark.numerics

QUANTIZATIONS = fx.LITERT_QUANTIZATIONS
TEXTS = fx.NORMAL  # one chunk (the exports' batch_size is 4)
PREFIXES = ["", "", "dog", ""]
CONSTRAINTS = [[], ["white"], [], []]


def _sparse_table(vocab, seed=0):
    """Each piece translates into itself and two random pieces; three frequent pieces: rows of
    one chunk have different shortlists, so a chunk's union is wider than any row's."""
    rng = np.random.default_rng(seed)
    rows = np.concatenate([np.arange(vocab)[:, None], rng.integers(4, vocab, (vocab, 2))], 1)
    return _table(rows, rng.choice(np.arange(4, vocab), 3, replace=False))


@pytest.fixture(scope="module")
def row_dirs(copy_model, toy_spm_bytes, _shared_root):
    """`{(quantization, beams): directory}`: the copy model exported with a shortlist and its
    constrained steps, in float32 and int8, with beam 3 (the shortlist tests' exports, shared)
    and greedy search."""
    dirs = {}
    for beams, name in ((3, "litert_shortlist_copy_model"), (1, "litert_rows_greedy")):
        exports = fx.litert_shortlist_exports(_shared_root, name, copy_model, toy_spm_bytes, beams)
        dirs.update({(q, beams): path for q, path in exports.items()})
    return dirs


def _translator(directory):
    translator = litert.load(directory, shortlist=True)
    translator.shortlist = _sparse_table(translator.shortlist.vocab_size)
    return translator


def _assert_rows_alone(translator, prefixes=None, constraints=None):
    """Each row of `TEXTS` translated in one chunk answers as it does alone: the same n-best
    ids, scores and token scores within 1e-5."""
    keep = int(translator.settings["n_best"]) if constraints is None else 1
    ids = None if constraints is None else translator._constraint_ids(constraints)
    batched = translator._hypotheses(TEXTS, keep, prefixes, ids)
    for i, text in enumerate(TEXTS):
        prefix = None if prefixes is None else [prefixes[i]]
        own = None if constraints is None else translator._constraint_ids([constraints[i]])
        alone = translator._hypotheses([text], keep, prefix, own)
        assert batched["text"][i] == alone["text"][0], (i, text)
        np.testing.assert_array_equal(batched["length"][i], alone["length"][0])
        np.testing.assert_allclose(batched["score"][i], alone["score"][0], atol=1e-5)
        width = alone["token_scores"].shape[-1]
        np.testing.assert_allclose(
            batched["token_scores"][i][..., :width], alone["token_scores"][0], atol=1e-5
        )
        assert not batched["token_scores"][i][..., width:].any()
        if constraints is not None:
            assert batched["constraints_met"][i] == alone["constraints_met"][0]


def test_the_chunks_shortlist_is_wider_than_any_rows(copy_model):
    """The sparse table gives the rows of `TEXTS` different shortlists: the chunk's columns are
    more than any row's own (so a row decoded over the chunk's would answer otherwise)."""
    table = _sparse_table(copy_model.vocab_size)
    spm = fx.spm_processor()
    sources = [spm.encode(t) + [3] for t in TEXTS]
    matrix = np.zeros((len(sources), max(map(len, sources))), np.int32)
    for i, row in enumerate(sources):
        matrix[i, : len(row)] = row
    _, real = batch_shortlist(table.translations, table.frequent, matrix)
    widths = [
        int(batch_shortlist(table.translations, table.frequent, matrix[i : i + 1])[1].sum())
        for i in range(len(sources))
    ]
    assert int(real.sum()) > max(widths)


@pytest.mark.scenario
@pytest.mark.parametrize("beams", [1, 3])
@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_each_row_answers_as_alone(row_dirs, quantization, beams):
    """The shortlist step (float: the columns; int8: the gathered head), plain and with a
    prefix on one row."""
    translator = _translator(row_dirs[quantization, beams])
    _assert_rows_alone(translator)
    _assert_rows_alone(translator, prefixes=PREFIXES)


@pytest.mark.scenario
@pytest.mark.parametrize("beams", [1, 3])
@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_each_constrained_row_answers_as_alone(row_dirs, quantization, beams):
    """The constrained shortlist step (float: the columns; int8: the per-row mask), with
    constraints on one row."""
    translator = _translator(row_dirs[quantization, beams])
    _assert_rows_alone(translator, constraints=CONSTRAINTS)


@pytest.mark.scenario
@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_compacted_rows_keep_their_own_shortlists(row_dirs, quantization, monkeypatch):
    """Sentences that settle early are dropped from the step (`keep`, then `_compact` once
    half the chunk is done): the per-row biases and masks follow the live rows."""
    from keras_transformer.litert import graphs

    events = []
    real = graphs.DecoderStep._compact

    def recorded(self):
        events.append("_compact")
        return real(self)

    monkeypatch.setattr(graphs.DecoderStep, "_compact", recorded)
    texts = ["blue", "red", "cat", "red apple cat dog fish plum pear white black green blue"]
    translator = _translator(row_dirs[quantization, 3])
    batched = translator._hypotheses(texts, 1)
    assert events
    for i, text in enumerate(texts):
        alone = translator._hypotheses([text], 1)
        assert batched["text"][i] == alone["text"][0]
        np.testing.assert_allclose(batched["score"][i], alone["score"][0], atol=1e-5)
