"""Pass 2's work: the record stream cut into segments, each encoded by a process (this one or
one of the pool's) into a local segment file that this process appends to the shards in order.

`data.prepare_workers` N processes each read the whole corpus and encode every Nth segment
(65,536 pairs, chunks of 4,096 per SentencePiece call) into a local TFRecord file, its records
grouped by the shard they go to; this process appends the files to the shards in the corpus's
order as they come (`prepare_progress.Shards`), so the shards are the same bytes whatever N (see
`ShardJob`). The pool starts before the vocabulary trains: its processes import TensorFlow
meanwhile.
"""

import dataclasses
import os

from keras_transformer import stopping
from keras_transformer.data import alignments, corpora, prepare_progress
from keras_transformer.data.encoding import Chunk, ChunkEncoder, Encoding
from keras_transformer.data.statistics import merge
from keras_transformer.errors import DataError
from keras_transformer.workdir import local_directory

# What `stopping.check` names while the shards are written.
PHASE = "prepare (writing the shards)"
# Pairs tokenized per sentencepiece call (its C++ threads split each call).
_CHUNK = 4096
# Pairs per segment, in chunks: the unit of work a worker process encodes and hands back.
_SEGMENT_CHUNKS = 16
# Segments a worker process must have at least to be started (smaller corpora: one process).
_SEGMENTS_PER_WORKER = 4


@dataclasses.dataclass(frozen=True)
class ShardJob:
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

    encoding: Encoding
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
    `num_shards` (see `ShardJob`), `counts` an `encoding.Chunk` of the manifest's counts of them
    (no records). Also yields `(index, None, None)` for its segments past the corpus's end. The
    segments before `job.start` (kept by a stopped preparation) are read, not encoded."""
    encoder, size = ChunkEncoder(job.encoding), job.segment
    for reading in range(job.readings):
        counter, pairs, current = corpora.Counter(job.spec), [], None
        base = reading * job.segments_per_reading
        stream = corpora.iter_training_pairs(job.spec, counter, verbose=False)
        if job.encoding.alignments:  # each pair with its line of data.train_alignments
            spec = alignments.check_corpus(job.spec)[0]
            stream = alignments.with_alignments(stream, counter, job.encoding.alignments, spec)
        for index, pair in enumerate(stream):
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
    modulo the shards, and an `encoding.Chunk` of their counts."""
    groups, record, counts = [[] for _ in range(job.num_shards)], 0, Chunk(reading)
    for start in range(0, len(pairs), job.chunk):
        # The chunk's index in the reading seeds its sampled segmentations.
        chunk_index = (index * job.segment + start) // job.chunk
        out = encoder(reading, chunk_index, pairs[start : start + job.chunk])
        for data in out.records:
            groups[record % job.num_shards].append(data)
            record += 1
        out.records = []
        merge(counts, out, every_reading=True)
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


class WorkerPool:
    """The processes of pass 2, started before the vocabulary trains: their start (TensorFlow's
    import) overlaps its single-threaded parts instead of delaying the shards."""

    def __init__(self, workers):
        self.workers, self.pool, self.progress, self.queue = workers, None, None, None

    def start(self, total, readings=1):
        """Starts the processes if the corpus (`total` pairs) is worth them: a process for
        every `_SEGMENTS_PER_WORKER` segments at most (starting one costs seconds; the result
        is the same)."""
        segments = max(total, 1) * readings // segment_sizes()[1]
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


def segment_sizes():
    """`(pairs per chunk, pairs per segment)` (a test may make them smaller: see
    `prepare_progress.segment_sizes`)."""
    return prepare_progress.segment_sizes(_CHUNK, _CHUNK * _SEGMENT_CHUNKS)


def write_segments(pool, job, shards, progress):
    """Pass 2: the segments of `job` encoded in the processes of `pool`, or in this one when it
    has none, and appended to `shards` in order; returns the `_Written` of each process."""
    if pool.pool is None:
        return [_write_here(job, shards, progress)]
    return _write_in_workers(pool, job, shards, progress)


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
            stopping.check(PHASE, shards.kept_message(segment + 1))
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
            stopping.check(PHASE, shards.kept_message(next_segment))
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
