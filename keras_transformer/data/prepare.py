"""Prepared data: a training corpus streamed once into sharded, tokenized examples on disk.

`prepare(config)` is the paper-scale path (like fairseq-preprocess or tensor2tensor's datagen):
it reads the training corpus as a stream, trains the shared SentencePiece vocabulary on a bounded,
seeded random sample of its sentences (reservoir sampling: at most `data.spm_max_sentences`
sentences are ever held), then tokenizes every pair and writes the ids to TFRecord shards with a
manifest. Memory does not grow with the corpus; training then streams the shards with tf.data
(`data.prepared.prepared_dataset`, the reader), each worker of a multi-worker job reading its
own files.

```
WORKDIR/
  spm.model                   the vocabulary (a copy of prepared/spm.model, where export reads it)
  prepared/
    manifest.json             written last: the completion marker (see below)
    spm.model                 the vocabulary the shards were tokenized with
    train-00000-of-00016.tfrecord ...
```

Atomicity: on the local disk everything of one preparation is written into a sibling
directory (`WORKDIR/prepared.partial`) that is renamed to `WORKDIR/prepared` in one step once
complete; on other filesystems (`gs://...`: no atomic directory rename) the files are written
into `WORKDIR/prepared` itself, `manifest.json` last. Either way a preparation killed midway
leaves no `prepared/manifest.json` and is never taken as done. Stopped (SIGTERM) or killed, it
goes on where it was: a trained vocabulary is kept (`kept_vocabulary`), and on the local disk
so are the segments of the shards that were complete (`prepare_progress`: the next run cuts the
shards back to them, encodes only the rest, and writes the same bytes as an uninterrupted run);
elsewhere the shards are written again. Every path goes through `tf.io.gfile` (any TensorFlow
filesystem).
`WORKDIR/spm.model` is installed after the rename; a
kill between the two is repaired by `check_prepared`, which restores it from `prepared/spm.model`
and refuses a `spm.model` whose sha256 differs from the manifest's.

Records: one per pair, the raw little-endian integers `[len(source), *source, *target]`
(uint16 when the vocabulary has at most 65,536 pieces, else int32): SentencePiece ids without
BOS/EOS, which the pipeline adds. Reading them is one `tf.io.decode_raw`, several times cheaper
than parsing `tf.train.Example` protos, and half the disk with uint16.

Overlong pairs (`data.long_pairs`): `drop` (the default, the paper's recipe of filtering by
length) leaves out the pairs whose source or target, with EOS, is longer than
`data.max_source_length` / `data.max_target_length` and counts them as `too_long`; `truncate`
keeps them whole in the shards (the pipeline cuts them, EOS kept) and counts them as `truncated`.

Parallel: `data.prepare_workers` N (default: the machine's cores) is the CPUs `prepare` uses. The
vocabulary trains on N CPUs (with SentencePiece threads as many as the machine's cores whatever N:
their number changes the vocabulary, the CPUs they run on do not), then N processes each read the
corpus, encode their share of it (segments of 65,536 pairs, every Nth) into local files, and this
process appends those to the shards in the corpus's order as they come, with their sha256: the
shards are byte-identical whatever N (see `_ShardJob`). (Except the sampled segmentations of
`data.subword_samples`: SentencePiece seeds them, per chunk here, but its samples still differ
from one process to the next, so those vary between preparations whatever the number of
workers.)
"""

import collections
import dataclasses
import hashlib
import json
import math
import os
import random
import sys
import time
from array import array
from typing import Optional

from keras_transformer import stopping
from keras_transformer.data import corpora, kept_vocabulary, prepare_progress
from keras_transformer.data.tokenizer import copy_model
from keras_transformer.errors import DataError, Preempted
from keras_transformer.integrity import file_digest, file_problem
from keras_transformer.workdir import (
    Workdir,
    is_local,
    local_directory,
    read_text,
    remove_tree,
    write_atomically,
)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
VOCABULARY = "spm.model"
# Shards: enough files for many workers to read different ones, each a few MB to a few hundred.
MIN_SHARDS = 16
MAX_SHARDS = 1024
PAIRS_PER_SHARD = 100_000
# Pairs tokenized per sentencepiece call (its C++ threads split each call).
_CHUNK = 4096
# Words whose pieces are remembered (about 200 bytes each): bounded, whatever the corpus size.
_WORD_CACHE_SIZE = 500_000
# Pairs of the first chunks also encoded whole, to check that words encode independently.
_CHECKED_PAIRS = 2 * _CHUNK
# Seconds between progress lines.
_PROGRESS_SECONDS = 10.0
# What `stopping.check` names, and what a preparation stopped during its shards keeps.
_PHASE = "prepare (writing the shards)"
_SAMPLING = "prepare (sampling sentences for the vocabulary)"
_KEPT = "the trained vocabulary is kept"
# A stored side is cut at this many pieces (the uint16 length header; far beyond any max length).
_MAX_STORED = 65_535


def _log(message, verbose):
    if verbose:
        print(message, file=sys.stderr, flush=True)


def _gfile():
    from keras_transformer import local_files

    return local_files.gfile()  # tf.io.gfile, or the local disk where TensorFlow is absent


def _settings(data_config):
    """What the prepared data depends on, as the manifest records it (config key -> value)."""
    d = data_config
    settings = {
        "data.train": d.train,
        "data.vocab_size": d.vocab_size,
        "data.spm_model_type": d.spm_model_type,
        "data.spm_character_coverage": d.spm_character_coverage,
        "data.spm_max_sentences": d.spm_max_sentences,
        "data.seed": d.seed,
        "data.long_pairs": d.long_pairs,
    }
    if d.subword_samples:  # recorded only when on: workdirs prepared before it still match
        settings["data.subword_samples"] = d.subword_samples
        settings["data.subword_alpha"] = d.subword_alpha
    if d.both_directions:  # likewise
        settings["data.both_directions"] = True
    if d.long_pairs == "drop":  # truncated pairs are stored whole: lengths do not matter then
        settings["data.max_source_length"] = d.max_source_length
        settings["data.max_target_length"] = d.max_target_length
    return settings


# Settings that shaped the vocabulary: changing one needs a new spm.model too.
_VOCABULARY_KEYS = (
    "data.train",
    "data.vocab_size",
    "data.spm_model_type",
    "data.spm_character_coverage",
    "data.spm_max_sentences",
    "data.seed",
)


def read_manifest(directory):
    """The manifest of a prepared directory, or None when it holds no complete preparation.

    Args:
        directory: `WORKDIR/prepared` (`Workdir(root).prepared`).

    Returns:
        The manifest dict, or None when `directory/manifest.json` does not exist (nothing
        prepared, or a preparation that did not finish: the manifest is its last file).
    """
    path = os.path.join(directory, MANIFEST)
    if not _gfile().exists(path):
        return None
    try:
        return json.loads(read_text(path))
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {path}: {e}; delete {directory} to prepare again") from None


def check_prepared(config, manifest=None, repair=True):
    """Checks that the workdir's prepared data matches `config`; returns its manifest.

    Args:
        config: an `ExperimentConfig`.
        manifest: the manifest if already read (default: read `WORKDIR/prepared/manifest.json`).
        repair: restore a missing `WORKDIR/spm.model` from `WORKDIR/prepared/spm.model` (a
            preparation killed after its rename); False for processes that must not write.

    Returns:
        The manifest dict, or None when the workdir holds no complete preparation.

    Raises:
        DataError: the prepared data was made with other settings (another corpus, vocabulary
            size, ...) or another vocabulary; the one-line message names the difference and says
            what to delete to start over.

    Example:
    ```python
    manifest = check_prepared(config)
    manifest["counts"]["written"]
    ```
    """
    layout = Workdir.of(config)
    manifest = manifest if manifest is not None else read_manifest(layout.prepared)
    if manifest is None:
        return None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DataError(
            f"{layout.prepared} has format version {manifest.get('format_version')}, this "
            f"version reads {FORMAT_VERSION}; delete {layout.prepared} or use another --workdir"
        )
    recorded, wanted = manifest.get("settings", {}), _settings(config.data)
    for key in list(wanted) + sorted(set(recorded) - set(wanted)):
        if recorded.get(key) != wanted.get(key):
            delete = layout.prepared
            if key in _VOCABULARY_KEYS:
                delete = f"{layout.prepared} and {layout.spm}"
            raise DataError(
                f"{key} differs from the prepared data in {layout.prepared}: prepared with "
                f"{recorded.get(key)!r}, the config says {wanted.get(key)!r}; delete {delete} "
                "to prepare again, or use another --workdir"
            )
    sha256 = manifest["vocabulary"]["sha256"]
    if not _gfile().exists(layout.spm):
        if repair:
            copy_model(os.path.join(layout.prepared, VOCABULARY), layout.spm)
    elif file_digest(layout.spm)[1] != sha256:
        raise DataError(
            f"{layout.spm} differs from the vocabulary the data in {layout.prepared} was "
            f"tokenized with (sha256 {sha256[:12]}...); delete {layout.prepared} and "
            f"{layout.spm} to prepare again, or use another --workdir"
        )
    verify_shards(layout.prepared, manifest)
    return manifest


def verify_shards(directory, manifest):
    """Checks every shard of a prepared directory against the manifest: the size always, the
    sha256 where the manifest has one (preparations from before checksums have sizes only).

    Reading the shards costs about a second per GB (once, at the start of `train`); it stops a
    truncated or changed shard before training instead of a crash mid-run (TFRecord's CRC) or
    silently missing examples.

    Raises:
        DataError: one line naming the shard, what is wrong and what to run.
    """
    for shard in manifest.get("shards", []):
        path = os.path.join(directory, shard["file"])
        problem = file_problem(path, shard.get("bytes"), shard.get("sha256"))
        if problem:
            raise DataError(
                f"prepared shard {path} is corrupted ({problem}, see {MANIFEST}): delete "
                f"{directory} and run keras-transformer prepare (or train) again"
            )


def _reservoir_sample(sentences, size, seed):
    """A uniform random sample of `size` items of an iterable of unknown length, holding no more
    than `size` of them (Vitter's algorithm R); all items, in order, when there are fewer."""
    rng = random.Random(seed)
    sample = []
    for seen, sentence in enumerate(sentences):
        if seen < size:
            sample.append(sentence)
        else:
            j = rng.randrange(seen + 1)
            if j < size:
                sample[j] = sentence
    return sample


def _sentences(spec, counter, progress):
    for source, target in corpora.iter_training_pairs(spec, counter, verbose=False):
        yield source.removeprefix(corpora.TAG_PREFIX)  # the sample holds real sentences
        yield target
        if counter.kept % 4096 == 0:
            progress.update(counter.lines, 0)
            stopping.check(_SAMPLING)


def _known_size(train):
    """Pairs `data.train` yields when known without reading it (synthetic, tfds metadata; each
    corpus times its copies), else None."""
    total = 0
    for spec, copies, _ in corpora.training_specs(train):
        size = _spec_size(spec)
        if size is None:
            return None
        total += size * copies
    return total


def _spec_size(spec):
    kind, rest = corpora.parse_spec(spec)
    if kind == "synthetic":
        from keras_transformer.data import synthetic

        return synthetic.spec_size(rest, spec)
    if kind == "tfds":
        return corpora.tfds_size(spec)
    return None


def num_shards_for(pairs):
    """Shards for `pairs` pairs: about one per 100,000 pairs, at least 16 (so that many workers
    can each read different files) and at most 1024; never more than the pairs."""
    shards = min(MAX_SHARDS, max(MIN_SHARDS, math.ceil(pairs / PAIRS_PER_SHARD)))
    return max(1, min(shards, pairs))


class _Progress:
    """Prints lines/s, pairs written and an ETA every few seconds."""

    def __init__(self, total, verbose, what="pairs written"):
        self.total, self.verbose, self.what = total, verbose, what
        self.start = self.last = time.time()

    def update(self, lines, written, force=False):
        now = time.time()
        if not self.verbose or (not force and now - self.last < _PROGRESS_SECONDS):
            return
        self.last = now
        rate = lines / max(now - self.start, 1e-9)
        line = f"  {lines:,} lines, {rate:,.0f} lines/s"
        if written:
            line += f", {written:,} {self.what}"
        elif not self.what.endswith(" written"):
            line += f" ({self.what})"
        if self.total:
            eta = max(0.0, (self.total - lines) / max(rate, 1e-9))
            line += f", {100 * lines / self.total:.0f}%, ETA {eta / 60:.1f} min"
        _log(line, self.verbose)


def _length_stats(histogram):
    """Mean and percentiles of a histogram {length: count}."""
    total = sum(histogram.values())
    if not total:
        return {"mean": 0, "p50": 0, "p90": 0, "p99": 0, "max": 0}
    stats = {"mean": round(sum(k * v for k, v in histogram.items()) / total, 2)}
    cumulative, marks = 0, {"p50": 0.5, "p90": 0.9, "p99": 0.99}
    for length in sorted(histogram):
        cumulative += histogram[length]
        for name, share in list(marks.items()):
            if cumulative >= share * total:
                stats[name] = length
                del marks[name]
    stats["max"] = max(histogram)
    return stats


class _WordCachedEncoder:
    """SentencePiece encoding with a cache of the pieces of each space-separated word.

    SentencePiece pieces never span a space (`split_by_whitespace`, the default, with which
    `train_sentencepiece` trains): a sentence's ids are the concatenation of its words' ids, so
    each distinct word is encoded once instead of at every occurrence: several times faster on
    natural text, whose words follow Zipf's law. The first pairs are also encoded whole and
    compared; any difference (a vocabulary trained otherwise) turns the cache off.
    """

    def __init__(self, processor, threads):
        self.processor, self.threads = processor, threads
        self.cache, self.enabled, self.checked = {}, True, 0

    def _encode_words(self, sentences):
        cache = self.cache
        missing = {w for sentence in sentences for w in sentence.split(" ") if w not in cache}
        missing.discard("")
        if missing:
            words = list(missing)
            ids = self.processor.encode(words, num_threads=self.threads)
            found = dict(zip(words, ids))
            for word in words[: max(0, _WORD_CACHE_SIZE - len(cache))]:
                cache[word] = found[word]
        else:
            found = {}
        encoded = []
        for sentence in sentences:
            pieces = []
            for word in sentence.split(" "):
                if word:
                    ids = cache.get(word)
                    pieces.extend(found[word] if ids is None else ids)
            encoded.append(pieces)
        return encoded

    def encode(self, sentences):
        if not self.enabled:
            return self.processor.encode(sentences, num_threads=self.threads)
        encoded = self._encode_words(sentences)
        if self.checked < 2 * _CHECKED_PAIRS:
            self.checked += len(sentences)
            if encoded != self.processor.encode(sentences, num_threads=self.threads):
                self.enabled = False
                return self.processor.encode(sentences, num_threads=self.threads)
        return encoded


@dataclasses.dataclass(frozen=True)
class _Encoding:
    """What turning a chunk of pairs into records needs (sent to the worker processes)."""

    model_proto: bytes
    limit_source: int  # longest stored source without EOS
    limit_target: int
    drop: bool  # data.long_pairs == "drop"
    both_directions: bool
    subword_samples: int
    subword_alpha: float
    seed: int
    threads: int  # sentencepiece threads per encode call
    bt_tag: Optional[int] = None  # the id of corpora.TAG when data.train has bt: corpora


@dataclasses.dataclass
class _Chunk:
    """The records of one chunk of pairs and what the manifest counts of them."""

    reading: int = 0  # the pass over the corpus (data.subword_samples)
    records: list = dataclasses.field(default_factory=list)  # bytes, in the corpus's order
    too_long: int = 0
    truncated: int = 0
    written: int = 0
    source_tokens: int = 0
    target_tokens: int = 0
    source_hist: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    target_hist: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    longer_hist: collections.Counter = dataclasses.field(default_factory=collections.Counter)


class _ChunkEncoder:
    """Pairs -> packed records (see the module docstring), the same in any process: the encoding
    of a chunk depends on the chunk alone (sampling is seeded by the reading and chunk index)."""

    def __init__(self, encoding):
        import sentencepiece as spm

        self.e = encoding
        self.processor = spm.SentencePieceProcessor(model_proto=encoding.model_proto)
        self.typecode = "H" if self.processor.get_piece_size() <= 65_536 else "i"
        self.cached = _WordCachedEncoder(self.processor, threads=encoding.threads)
        self.tag = [self.processor.bos_id()]

    def _encode(self, sentences, seed):
        if not self.e.subword_samples:
            return self.cached.encode(sentences)
        import sentencepiece as spm

        spm.set_random_generator_seed(seed)
        return self.processor.encode(
            sentences, enable_sampling=True, alpha=self.e.subword_alpha, nbest_size=-1,
            num_threads=1,
        )  # fmt: skip

    def _too_long(self, source, target):
        e = self.e
        if len(source) > e.limit_source or len(target) > e.limit_target:
            return True
        # The reversed record: the tag and the target as its source, the source as its target.
        return e.both_directions and (
            len(target) + 1 > e.limit_source or len(source) > e.limit_target
        )

    def _add(self, out, source, target):
        source, target = source[:_MAX_STORED], target[:_MAX_STORED]
        record = array(self.typecode, [len(source)])
        record.extend(source)
        record.extend(target)
        if sys.byteorder == "big":
            record.byteswap()
        out.records.append(record.tobytes())
        n_source, n_target = len(source) + 1, len(target) + 1  # with EOS, as the model sees
        out.source_tokens += n_source
        out.target_tokens += n_target
        out.source_hist[n_source] += 1
        out.target_hist[n_target] += 1
        out.longer_hist[max(n_source, n_target)] += 1  # the length that picks the bucket

    def _untag(self, pairs):
        """`(pairs, tags)`: the pairs without the text tag of `bt:` corpora, and the ids that
        lead each source (`[bt_tag]` or none)."""
        if self.e.bt_tag is None:
            return pairs, [[]] * len(pairs)
        prefix = corpora.TAG_PREFIX
        tags = [[self.e.bt_tag] if s.startswith(prefix) else [] for s, _ in pairs]
        return [(s.removeprefix(prefix), t) for s, t in pairs], tags

    def __call__(self, reading, index, pairs):
        seed = (self.e.seed * 1_000_003 + reading) * 1_000_003 + 2 * index
        pairs, tags = self._untag(pairs)
        sources = self._encode([s for s, _ in pairs], seed % (1 << 31))
        targets = self._encode([t for _, t in pairs], (seed + 1) % (1 << 31))
        out = _Chunk(reading)
        for pair, tag, source, target in zip(pairs, tags, sources, targets):
            if self.e.subword_samples and self._too_long(tag + source, target):
                # A sample longer than the limits: the best segmentation instead, so that a pair
                # is kept or dropped whatever its samples.
                source, target = self.processor.encode(list(pair))
            if self._too_long(tag + source, target):
                if self.e.drop:
                    out.too_long += 1
                    continue
                out.truncated += 1
            self._add(out, tag + source, target)  # truncated pairs are stored whole
            if self.e.both_directions:
                self._add(out, self.tag + target, source)
            out.written += 1
        return out


# Pairs per segment, in chunks: the unit of work a worker process encodes and hands back.
_SEGMENT_CHUNKS = 16
# Segments a worker process must have at least to be started (smaller corpora: one process).
_SEGMENTS_PER_WORKER = 4


@dataclasses.dataclass(frozen=True)
class _ShardJob:
    """What one process of pass 2 needs (sent to the worker processes).

    The record stream (every reading of the corpus, one after the other; the pairs kept by
    cleaning, encoded, each one or two records) goes round robin into the shards: record `g`
    into shard `g % num_shards`, so every shard is a uniform slice of the corpus (WMT corpora
    are concatenations of very different sources) and shard sizes differ by one at most. The
    stream is cut into segments of `segment` consecutive pairs (whole chunks); process `worker`
    of `workers` encodes the segments whose index modulo `workers` is its own (every process
    reads the whole corpus, encoding only its own pairs) and groups each segment's records by
    their index modulo `num_shards`. Once the segments before it are done, a segment's offset in
    the stream is known and each group appends to one shard: the shards are the same bytes
    whatever the number of processes."""

    encoding: _Encoding
    spec: str
    readings: int
    segments_per_reading: int  # an upper bound (segments past the corpus's end are empty)
    num_shards: int
    chunk: int  # pairs per sentencepiece call
    segment: int  # pairs per segment (chunks)
    workers: int = 1
    worker: int = 0
    directory: str = ""  # a worker process's local directory for its segment files
    start: int = 0  # the first segment to encode (those before it a stopped run kept)


@dataclasses.dataclass
class _Written:
    """What one process of pass 2 did: its lines read over the readings, segments encoded."""

    lines: int = 0
    encoded: int = 0
    counter: object = None  # the first reading's corpora.Counter (every process reads all)


def _segments(job, done, report):
    """Yields `(segment index, groups, counts)` for the segments of `job`'s process from
    `job.start` on, in order: `groups` holds the segment's records (bytes) by their index modulo
    `num_shards` (see `_ShardJob`), `counts` a `_Chunk` of the manifest's counts of them (no
    records). Also yields `(index, None, None)` for its segments past the corpus's end. The
    segments before `job.start` (kept by a stopped preparation) are read, not encoded."""
    encoder, size = _ChunkEncoder(job.encoding), job.segment
    for reading in range(job.readings):
        counter, pairs, current = corpora.Counter(job.spec), [], None
        base = reading * job.segments_per_reading
        for index, pair in enumerate(corpora.iter_training_pairs(job.spec, counter, verbose=False)):
            if index % 4096 == 0:
                report(done.lines + counter.lines)
            segment = base + index // size
            if segment >= base + job.segments_per_reading:
                raise DataError(f"{job.spec} has more pairs than when prepare counted them")
            if segment % job.workers != job.worker or segment < job.start:
                continue
            if current is not None and segment != current:
                yield current, *_encode_segment(encoder, job, done, reading, current - base, pairs)
                pairs = []
            current = segment
            pairs.append(pair)
        if pairs:
            yield current, *_encode_segment(encoder, job, done, reading, current - base, pairs)
        last = current if current is not None else base - 1
        for segment in range(max(last + 1, job.start), base + job.segments_per_reading):
            if segment % job.workers == job.worker:
                yield segment, None, None
        done.lines += counter.lines
        done.counter = done.counter or counter


def _encode_segment(encoder, job, done, reading, index, pairs):
    """`(groups, counts)` of segment `index` of a reading: its records grouped by their index
    modulo the shards, and a `_Chunk` of their counts."""
    groups, record, counts = [[] for _ in range(job.num_shards)], 0, _Chunk(reading)
    for start in range(0, len(pairs), job.chunk):
        # The chunk's index in the reading seeds its sampled segmentations.
        chunk_index = (index * job.segment + start) // job.chunk
        out = encoder(reading, chunk_index, pairs[start : start + job.chunk])
        for data in out.records:
            groups[record % job.num_shards].append(data)
            record += 1
        out.records = []
        _merge(counts, out, every_reading=True)
    done.encoded += 1
    return groups, counts


def _write_segment_file(path, groups):
    """Writes a segment's groups one after the other to the local TFRecord file `path`; returns
    `(bytes of each group, records of each group)`."""
    import tensorflow as tf

    writer = tf.io.TFRecordWriter(path)
    try:
        for group in groups:
            for data in group:
                writer.write(data)
    finally:
        writer.close()
    # A TFRecord is its data and 16 bytes of framing (length and two checksums).
    return [sum(len(data) + 16 for data in group) for group in groups], [len(g) for g in groups]


_WORKER = {}  # in a worker process: its progress array, result queue and parent's pid


def _start_worker(progress, queue):
    # Imported now, while the parent trains the vocabulary, not when the shards are due.
    import signal

    import sentencepiece  # noqa: F401
    import tensorflow  # noqa: F401

    # Ctrl-C reaches the whole process group: the parent stops at a safe point and ends these.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER.update(progress=progress, queue=queue, parent=os.getppid())


def _run_in_worker(job):
    """Writes each segment of `job` to a local TFRecord file, its groups one after the other,
    and puts `(segment, group sizes in bytes, group records, counts)` on the queue; returns the
    `_Written` (lines read, segments encoded)."""

    def report(lines):
        if os.getppid() != _WORKER["parent"]:  # the parent died (SIGKILL): stop
            os._exit(1)
        _WORKER["progress"][job.worker] = lines

    done = _Written()
    for segment, groups, counts in _segments(job, done, report):
        if groups is None:
            _WORKER["queue"].put((segment, None, None, None))
            continue
        sizes, records = _write_segment_file(_segment_path(job.directory, segment), groups)
        _WORKER["queue"].put((segment, sizes, records, counts))
    return done


def _segment_path(directory, segment):
    return os.path.join(directory, f"segment-{segment:07d}.tfrecord")


class _WorkerPool:
    """The processes of pass 2, started before the vocabulary trains: their start (TensorFlow's
    import) overlaps its single-threaded parts instead of delaying the shards."""

    def __init__(self, workers):
        self.workers, self.pool, self.progress, self.queue = workers, None, None, None

    def start(self, total, readings=1):
        """Starts the processes if the corpus (`total` pairs) is worth them: a process for
        every `_SEGMENTS_PER_WORKER` segments at most (starting one costs seconds; the result
        is the same)."""
        segments = max(total, 1) * readings // _segment_sizes()[1]
        workers = min(self.workers, segments // _SEGMENTS_PER_WORKER)
        if workers <= 1 or self.pool is not None:
            return
        import multiprocessing

        # spawn: the parent runs TensorFlow's threads, which a fork would copy half-locked.
        context = multiprocessing.get_context("spawn")
        self.progress = context.Array("q", workers, lock=False)
        self.queue = context.Queue()
        self.pool = context.Pool(workers, _start_worker, (self.progress, self.queue))
        self.workers = workers

    def close(self):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None


def _segment_sizes():
    """`(pairs per chunk, pairs per segment)` (a test may make them smaller: see
    `prepare_progress.segment_sizes`)."""
    return prepare_progress.segment_sizes(_CHUNK, _CHUNK * _SEGMENT_CHUNKS)


def _write_here(job, shards, progress):
    """Pass 2 in this process (one worker, or a small corpus): each segment goes through a
    local segment file (as a worker process's) into the shards; returns its `_Written`."""
    done = _Written()
    report = lambda lines: progress.update(lines, shards.offset)  # noqa: E731
    with local_directory() as local:
        for segment, groups, counts in _segments(job, done, report):
            if groups is not None:
                path = _segment_path(local, segment)
                sizes, records = _write_segment_file(path, groups)
                shards.add_segment_file(path, sizes, records, counts)
            shards.commit(segment + 1)
            stopping.check(_PHASE, shards.kept_message(segment + 1))
    return done


def _write_in_workers(pool, job, shards, progress):
    """Pass 2 in the pool's processes, their segments appended to `shards` in order as they
    come; returns the processes' `_Written`s."""
    import queue

    with local_directory() as local:
        jobs = [
            dataclasses.replace(job, workers=pool.workers, worker=w, directory=local)
            for w in range(pool.workers)
        ]
        results = [pool.pool.apply_async(_run_in_worker, (job,)) for job in jobs]
        ready, next_segment = {}, job.start
        while next_segment < job.readings * job.segments_per_reading:
            stopping.check(_PHASE, shards.kept_message(next_segment))
            for result in results:
                if result.ready() and not result.successful():
                    result.get()  # raises the worker's error
            try:
                segment, sizes, records, counts = pool.queue.get(timeout=1.0)
                ready[segment] = (sizes, records, counts)
            except queue.Empty:
                pass
            committed = next_segment
            while next_segment in ready:
                sizes, records, counts = ready.pop(next_segment)
                if sizes is not None:
                    path = _segment_path(local, next_segment)
                    shards.add_segment_file(path, sizes, records, counts)
                next_segment += 1
            if next_segment != committed:
                shards.commit(next_segment)
            progress.update(min(pool.progress), shards.offset)
        return [result.get() for result in results]


def _write_shards(config, model_proto, directory, total, verbose, pool, root):
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
    it has none; the shards are the same bytes either way (see `_ShardJob`). On the local disk
    the segments a stopped preparation completed are kept (`prepare_progress`, in the workdir
    `root`): only the others are encoded.
    """
    d = config.data
    encoding = _Encoding(
        model_proto, d.max_source_length - 1, d.max_target_length - 1, d.long_pairs == "drop",
        d.both_directions, d.subword_samples, d.subword_alpha, d.seed, threads=1,
        bt_tag=_bt_tag(model_proto, d.train),
    )  # fmt: skip
    readings = max(1, d.subword_samples)
    num_shards = num_shards_for(max(total, 1) * readings)
    names = [f"train-{i:05d}-of-{num_shards:05d}.tfrecord" for i in range(num_shards)]
    chunk, segment = _segment_sizes()
    per_reading = math.ceil(max(total, 1) / segment)
    key = {
        "settings": _settings(d),
        "vocabulary": hashlib.sha256(model_proto).hexdigest(),
        "pairs": total,
        "readings": readings,
        "shards": num_shards,
        "chunk": chunk,
        "segment": segment,
    }
    shards = prepare_progress.Shards(directory, names, root, key, (_Chunk, _merge))
    segments = readings * per_reading
    if shards.kept:
        _log(
            f"continuing the shards of a stopped preparation: {shards.kept} of {segments} "
            f"segments kept ({shards.offset:,} records), encoding the others",
            verbose,
        )
    job = _ShardJob(encoding, d.train, readings, per_reading, num_shards, chunk, segment)
    job = dataclasses.replace(job, start=shards.kept)
    what = "records written" if d.subword_samples else "pairs written"
    progress = _Progress(total * readings if total else None, verbose, what)
    pool.start(total, readings)
    try:
        if pool.pool is None:
            written = _write_here(job, shards, progress)
        else:
            written = _write_in_workers(pool, job, shards, progress)
    finally:
        shards.close()
    written = written if isinstance(written, list) else [written]
    if shards.kept:
        encoded = sum(part.encoded for part in written)
        _log(f"  {encoded} segments encoded, {shards.kept} kept from the stopped one", verbose)
    manifest = _shards_manifest(config, shards, written, progress)
    pieces = _ChunkEncoder(encoding).processor.get_piece_size()
    manifest["record_dtype"] = "uint16" if pieces <= 65_536 else "int32"
    return manifest


def _bt_tag(model_proto, train):
    """The id of the tag that leads the sources of `bt:` corpora, or None without any."""
    if not corpora.is_tagged(train):
        return None
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=model_proto)
    tag = processor.piece_to_id(corpora.TAG)
    if tag == processor.unk_id():
        raise DataError(
            f"data.train has bt: corpora but the vocabulary has no {corpora.TAG} piece (it was "
            "trained without them, e.g. a fine-tuning parent's): use a vocabulary trained with "
            "the bt: corpora"
        )
    return tag


def _merge(total, chunk, every_reading=False):
    """Adds a chunk's counts to `total` (pairs are counted in the first reading only, unless
    `every_reading`: a segment's counts, which keep their reading)."""
    if chunk.reading == 0 or every_reading:
        total.too_long += chunk.too_long
        total.truncated += chunk.truncated
        total.written += chunk.written
    total.source_tokens += chunk.source_tokens
    total.target_tokens += chunk.target_tokens
    total.source_hist.update(chunk.source_hist)
    total.target_hist.update(chunk.target_hist)
    total.longer_hist.update(chunk.longer_hist)


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
    return {
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
            "source_length": _length_stats(total.source_hist),
            "target_length": _length_stats(total.target_hist),
            # Pairs per length of their longer side (EOS included): for choosing buckets.
            "longer_side_histogram": {str(k): v for k, v in sorted(total.longer_hist.items())},
        },
    }


def _remove_leftovers(layout):
    """Removes what preparations killed midway left and cannot be continued: `prepared/`
    without its manifest, the temporary directories of older versions (`prepared.tmp-*`), a
    `prepared.partial/` without its progress (see `prepare_progress`)."""
    gfile = _gfile()
    for path in gfile.glob(os.path.join(layout.root, "prepared.tmp-*")):
        remove_tree(path)
    prepared = layout.prepared
    if gfile.isdir(prepared) and not gfile.exists(os.path.join(prepared, MANIFEST)):
        remove_tree(prepared)
    if not prepare_progress.has_progress(layout.root):
        remove_tree(os.path.join(layout.root, prepare_progress.PARTIAL))


def _temporary_directory(layout):
    """Where a preparation is written: on the local disk `prepared.partial/`, a sibling of
    `prepared/` renamed once complete (kept when stopped, to be continued); `prepared/` itself
    elsewhere (no atomic directory rename: the manifest, written last, marks it complete)."""
    if is_local(layout.root):
        directory = os.path.join(layout.root, prepare_progress.PARTIAL)
        os.makedirs(directory, exist_ok=True)
        return directory
    _gfile().makedirs(layout.prepared)
    return layout.prepared


def _workers(data_config):
    """`data.prepare_workers`, or the machine's cores when it is null."""
    return int(data_config.prepare_workers or max(1, os.cpu_count() or 1))


def prepare(config, verbose=True):
    """Streams the training corpus once into a vocabulary and sharded, tokenized examples.

    Reads `config.data.train` as a stream, trains the SentencePiece vocabulary on a seeded
    reservoir sample of at most `data.spm_max_sentences` sentences (both sides; skipped when
    `WORKDIR/spm.model` already exists, which is then used as is), tokenizes every pair and writes
    them round robin to TFRecord shards in `WORKDIR/prepared` with `manifest.json`. Memory stays
    bounded by the sample and a chunk of a few thousand pairs, whatever the corpus size. Prints
    progress (lines/s, pairs written, ETA when the size is known) and a summary to stderr.

    A workdir that is already prepared is checked against `config` and reused (nothing is
    read); see `check_prepared`. Only one process should prepare a workdir (the chief of a
    multi-worker job); others wait until `WORKDIR/prepared/manifest.json` exists. A
    preparation that was stopped (SIGTERM: `errors.Preempted`) continues from its trained
    vocabulary and, on the local disk, from the last complete segment of its shards.

    Args:
        config: an `ExperimentConfig` (`data.*` and `runtime.workdir`).
        verbose: print progress and the summary.

    Returns:
        The manifest dict: `format_version`, `settings` (the config keys the data depends on),
        `vocabulary` (`sha256`, `pieces`, `trained`, `sample_sentences`), `counts` (`lines`
        read, pairs `written`, `skipped` by reason: `empty`, `invalid_utf8`, `malformed`,
        `too_long`; `truncated`; `segmentations` of each pair and its `directions`, and the
        `records` they make, see `data.subword_samples` and `data.both_directions`), `shards`
        (`file`, `pairs` (records), `bytes`, `sha256` each),
        `record_dtype`, `tokens` (totals and length statistics), `seconds`, `phase_seconds`
        (`vocabulary_sample`, `vocabulary_training` when it trained one, `shards`).

    Raises:
        DataError: unreadable corpus, empty result, or a prepared workdir that does not match.

    Example:
    ```python
    manifest = prepare(load_config("configs/quickstart.yaml"))
    manifest["counts"]["written"], len(manifest["shards"])
    # -> (20000, 16)
    ```
    """
    layout = Workdir.of(config)
    existing = check_prepared(config)
    if existing is not None:
        _log(
            f"using the prepared data in {layout.prepared} "
            f"({existing['counts']['written']:,} pairs)",
            verbose,
        )
        return existing
    _gfile().makedirs(layout.root)
    root = layout.root
    _remove_leftovers(layout)
    d = config.data
    started = time.time()
    temporary = _temporary_directory(layout)
    pool, phases = _WorkerPool(_workers(d)), {}
    try:
        vocabulary = os.path.join(temporary, VOCABULARY)
        total, trained, sampled = _vocabulary(config, layout, vocabulary, verbose, pool, phases)
        if total is None:  # a file corpus with an existing vocabulary: count it for the shards
            counter = corpora.Counter(d.train)
            total = sum(1 for _ in corpora.iter_training_pairs(d.train, counter, verbose=False))
        _log(f"tokenizing {total:,} pairs into shards ({_workers(d)} workers) ...", verbose)
        with _gfile().GFile(vocabulary, "rb") as f:
            proto = f.read()
        stopping.check(_PHASE, _KEPT if trained else "nothing half-written")
        manifest = _manifest_head(d, proto, trained, sampled)
        shards_started = time.time()
        manifest.update(_write_shards(config, proto, temporary, total, verbose, pool, root))
        pool.close()
        phases["shards"] = time.time() - shards_started
        manifest["seconds"] = round(time.time() - started, 1)
        manifest["phase_seconds"] = {k: round(v, 1) for k, v in phases.items()}
        manifest["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # The manifest is the last file written: its presence means complete.
        write_atomically(os.path.join(temporary, MANIFEST), json.dumps(manifest, indent=1))
        if temporary != layout.prepared:
            os.rename(temporary, layout.prepared)
    except (Preempted, KeyboardInterrupt):
        raise  # stopped: what is complete is kept (the vocabulary, segments of the shards)
    except BaseException:
        if temporary != layout.prepared:
            remove_tree(temporary)
            prepare_progress.forget(root)
        raise
    finally:
        pool.close()
    prepare_progress.forget(root)
    if not _gfile().exists(layout.spm):
        copy_model(os.path.join(layout.prepared, VOCABULARY), layout.spm)
    kept_vocabulary.forget(layout.root)
    _summary(manifest, layout, verbose)
    return manifest


def _vocabulary(config, layout, vocabulary, verbose, pool, phases):
    """Installs the workdir's vocabulary at `vocabulary`, or trains one on a seeded sample of
    the corpus; returns `(pairs in the corpus or None, trained, sentences sampled)`.

    The vocabulary trains with as many SentencePiece threads as the machine has cores, whatever
    `data.prepare_workers` says: its threads split the sentences among them and sum their
    counts in floating point, so their number changes the vocabulary (slightly), and the
    prepared data must be the same whatever the number of workers. `pool` starts meanwhile.
    The seconds of sampling and training go into `phases`."""
    d, started = config.data, time.time()
    total = _known_size(d.train)
    if _gfile().exists(layout.spm):
        _log(f"preparing {d.train} with the existing vocabulary {layout.spm}", verbose)
        copy_model(layout.spm, vocabulary)
        return total, False, 0
    record = kept_vocabulary.restore(layout.root, _vocabulary_settings(d), vocabulary)
    if record is not None:  # a preparation stopped after training it
        _log(f"preparing {d.train} with the vocabulary a stopped preparation trained", verbose)
        phases.update(record["phase_seconds"])
        return record["pairs"], True, record["sample_sentences"]
    from keras_transformer.data.tokenizer import train_sentencepiece

    _log(f"preparing {d.train}: sampling sentences for the vocabulary ...", verbose)
    counter = corpora.Counter(d.train)
    progress = _Progress(total, verbose, "read for the vocabulary sample")
    sample = _reservoir_sample(_sentences(d.train, counter, progress), d.spm_max_sentences, d.seed)
    progress.update(counter.lines, 0, force=True)
    pool.start(counter.kept, max(1, d.subword_samples))
    phases["vocabulary_sample"], started = time.time() - started, time.time()
    train_sentencepiece(
        sample,
        vocabulary,
        vocab_size=d.vocab_size,
        model_type=d.spm_model_type,
        character_coverage=d.spm_character_coverage,
        max_sentences=max(1, len(sample)),
        seed=d.seed,
        num_threads=max(1, os.cpu_count() or 1),
        verbose=verbose,
        # Tagged back-translation reserves its tag: one piece, never split (only then, so
        # the vocabulary of every other config stays what it was).
        user_defined_symbols=[corpora.TAG] if corpora.is_tagged(d.train) else None,
    )
    phases["vocabulary_training"] = time.time() - started
    record = {"settings": _vocabulary_settings(d), "pairs": counter.kept}
    record.update(sample_sentences=len(sample), phase_seconds=phases)
    kept_vocabulary.keep(layout.root, vocabulary, record)
    return counter.kept, True, len(sample)  # the count is now known exactly


def _vocabulary_settings(data_config):
    """The settings that shaped the vocabulary (a kept one is reused only when they match)."""
    settings = _settings(data_config)
    return {key: settings[key] for key in _VOCABULARY_KEYS}


def _manifest_head(data_config, proto, trained, sampled):
    """The manifest's first keys: its format, the settings the data depends on, the vocabulary."""
    import sentencepiece as spm

    return {
        "format_version": FORMAT_VERSION,
        "settings": _settings(data_config),
        "vocabulary": {
            "file": VOCABULARY,
            "sha256": hashlib.sha256(proto).hexdigest(),
            "pieces": spm.SentencePieceProcessor(model_proto=proto).get_piece_size(),
            "trained": trained,
            "sample_sentences": sampled,
        },
    }


def _summary(manifest, layout, verbose):
    counts, tokens = manifest["counts"], manifest["tokens"]
    skipped = ", ".join(f"{k} {v:,}" for k, v in counts["skipped"].items() if v) or "none"
    size = sum(s["bytes"] for s in manifest["shards"])
    sampled = ""
    if counts.get("segmentations", 1) > 1:
        sampled = f" x {counts['segmentations']} sampled segmentations"
    if counts.get("directions", 1) > 1:
        sampled += f" x {counts['directions']} directions"
    if sampled:
        sampled += f" ({counts['records']:,} records)"
    _log(
        f"prepared {counts['written']:,} pairs{sampled} of {counts['lines']:,} lines in "
        f"{manifest['seconds']:.0f} s (skipped: {skipped}; truncated {counts['truncated']:,}): "
        f"{len(manifest['shards'])} shards, {size / 1e6:,.1f} MB, {tokens['source']:,} source "
        f"and {tokens['target']:,} target tokens, vocabulary {manifest['vocabulary']['pieces']} "
        f"pieces -> {layout.prepared}",
        verbose,
    )
