"""The shards of `prepare` as they are written, and the progress that lets a stopped
preparation continue from its last complete segment.

`prepare` encodes the corpus in segments of consecutive pairs (65,536) and appends each
segment's records to the shards, in the corpus's order (see `workers.ShardJob`). Once a segment
is appended, `Shards.commit` flushes the shards and records, in `WORKDIR/prepare.progress.json`
(written whole, beside and renamed), how far each shard is complete: its size in bytes, its
records and the sha256 of those bytes, with the counts the manifest needs of the segments so
far, and what the shards depend on (the data settings, the vocabulary's sha256, the corpus's
size, the shards and segments). A preparation stopped by SIGTERM (or killed) leaves its
directory `WORKDIR/prepared.partial/` and that file; the same command then cuts each shard back
to its recorded size, checks the sha256 of what is left, and appends the rest: it reads the
corpus again (for its counts) but encodes only the segments after the last complete one, and
the shards are the same bytes as an uninterrupted preparation's. A progress file that does not
match (other settings, another vocabulary, a shard changed meanwhile) is ignored and every
shard is written again.

Only on the local disk: object stores (`gs://`) can neither append to nor cut a file, so there
the shards are written into `WORKDIR/prepared/` from the start again (the trained vocabulary
is still kept, see `kept_vocabulary`).
"""

import collections
import dataclasses
import glob
import hashlib
import json
import os

from keras_transformer.lock import fence
from keras_transformer.workdir import is_local, join, read_text, write_atomically

PROGRESS = "prepare.progress.json"
PARTIAL = "prepared.partial"  # where a preparation writes on the local disk, renamed when done
FORMAT = 1
# Tests: pairs per segment (instead of 65,536), to stop a small corpus after a few segments.
SEGMENT_ENV = "KERAS_TRANSFORMER_PREPARE_SEGMENT"


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def segment_sizes(chunk, segment):
    """`(pairs per chunk, pairs per segment)`: the given ones, or a test's
    `KERAS_TRANSFORMER_PREPARE_SEGMENT=PAIRS` (chunks of at most PAIRS pairs, and a whole
    number of them per segment)."""
    wanted = os.environ.get(SEGMENT_ENV)
    if not wanted:
        return chunk, segment
    pairs = max(1, int(wanted))
    chunk = min(chunk, pairs)
    return chunk, -(-pairs // chunk) * chunk


def counts_to_json(counts):
    """A dataclass of counts (ints and Counters; its `records` left out) as JSON-able dict."""
    out = {}
    for field in dataclasses.fields(counts):
        value = getattr(counts, field.name)
        if isinstance(value, collections.Counter):
            out[field.name] = {str(k): v for k, v in value.items()}
        elif isinstance(value, int):
            out[field.name] = value
    return out


def counts_from_json(cls, values):
    """The inverse of `counts_to_json`: an instance of `cls`."""
    counts = cls()
    for field in dataclasses.fields(counts):
        if field.name not in values:
            continue
        value = values[field.name]
        if isinstance(getattr(counts, field.name), collections.Counter):
            value = collections.Counter({int(k): v for k, v in value.items()})
        setattr(counts, field.name, value)
    return counts


def _file_sha256(path, size):
    """The sha256 object of the first `size` bytes of the local file `path`; None when the
    file is shorter."""
    digest, left = hashlib.sha256(), size
    with open(path, "rb") as f:
        while left:
            block = f.read(min(left, 1 << 20))
            if not block:
                return None
            digest.update(block)
            left -= len(block)
    return digest


class Shards:
    """The shards being written into `directory`, segment files appended in the stream's order.

    Args:
        directory: `WORKDIR/prepared.partial` (local) or `WORKDIR/prepared` (elsewhere).
        names: the shards' file names.
        root: the workdir (where the progress file lives).
        key: what the shards depend on (a JSON-able dict); a recorded progress is used only
            when its key is the same.
        counts: `(cls, merge)`: the dataclass of a segment's counts and `merge(total, counts)`.

    After construction, `kept` is the number of segments kept from a stopped preparation (0
    when none, or not on the local disk); `total` holds their counts.
    """

    def __init__(self, directory, names, root, key, counts):
        self.directory, self.names, self.key = directory, names, key
        self.progress = os.path.join(root, PROGRESS) if is_local(root) else None
        self.counts_cls, self.merge = counts
        self.total = self.counts_cls()
        self.records, self.bytes = [0] * len(names), [0] * len(names)
        self.digests = [hashlib.sha256() for _ in names]
        self.offset, self.kept = 0, 0  # records in the stream so far; segments kept
        self.writers = []
        if self.progress is not None and self._resume():
            return
        self._remove_strays()
        gfile = _gfile()
        self.writers = [gfile.GFile(join(directory, name), "wb") for name in names]

    def _recorded(self):
        try:
            state = json.loads(read_text(self.progress))
        except Exception:  # absent, torn or unreadable: start again
            return None
        if state.get("format") != FORMAT or state.get("key") != self.key:
            return None
        if len(state.get("shards", ())) != len(self.names):
            return None
        return state

    def _resume(self):
        """Cuts the shards back to the recorded progress and opens them for appending; False
        (nothing opened) when there is no usable progress."""
        state = self._recorded()
        if state is None:
            return False
        digests = []
        for name, shard in zip(self.names, state["shards"]):
            path = os.path.join(self.directory, name)
            if not os.path.exists(path):
                return False
            digest = _file_sha256(path, shard["bytes"])
            if digest is None or digest.hexdigest() != shard["sha256"]:
                return False
            digests.append(digest)
        for name, shard in zip(self.names, state["shards"]):
            os.truncate(os.path.join(self.directory, name), shard["bytes"])  # a torn segment
        self.digests = digests
        self.bytes = [shard["bytes"] for shard in state["shards"]]
        self.records = [shard["pairs"] for shard in state["shards"]]
        self.offset, self.kept = state["offset"], state["segments"]
        self.total = counts_from_json(self.counts_cls, state["counts"])
        self.writers = [open(os.path.join(self.directory, name), "ab") for name in self.names]
        return True

    def _remove_strays(self):
        """Shards of another preparation (other names) that must not be renamed into place."""
        if self.progress is None:
            return
        for path in glob.glob(os.path.join(self.directory, "train-*.tfrecord")):
            if os.path.basename(path) not in self.names:
                os.remove(path)

    def add_segment_file(self, path, sizes, counts, segment_counts):
        """Appends the local segment file `path`, whose groups (by record index modulo the
        shards) have `sizes` bytes and `counts` records, and adds `segment_counts` to `total`
        (not once this process lost the workdir's lock: `lock.fence`)."""
        fence(self.directory, "a segment of the prepared shards")
        with open(path, "rb") as f:
            for group, (size, records) in enumerate(zip(sizes, counts)):
                data = f.read(size)
                shard = (self.offset + group) % len(self.names)
                self.writers[shard].write(data)
                self.digests[shard].update(data)
                self.bytes[shard] += size
                self.records[shard] += records
        os.remove(path)
        self.offset += sum(counts)
        self.merge(self.total, segment_counts)

    def commit(self, segments):
        """Records that the first `segments` segments are in the shards (local disk only)."""
        if self.progress is None:
            return
        for writer in self.writers:
            writer.flush()
        state = {
            "format": FORMAT,
            "key": self.key,
            "segments": segments,
            "offset": self.offset,
            "shards": [
                dict(bytes=size, pairs=records, sha256=digest.copy().hexdigest())
                for size, records, digest in zip(self.bytes, self.records, self.digests)
            ],
            "counts": counts_to_json(self.total),
        }
        write_atomically(self.progress, json.dumps(state))

    def kept_message(self, segments):
        """What a stop after `segments` complete segments keeps (for `stopping.check`)."""
        if self.progress is None:
            return "the vocabulary is kept; the shards are written again (not on this filesystem)"
        return (
            f"the vocabulary and {segments} complete segments of the shards are kept "
            f"({self.offset:,} records)"
        )

    def close(self):
        for writer in self.writers:
            writer.close()

    def manifest(self):
        """The manifest's `shards`: name, records, bytes and sha256 of each."""
        return [
            dict(file=name, pairs=records, bytes=size, sha256=digest.hexdigest())
            for name, records, size, digest in zip(
                self.names, self.records, self.bytes, self.digests
            )
        ]


def forget(root):
    """Removes the progress file (the preparation is complete, or starts over)."""
    path = os.path.join(root, PROGRESS)
    if is_local(root) and os.path.exists(path):
        os.remove(path)


def has_progress(root):
    return is_local(root) and os.path.exists(os.path.join(root, PROGRESS))
