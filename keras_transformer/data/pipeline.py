"""tf.data input pipeline: tokenize, add BOS/EOS, truncate, bucket by length, batch by tokens.

Every batch of a bucket has the same shape: sentences are padded to the bucket's fixed length
(not to the longest sentence in the batch) and a bucket of length L always holds
`tokens_per_batch // L` sentences (training drops incomplete batches). So a model compiled with
XLA sees a handful of shapes, one per bucket, and never recompiles after warm-up.
"""

import sys

from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from keras_transformer.errors import DataError


def bucket_boundaries(max_length, min_length=8, growth=1.5, multiple=8):
    """A few fixed padded lengths from `min_length` up to `max_length` (included).

    Lengths grow geometrically by `growth` and are rounded up to a multiple of `multiple`
    (friendly to accelerators); the last one is `max_length` itself.

    Args:
        max_length: the longest sequence (the last boundary).
        min_length: the first boundary.
        growth: ratio between successive boundaries.
        multiple: boundaries (except possibly the last) are multiples of this.

    Returns:
        An increasing list of ints ending with `max_length`.

    Example:
    >>> bucket_boundaries(128)
    [8, 16, 24, 40, 64, 96, 128]
    """
    if max_length <= 0:
        raise ValueError(f"max_length must be positive, got {max_length}")
    boundaries, length = [], min(min_length, max_length)
    while length < max_length:
        boundaries.append(length)
        grown = max(length + 1, int(length * growth))
        length = -(-grown // multiple) * multiple
    boundaries.append(max_length)
    return boundaries


def _resolve_boundaries(data_config):
    max_length = max(data_config.max_source_length, data_config.max_target_length)
    if data_config.bucket_boundaries:
        boundaries = sorted({int(b) for b in data_config.bucket_boundaries if 0 < int(b)})
        boundaries = [b for b in boundaries if b < max_length] + [max_length]
        return boundaries
    return bucket_boundaries(max_length)


def bucket_batch_sizes(boundaries, tokens_per_batch, batch_multiple=1):
    """Sentences per batch for each bucket: `tokens_per_batch // length`, rounded down to a
    multiple of `batch_multiple` (e.g. the number of replicas), at least `batch_multiple`."""
    sizes = []
    for length in boundaries:
        size = (tokens_per_batch // length) // batch_multiple * batch_multiple
        sizes.append(max(batch_multiple, size))
    return sizes


def valid_utf8(strings):
    """tf.string tensor -> the same strings with every invalid UTF-8 sequence replaced by U+FFFD
    (as Python's `bytes.decode("utf-8", errors="replace")` reads them): what every signature
    does to its text inputs first, so that a request of random bytes gets an answer.

    Example:
    ```python
    valid_utf8(tf.constant([b"ein \\xff Haus"]))  # [b"ein \\xef\\xbf\\xbd Haus"]
    ```
    """
    import tensorflow as tf

    return tf.strings.unicode_transcode(
        strings, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
    )


def encode_source(tokenizer, text, max_source_length, eos_id=EOS_ID):
    """One source string -> its ids as the model saw them in training (pieces truncated to
    `max_source_length - 1`, then EOS): `encode_sources`' convention in plain Python (the
    tokenizer's Python `encode`), for a search run on either backend (`evaluation`).

    Example:
    ```python
    encode_source(tokenizer, "ein Haus", 128)  # [pieces..., 3]
    ```
    """
    return list(tokenizer.encode(text))[: max_source_length - 1] + [eos_id]


def encode_sources(tokenizer, texts, max_source_length, length=None, ragged=False, eos_id=EOS_ID):
    """Source strings -> ids as the model saw them in training: pieces + [EOS].

    The one home of that convention (pieces truncated to `max_source_length - 1`, then EOS,
    padded with 0), shared by `make_dataset`'s sources and the exported `Translator` (and, in
    plain Python, `encode_source`: decoding during training). Works eagerly and in graphs.

    Args:
        tokenizer: a `Tokenizer`, or any object whose `tokenize(texts)` returns int ragged
            pieces `[N, None]` (such as tensorflow-text's `SentencepieceTokenizer`).
        texts: `tf.string` [N] (or a list of str).
        max_source_length: longest source in tokens, EOS included.
        length: pad to this many columns (default: the longest row).
        ragged: return the ragged ids `[N, None]` instead of a padded tensor.
        eos_id: the end-of-sequence id.

    Returns:
        int32 tensor [N, length] (or a ragged one with `ragged=True`).

    Example:
    ```python
    encode_sources(tokenizer, ["ein Haus"], 128)  # [[pieces..., 3]]
    ```
    """
    import tensorflow as tf

    pieces = tokenizer.tokenize(texts)[:, : max_source_length - 1]
    eos = tf.fill([pieces.nrows(), 1], tf.constant(eos_id, pieces.dtype))
    ids = tf.concat([pieces, tf.RaggedTensor.from_tensor(eos)], axis=1)
    if ragged:
        return ids
    if length is None:
        return ids.to_tensor(default_value=PAD_ID)
    return ids.to_tensor(default_value=PAD_ID, shape=[None, length])


def _describe(what, count, boundaries, batch_sizes, source_lengths, target_lengths):
    shapes = ", ".join(
        f"[{b}, {s}]/[{b}, {t}]" for b, s, t in zip(batch_sizes, source_lengths, target_lengths)
    )
    print(
        f"{what}: {count} pairs in {len(boundaries)} length buckets, source/target batch "
        f"shapes {shapes}",
        file=sys.stderr,
        flush=True,
    )


def batch_examples(
    examples,
    data_config,
    training=True,
    *,
    tokens_per_batch=None,
    batch_multiple=1,
    description=None,
):
    """Token ids of pairs -> padded, length-bucketed batches: the one batching of the package.

    Both the in-memory `make_dataset` and the reader of prepared shards
    (`keras_transformer.data.prepared_dataset`) end here, so batches from either have the same
    shapes and conventions.

    Args:
        examples: a `tf.data.Dataset` of `(source_pieces, target_pieces)`, int32 vectors of
            SentencePiece ids without BOS/EOS (already shuffled and repeated for training).
        data_config: `DataConfig` (max_source_length, max_target_length, tokens_per_batch,
            bucket_boundaries, long_pairs).
        training: True drops incomplete batches (every batch of a bucket has the same shape)
            and, with `data.long_pairs: drop`, the pairs longer than the max lengths; False
            keeps every pair (truncated) and the last, smaller batch of each bucket.
        tokens_per_batch: overrides `data_config.tokens_per_batch`.
        batch_multiple: batch sizes are multiples of this (e.g. the number of replicas).
        description: print the buckets and batch shapes to stderr under this title (None: quiet).

    Returns:
        A dataset of `({"source_ids": [B, S], "target_ids": [B, T]}, labels [B, T])`, see
        `make_dataset`.

    Example:
    ```python
    ids = tf.data.Dataset.from_tensors((tf.constant([5, 6]), tf.constant([7])))
    batch_examples(ids.repeat(), config.data)
    ```
    """
    import tensorflow as tf

    max_source = data_config.max_source_length
    max_target = data_config.max_target_length
    budget = tokens_per_batch or data_config.tokens_per_batch
    boundaries = _resolve_boundaries(data_config)
    batch_sizes = bucket_batch_sizes(boundaries, budget, batch_multiple)
    source_lengths = [min(b, max_source) for b in boundaries]
    target_lengths = [min(b, max_target) for b in boundaries]
    if description:
        _describe(
            description[0], description[1], boundaries, batch_sizes, source_lengths, target_lengths
        )

    if training and getattr(data_config, "long_pairs", "drop") == "drop":
        # The paper's recipe: pairs that do not fit are left out rather than cut (a cut target
        # teaches the model to stop mid-sentence). Prepared shards hold none already.
        examples = examples.filter(
            lambda source, target, *links: tf.logical_and(
                tf.size(source) < max_source, tf.size(target) < max_target
            )
        )

    dataset = _with_bos_and_eos(examples, max_source, max_target)
    dataset = _bucketed(dataset, boundaries, batch_sizes, source_lengths, target_lengths, training)
    if training and len(boundaries) == 1:
        # One bucket: every batch has the same shape, so the element spec can say so too (what
        # TPUs and other fully static compilers want); several buckets vary by batch.
        b, s, t = batch_sizes[0], source_lengths[0], target_lengths[0]
        dataset = dataset.map(
            lambda source, target_ids, labels, *links: (
                tf.ensure_shape(source, [b, s]),
                tf.ensure_shape(target_ids, [b, t]),
                tf.ensure_shape(labels, [b, t]),
                *(tf.ensure_shape(x, [b, t, s]) for x in links),
            )
        )

    def to_inputs(source, target_ids, labels, *links):
        x = {"source_ids": source, "target_ids": target_ids}
        if links:  # prepared with data.train_alignments
            x["alignment"] = links[0]
        return x, labels

    dataset = dataset.map(to_inputs)
    return dataset.prefetch(tf.data.AUTOTUNE)


def _with_bos_and_eos(examples, max_source, max_target):
    """`(source, target)` pieces -> `(source + EOS, BOS + target, target + EOS)`, truncated to
    the max lengths; `(source, target, links)` -> the same and the links' matrix
    (`_link_matrix`)."""
    import tensorflow as tf

    eos = tf.constant([EOS_ID], tf.int32)
    bos = tf.constant([BOS_ID], tf.int32)

    def to_example(source, target, *links):
        source = tf.concat([source[: max_source - 1], eos], axis=0)
        target = target[: max_target - 1]
        out = source, tf.concat([bos, target], axis=0), tf.concat([target, eos], axis=0)
        if not links:
            return out
        return (*out, _link_matrix(links[0], tf.size(target), tf.size(source) - 1))

    return examples.map(to_example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _link_matrix(links, target_pieces, source_pieces):
    """float32 `[target_pieces + 1, source_pieces + 1]`: 1 where target piece t (a row of the
    labels) is linked to source piece s (a column of the source), of the piece links `links`
    int32 `[n, 2]` `(s, t)`; the links past a truncation are dropped, and the rows of EOS and
    the column of EOS stay 0."""
    import tensorflow as tf

    inside = tf.logical_and(links[:, 0] < source_pieces, links[:, 1] < target_pieces)
    kept = tf.boolean_mask(links, inside)
    return tf.scatter_nd(
        tf.reverse(kept, axis=[1]),
        tf.ones([tf.shape(kept)[0]], tf.float32),
        tf.stack([target_pieces + 1, source_pieces + 1]),
    )


def _bucketed(dataset, boundaries, batch_sizes, source_lengths, target_lengths, training):
    """Examples -> batches of one length bucket each, padded to the bucket's lengths (a
    complete batch only, when `training`)."""
    import tensorflow as tf

    with_links = len(dataset.element_spec) == 4  # with the links' matrices
    boundaries_t = tf.constant(boundaries, tf.int32)
    batch_sizes_t = tf.constant(batch_sizes, tf.int64)
    source_lengths_t = tf.constant(source_lengths, tf.int64)
    target_lengths_t = tf.constant(target_lengths, tf.int64)

    def bucket_of(source, target_ids, labels, *links):
        length = tf.maximum(tf.size(source), tf.size(target_ids))
        # The first boundary that fits; lengths are truncated so the last always fits.
        return tf.cast(tf.argmax(tf.cast(length <= boundaries_t, tf.int32)), tf.int64)

    def batch_bucket(bucket, window):
        source_length = tf.reshape(source_lengths_t[bucket], [1])
        target_length = tf.reshape(target_lengths_t[bucket], [1])
        shapes, values = (source_length, target_length, target_length), (PAD_ID, PAD_ID, PAD_ID)
        if with_links:  # the links' matrices, padded with zeros to [target, source]
            shapes += (tf.concat([target_length, source_length], axis=0),)
            values += (0.0,)
        return window.padded_batch(
            batch_sizes_t[bucket],
            padded_shapes=shapes,
            padding_values=values,
            drop_remainder=training,
        )

    return dataset.group_by_window(
        key_func=bucket_of,
        reduce_func=batch_bucket,
        window_size_func=lambda bucket: batch_sizes_t[bucket],
    )


def make_dataset(
    pairs,
    tokenizer,
    data_config,
    training=True,
    *,
    tokens_per_batch=None,
    batch_multiple=1,
    seed=None,
    verbose=True,
):
    """A `tf.data.Dataset` of padded, length-bucketed batches for `model.fit`, from pairs in
    memory (a few hundred thousand at most; `keras_transformer.data.prepare` and
    `prepared_dataset` stream corpora of any size from disk into the same batches).

    Args:
        pairs: list of `(source, target)` strings (from `read_pairs`).
        tokenizer: a `Tokenizer`.
        data_config: `keras_transformer.config.DataConfig` (max_source_length,
            max_target_length, long_pairs, tokens_per_batch, bucket_boundaries, shuffle_buffer,
            seed).
        training: True shuffles, repeats forever, drops incomplete batches (every batch of a
            bucket has the same shape) and, with `long_pairs: drop`, the overlong pairs; False
            keeps every example once (truncated), in bucket order, without shuffling (the last
            batch of a bucket may be smaller).
        tokens_per_batch: overrides `data_config.tokens_per_batch` (e.g. the global budget of
            all replicas, when a distribution strategy splits each batch).
        batch_multiple: batch sizes are multiples of this (e.g. the number of replicas, so each
            gets an equal share).
        seed: shuffle seed (default `data_config.seed`).
        verbose: print the buckets and batch sizes to stderr.

    Returns:
        A dataset of `({"source_ids": int32 [B, S], "target_ids": int32 [B, T]}, labels int32
        [B, T])` where source = pieces + [EOS] (truncated to `max_source_length`, EOS kept),
        target_ids = [BOS] + pieces and labels = pieces + [EOS] (truncated to
        `max_target_length`), padded with 0. For a bucket of length L, S = min(L,
        max_source_length), T = min(L, max_target_length) and B = tokens_per_batch // L
        (rounded down to `batch_multiple`).

    Example:
    ```python
    dataset = make_dataset(pairs, tokenizer, config.data)
    model.fit(dataset, steps_per_epoch=1000)
    ```
    """
    import numpy as np
    import tensorflow as tf

    if not pairs:
        raise DataError("cannot build a dataset from an empty corpus")
    sources = np.array([s for s, _ in pairs], dtype=object)
    targets = np.array([t for _, t in pairs], dtype=object)
    dataset = tf.data.Dataset.from_tensor_slices((sources, targets))
    # Tokenizing a thousand sentences per call is much faster than one at a time.
    dataset = dataset.batch(1024).map(
        lambda s, t: (tokenizer.tokenize(s), tokenizer.tokenize(t)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    dataset = dataset.unbatch()
    # Tokenize once: later epochs read the pieces from memory.
    dataset = dataset.cache()
    if training:
        seed = data_config.seed if seed is None else seed
        buffer = max(1, min(data_config.shuffle_buffer, len(pairs)))
        dataset = dataset.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
        dataset = dataset.repeat()
    return batch_examples(
        dataset,
        data_config,
        training,
        tokens_per_batch=tokens_per_batch,
        batch_multiple=batch_multiple,
        description=(
            ("training data" if training else "evaluation data", len(pairs)) if verbose else None
        ),
    )
