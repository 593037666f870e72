"""`ops.top_k` over wide rows in two passes, with the same answer: the values, the indices and
the order of equal values (the lower index first).

A row's `k` largest entries lie in its `k` blocks of highest maxima (blocks of `block`
entries, ranked by maximum, the lower block first among equal maxima): each block ranked above
an entry's own holds an entry that comes before it in `top_k`'s order (larger, or equal at a
lower index), so an entry among the `k` first has fewer than `k` blocks above its own. The
first pass takes the blocks' maxima (one vectorised reduction) and their `k` best; the second
takes the `k` best of those blocks' `k * block` entries, laid out in increasing index order,
so that `top_k`'s lower-position-first rule among equal values is the lower index's. Sorting
scans see `width / block` and `k * block` entries instead of `width`: beam search's
`[batch, beams * vocab]` rows (32 x 128,000, `k = 8`, TensorFlow on 2 AMD EPYC cores) take
0.7 ms instead of 4.8; LiteRT's TOPK_V2 (not an XNNPACK op, one thread) over 128 x 32,000,
2.4 ms instead of 6.3.

Used by the beam search (`keras_transformer.decoding.search`, `decoding.constraints`) and the
LiteRT export's decoder steps (`keras_transformer.export.litert_graphs`), which passes a
`gather` that converts to one LiteRT op.
"""

from keras import ops

from keras_transformer.decoding.beams import static_rows
from keras_transformer.search_rules import NEG_INF

TOP_K_BLOCK = 64  # entries per block


def _take_rows(params, indices):
    """`params[r, indices[r, j]]` along axis 1 for every row `r` (`params` `[rows, n]` or
    `[rows, n, m]`, `indices` int32 `[rows, j]`)."""
    if len(params.shape) == 3:
        # One gather from the `[rows * n, m]` view: TensorFlow's `take_along_axis` would
        # broadcast and transpose all of `params` first (beam search's `[32, 653, 64]` blocks
        # over a shortlist: a 0.6 ms copy at every step, on 2 AMD EPYC cores).
        shape = ops.shape(params)
        starts = ops.arange(shape[0], dtype="int32") * ops.cast(shape[1], "int32")  # [rows]
        rows = ops.cast(indices, "int32") + ops.expand_dims(starts, 1)  # [rows, j]
        return ops.take(ops.reshape(params, (-1, params.shape[-1])), rows, axis=0)
    return ops.take_along_axis(params, indices, axis=1)


def top_k_of_blocks(blocks, k, gather=None):
    """`ops.top_k` of each row of `blocks` `[rows, n, block]` flattened to `[rows, n * block]`
    (`n >= k`): `(values, indices)`, as `ops.top_k` gives them (module docstring).
    `gather(params, indices)`: `params[r, indices[r, j]]` along axis 1 (default:
    `take_along_axis`)."""
    gather = _take_rows if gather is None else gather
    block = blocks.shape[-1]
    _, best = ops.top_k(ops.max(blocks, axis=-1), k)  # [rows, k] the k best blocks
    best = -ops.top_k(-best, k)[0]  # in increasing order: candidates in index order
    candidates = gather(blocks, best)  # [rows, k, block]
    values, positions = ops.top_k(ops.reshape(candidates, (-1, k * block)), k)
    chosen = gather(best, positions // block)
    return values, chosen * block + positions % block


def blocked_top_k(x, k, block=TOP_K_BLOCK, gather=None):
    """`ops.top_k(x, k)` of `x` `[rows, width]` (module docstring): the same values and
    indices. Rows too narrow for blocks to pay (`4 * k` blocks or fewer) go to `ops.top_k`
    itself; a width that is not a multiple of `block` is padded with entries below any other.
    A width known only when the graph runs (a vocabulary shortlist's, in a traced
    TensorFlow graph) is padded so: to a multiple of `block`, and to `k` blocks at least."""
    width = x.shape[-1]
    if width is not None and width <= 4 * k * block:
        return ops.top_k(x, k)
    if width is None:  # a tensor: blocks counted, and the rows padded, at run time
        width = ops.shape(x)[-1]
        blocks = ops.maximum(-(-width // block), k)
    else:
        blocks = -(-width // block)
    padding = blocks * block - width
    if not isinstance(padding, int) or padding:
        x = ops.pad(x, ((0, 0), (0, padding)), constant_values=2.0 * NEG_INF)
    return top_k_of_blocks(ops.reshape(x, (static_rows(x), blocks, block)), k, gather)
