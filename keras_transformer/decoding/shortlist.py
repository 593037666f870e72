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
ids, real, member = row_shortlists(table.translations, table.frequent, source_ids)
cache = model.init_cache(memory, max_length=20, output_ids=ids)  # logits [..., len(ids)]
```
"""

from keras import ops

# The bucket and the ids always in: the lexical table's module, whose `row_shortlists` is this
# module's in NumPy (for the runtimes without TensorFlow).
from keras_transformer.data.shortlist import SHORTLIST_BUCKET, SPECIAL_IDS
from keras_transformer.special_ids import PAD_ID


def row_shortlists(translations, frequent, source_ids, extras=(), bucket=SHORTLIST_BUCKET):
    """A batch's shortlist and each row's own: `(ids [n], real [n], member bool [batch, n])`.

    `ids` and `real` are the batch's columns: the union of the rows' shortlists, in
    increasing id order, then padding columns (`real` False, id `PAD_ID`) up to the smallest
    multiple of `bucket` holding it (`n` depends on the batch: a tensor in a traced graph, kept
    by the search's loop for all its steps); `member[b, j]` says whether column `j` is in
    row `b`'s own shortlist: the table's translations of its source pieces, the frequent and
    special ids and its own `extras` (a sequence of int tensors `[batch, ...]`, None skipped,
    0 ignored: its prefix, its constraints, its glossary's target pieces). The search masks
    each row to its own columns, so that a row's answer is the one it gets alone, whatever
    else the batch holds.
    The NumPy twin, for the runtimes without TensorFlow: `lexical_table.row_shortlists`.
    """
    source_ids = ops.cast(ops.convert_to_tensor(source_ids), "int32")
    batch = ops.shape(source_ids)[0]
    own = [ops.reshape(_row_pieces(translations, source_ids), (batch, -1))]
    own += [
        ops.reshape(ops.cast(ops.convert_to_tensor(x), "int32"), (batch, -1))
        for x in extras
        if x is not None
    ]
    own = ops.concatenate(own, axis=1)  # [batch, P]
    common = _common_ids(frequent)  # [M + 4]
    ids, real = _union(ops.concatenate([ops.reshape(own, (-1,)), common], 0), bucket)
    # Row b's marks over the ids up to the largest column id: [batch, top].
    top = _size(ops.max(ids) + 1)
    rows = ops.broadcast_to(ops.expand_dims(ops.arange(batch, dtype="int32"), 1), ops.shape(own))
    pairs = ops.reshape(ops.stack([rows, own], axis=-1), (-1, 2))  # [batch * P, 2]
    marks = ops.scatter(pairs, ops.ones(ops.shape(pairs)[:1], "int32"), (batch, top))
    member = ops.greater(ops.take(marks, ids, axis=1), 0)  # [batch, n]
    in_common = ops.any(ops.equal(ops.expand_dims(ids, 1), ops.expand_dims(common, 0)), axis=1)
    member = ops.logical_or(member, ops.expand_dims(in_common, 0))
    return ids, real, ops.logical_and(member, ops.expand_dims(real, 0))


def _row_pieces(translations, source_ids):
    """int32 `[batch, s_len, K]`: the table's target pieces of each source piece, a padding
    position's none (0, the padding id, in every shortlist)."""
    translations = ops.cast(ops.convert_to_tensor(translations), "int32")
    source_ids = ops.cast(ops.convert_to_tensor(source_ids), "int32")
    pieces = ops.take(translations, source_ids, axis=0)  # [batch, s_len, K]
    padding = ops.expand_dims(ops.equal(source_ids, PAD_ID), -1)
    return ops.where(padding, PAD_ID, pieces)


def _common_ids(frequent):
    """int32 `[M + 4]`: the ids every row's shortlist holds (the frequent and special ones)."""
    frequent = ops.cast(ops.reshape(ops.convert_to_tensor(frequent), (-1,)), "int32")
    return ops.concatenate([frequent, ops.convert_to_tensor(SPECIAL_IDS, dtype="int32")], 0)


def _union(wanted, bucket):
    """`(ids, real)` of the distinct ids of `wanted` (ids >= 0; see `row_shortlists`)."""
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
