"""Files that are complete or absent, and checks that tell a torn or corrupted file from a good one.

What a long run meets on disk: a full disk mid-write, a machine that dies while a file is half
written, a sync tool that truncates one. The writers keep their output invisible until complete
(written beside, then renamed: `write_atomically`), and the readers check what they load:

- step checkpoints (`ckpt-<step>.weights.h5`) get a checksum file beside them, written after the
  checkpoint (`write_checksum`); `checkpoint_problem` compares size and sha256 with it and opens
  the HDF5 file (whose superblock records its length: a truncated file is found even without a
  checksum file);
- the resume state is a `tf.train.Checkpoint`, whose reader checks each tensor's CRC32C itself;
- prepared shards have their size and sha256 in the manifest (`file_problem`).

Everything goes through `tf.io.gfile`, so a workdir on `gs://` is checked the same way. This
module sits at the bottom of the package (it imports nothing of ours but the errors and the
workdir lock, whose `fence` every atomic write passes before its file appears).
"""

import hashlib
import json
import os
import uuid

from keras_transformer import local_files
from keras_transformer.errors import first_line
from keras_transformer.lock import fence

CHECKSUM_SUFFIX = ".sha256"
_BLOCK = 1 << 20


def _gfile():
    return local_files.gfile()  # tf.io.gfile, or the local disk where TensorFlow is absent


def file_digest(path):
    """`(size in bytes, sha256 hex digest)` of the file at `path` (any TensorFlow filesystem).

    Reading is the cost (sha256 itself keeps up with a local disk).
    """
    digest, size = hashlib.sha256(), 0
    with _gfile().GFile(os.fspath(path), "rb") as f:
        while True:
            block = f.read(_BLOCK)
            if not block:
                break
            size += len(block)
            digest.update(block)
    return size, digest.hexdigest()


def is_local(path):
    """True for a path on the local disk (no `scheme://`, or `file://`)."""
    path = os.fspath(path)
    return "://" not in path or path.startswith("file://")


def write_atomically(path, data):
    """Writes `data` (str or bytes) to `path` so that it appears whole or not at all: on the
    local disk beside it (fsynced) and renamed over it; elsewhere in one upload (an object
    store shows an object only when complete). On failure (a full disk) nothing is left.

    Inside a workdir whose lock this process holds, the lock is checked first (`lock.fence`):
    a run whose lock was taken over writes nothing (`errors.Preempted`)."""
    gfile, path = _gfile(), os.fspath(path)
    directory = os.path.dirname(path)
    if directory:
        gfile.makedirs(directory)
    mode = "wb" if isinstance(data, bytes) else "w"
    if not is_local(path):
        fence(path)
        with gfile.GFile(path, mode) as f:
            f.write(data)
        return path
    temporary = os.path.join(directory, f".tmp-{uuid.uuid4().hex[:8]}-{os.path.basename(path)}")
    try:
        with gfile.GFile(temporary, mode) as f:
            f.write(data)
        descriptor = os.open(temporary, os.O_RDONLY)  # on disk before the rename makes it seen
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        fence(path)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    return path


def checksum_path(path):
    """The checksum file of `path`: `path.sha256`."""
    return os.fspath(path) + CHECKSUM_SUFFIX


def write_checksum(path):
    """Writes `path.sha256` (`{"bytes": ..., "sha256": ...}`) for the complete file at `path`.

    Written after the file: a file without one (a kill in between, or a workdir from before
    checksums) is checked by its format only."""
    size, sha256 = file_digest(path)
    write_atomically(checksum_path(path), json.dumps({"bytes": size, "sha256": sha256}))
    return sha256


def remove_with_checksum(path):
    """Removes `path` and its checksum file (either may be missing)."""
    gfile = _gfile()
    for name in (os.fspath(path), checksum_path(path)):
        if gfile.exists(name):
            gfile.remove(name)


def file_problem(path, expected_bytes=None, expected_sha256=None):
    """What is wrong with the file at `path` against its recorded size and sha256, or None.

    The size is compared first (a `stat`, no reading); the sha256 only when the size matches and
    one is given.

    Returns:
        None when it matches, else a few words: `missing`, `N bytes, M recorded` (truncated or
        grown) or `its sha256 differs from the recorded one` (changed in place).
    """
    gfile, path = _gfile(), os.fspath(path)
    if not gfile.exists(path):
        return "missing"
    size = gfile.stat(path).length
    if expected_bytes is not None and size != int(expected_bytes):
        return f"{size:,} bytes, {int(expected_bytes):,} recorded"
    if expected_sha256 and file_digest(path)[1] != expected_sha256:
        return "its sha256 differs from the recorded one"
    return None


def _read_checksum(path):
    gfile = _gfile()
    try:
        with gfile.GFile(checksum_path(path), "r") as f:
            recorded = json.loads(f.read())
        return int(recorded["bytes"]), str(recorded["sha256"])
    except Exception:  # missing or itself torn: the format check still runs
        return None


def checkpoint_problem(path):
    """What makes the step checkpoint at `path` unusable (torn, truncated, corrupted), or None.

    Checks the size and sha256 recorded in `path.sha256` when there is one, then opens the file
    as HDF5 (its superblock records the file's length, so a truncated file fails to open).
    """
    recorded = _read_checksum(path)
    if recorded is not None:
        problem = file_problem(path, *recorded)
        if problem:
            return problem
    import h5py

    try:
        with _gfile().GFile(os.fspath(path), "rb") as f, h5py.File(f, "r"):
            pass
    except Exception as e:
        return f"not a readable HDF5 file ({first_line(e)})"
    return None
