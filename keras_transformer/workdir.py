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
  backup/              resume state (tf.train.Checkpoint: weights, optimizer, step, dropout RNG,
                       data position), the last train.keep_backups kept
  logs/                TensorBoard
  result.json          the final summary
  lock.json            who runs `train` or `prepare` here now (see `keras_transformer.lock`)
```

This module sits at the bottom of the package (it imports nothing of ours), so the data, training
and command modules can all use it.
"""

import dataclasses
import os
import re
import warnings

from keras_transformer.integrity import checkpoint_problem, write_checksum

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
        return os.path.join(self.root, *parts)

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
    def backup(self):
        return self._join("backup")

    @property
    def logs(self):
        return self._join("logs")

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


def checkpoint_path(directory, step):
    """`directory/ckpt-<step>.weights.h5`."""
    return os.path.join(os.fspath(directory), f"ckpt-{int(step)}.weights.h5")


def list_checkpoints(directory):
    """`[(step, path), ...]` of the `ckpt-<step>.weights.h5` files in `directory`, oldest first
    (an empty list when the directory does not exist)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return []
    found = []
    for entry in os.listdir(directory):
        match = CHECKPOINT_PATTERN.match(entry)
        if match:
            found.append((int(match.group(1)), os.path.join(directory, entry)))
    return sorted(found)


def save_model_weights(model, path):
    """Writes `model`'s own weights (no optimizer state) to the `.weights.h5` file `path`.

    Keras's `save_weights` on a compiled model also writes the optimizer's variables (Adam's two
    moments: about 3x the weights); step checkpoints are for averaging and export, which need
    the weights only. The file appears atomically (written beside, then renamed), so a kill
    mid-write never leaves a broken checkpoint (a failed write, e.g. a full disk, leaves
    nothing); then `path.sha256` records its size and checksum, which `complete_checkpoints`
    checks. `model.load_weights` reads it back.

    Example:
    ```python
    save_model_weights(model, Workdir("workdirs/quickstart").checkpoint(1000))
    ```
    """
    from keras.src.saving import saving_lib  # save_weights_only is not exported by Keras

    path = os.fspath(path)
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".tmp-{name}")
    optimizer = getattr(model, "optimizer", None)
    try:
        saving_lib.save_weights_only(
            model, tmp, objects_to_skip=[optimizer] if optimizer is not None else None
        )
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    os.replace(tmp, path)
    write_checksum(path)
    return path


def load_model_weights(model, path):
    """Loads a weights file into `model`, leaving a compiled model's optimizer as it is (step
    checkpoints hold no optimizer state; Keras would warn that it has none)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
        model.load_weights(os.fspath(path))
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


def load_last_checkpoints(model, directory, count):
    """Loads the last complete checkpoint of `directory` into `model`, or the average of the last
    `count` complete ones (torn ones are skipped, see `complete_checkpoints`).

    Returns:
        The steps of the checkpoints used, oldest first (empty when there is none).
    """
    chosen = complete_checkpoints(directory, max(1, int(count)))
    if not chosen:
        return []
    if len(chosen) == 1:
        load_model_weights(model, chosen[0][1])
    else:
        average_checkpoints(model, [path for _, path in chosen])
    return [step for step, _ in chosen]
