"""Reading prepared shards (the writer is `data.prepare`): the pairs as a deterministic tf.data
stream (`prepared_examples`) and the padded, length-bucketed batches of `model.fit`
(`prepared_dataset`, through the pipeline's one batching, `pipeline.batch_examples`).

Records are the raw little-endian integers `[len(source), *source, *target]` (uint16 or int32,
as the manifest's `record_dtype` says): one `tf.io.decode_raw` each.
"""

import os

from keras_transformer.data.alignments import has_links
from keras_transformer.data.manifest import read_manifest
from keras_transformer.data.pipeline import batch_examples
from keras_transformer.errors import DataError


def prepared_examples(
    directory,
    training=True,
    *,
    seed=1234,
    shuffle_buffer=10000,
    input_context=None,
    auto_shard_policy=None,
):
    """The pairs of a prepared directory as a dataset of `(source_pieces, target_pieces)` int32
    vectors (no BOS/EOS): the input of `pipeline.batch_examples`.

    Deterministic: for a given seed (and input context) the dataset yields the same elements in
    the same order every time it is built or iterated (each epoch's order is a function of the
    seed and the epoch alone), so `dataset.skip(n)` finds a stream position again.

    Args:
        directory: `WORKDIR/prepared`.
        training: True shuffles the files (seeded, anew each epoch), interleaves them in
            parallel, shuffles examples in a buffer of `shuffle_buffer` and repeats forever;
            False reads each pair once, the files in order.
        seed: seed of both shuffles.
        shuffle_buffer: examples in the shuffle buffer (memory: this many pairs).
        input_context: a `tf.distribute.InputContext`: this pipeline reads only its own files
            (every `num_input_pipelines`-th one from `input_pipeline_id`). Without one, the
            dataset's auto-shard policy is FILE, so a multi-worker strategy distributing it gives
            each worker its own files.
        auto_shard_policy: another `tf.data.experimental.AutoShardPolicy` to set instead (for
            datasets built on these examples that file sharding cannot see through).

    Returns:
        A `tf.data.Dataset`.
    """
    import tensorflow as tf

    manifest = read_manifest(directory)
    if manifest is None:
        raise DataError(f"no prepared data in {directory} (run keras-transformer prepare)")
    files = [os.path.join(directory, shard["file"]) for shard in manifest["shards"]]
    dtype = tf.uint16 if manifest["record_dtype"] == "uint16" else tf.int32
    links = has_links(manifest)  # data.train_alignments: a third component, the piece links
    dataset = tf.data.Dataset.from_tensor_slices(files)
    if input_context is not None and input_context.num_input_pipelines > 1:
        if len(files) < input_context.num_input_pipelines:
            raise DataError(
                f"{directory} has {len(files)} shards for {input_context.num_input_pipelines} "
                "input pipelines; prepare again with more data or use fewer workers"
            )
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if training:
        files_dataset, first_seed = dataset, tf.constant(seed, tf.int64)

        def epoch(index):
            # Each epoch's order depends on the seed and the epoch's index alone: iterators of
            # one dataset share no shuffle state (Keras iterates a distributed dataset twice,
            # and a shared reshuffling seed would make the orders depend on timing). The
            # function's own graph seed is fixed: not the global seed (train.seed), which
            # TensorFlow cannot pair with a tensor op seed when it is 0.
            tf.compat.v1.get_default_graph().seed = _EPOCH_GRAPH_SEED
            epoch_seed = first_seed + 2 * index
            order = files_dataset.shuffle(
                len(files), seed=epoch_seed, reshuffle_each_iteration=False
            )
            return _read_records(order, len(files), dtype, links).shuffle(
                max(1, shuffle_buffer), seed=epoch_seed + 1, reshuffle_each_iteration=False
            )

        # Endless: a new order every epoch.
        dataset = tf.data.Dataset.range(1 << 62).flat_map(epoch)
    else:
        dataset = _read_records(dataset, len(files), dtype, links)
    options = tf.data.Options()
    options.deterministic = True
    # The epochs' shuffles hold a seed resource without state (DummySeedGenerator, as with any
    # reshuffle_each_iteration=False) that iterator checkpointing would refuse as "stateful":
    # nothing of it needs saving (see `ResumeState`).
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    policy = tf.data.experimental.AutoShardPolicy
    if input_context is not None:
        auto_shard_policy = policy.OFF  # sharded by hand above
    options.experimental_distribute.auto_shard_policy = auto_shard_policy or policy.FILE
    return dataset.with_options(options)


# The graph-level seed of the epochs' shuffles (their op seeds are data.seed and the epoch).
_EPOCH_GRAPH_SEED = 87654321


def _read_records(files, count, dtype, links=False):
    """`(source_pieces, target_pieces)` of the records of a dataset of `count` shard paths
    (`links`: and their piece links int32 `[n, 2]`, `(source piece, target piece)` each)."""
    import tensorflow as tf

    dataset = files.interleave(
        lambda path: tf.data.TFRecordDataset(path, buffer_size=1 << 20),
        cycle_length=min(count, 16),
        block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )

    def decode(record):
        values = tf.cast(tf.io.decode_raw(record, dtype, little_endian=True), tf.int32)
        if links:
            s, t = values[0], values[1]
            pairs = tf.reshape(values[2 + s + t :], [-1, 2])
            return values[2 : 2 + s], values[2 + s : 2 + s + t], pairs
        length = values[0]
        return values[1 : 1 + length], values[1 + length :]

    return dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def prepared_dataset(
    directory,
    data_config,
    training=True,
    *,
    tokens_per_batch=None,
    batch_multiple=1,
    seed=None,
    input_context=None,
    verbose=True,
):
    """Padded, length-bucketed batches streamed from prepared shards, for `model.fit`.

    The same batches as `make_dataset` (one batching implementation: `batch_examples`): fixed
    bucket shapes, a token budget per batch, BOS/EOS added here. Deterministic for a given seed:
    building it again yields the same batches in the same order (see `prepared_examples`).

    Args:
        directory: `WORKDIR/prepared` (from `prepare`).
        data_config: `DataConfig` (lengths, buckets, tokens_per_batch, shuffle_buffer, seed).
        training: shuffle, repeat and drop incomplete batches (see `batch_examples`).
        tokens_per_batch: overrides `data_config.tokens_per_batch` (e.g. the global budget).
        batch_multiple: batch sizes are multiples of this (the number of replicas).
        seed: shuffle seed (default `data_config.seed`).
        input_context: a `tf.distribute.InputContext` to read only this pipeline's files (then
            batches are per replica: give the per-replica `tokens_per_batch`). Without one, a
            multi-worker strategy shards the batches between workers (auto-shard policy DATA).
        verbose: print the buckets and batch shapes.

    Returns:
        A dataset of `({"source_ids": [B, S], "target_ids": [B, T]}, labels [B, T])`.

    Example:
    ```python
    manifest = prepare(config)
    dataset = prepared_dataset(Workdir.of(config).prepared, config.data)
    model.fit(dataset, steps_per_epoch=1000)
    ```
    """
    manifest = read_manifest(directory)
    if manifest is None:
        raise DataError(f"no prepared data in {directory} (run keras-transformer prepare)")
    import tensorflow as tf

    # tf.distribute's file-level sharding cannot see through the bucketing (its windows are
    # datasets made inside a function) and fails; a dataset handed to a multi-worker strategy
    # as a whole is sharded by batches instead (every worker reads all files). For files per
    # worker, build it per worker with an input context, as `train()` does through
    # `strategy.distribute_datasets_from_function`.
    examples = prepared_examples(
        directory,
        training,
        seed=data_config.seed if seed is None else seed,
        shuffle_buffer=data_config.shuffle_buffer,
        input_context=input_context,
        auto_shard_policy=tf.data.experimental.AutoShardPolicy.DATA,
    )
    title = "training data (prepared)" if training else "evaluation data (prepared)"
    return batch_examples(
        examples,
        data_config,
        training,
        tokens_per_batch=tokens_per_batch,
        batch_multiple=batch_multiple,
        description=(title, manifest["counts"]["written"]) if verbose else None,
    )
