"""The two-pass top-k (`keras_transformer.decoding.top_k`) gives `ops.top_k`'s answer exactly:
the same values, the same indices, equal values in the same order (the lower index first),
however many entries tie, in eager mode, in a graph with an unknown number of rows or columns
(a vocabulary shortlist's width), and with the batched gather the LiteRT export converts."""

import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_transformer.decoding.top_k import TOP_K_BLOCK, blocked_top_k, top_k_of_blocks
from keras_transformer.export.litert_graphs import _gather_rows


def _rows(seed, rows, width, levels):
    """Rows drawn from `levels` distinct values (few levels: most entries tie), some banned."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, levels, size=(rows, width)).astype("float32")
    x[0, ::5] = -1e9
    x[-1] = -1e9  # a row of nothing but ties
    return x


def _assert_same(got, expected):
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("width", [40, 4 * 8 * TOP_K_BLOCK + 1, 8193, 32000, 128000])
@pytest.mark.parametrize("levels", [2, 7, 1_000_000])
def test_blocked_top_k_is_top_k_ties_included(width, levels):
    x = _rows(width + levels, 5, width, levels)
    for k in (1, 2, 8, 9):
        _assert_same(blocked_top_k(x, k), ops.top_k(x, k))
        _assert_same(blocked_top_k(x, k, gather=_gather_rows), ops.top_k(x, k))


def test_the_blocks_first_pass_does_the_work():
    """Wide rows take the two passes (a top-k over the blocks' maxima, one over `k` blocks),
    narrow ones `ops.top_k` alone: the graph's TopKV2 inputs show which."""

    def top_k_widths(width):
        fn = tf.function(lambda x: blocked_top_k(x, 8))
        graph = fn.get_concrete_function(tf.TensorSpec([None, width], tf.float32)).graph
        ops_ = [op for op in graph.get_operations() if op.type == "TopKV2"]
        return sorted(op.inputs[0].shape[-1] for op in ops_)

    assert top_k_widths(32000) == [8, 500, 8 * TOP_K_BLOCK]  # maxima, block order, entries
    assert top_k_widths(2000) == [2000]


def test_in_a_graph_with_unknown_rows_and_blocks():
    x = _rows(3, 7, 6400, 3)
    wide = tf.function(lambda x: blocked_top_k(x, 8),
                       input_signature=[tf.TensorSpec([None, 6400], tf.float32)])  # fmt: skip
    _assert_same(wide(x), ops.top_k(x, 8))
    columns = tf.function(
        lambda x: top_k_of_blocks(tf.reshape(x, [tf.shape(x)[0], -1, 64]), 9),
        input_signature=[tf.TensorSpec([None, None], tf.float32)],
    )
    _assert_same(columns(x), ops.top_k(x, 9))


@pytest.mark.parametrize("width", [40, 3 * TOP_K_BLOCK, 6400, 8193, 41784])
def test_widths_known_only_when_the_graph_runs(width):
    """A width unknown when traced (beam search's `[batch, beams * n]` over a shortlist of `n`
    ids) is padded at run time and takes the two passes: the same answer as `ops.top_k`, even
    for rows narrower than `k` blocks, and the graph's last TopKV2 sees `k` blocks only."""
    fn = tf.function(
        lambda x: blocked_top_k(x, 8), input_signature=[tf.TensorSpec([None, None], tf.float32)]
    )
    for levels in (2, 1_000_000):
        x = _rows(width + levels, 5, width, levels)
        _assert_same(fn(x), ops.top_k(x, 8))
    graph = fn.get_concrete_function().graph
    widths = [op.inputs[0].shape[-1] for op in graph.get_operations() if op.type == "TopKV2"]
    assert 8 * TOP_K_BLOCK in widths, widths
    # A known number of rows stays known (a search's loop keeps its variables' shapes).
    rows_known = tf.function(lambda x: blocked_top_k(x, 8)).get_concrete_function(
        tf.TensorSpec([5, None], tf.float32)
    )
    assert [tuple(x.shape) for x in rows_known.outputs] == [(5, 8), (5, 8)]


JAX_CHECK = """
import jax, numpy as np
from keras import ops
from keras_transformer.decoding.top_k import blocked_top_k
x = np.random.default_rng(0).integers(0, 3, (5, 40000)).astype("float32")
for k in (1, 8, 9):
    expected = [np.asarray(a) for a in ops.top_k(x, k)]
    for got in (blocked_top_k(x, k), jax.jit(lambda x: blocked_top_k(x, k))(x)):
        assert all(np.array_equal(np.asarray(a), b) for a, b in zip(got, expected)), k
print("same")
"""


@pytest.mark.scenario
def test_the_same_on_jax_eager_and_jitted():
    import os
    import subprocess
    import sys

    pytest.importorskip("jax")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=root)
    done = subprocess.run([sys.executable, "-c", JAX_CHECK], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "same", done.stderr[-2000:]
