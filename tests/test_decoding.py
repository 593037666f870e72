"""Greedy and beam search: fake next-token functions with known answers, and the real model."""

import itertools
import math
import os
import subprocess
import sys

import _inference_fixtures as fx
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_transformer.decoding import beam_search, greedy_search, translate_ids
from keras_transformer.decoding.search import (
    DecodingResult,
    expand_to_beams,
    flatten_beams,
    gather_beams,
    length_penalty,
    unflatten_beams,
)

# Numerically sensitive: CI runs this module again with oneDNN off and with one thread.
pytestmark = pytest.mark.numerics

EOS = 3


def lp(length, alpha):
    return ((5.0 + length) / 6.0) ** alpha


# --------------------------------------------------------------------------- helpers


def test_beam_helpers_match_numpy():
    x = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    flat = flatten_beams(x)
    np.testing.assert_array_equal(flat, x.reshape(6, 4))
    np.testing.assert_array_equal(unflatten_beams(flat, 3), x)
    indices = np.array([[2, 2, 0, 1], [1, 0, 0, 2]])
    expected = np.stack([x[b, indices[b]] for b in range(2)])
    np.testing.assert_array_equal(gather_beams(x, indices), expected)
    np.testing.assert_array_equal(expand_to_beams(np.array([[1], [2]]), 3), [[1]] * 3 + [[2]] * 3)
    np.testing.assert_allclose(length_penalty(np.array([1, 7]), 0.6), [1.0, 2.0**0.6], rtol=1e-6)


# --------------------------------------------------------------------------- a Markov fake


class MarkovFake:
    """log p(next | prefix) from a random table indexed by position and a hash of the prefix.

    The hash is carried in the search *state* (updated by the step function itself), so a beam
    search that reorders its state wrongly scores prefixes with the wrong distributions. The
    initial state is the input's row number, so every input has its own distributions.
    """

    def __init__(self, vocab=5, length=4, buckets=97, seed=0):
        rng = np.random.default_rng(seed)
        logits = rng.normal(size=(length, buckets, vocab)) * 2.0
        self.table = (logits - np.log(np.exp(logits).sum(-1, keepdims=True))).astype("float32")
        self.vocab, self.length, self.buckets = vocab, length, buckets

    def step_fn(self, ids, index, state):
        last = ops.squeeze(ops.take(ids, ops.reshape(index, (1,)), axis=1), 1)  # [rows]
        code = (ops.cast(state, "int32") * self.vocab + last) % self.buckets  # [rows]
        flat = ops.reshape(ops.convert_to_tensor(self.table), (-1, self.vocab))
        log_probs = ops.take(flat, index * self.buckets + code, axis=0)  # [rows, vocab]
        return log_probs, code

    def reference_nbest(self, row, alpha, max_length, bos=2):
        """All complete outputs of input `row`, best first: [(score, tokens)]."""
        results = []
        for length in range(1, max_length + 1):
            for body in itertools.product(
                [t for t in range(self.vocab) if t != EOS], repeat=length - 1
            ):
                tokens = list(body) + [EOS]
                code, total, last = row, 0.0, bos
                for i, token in enumerate(tokens):
                    code = (code * self.vocab + last) % self.buckets
                    total += float(self.table[i, code, token])
                    last = token
                results.append((total / lp(length, alpha), tokens))
        return sorted(results, key=lambda r: -r[0])

    def score_of(self, row, tokens, alpha, bos=2):
        code, total, last = row, 0.0, bos
        for i, token in enumerate(tokens):
            code = (code * self.vocab + last) % self.buckets
            total += float(self.table[i, code, token])
            last = token
        return total / lp(len(tokens), alpha)

    def token_log_probs(self, row, tokens, bos=2):
        """log p of each of `tokens` (an output, EOS included) after the ones before it."""
        code, last, found = row, bos, []
        for i, token in enumerate(tokens):
            code = (code * self.vocab + last) % self.buckets
            found.append(float(self.table[i, code, token]))
            last = token
        return found


def _strip(row):
    row = list(np.asarray(row))
    return row[: row.index(EOS) + 1]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_exhaustive_beam_search_equals_brute_force_nbest(alpha):
    fake = MarkovFake()
    # 4 live tokens: at most 4^2 * 5 = 80 candidates per step, so beam 80 is exhaustive.
    batch, k, max_length = 3, 80, fake.length
    ids, scores, _ = beam_search(
        fake.step_fn,
        np.full((batch,), 2),
        np.arange(batch),
        beam_size=k,
        max_length=max_length,
        alpha=alpha,
        eos_id=EOS,
        return_all=True,
    )
    ids, scores = np.asarray(ids), np.asarray(scores)
    assert ids.shape == (batch, k, max_length) and scores.shape == (batch, k)
    for row in range(batch):
        reference = fake.reference_nbest(row, alpha, max_length)[:k]
        np.testing.assert_allclose(scores[row], [s for s, _ in reference], rtol=1e-5, atol=1e-6)
        assert np.all(np.diff(scores[row]) <= 0), "n-best must be sorted best first"
        for j, (_, tokens) in enumerate(reference[:10]):  # the top ones have no near-ties
            assert _strip(ids[row, j]) == tokens
        # After EOS the output is padding.
        for j in range(k):
            tokens = _strip(ids[row, j])
            assert not np.any(ids[row, j, len(tokens) :])


def test_small_beam_scores_are_the_scores_of_its_outputs():
    fake = MarkovFake(vocab=6, length=5, seed=3)
    ids, scores, _ = beam_search(
        fake.step_fn,
        np.full((4,), 2),
        np.arange(4),
        beam_size=2,
        max_length=5,
        alpha=0.6,
        eos_id=EOS,
        return_all=True,
    )
    for row in range(4):
        best = fake.reference_nbest(row, 0.6, 5)[0][0]
        for j in range(2):
            tokens = _strip(np.asarray(ids)[row, j])
            assert float(scores[row, j]) == pytest.approx(fake.score_of(row, tokens, 0.6), rel=1e-5)
            assert float(scores[row, j]) <= best + 1e-6


def test_beam_size_one_equals_greedy():
    fake = MarkovFake(vocab=7, length=6, seed=5)
    initial = np.full((5,), 2)
    beam_ids, beam_scores, _ = beam_search(
        fake.step_fn, initial, np.arange(5), beam_size=1, max_length=6, alpha=0.0, eos_id=EOS
    )
    greedy_ids, greedy_scores, _ = greedy_search(
        fake.step_fn, initial, np.arange(5), max_length=6, eos_id=EOS
    )
    np.testing.assert_array_equal(beam_ids, greedy_ids)
    np.testing.assert_allclose(beam_scores, greedy_scores, rtol=1e-6)


def test_the_searches_return_one_type():
    """`greedy_search` and `beam_search` return a `DecodingResult` whatever their options (as
    `translate_ids` does): the token scores are always there, shaped like the ids."""
    fake = MarkovFake(vocab=6, length=5, seed=3)
    args = (fake.step_fn, np.full((4,), 2), np.arange(4))
    found = [
        greedy_search(*args, max_length=5, eos_id=EOS),
        beam_search(*args, beam_size=2, max_length=5, eos_id=EOS),
        beam_search(*args, beam_size=2, max_length=5, eos_id=EOS, return_all=True),
    ]
    for result in found:
        assert isinstance(result, DecodingResult)
        assert tuple(result.token_scores.shape) == tuple(result.ids.shape)
    assert tuple(found[2].ids.shape) == (4, 2, 5) and tuple(found[2].scores.shape) == (4, 2)


@pytest.mark.parametrize("beam_size", [1, 2, 4])
def test_token_scores_are_the_log_probs_of_each_output_token(beam_size):
    """Tracked with the hypotheses (reordered with them at every step), each output's token
    scores are the log-probabilities of its tokens, then 0; they sum to its unnormalised score."""
    fake = MarkovFake(vocab=6, length=5, seed=3)
    args = (fake.step_fn, np.full((4,), 2), np.arange(4))
    kwargs = dict(max_length=5, alpha=0.6, eos_id=EOS)
    if beam_size == 1:
        ids, scores, token_scores = (np.asarray(x)[:, None] for x in greedy_search(*args, **kwargs))
    else:
        found = beam_search(*args, beam_size=beam_size, return_all=True, **kwargs)
        ids, scores, token_scores = (np.asarray(x) for x in found)
    assert token_scores.shape == ids.shape and token_scores.dtype == np.float32
    for row, j in itertools.product(range(4), range(beam_size)):
        tokens = _strip(ids[row, j])
        expected = fake.token_log_probs(row, tokens)
        np.testing.assert_allclose(token_scores[row, j, : len(tokens)], expected, atol=1e-6)
        assert not np.any(token_scores[row, j, len(tokens) :])
        total = scores[row, j] * lp(len(tokens), 0.6)
        assert token_scores[row, j].sum() == pytest.approx(total, rel=1e-5)


# --------------------------------------------------------------------------- a position-only fake

# Rows: the distribution of the token at output position 1, 2, ... (independent of the prefix).
_TABLE = np.log(
    np.array(
        [
            [0.01, 0.01, 0.01, 0.37, 0.30, 0.2998, 0.0001, 0.0001],
            [0.01, 0.01, 0.01, 0.90, 0.03, 0.0298, 0.0001, 0.0001],
            [0.01, 0.01, 0.01, 0.90, 0.03, 0.0298, 0.0001, 0.0001],
        ],
        dtype="float32",
    )
)


def _position_step(ids, index, state):
    log_probs = ops.take(ops.convert_to_tensor(_TABLE), index, axis=0)  # [vocab]
    return ops.broadcast_to(log_probs[None], (ops.shape(ids)[0], 8)), state


def test_length_penalty_changes_the_winner():
    short, long = math.log(0.37), math.log(0.30) + math.log(0.90)  # [EOS] vs [4, EOS]
    assert short > long and short < long / lp(2, 2.0)  # alpha 2 favours the longer one
    ids, scores, _ = beam_search(
        _position_step,
        np.array([2]),
        np.zeros((1,)),
        beam_size=3,
        max_length=3,
        alpha=0.0,
        eos_id=EOS,
    )
    assert _strip(ids[0]) == [EOS] and float(scores[0]) == pytest.approx(short, rel=1e-5)
    ids, scores, _ = beam_search(
        _position_step,
        np.array([2]),
        np.zeros((1,)),
        beam_size=3,
        max_length=3,
        alpha=2.0,
        eos_id=EOS,
    )
    assert _strip(ids[0]) == [4, EOS]
    assert float(scores[0]) == pytest.approx(long / lp(2, 2.0), rel=1e-5)


def test_nbest_exact_outputs_and_order():
    ids, scores, _ = beam_search(
        _position_step,
        np.array([2, 2]),
        np.zeros((2,)),
        beam_size=3,
        max_length=3,
        alpha=0.0,
        eos_id=EOS,
        return_all=True,
    )
    expected = [
        ([EOS], math.log(0.37)),
        ([4, EOS], math.log(0.30) + math.log(0.90)),
        ([5, EOS], math.log(0.2998) + math.log(0.90)),
    ]
    for row in range(2):
        for j, (tokens, score) in enumerate(expected):
            assert _strip(ids[row, j]) == tokens
            assert float(scores[row, j]) == pytest.approx(score, rel=1e-5)


def _never_eos_step(ids, index, state):
    # EOS is the least likely token everywhere: only the length limit ends a sequence.
    log_probs = np.log(np.array([0.1, 0.1, 0.1, 0.001, 0.5, 0.199], dtype="float32"))
    return ops.broadcast_to(ops.convert_to_tensor(log_probs)[None], (ops.shape(ids)[0], 6)), state


@pytest.mark.parametrize("beam_size", [1, 3])
def test_eos_is_forced_at_each_inputs_length_limit(beam_size):
    max_lengths = np.array([1, 3, 6])
    args = (_never_eos_step, np.full((3,), 2), np.zeros((3,)))
    if beam_size == 1:
        ids, _, _ = greedy_search(*args, max_length=6, eos_id=EOS, max_lengths=max_lengths)
    else:
        ids, _, _ = beam_search(
            *args, beam_size=beam_size, max_length=6, eos_id=EOS, max_lengths=max_lengths
        )
    ids = np.asarray(ids)
    assert ids.shape == (3, 6)
    for row, limit in enumerate(max_lengths):
        assert _strip(ids[row]) == [4] * (limit - 1) + [EOS]
        assert not np.any(ids[row, limit:])


def test_beam_search_compiles_with_xla():
    fake = MarkovFake()
    run = tf.function(
        lambda initial, state: beam_search(
            fake.step_fn, initial, state, beam_size=4, max_length=4, alpha=0.6, eos_id=EOS
        ),
        jit_compile=True,
    )
    initial, state = tf.fill([3], 2), tf.range(3)
    ids, scores, _ = run(initial, state)
    eager_ids, eager_scores, _ = beam_search(
        fake.step_fn, initial, state, beam_size=4, max_length=4, alpha=0.6, eos_id=EOS
    )
    np.testing.assert_array_equal(ids, eager_ids)
    np.testing.assert_allclose(scores, eager_scores, rtol=1e-5)


# --------------------------------------------------------------------------- the real model


@pytest.fixture(scope="module")
def sources():
    texts = ["red apple cat", "dog dog fish bird", "blue", "plum pear white black green", ""]
    return texts, fx.encode_sources(texts)


def test_trained_copy_model_copies(model, sources):
    texts, source_ids = sources
    ids, scores, _ = translate_ids(model, source_ids, beam_size=4, max_extra_length=10)
    assert fx.decode_outputs(ids) == texts
    assert np.all(np.asarray(scores) <= 0)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_cached_search_equals_full_rerun(model, sources, beam_size):
    _, source_ids = sources
    kwargs = dict(beam_size=beam_size, alpha=0.6, max_extra_length=6)
    cached_ids, cached_scores, _ = translate_ids(model, source_ids, **kwargs)
    full_ids, full_scores, _ = translate_ids(model, source_ids, use_cache=False, **kwargs)
    np.testing.assert_array_equal(cached_ids, full_ids)
    np.testing.assert_allclose(cached_scores, full_scores, rtol=1e-4, atol=1e-5)


def test_translate_ids_shapes_and_limits(model, sources):
    _, source_ids = sources
    ids, scores, _ = translate_ids(model, source_ids, beam_size=2, max_extra_length=4, max_length=5)
    assert ids.shape == (len(source_ids), 5) and scores.shape == (len(source_ids),)
    ids = np.asarray(ids)
    assert ids.dtype == np.int32
    assert not np.any(ids == 2), "BOS is never generated"
    # Every output ends in EOS within the limit: min(source length + 4, 5).
    lengths = (source_ids != 0).sum(1)
    for row, limit in zip(ids, np.minimum(lengths + 4, 5)):
        tokens = _strip(row[:limit])
        assert tokens[-1] == EOS and 0 not in tokens, "padding only after EOS"


@pytest.mark.scenario
def test_translate_ids_under_xla_equals_eager(model, sources):
    _, source_ids = sources
    run = tf.function(
        lambda s: translate_ids(model, s, beam_size=3, max_extra_length=6), jit_compile=True
    )
    ids, scores, _ = run(tf.constant(source_ids))
    eager_ids, eager_scores, _ = translate_ids(model, source_ids, beam_size=3, max_extra_length=6)
    np.testing.assert_array_equal(ids, eager_ids)
    np.testing.assert_allclose(scores, eager_scores, rtol=1e-4, atol=1e-5)


def test_translate_ids_with_unknown_shapes(model, sources):
    _, source_ids = sources
    run = tf.function(
        lambda s: translate_ids(model, s, beam_size=3, max_extra_length=6),
        input_signature=[tf.TensorSpec([None, None], tf.int32)],
    )
    ids = run(tf.constant(source_ids)).ids
    eager_ids = translate_ids(model, source_ids, beam_size=3, max_extra_length=6).ids
    np.testing.assert_array_equal(ids, eager_ids)


_JAX_SCRIPT = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
import jax, numpy as np, keras
from test_decoding import MarkovFake
from keras_transformer.decoding import beam_search, translate_ids
from keras_transformer.models import Transformer
assert keras.backend.backend() == "jax"
fake = MarkovFake()
run = jax.jit(lambda s: beam_search(fake.step_fn, np.full((3,), 2), s, beam_size=80, max_length=4,
                                    alpha=0.6, eos_id=3, return_all=True))
ids, scores, _ = run(np.arange(3))
for row in range(3):
    ref = fake.reference_nbest(row, 0.6, 4)[:80]
    np.testing.assert_allclose(np.asarray(scores)[row], [s for s, _ in ref], rtol=1e-5, atol=1e-6)
keras.utils.set_random_seed(0)
model = Transformer(vocab_size=30, num_layers=1, d_model=16, num_heads=2, d_ff=32)
src = np.array([[5, 6, 7, 3], [8, 3, 0, 0]], "int32")
a = translate_ids(model, src, beam_size=3, max_extra_length=4)
b = translate_ids(model, src, beam_size=3, max_extra_length=4, use_cache=False)
np.testing.assert_array_equal(a[0], b[0])
print("JAX OK")
"""


@pytest.mark.scenario
def test_search_runs_on_jax():
    pytest.importorskip("jax")
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(tests_dir)
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-c", _JAX_SCRIPT, tests_dir],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "JAX OK" in done.stdout
