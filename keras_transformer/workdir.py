"""The training workdir's layout: where every file of a run lives, and its step checkpoints.

One home for the paths that the trainer writes and that `prepare`, `export`, the notebook and
the tests read back:

```
WORKDIR/
  config.yaml          the resolved config
  spm.model            the shared SentencePiece vocabulary (spm.vocab beside it, for people)
  prepared/            the training corpus tokenized into TFRecord shards, with manifest.json
                       (written by `keras-transformer prepare`: data/prepare.py)
  checkpoints/         ckpt-<step>.weights.h5: the model's weights (only) every
                       train.checkpoint_every steps, the last train.keep_checkpoints kept
  best/                with train.keep_best: the K checkpoints of the best dev BLEU (same
                       names) and scores.json, the dev BLEU of every step scored
  backup/              resume state (tf.train.Checkpoint: weights, optimizer, step, dropout RNG,
                       data position and, on one machine, the tf.data iterator), the last
                       train.keep_backups kept; under several workers, data-worker-K/ holds
                       worker K's tf.data iterator at the same steps (ckpt-STEP, .json last)
  logs/                TensorBoard
  result.json          the final summary
  shortlist.npz        the vocabulary shortlist's lexical table (`keras-transformer shortlist`,
                       data/shortlist.py), read by an export with export.shortlist
  init_from.json       a fine-tuning run's parent: path, checkpoint, step (train.init_from,
                       training/run/init_from.py)
  lock.json            who runs `train` or `prepare` here now (see `keras_transformer.lock`)
  distill/ distilled/  a distilled student's corpus: the teacher's translated shards, and the
                       merged corpus it trains on (`keras_transformer.distillation`)
  prepared.partial/    a preparation under way or stopped (local disk), renamed to prepared/
  prepare.progress.json  its complete segments, so that a stopped one continues (see
                       data/prepare_progress.py); prepare.vocabulary.*: its trained vocabulary
  prepare.heartbeat    while the chief of a multi-worker job prepares the data: its heartbeat,
                       which the waiting workers watch (training/engines/distribute.py)
```

Every path may be on any TensorFlow filesystem (`gs://bucket/run`, `ram://` in tests, a local
directory): all reads and writes go through `tf.io.gfile` or through TensorFlow APIs that take
such paths (`tf.train.CheckpointManager`, summary writers, TFRecord files, SavedModel). What
only writes local files (Keras's `.weights.h5`, CTranslate2, SentencePiece's trainer) writes into
a local temporary file that is then copied (the helpers below).

Atomicity, where it holds:
- local disk (a POSIX rename): a file appears whole or not at all (written beside, then
  `rename`d); a directory too (`prepared/`, an export version);
- object stores (`gs://`, `s3://`) and any other filesystem: one file (object) appears whole
  when its upload ends, so single files keep the guarantee; a directory has no atomic rename, so
  its files are written in place with a completion marker last (`prepared/manifest.json`, an
  export's `saved_model.pb`, a CTranslate2 model's `model.bin`, `backup/checkpoint`), and
  readers look for the marker. A kill midway leaves a directory without its marker, which the
  next run removes or ignores.

This module sits at the bottom of the package (it imports nothing of ours), so the data, training
and command modules can all use it.
"""

import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile
import uuid
import warnings

from keras_transformer import local_files
from keras_transformer.integrity import (
    checkpoint_problem,
    is_local,
    write_checksum,
)
from keras_transformer.integrity import (
    write_atomically as write_atomically,  # re-exported: the writers import it from here
)
from keras_transformer.lock import fence

CHECKPOINT_PATTERN = re.compile(r"^ckpt-(\d+)\.weights\.h5$")


@dataclasses.dataclass(frozen=True)
class Workdir:
    """The paths of one training workdir.

    Args:
        root: the workdir (`runtime.workdir`, default `workdirs/<config name>`).

    Example:
    >>> Workdir("workdirs/quickstart").spm
    'workdirs/quickstart/spm.model'
    """

    root: str

    def __post_init__(self):
        object.__setattr__(self, "root", os.fspath(self.root))

    @classmethod
    def of(cls, config):
        """The workdir of an `ExperimentConfig`: `runtime.workdir` or `workdirs/<name>`."""
        return cls(config.runtime.workdir or os.path.join("workdirs", config.name))

    def _join(self, *parts):
        return join(self.root, *parts)

    @property
    def config(self):
        return self._join("config.yaml")

    @property
    def spm(self):
        return self._join("spm.model")

    @property
    def prepared(self):
        """The prepared training data: shards, their vocabulary and `manifest.json`."""
        return self._join("prepared")

    @property
    def prepared_manifest(self):
        """`prepared/manifest.json`: it exists only once a preparation is complete."""
        return self._join("prepared", "manifest.json")

    @property
    def checkpoints(self):
        return self._join("checkpoints")

    @property
    def best(self):
        """`best/`: the `train.keep_best` checkpoints of the best dev BLEU, with `scores.json`."""
        return self._join("best")

    @property
    def backup(self):
        return self._join("backup")

    @property
    def logs(self):
        return self._join("logs")

    @property
    def shortlist(self):
        """`shortlist.npz`: the vocabulary shortlist's lexical table (`keras-transformer
        shortlist`, `data/shortlist.py`)."""
        return self._join("shortlist.npz")

    @property
    def result(self):
        return self._join("result.json")

    @property
    def lock(self):
        """`lock.json`: the holder of the workdir while `train` or `prepare` runs."""
        return self._join("lock.json")

    def checkpoint(self, step):
        """The path of the step checkpoint written at optimizer step `step`."""
        return checkpoint_path(self.checkpoints, step)

    def list_checkpoints(self):
        """`[(step, path), ...]` of the step checkpoints, oldest first."""
        return list_checkpoints(self.checkpoints)


def _gfile():
    # Lazily: config errors come before TensorFlow loads (local files where it is absent).
    return local_files.gfile()


def join(*parts):
    """`os.path.join` that keeps URLs (`gs://bucket/run` + `a` -> `gs://bucket/run/a`)."""
    parts = [os.fspath(p) for p in parts]
    if is_local(parts[0]):
        return os.path.join(*parts)
    return "/".join([parts[0].rstrip("/")] + [p.strip("/") for p in parts[1:]])


def read_text(path):
    """The text of `path` (any filesystem). Raises OSError subclasses when missing."""
    try:
        with _gfile().GFile(os.fspath(path), "r") as f:
            return f.read()
    except _not_found_errors() as e:
        raise FileNotFoundError(f"{path}: {e}") from None


def read_json(path):
    """The JSON value in `path` (any filesystem), or None where it is missing or unreadable
    (the files written whole by `write_atomically` are complete or absent)."""
    try:
        return json.loads(read_text(path))
    except (OSError, ValueError):
        return None


def _not_found_errors():
    return local_files.not_found_errors()


def copy_atomically(local_path, path):
    """Copies the local file `local_path` to `path` (any filesystem), appearing whole (after
    `lock.fence`: not into a workdir whose lock this process lost)."""
    gfile, path = _gfile(), os.fspath(path)
    if is_local(path):
        temporary = f"{path}.tmp-{os.getpid()}"
        try:
            shutil.copyfile(local_path, temporary)
            fence(path)
        except BaseException:  # a full disk (or the lock lost): leave nothing behind
            if os.path.exists(temporary):
                os.remove(temporary)
            raise
        os.replace(temporary, path)
    else:
        fence(path)
        gfile.copy(local_path, path, overwrite=True)
    return path


@contextlib.contextmanager
def local_file(path):
    """A local path holding the contents of `path`: itself when local, else a temporary copy
    (deleted afterwards), for libraries that read local files only (h5py)."""
    path = os.fspath(path)
    if is_local(path):
        yield path
        return
    directory = tempfile.mkdtemp(prefix="keras-transformer-")
    try:
        local = os.path.join(directory, os.path.basename(path))
        _gfile().copy(path, local, overwrite=True)
        yield local
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def local_directory():
    """A local temporary directory, removed afterwards: where local-only writers write before
    their files are copied to any filesystem (`copy_tree`)."""
    directory = tempfile.mkdtemp(prefix="keras-transformer-")
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def staging_directory(parent, prefix):
    """A new empty directory in the local directory `parent` (created if needed), named
    `prefix` and a random suffix: where an export is written before it is renamed into place.

    It gets the permissions any new directory gets (`mkdir`: 0777 less the umask, default ACLs
    applied), not `tempfile.mkdtemp`'s 0700, which the rename would carry over: TF Serving, a
    container or a web server running as another user could not read the export.
    """
    os.makedirs(parent, exist_ok=True)
    for _ in range(100):
        path = os.path.join(parent, f"{prefix}{uuid.uuid4().hex[:12]}")
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free name for a new directory {prefix}... in {parent}")


def copy_tree(local_dir, destination, last=None):
    """Copies the files of the local directory `local_dir` into `destination` (any filesystem),
    the file named `last` (relative path: the completion marker readers look for) last."""
    gfile = _gfile()
    files = []
    for directory, _, names in os.walk(local_dir):
        files += [os.path.relpath(os.path.join(directory, n), local_dir) for n in names]
    files.sort(key=lambda name: (name == last, name))
    for name in files:
        target = join(destination, *name.split(os.sep))
        gfile.makedirs(os.path.dirname(target) if is_local(target) else target.rsplit("/", 1)[0])
        gfile.copy(os.path.join(local_dir, name), target, overwrite=True)
    return destination


def remove_tree(path):
    """Removes a directory and everything under it, if it exists (any filesystem)."""
    gfile, path = _gfile(), os.fspath(path)
    if is_local(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    if not gfile.exists(path):
        return
    # Some filesystems (ram://) remove only files reliably: delete them, then the directories.
    for directory, _, names in list(gfile.walk(path, topdown=False)):
        for name in names:
            gfile.remove(join(directory, name))
    with contextlib.suppress(Exception):
        gfile.rmtree(path)


def checkpoint_path(directory, step):
    """`directory/ckpt-<step>.weights.h5`."""
    return join(os.fspath(directory), f"ckpt-{int(step)}.weights.h5")


def list_checkpoints(directory):
    """`[(step, path), ...]` of the `ckpt-<step>.weights.h5` files in `directory`, oldest first
    (an empty list when the directory does not exist)."""
    gfile, directory = _gfile(), os.fspath(directory)
    if not gfile.isdir(directory):
        return []
    found = []
    for entry in gfile.listdir(directory):
        match = CHECKPOINT_PATTERN.match(entry.rstrip("/"))
        if match:
            found.append((int(match.group(1)), join(directory, entry.rstrip("/"))))
    return sorted(found)


def save_model_weights(model, path):
    """Writes `model`'s own weights (no optimizer state) to the `.weights.h5` file `path`.

    Keras's `save_weights` on a compiled model also writes the optimizer's variables (Adam's two
    moments: about 3x the weights); step checkpoints are for averaging and export, which need
    the weights only. The file appears atomically (written beside, then renamed), so a kill
    mid-write never leaves a broken checkpoint (a failed write, e.g. a full disk, leaves
    nothing); then `path.sha256` records its size and checksum, which `complete_checkpoints`
    checks. `model.load_weights` reads it back. Keras writes h5 files to local paths only: the
    file is written in a local temporary directory and copied to `path` (any filesystem, see
    `copy_atomically`).

    Example:
    ```python
    save_model_weights(model, Workdir("workdirs/quickstart").checkpoint(1000))
    ```
    """
    from keras.src.saving import saving_lib  # save_weights_only is not exported by Keras

    path = os.fspath(path)
    optimizer = getattr(model, "optimizer", None)
    with local_directory() as directory:
        local = os.path.join(directory, os.path.basename(path))
        saving_lib.save_weights_only(
            model, local, objects_to_skip=[optimizer] if optimizer is not None else None
        )
        copy_atomically(local, path)
    write_checksum(path)
    return path


def load_model_weights(model, path):
    """Loads a weights file into `model`, leaving a compiled model's optimizer as it is (step
    checkpoints hold no optimizer state; Keras would warn that it has none)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
        with local_file(path) as local:
            model.load_weights(local)
    return model


def average_checkpoints(model, paths):
    """Sets `model`'s weights to the element-wise mean of the checkpoints at `paths`.

    The paper averages the last 5 (base) or 20 (big) checkpoints, written 10 minutes apart;
    the mean of nearby points of one run is a smoother, usually slightly better, model.

    Args:
        model: a built Keras model whose weights match the checkpoints.
        paths: Keras weight files (`*.weights.h5`), at least one.

    Returns:
        `model`, holding the averaged weights (non-float weights, if any, from the last file).

    Example:
    ```python
    steps_and_paths = Workdir("workdirs/quickstart").list_checkpoints()
    average_checkpoints(model, [path for _, path in steps_and_paths[-5:]])
    ```
    """
    import numpy as np

    paths = list(paths)
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint path")
    sums = None
    for path in paths:
        load_model_weights(model, path)
        values = [np.asarray(w.numpy()) for w in model.weights]
        if sums is None:
            sums = [v.astype("float64") if v.dtype.kind == "f" else v for v in values]
        else:
            sums = [s + v if v.dtype.kind == "f" else v for s, v in zip(sums, values, strict=True)]
    for weight, total in zip(model.weights, sums, strict=True):
        if total.dtype.kind == "f":
            weight.assign((total / len(paths)).astype(weight.dtype))
    return model


def complete_checkpoints(directory, count=None, report=None):
    """`[(step, path), ...]` of the last `count` (default: all) step checkpoints of `directory`
    that are complete, oldest first: a torn, truncated or corrupted one
    (`integrity.checkpoint_problem`) is left out and reported in one line.

    Checkpoints are checked newest first, and only until `count` complete ones are found (each
    check reads the whole file for its sha256).

    Args:
        directory: the checkpoints directory.
        count: how many complete checkpoints are wanted.
        report: `line -> None` for each checkpoint left out (default: print to stderr).
    """
    import sys

    report = report or (lambda line: print(line, file=sys.stderr, flush=True))
    complete = []
    for step, path in reversed(list_checkpoints(directory)):
        if count is not None and len(complete) >= count:
            break
        problem = checkpoint_problem(path)
        if problem:
            report(f"skipping the torn or corrupted checkpoint {path}: {problem}")
        else:
            complete.append((step, path))
    return complete[::-1]
