"""Prepared shards read without TensorFlow: a plain-Python TFRecord reader and numpy batches
with the pipeline's conventions, for the JAX engine (`training.engines.jax_engine`) on machines
where TensorFlow is not installed.

The batches follow `pipeline.batch_examples`: sources `pieces + [EOS]`, decoder inputs
`[BOS] + pieces`, labels `pieces + [EOS]`, one length bucket per batch padded to the bucket's
lengths (`data.bucket_boundaries`), `tokens_per_batch // length` rows (a multiple of
`batch_multiple`), pairs longer than the max lengths dropped. The order is numpy's, not
tf.data's: each epoch is a seeded permutation of all pairs (a function of the seed and the
epoch alone), so `numpy_batches(..., start=n)` finds a stream position again.
"""

import bisect
import os
import struct

import numpy as np

from keras_transformer import local_files
from keras_transformer.data.alignments import has_links
from keras_transformer.data.manifest import read_manifest
from keras_transformer.data.pipeline import _resolve_boundaries, bucket_batch_sizes
from keras_transformer.data.tokenizer import BOS_ID, EOS_ID
from keras_transformer.errors import DataError


def read_tfrecords(path):
    """The records (bytes) of the TFRecord file at `path` (any filesystem `tf.io.gfile` reads;
    local files where TensorFlow is not installed): each is a little-endian uint64 length, its
    masked CRC32C, the data and the data's masked CRC32C (the checksums are not checked here:
    `prepare`'s manifest records each shard's sha256). The file is read whole, in one call."""
    with local_files.gfile().GFile(path, "rb") as f:
        content = f.read()
    offset, end = 0, len(content)
    while offset < end:
        if end - offset < 12:
            raise DataError(f"{path}: truncated TFRecord header")
        (length,) = struct.unpack_from("<Q", content, offset)
        start = offset + 12
        offset = start + length + 4
        if offset > end:
            raise DataError(f"{path}: truncated TFRecord")
        yield content[start : start + length]


def prepared_pairs(directory):
    """`[(source_pieces, target_pieces)]` (int32 arrays, no BOS/EOS) of a prepared directory,
    the shards in the manifest's order; prepared with `data.train_alignments`, `[(source_pieces,
    target_pieces, links)]`, `links` int32 `[n, 2]` `(source piece, target piece)` each."""
    manifest = read_manifest(directory)
    if manifest is None:
        raise DataError(f"no prepared data in {directory} (run keras-transformer prepare)")
    dtype = np.dtype("<u2") if manifest["record_dtype"] == "uint16" else np.dtype("<i4")
    links = has_links(manifest)
    pairs = []
    for shard in manifest["shards"]:
        for record in read_tfrecords(os.path.join(directory, shard["file"])):
            values = np.frombuffer(record, dtype).astype(np.int32)
            if links:
                s, t = int(values[0]), int(values[1])
                pieces = values[2 + s + t :].reshape(-1, 2)
                pairs.append((values[2 : 2 + s], values[2 + s : 2 + s + t], pieces))
                continue
            length = int(values[0])
            pairs.append((values[1 : 1 + length], values[1 + length :]))
    return pairs


def numpy_batches(pairs, data_config, *, seed, tokens_per_batch=None, batch_multiple=1, start=0):
    """Endless training batches `({"source_ids", "target_ids"}, labels)` of int32 arrays from
    `pairs`, from batch `start` on (the batches before it are made and skipped: cheap)."""
    boundaries = _resolve_boundaries(data_config)
    budget = tokens_per_batch or data_config.tokens_per_batch
    sizes = bucket_batch_sizes(boundaries, budget, batch_multiple)
    max_source, max_target = data_config.max_source_length, data_config.max_target_length
    kept = [
        pair for pair in pairs if len(pair[0]) < max_source and len(pair[1]) < max_target
    ] if data_config.long_pairs == "drop" else pairs  # fmt: skip
    if not kept:
        raise DataError("no training pair fits data.max_source_length/max_target_length")
    count, epoch = 0, 0
    while True:
        order = np.random.default_rng([seed, epoch]).permutation(len(kept))
        buckets = [[] for _ in boundaries]
        for index in order:
            source, target, *links = kept[index]
            source = list(source[: max_source - 1]) + [EOS_ID]
            target = list(target[: max_target - 1])
            longest = max(len(source), len(target) + 1)
            bucket = min(bisect.bisect_left(boundaries, longest), len(boundaries) - 1)
            buckets[bucket].append((source, target, *links))
            if len(buckets[bucket]) == sizes[bucket]:
                if count >= start:
                    yield _padded(buckets[bucket], boundaries[bucket], max_source, max_target)
                count += 1
                buckets[bucket] = []
        epoch += 1


def _padded(rows, boundary, max_source, max_target):
    source_length, target_length = min(boundary, max_source), min(boundary, max_target)
    sources = np.zeros((len(rows), source_length), np.int32)
    inputs = np.zeros((len(rows), target_length), np.int32)
    labels = np.zeros((len(rows), target_length), np.int32)
    matrices = None
    if rows and len(rows[0]) == 3:  # prepared with data.train_alignments: the links' matrices
        matrices = np.zeros((len(rows), target_length, source_length), np.float32)
    for i, (source, target, *links) in enumerate(rows):
        sources[i, : len(source)] = source
        inputs[i, : len(target) + 1] = [BOS_ID, *target]
        labels[i, : len(target) + 1] = [*target, EOS_ID]
        if matrices is not None:  # as `pipeline._link_matrix`: the links past a cut dropped
            s, t = links[0][:, 0], links[0][:, 1]
            inside = (s < len(source) - 1) & (t < len(target))
            matrices[i, t[inside], s[inside]] = 1.0
    x = {"source_ids": sources, "target_ids": inputs}
    if matrices is not None:
        x["alignment"] = matrices
    return x, labels
