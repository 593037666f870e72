"""Pass 2 of `prepare`: the training pairs tokenized into TFRecord shards, and the manifest's
parts that measure them (counts, shards, token statistics).

Every record goes round robin into one of `num_shards_for(records)` shards
(`train-00000-of-00016.tfrecord` ...), so every shard is a uniform slice of the corpus; the
encoding is `encoding`'s, the processes that do it `workers`', the shards as they are written
and the progress that lets a stopped preparation continue `prepare_progress`'.
"""

import dataclasses
import hashlib
import math

from keras_transformer.data import alignments, prepare_progress, workers
from keras_transformer.data.encoding import (
    Chunk,
    ChunkEncoder,
    Encoding,
    bt_tag,
    record_dtype,
    terminology_entries,
    terminology_record,
)
from keras_transformer.data.manifest import data_settings
from keras_transformer.data.statistics import Progress, length_stats, log, merge
from keras_transformer.errors import DataError

# Shards: enough files for many workers to read different ones, each a few MB to a few hundred.
MIN_SHARDS = 16
MAX_SHARDS = 1024
PAIRS_PER_SHARD = 100_000


def num_shards_for(pairs):
    """Shards for `pairs` pairs: about one per 100,000 pairs, at least 16 (so that many workers
    can each read different files) and at most 1024; never more than the pairs."""
    shards = min(MAX_SHARDS, max(MIN_SHARDS, math.ceil(pairs / PAIRS_PER_SHARD)))
    return max(1, min(shards, pairs))


def write_shards(config, model_proto, directory, total, verbose, pool, root):
    """Pass 2: tokenize the stream and write the shards; returns the manifest's counts part.

    With `data.subword_samples` K > 0 the corpus is read K times and each reading writes one
    sampled segmentation of every pair (SentencePiece's `enable_sampling`, seeded by
    `data.seed`, the reading and the chunk); one reading after the other, so the copies of a
    pair lie a whole corpus apart in the stream.

    With `data.both_directions` every pair (source, target) is followed by a second record
    (BOS + target, source): the pair reversed, its source tagged with the BOS id, which no
    forward source contains (Johnson et al. 2017 tag the target language the same way; here
    only the reversed direction is tagged, so forward inputs stay as they are at inference).
    A pair is kept only when both of its records fit the max lengths (`long_pairs: drop`).

    The pairs are encoded in the processes of `pool` (`data.prepare_workers`), or here when
    it has none; the shards are the same bytes either way (see `workers.ShardJob`). On the local
    disk the segments a stopped preparation completed are kept (`prepare_progress`, in the
    workdir `root`): only the others are encoded.
    """
    d = config.data
    encoding = Encoding(
        model_proto, d.max_source_length - 1, d.max_target_length - 1, d.long_pairs == "drop",
        d.both_directions, d.subword_samples, d.subword_alpha, d.seed, threads=1,
        bt_tag=bt_tag(model_proto, d.train),
        terminology=terminology_entries(model_proto, d.terminology),
        terminology_fraction=d.terminology_fraction,
        alignments=d.train_alignments,
    )  # fmt: skip
    if d.train_alignments:
        alignments.check_corpus(d.train)
    readings = max(1, d.subword_samples)
    num_shards = num_shards_for(max(total, 1) * readings)
    names = [f"train-{i:05d}-of-{num_shards:05d}.tfrecord" for i in range(num_shards)]
    chunk, segment = workers.segment_sizes()
    per_reading = math.ceil(max(total, 1) / segment)
    key = {
        "settings": data_settings(d),
        "vocabulary": hashlib.sha256(model_proto).hexdigest(),
        "pairs": total,
        "readings": readings,
        "shards": num_shards,
        "chunk": chunk,
        "segment": segment,
    }
    shards = prepare_progress.Shards(directory, names, root, key, (Chunk, merge))
    segments = readings * per_reading
    if shards.kept:
        log(
            f"continuing the shards of a stopped preparation: {shards.kept} of {segments} "
            f"segments kept ({shards.offset:,} records), encoding the others",
            verbose,
        )
    job = workers.ShardJob(encoding, d.train, readings, per_reading, num_shards, chunk, segment)
    job = dataclasses.replace(job, start=shards.kept)
    what = "records written" if d.subword_samples else "pairs written"
    progress = Progress(total * readings if total else None, verbose, what)
    pool.start(total, readings)
    try:
        written = workers.write_segments(pool, job, shards, progress)
    finally:
        shards.close()
    if shards.kept:
        encoded = sum(part.encoded for part in written)
        log(f"  {encoded} segments encoded, {shards.kept} kept from the stopped one", verbose)
    manifest = _shards_manifest(config, shards, written, progress)
    manifest["record_dtype"] = record_dtype(ChunkEncoder(encoding).processor.get_piece_size())
    return manifest


def _shards_manifest(config, shards, written, progress):
    """The manifest's parts that pass 2 measured (`written`: the `_Written` of each process;
    the counts: those of every segment in the shards, kept ones included)."""
    d, counter, total = config.data, written[0].counter, shards.total
    records = shards.offset
    progress.update(min(part.lines for part in written), records, force=True)
    if not total.written:
        raise DataError(f"{d.train}: no pair left to train on ({counter.lines} lines read)")
    skipped = counter.skipped_by_reason()
    skipped["too_long"] = total.too_long
    shards = shards.manifest()
    manifest = {
        "counts": {
            "lines": counter.lines,
            "written": total.written,
            "skipped": skipped,
            "truncated": total.truncated,
            # Records in the shards: `written` times the segmentations times the directions. (A
            # sample longer than the max lengths is replaced by the pair's best segmentation.)
            "segmentations": max(1, d.subword_samples),
            "directions": 2 if d.both_directions else 1,
            "records": records,
        },
        "shards": shards,
        "tokens": {
            # Over all records (every segmentation), with EOS.
            "source": total.source_tokens,
            "target": total.target_tokens,
            "source_length": length_stats(total.source_hist),
            "target_length": length_stats(total.target_hist),
            # Pairs per length of their longer side (EOS included): for choosing buckets.
            "longer_side_histogram": {str(k): v for k, v in sorted(total.longer_hist.items())},
        },
    }
    if d.terminology:  # what inference needs to know: the model reads glossary annotations
        manifest["terminology"] = terminology_record(d, total.annotated)
    if d.train_alignments:  # the records hold piece links (`encoding`)
        manifest["alignments"] = alignments.record(d.train_alignments)
    return manifest
