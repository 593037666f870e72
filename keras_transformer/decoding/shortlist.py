"""A vocabulary shortlist in the graph: the target ids a batch's outputs may use, from a lexical
table (`keras_transformer.data.shortlist`), so that the search projects and normalises over them
alone (`translate_ids(..., shortlist=...)`).

The shortlist of a batch is the union of the table's translations of every source piece of the
batch, the table's most frequent target pieces, the special ids and any forced prefix ids, in
increasing id order, padded to a multiple of a bucket size with padding columns: the search's
tensors then take one of a few widths, and a padding column's logit is masked (it can never be
chosen). Written with `keras.ops`, so it runs on either backend.

Example:
```python
ids, real = shortlist_ids(table.translations, table.frequent, source_ids)
cache = model.init_cache(memory, max_length=20, output_ids=ids)  # logits [..., len(ids)]
```
"""

from keras import ops

# The bucket and the ids always in: the lexical table's module, whose `batch_shortlist` is this
# function in NumPy (for the runtimes without TensorFlow).
from keras_transformer.data.shortlist import SHORTLIST_BUCKET, SPECIAL_IDS
from keras_transformer.special_ids import PAD_ID


def shortlist_ids(translations, frequent, source_ids, extra_ids=None, bucket=SHORTLIST_BUCKET):
    """The shortlist of one batch: `(ids, real)`.

    Args:
        translations: int `[source_vocab, K]`, row `s` the target ids source piece `s`
            translates into (a table's `translations`; entries may repeat or be 0).
        frequent: int `[M]`, target ids always in the shortlist (the most frequent ones).
        source_ids: int `[batch, s_len]`, 0-padded.
        extra_ids: optional int tensor (any shape), more target ids to include, 0 ignored (a
            forced prefix's ids).
        bucket: the width is rounded up to a multiple of this (Python int).

    Returns:
        `ids` int32 `[n]` and `real` bool `[n]`, `n` the smallest multiple of `bucket` holding
        the union: the union's ids in increasing order, then padding columns (`real` False,
        id `PAD_ID`). `n` depends on the batch (a tensor in a traced graph, not a static
        size): the search's loop keeps it for all its steps.
    """
    translations = ops.cast(ops.convert_to_tensor(translations), "int32")
    source_ids = ops.cast(ops.convert_to_tensor(source_ids), "int32")
    pieces = ops.reshape(ops.take(translations, ops.reshape(source_ids, (-1,)), axis=0), (-1,))
    parts = [pieces, ops.cast(ops.reshape(ops.convert_to_tensor(frequent), (-1,)), "int32")]
    parts.append(ops.convert_to_tensor(SPECIAL_IDS, dtype="int32"))
    if extra_ids is not None:
        parts.append(ops.cast(ops.reshape(ops.convert_to_tensor(extra_ids), (-1,)), "int32"))
    wanted = ops.concatenate(parts, axis=0)  # [N] with repeats
    return _union(wanted, bucket)


def _union(wanted, bucket):
    """`(ids, real)` of the distinct ids of `wanted` (ids >= 0; see `shortlist_ids`)."""
    top = ops.max(wanted) + 1
    width = ((top + bucket - 1) // bucket) * bucket  # room for every id, a multiple of bucket
    counts = ops.scatter(ops.expand_dims(wanted, 1), ops.ones_like(wanted), (width,))  # [width]
    member = ops.greater(counts, 0)  # [width]
    size = ops.sum(ops.cast(member, "int32"))
    n = ((size + bucket - 1) // bucket) * bucket  # <= width
    # Ranks: members first, the lower id first; top_k breaks ties to the lower index.
    positions = ops.arange(width, dtype="int32")
    rank = ops.where(member, width - positions, 0)  # [width]
    values, ids = ops.top_k(rank, _size(n))  # [n]
    real = ops.greater(values, 0)
    return ops.where(real, ops.cast(ids, "int32"), PAD_ID), real


def _size(n):
    """`n` as `top_k` takes it: a tensor in a traced TensorFlow graph, a Python int when it is
    known (eager, or JAX, whose `top_k` needs a static size)."""
    try:
        return int(n)
    except TypeError:
        return n
