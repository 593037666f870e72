"""Hard lexical constraints in the beam search (`decoding.constraints`), `translate_ids`'
`constraints`, the `Translator`'s and the SavedModel's `translate_constrained`."""

import _inference_fixtures as fx
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import constraint_rules
from keras_transformer.decoding import translate_ids
from keras_transformer.decoding.constraints import KERAS

SOURCES = ["red apple cat", "dog dog fish bird", "blue", "plum pear white black green"]
SETTINGS = dict(alpha=0.6, max_extra_length=6)


def _pieces(text):
    return fx.spm_processor().encode(text)


def _constraints(rows):
    """`[[text, ...], ...]` -> int32 `[batch, C, P]`, 0-padded."""
    pieces = [[_pieces(t) for t in row] for row in rows]
    c = max(1, max(len(row) for row in pieces))
    p = max([1] + [len(x) for row in pieces for x in row])
    out = np.zeros((len(rows), c, p), "int32")
    for i, row in enumerate(pieces):
        for j, x in enumerate(row):
            out[i, j, : len(x)] = x
    return out


def _contains(sequence, piece_ids):
    n = len(piece_ids)
    return any(list(sequence[i : i + n]) == list(piece_ids) for i in range(len(sequence) - n + 1))


def _output(ids):
    """Output tokens before EOS."""
    ids = list(np.asarray(ids))
    return ids[: ids.index(fx.EOS)] if fx.EOS in ids else ids


# --------------------------------------------------------------------------- progress


@pytest.mark.parametrize("engine", ["keras", "numpy"])
def test_progress_is_the_longest_prefix_the_window_ends_with(engine):
    """The one rule, run on `keras.ops` (the graph's) and on numpy (the LiteRT runtime's)."""
    xp = KERAS if engine == "keras" else constraint_rules.NUMPY
    constraints = np.array([[[5, 5, 7, 0], [9, 0, 0, 0]]], "int32")  # "5 5 7", "9"
    windows = np.array(
        [[[-1, -1, -1, 5], [-1, 5, 5, 5], [5, 5, 5, 7], [5, 5, 7, 8], [1, 2, 9, 5]]], "int32"
    )
    old = np.zeros((1, 5, 2), "int32")
    old[0, 4, 1] = 1  # already met "9": stays met whatever comes
    lengths = constraint_rules.constraint_lengths(xp, constraints)
    progress = np.asarray(constraint_rules.progress_after(xp, windows, constraints, lengths, old))
    # "5 5 5" ends with "5 5" (a fallback, not a restart), "5 5 5 7" meets it, "8" leaves it.
    np.testing.assert_array_equal(progress[0], [[1, 0], [2, 0], [3, 0], [0, 0], [1, 1]])


# --------------------------------------------------------------------------- the search


@pytest.fixture(scope="module")
def source_ids():
    return fx.encode_sources(SOURCES)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_rows_without_constraints_get_the_unconstrained_answers(model, source_ids, beam_size):
    kwargs = dict(SETTINGS, beam_size=beam_size, return_all=True)
    plain = translate_ids(model, source_ids, **kwargs)
    constraints = _constraints([["dog"], [], ["green fish"], []])
    out = translate_ids(model, source_ids, constraints=constraints, **kwargs)
    assert np.asarray(out.constraints_met).all()
    for row in (1, 3):
        np.testing.assert_array_equal(out.ids[row], plain.ids[row])
        np.testing.assert_array_equal(out.scores[row], plain.scores[row])
        np.testing.assert_array_equal(out.token_scores[row], plain.token_scores[row])
    # The constrained rows changed: the copy model never says "dog" for "red apple cat".
    assert not _contains(_output(plain.ids[0, 0]), _pieces("dog"))
    none = translate_ids(model, source_ids, constraints=_constraints([[]] * 4), **kwargs)
    for got, want in zip(none[:3], plain):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_every_output_meets_its_constraints(model, source_ids, beam_size):
    rows = [["dog", "plum"], ["white"], ["green fish", "black"], ["cat", "cat bird"]]
    constraints = _constraints(rows)
    out = translate_ids(
        model, source_ids, constraints=constraints, beam_size=beam_size, return_all=True,
        **SETTINGS,
    )  # fmt: skip
    assert np.asarray(out.constraints_met).tolist() == [True] * 4
    ids, scores = np.asarray(out.ids), np.asarray(out.scores)
    for i, row in enumerate(rows):
        for j in range(beam_size):
            if scores[i, j] <= -1e8:  # an empty n-best slot
                continue
            output = _output(ids[i, j])
            assert fx.EOS in ids[i, j].tolist(), "every output ends"
            for term in row:  # met, contiguously, before EOS
                assert _contains(output, _pieces(term)), (i, j, term, output)
    # The score is the output's: its token scores summed over the length penalty.
    lengths = (ids[:, 0] != 0).sum(-1)
    penalty = ((5.0 + lengths) / 6.0) ** SETTINGS["alpha"]
    np.testing.assert_allclose(
        np.asarray(out.token_scores)[:, 0].sum(-1) / penalty, scores[:, 0], rtol=1e-5
    )


def test_unmeetable_constraints_give_the_unconstrained_answer_flagged(model, source_ids):
    kwargs = dict(SETTINGS, beam_size=3)
    plain = translate_ids(model, source_ids, **kwargs)
    too_long = " ".join(["red green"] * 8)  # longer than any output may be
    constraints = _constraints([["pear"], [too_long], [], ["dog", too_long]])
    out = translate_ids(model, source_ids, constraints=constraints, **kwargs)
    assert np.asarray(out.constraints_met).tolist() == [True, False, True, False]
    for row in (1, 2, 3):
        np.testing.assert_array_equal(out.ids[row], plain.ids[row])
        np.testing.assert_array_equal(out.scores[row], plain.scores[row])
    assert _contains(_output(out.ids[0]), _pieces("pear"))


def test_constraint_pieces_enter_the_shortlist(model, source_ids):
    """With a shortlist of the source's own pieces (the copy task's), a term none of the
    sources holds is still met: its pieces join the batch's shortlist."""
    from keras_transformer.data.shortlist import LexicalTable

    vocab = model.vocab_size
    table = LexicalTable(np.arange(vocab, dtype=np.int32)[:, None], np.zeros([0], np.int32))
    constraints = _constraints([["dog"], [], [], []])
    kwargs = dict(SETTINGS, beam_size=3, shortlist=table)
    out = translate_ids(model, source_ids, constraints=constraints, **kwargs)
    assert np.asarray(out.constraints_met).all()
    assert _contains(_output(out.ids[0]), _pieces("dog"))
    plain = translate_ids(model, source_ids, **kwargs)
    np.testing.assert_array_equal(out.ids[1:], plain.ids[1:])


def test_constraints_refuse_sampling(model, source_ids):
    with pytest.raises(ValueError, match="sampling"):
        translate_ids(model, source_ids, constraints=_constraints([[]] * 4), sampling_topk=5)


@pytest.mark.scenario
@pytest.mark.parametrize("kernels", ["none", "all"])
def test_the_search_compiles_with_xla_and_answers_the_same(model, source_ids, kernels):
    constraints = _constraints([["dog"], [], ["green fish"], ["cat", "cat bird"]])
    kwargs = dict(SETTINGS, beam_size=3, return_all=True, kernels=kernels)

    def search(source, constraints):
        return tuple(translate_ids(model, source, constraints=constraints, **kwargs))

    eager = search(source_ids, constraints)
    compiled = tf.function(search, jit_compile=True, autograph=False)(source_ids, constraints)
    np.testing.assert_array_equal(compiled[0], eager[0])
    np.testing.assert_allclose(compiled[1], eager[1], atol=1e-4)
    np.testing.assert_array_equal(compiled[3], eager[3])


# --------------------------------------------------------------------------- the Translator


def _translator(model, spm_bytes):
    from keras_transformer.export import Translator

    decode, data = fx.EXPORT_DECODE, fx.EXPORT_DATA
    return Translator(
        model, spm_bytes, max_source_length=data["max_source_length"],
        **{key: decode[key] for key in ("beam_size", "alpha", "max_extra_length", "batch_size")},
    )  # fmt: skip


@pytest.mark.scenario
def test_translator_meets_string_constraints_and_answers_hostile_ones(copy_model, toy_spm_bytes):
    translator = _translator(copy_model, toy_spm_bytes)
    texts = fx.NORMAL + ["red apple cat", "blue", "blue", "blue", "blue"]
    long_term = " ".join(["green"] * 40)  # more pieces than any output holds
    constraints = [
        ["dog"],
        [],
        ["fish", "white"],
        ["", "plum"],  # "" is no term
        ["cat", "cat bird"],  # overlapping: one the other's prefix
        [long_term],
        [b"\xff\xfe"],  # invalid UTF-8: U+FFFD, which the vocabulary drops: no term
        [b"pear \xff"],  # "pear"
        ["\u00e9t\u00e9"],  # pieces the vocabulary lacks: never in an output
    ]
    out = translator.translate(texts, constraints=constraints)
    plain = translator.translate(texts)
    assert set(out) == {"translation", "score", "constraints_met"}
    # Unmeetable: longer than any output, or with pieces the vocabulary lacks.
    assert out["constraints_met"] == [True] * 5 + [False, True, True, False]
    words = [t.split() for t in out["translation"]]
    assert "dog" in words[0] and {"fish", "white"} <= set(words[2]) and "plum" in words[3]
    assert "cat bird" in " ".join(words[4]) and "pear" in words[7]
    for row in (1, 5, 6, 8):  # no constraint or unmeetable ones: `serve`'s answers
        assert out["translation"][row] == plain["translation"][row]
        np.testing.assert_allclose(out["score"][row], plain["score"][row], atol=1e-5)


@pytest.mark.scenario
def test_translate_constrained_refuses_row_counts_that_differ(copy_model, toy_spm_bytes):
    translator = _translator(copy_model, toy_spm_bytes)
    with pytest.raises(tf.errors.InvalidArgumentError, match="constraints has"):
        translator.translate_constrained(tf.constant(["blue"]), tf.constant([["a"], ["b"]]))
    nothing = tf.constant([], tf.string)
    empty = translator.translate_constrained(nothing, tf.zeros([0, 0], tf.string))
    assert empty["translation"].shape == (0,)


@pytest.mark.scenario
def test_the_saved_model_signature_serves_the_translators_answers(exported_copy_model):
    import json
    import os

    translator, path = exported_copy_model
    texts = tf.constant(fx.NORMAL + fx.HOSTILE)
    rows = [["dog", ""], ["", ""], ["fish", "white"], ["pear", "cat bird"]] + [["blue", ""]] * 5
    rows[5] = [" ".join(["green"] * 40), "\u00e9t\u00e9"]  # unmeetable
    constraints = tf.constant(rows)
    signature = tf.saved_model.load(path).signatures["translate_constrained"]
    out = signature(text=texts, constraints=constraints)
    fx.assert_same_answers(out, translator.translate_constrained(texts, constraints))
    met = out["constraints_met"].numpy().tolist()
    assert met[:5] == [True] * 5 and met[5] is False
    assert b"dog" in out["translation"].numpy()[0]
    with open(os.path.join(path, "assets.extra", "keras_transformer.json")) as f:
        inputs = json.load(f)["signatures"]["translate_constrained"]["inputs"]
    assert inputs == {"text": "string [batch]", "constraints": "string [batch, C]"}


# --------------------------------------------------------------------------- the command


@pytest.mark.scenario
def test_translate_constraints_from_the_command_line(model_base_dir, run_cli, tmp_path):
    terms = tmp_path / "terms.tsv"
    terms.write_text("dog\tplum\n\nwhite\n" + "\t".join([" ".join(["green"] * 40)]) + "\n")
    texts = ["red apple cat", "blue", "dog dog fish bird", "blue"]
    code, out, err = run_cli(
        "translate", "--model", model_base_dir, "--constraints", str(terms), *texts
    )
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 4
    assert {"dog", "plum"} <= set(lines[0].split()) and "white" in lines[2].split()
    plain = run_cli("translate", "--model", model_base_dir, *texts)[1].splitlines()
    assert lines[1] == plain[1] and lines[3] == plain[3]  # no terms; terms too long
    assert "line 4: its terms cannot be met" in err and "line 1" not in err
    for argv, message in [
        (("--constraints", str(terms), "a"), "4 lines for 1 TEXT"),
        (("--constraints", str(tmp_path / "none.tsv"), "a"), "cannot read"),
        (("--constraints", str(terms), "--n-best", "2", "a", "b", "c", "d"), "--constraints"),
    ]:
        code, _, err = run_cli("translate", "--model", model_base_dir, *argv)
        assert code == 2 and message in err, err


_JAX_SCRIPT = r"""
import jax
import numpy as np

from keras_transformer.decoding import translate_ids
from keras_transformer.models import Transformer

model = Transformer(vocab_size=40, num_layers=1, d_model=16, num_heads=2, d_ff=32, dropout=0.0)
source = np.array([[5, 6, 7, 3], [8, 9, 3, 0]], "int32")
model({"source_ids": source, "target_ids": source}, training=False)
constraints = np.array([[[11, 12], [13, 0]], [[0, 0], [0, 0]]], "int32")
for k in (1, 3):
    kwargs = dict(beam_size=k, max_extra_length=8)
    out = translate_ids(model, source, constraints=constraints, **kwargs)
    plain = translate_ids(model, source, **kwargs)
    assert np.asarray(out.constraints_met).all()
    ids = np.asarray(out.ids)[0].tolist()
    assert [11, 12] in [ids[i : i + 2] for i in range(len(ids))] and 13 in ids[: ids.index(3)]
    np.testing.assert_array_equal(out.ids[1], plain.ids[1])
    jitted = jax.jit(lambda s, c: tuple(translate_ids(model, s, constraints=c, **kwargs)))
    np.testing.assert_array_equal(jitted(source, constraints)[0], out.ids)
print("constrained on jax")
"""


@pytest.mark.scenario
def test_the_search_runs_on_jax():
    import os
    import subprocess
    import sys

    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", _JAX_SCRIPT], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0 and "constrained on jax" in done.stdout, done.stderr[-3000:]


@pytest.mark.scenario
def test_the_xla_translator_answers_as_the_plain_one(copy_model, toy_spm_bytes):
    from keras_transformer.export import Translator

    decode, data = fx.EXPORT_DECODE, fx.EXPORT_DATA
    kwargs = {key: decode[key] for key in ("beam_size", "alpha", "max_extra_length", "batch_size")}
    kwargs["max_source_length"] = data["max_source_length"]
    texts = tf.constant(["red apple cat", "blue", "dog dog fish bird"])
    constraints = tf.constant([["dog", ""], ["", ""], ["white", "cat bird"]])
    plain = Translator(copy_model, toy_spm_bytes, **kwargs)
    compiled = Translator(copy_model, toy_spm_bytes, jit_compile=True, **kwargs)
    fx.assert_same_answers(
        compiled.translate_constrained(texts, constraints),
        plain.translate_constrained(texts, constraints),
    )
