"""A row's answer is its own: over a vocabulary shortlist, each row of a batch gets the
translation, score, token scores and n-best list it gets alone, whatever the other rows carry
(sources, prefixes, constraints, glossaries). The batch's columns are the union of its rows'
shortlists; each row is masked to its own (`decoding.shortlist.row_shortlists`)."""

import types

import _inference_fixtures as fx
import numpy as np
import pytest
from _shortlist_tables import table as _table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keras_transformer.constraint_rules import NUMPY
from keras_transformer.decoding import translate_ids
from keras_transformer.decoding.shortlist import row_shortlists
from keras_transformer.lexical_table import batch_shortlist, glossary_pieces
from keras_transformer.lexical_table import row_shortlists as numpy_row_shortlists
from keras_transformer.special_ids import PAD_ID

pytestmark = pytest.mark.numerics


def _sparse_table(vocab, seed=0):
    """Each piece translates into itself and two random pieces; three frequent pieces: rows of
    one batch have different shortlists, so a batch's union is wider than any row's."""
    rng = np.random.default_rng(seed)
    rows = np.concatenate([np.arange(vocab)[:, None], rng.integers(4, vocab, (vocab, 2))], 1)
    return _table(rows, rng.choice(np.arange(4, vocab), 3, replace=False))


def _trimmed(ids):
    """A row's 0-padded ids without the trailing padding (its request alone)."""
    ids = np.asarray(ids)
    keep = np.flatnonzero(ids.reshape(ids.shape[0], -1).any(axis=0)) if ids.size else []
    width = (int(keep[-1]) + 1) if len(keep) else 1
    return ids[:, :width]


def _alone(source_ids, row):
    return _trimmed(source_ids[row : row + 1])


# --------------------------------------------------------------------------- the columns


def test_each_rows_own_columns_are_its_shortlist_alone():
    rng = np.random.default_rng(3)
    translations = rng.integers(0, 300, size=(120, 5))
    frequent = rng.integers(0, 300, size=6)
    source = rng.integers(1, 120, size=(4, 9))
    source[1, 5:] = PAD_ID  # a padded row: its padding adds no piece
    source[3, 2:] = PAD_ID
    prefix = np.zeros((4, 3), np.int64)
    prefix[2] = [250, 251, 0]
    for engine in ("numpy", "graph"):
        if engine == "numpy":
            ids, real, member = numpy_row_shortlists(translations, frequent, source, [prefix], 16)
        else:
            ids, real, member = (
                np.asarray(x) for x in row_shortlists(translations, frequent, source, [prefix], 16)
            )
        batch_ids, batch_real = batch_shortlist(translations, frequent, source, prefix, 16)
        np.testing.assert_array_equal(ids, batch_ids)
        np.testing.assert_array_equal(real, batch_real)
        for row in range(4):
            alone, alone_real = batch_shortlist(
                translations, frequent, _alone(source, row), _trimmed(prefix[row : row + 1]), 16
            )
            assert ids[member[row]].tolist() == alone[alone_real].tolist(), (engine, row)


def test_padding_positions_add_no_piece():
    """A row padded by a longer neighbour keeps the shortlist it has alone (before: the table's
    row of the padding id entered every padded batch)."""
    translations = np.zeros((10, 1), np.int64)
    translations[0] = 9  # the padding id's row
    translations[5] = 6
    ids, real = batch_shortlist(translations, [], [[5, 3, 0]], bucket=8)
    assert 9 not in ids[real]
    ids, real, _ = row_shortlists(translations, [], np.array([[5, 3, 0]], np.int32), bucket=8)
    assert 9 not in np.asarray(ids)[np.asarray(real)]


def test_glossary_target_pieces_are_found_between_the_tags():
    sep, end = 7, 8  # <trans>, </term>
    source = np.array(
        [[4, 6, sep, 11, 12, end, 13, 6, sep, 14, end, 3], [4, 5, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0]]
    )
    expected = [[0, 0, 0, 11, 12, 0, 0, 0, 0, 14, 0, 0], [0] * 12]
    assert glossary_pieces(NUMPY, source, sep, end).tolist() == expected
    from keras import ops

    assert np.asarray(glossary_pieces(ops, source, sep, end)).tolist() == expected


# --------------------------------------------------------------------------- the search


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_rows_answer_does_not_depend_on_its_batch(model, beam_size):
    """Reproduction: over the default shortlist, a sentence's score changed with the sentences
    batched with it (the batch's union widened its softmax)."""
    texts = ["red apple cat", "dog dog fish bird", "blue", "plum pear white black green"]
    source_ids = fx.encode_sources(texts)
    table = _sparse_table(model.vocab_size)
    kwargs = dict(beam_size=beam_size, alpha=0.6, max_extra_length=6, return_all=True)
    batched = translate_ids(model, source_ids, shortlist=table, **kwargs)
    widths = []
    for row in range(len(texts)):
        alone = translate_ids(model, _alone(source_ids, row), shortlist=table, **kwargs)
        _assert_row(batched, row, alone)
        _, real = batch_shortlist(table.translations, table.frequent, _alone(source_ids, row))
        widths.append(int(real.sum()))
    _, real = batch_shortlist(table.translations, table.frequent, source_ids)
    assert int(real.sum()) > max(widths)  # the batch's columns are wider than any row's


def _assert_row(batched, row, alone):
    ids, alone_ids = np.asarray(batched.ids)[row], np.asarray(alone.ids)[0]
    width = alone_ids.shape[-1]
    np.testing.assert_array_equal(ids[..., :width], alone_ids)
    assert not ids[..., width:].any()
    np.testing.assert_allclose(np.asarray(batched.scores)[row], alone.scores[0], atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(batched.token_scores)[row][..., :width], alone.token_scores[0], atol=1e-5
    )


_PIECES = st.integers(4, 15)  # the toy vocabulary's word pieces (fx.encode_sources)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    data=st.data(),
    rows=st.integers(2, 5),
    beam_size=st.sampled_from([1, 3]),
    kind=st.sampled_from(["plain", "prefix", "constraints"]),
)
def test_random_mixed_batches_answer_each_row_as_alone(model, data, rows, beam_size, kind):
    """Random batches of requests: each row's n-best list, scores and token scores are the ones
    it gets alone, whatever its neighbours' sources, prefixes or constraints."""
    seed = data.draw(st.integers(0, 10_000))
    texts = fx.toy_sentences(rows, seed=seed)
    source_ids = fx.encode_sources(texts)
    table = _sparse_table(model.vocab_size, seed=seed)
    kwargs = dict(beam_size=beam_size, alpha=0.6, max_extra_length=5, return_all=True)
    extra, alone_extra = {}, lambda row: {}
    if kind == "prefix":
        prefix = np.zeros((rows, 2), np.int32)
        for row in range(rows):
            if data.draw(st.booleans()):
                prefix[row, : data.draw(st.integers(1, 2))] = data.draw(_PIECES)
        extra = {"prefix_ids": prefix}

        def alone_extra(row):
            own = _trimmed(prefix[row : row + 1])
            return {"prefix_ids": own} if own.any() else {}

    elif kind == "constraints":
        beam_size = kwargs["beam_size"] = 3
        constraints = np.zeros((rows, 1, 2), np.int32)
        for row in range(rows):
            if data.draw(st.booleans()):
                constraints[row, 0, 0] = data.draw(_PIECES)
        extra = {"constraints": constraints}

        def alone_extra(row):
            return {"constraints": constraints[row : row + 1]}

    batched = translate_ids(model, source_ids, shortlist=table, **extra, **kwargs)
    for row in range(rows):
        alone = translate_ids(
            model, _alone(source_ids, row), shortlist=table, **alone_extra(row), **kwargs
        )
        _assert_row(batched, row, alone)


# --------------------------------------------------------------------------- the SavedModel


def _rows_of(out, row):
    return {key: value.numpy()[row : row + 1] for key, value in out.items()}


def _assert_same_rows(batched, alone, row):
    for key, value in alone.items():
        mine = batched[key][row : row + 1].numpy()
        value = value.numpy()
        if value.dtype.kind in "SO":
            np.testing.assert_array_equal(mine, value, err_msg=key)
        else:  # token scores: 0-padded to the batch's widest answer
            width = value.shape[-1] if value.ndim > 1 else None
            if width is not None and mine.shape[-1] > width:
                assert not mine[..., width:].any(), key
                mine = mine[..., :width]
            np.testing.assert_allclose(mine, value, atol=1e-5, err_msg=key)


@pytest.mark.scenario
def test_every_signature_answers_a_row_as_alone(copy_model, toy_spm_bytes):
    """Reproduction: `serving_default` of an export over the shortlist scored a sentence -0.516
    alone, -0.585 and -0.602 batched; `translate_constrained` and `translate_prefix` moved a
    row without terms when another row had one. Every searching signature, every output."""
    import tensorflow as tf

    from keras_transformer.export import Translator

    decode, data = fx.EXPORT_DECODE, fx.EXPORT_DATA
    translator = Translator(
        copy_model, toy_spm_bytes, max_source_length=data["max_source_length"],
        shortlist=_sparse_table(copy_model.vocab_size, seed=5),
        **{key: decode[key] for key in ("beam_size", "alpha", "max_extra_length", "batch_size")},
    )  # fmt: skip
    texts = ["red apple cat", "dog fish", "blue plum pear", "white"]
    batch = tf.constant(texts)
    calls = {
        "serve": (translator.serve, lambda rows: (batch[rows],)),
        "nbest": (translator.translate_nbest, lambda rows: (batch[rows],)),
        "prefix": (
            translator.translate_prefix,
            lambda rows: (batch[rows], tf.constant(["", "bird", "", "green"])[rows]),
        ),
        "constrained": (
            translator.translate_constrained,
            lambda rows: (batch[rows], tf.constant([["cat"], [""], ["fish"], [""]])[rows]),
        ),
    }
    everything = slice(0, len(texts))
    for name, (signature, inputs) in calls.items():
        batched = signature(*inputs(everything))
        for row in range(len(texts)):
            alone = signature(*inputs(slice(row, row + 1)))
            _assert_same_rows(batched, alone, row)


def test_a_soft_glossarys_target_pieces_enter_its_rows_shortlist(tmp_path):
    """Reproduction: `translate_glossary` added the glossary's target pieces to no shortlist,
    so a term the table does not list could not be produced after `<trans>`."""
    import sentencepiece as spm

    from keras_transformer import glossary as g
    from keras_transformer.decoding.search import _shortlist_columns
    from keras_transformer.export.translator import glossary_tag_ids

    proto = fx.glossary_spm_proto(str(tmp_path / "spm"))
    tags = glossary_tag_ids(proto)
    processor = spm.SentencePieceProcessor(model_proto=proto)
    texts = ["the cat sat", g.annotate("the cat sat", {"cat": "plum"})]
    rows = [processor.encode(t) + [3] for t in texts]
    source = np.zeros((2, max(map(len, rows))), np.int32)
    for i, row in enumerate(rows):
        source[i, : len(row)] = row
    table = _table(np.zeros((40, 1)))  # lists nothing: only the special ids
    table_with_tags = types.SimpleNamespace(
        translations=table.translations, frequent=table.frequent,
        glossary_ids=(tags[g.SEPARATOR], tags[g.END]),
    )  # fmt: skip
    plum = processor.encode("plum")
    ids, _, member = (np.asarray(x) for x in _shortlist_columns(table_with_tags, source, ()))
    assert set(plum) <= set(ids[member[1]].tolist())  # the annotated row can write "plum"
    assert not set(plum) & set(ids[member[0]].tolist())  # the plain row, as alone: not
    assert tags is not None and glossary_tag_ids(fx_spm_bytes()) is None


def fx_spm_bytes():
    with open(fx.spm_model_path(), "rb") as f:
        return f.read()
