"""The TensorFlow engine's resume state: a `tf.train.Checkpoint` in `WORKDIR/backup/`."""

import os
import re

import tensorflow as tf

from keras_transformer.errors import DataError, first_line
from keras_transformer.training.run.callbacks import ResumeCallback
from keras_transformer.training.run.run_state import optimizer_step


class ResumeState(ResumeCallback):
    """The state a killed run resumes from: one `tf.train.Checkpoint` of the model's variables
    (weights and the dropout layers' RNG states), the optimizer's variables (moments, step, loss
    scale) and the run state (`RunState`: the data position and the seconds trained), every
    `every` optimizer steps and at the end of training; the last `keep` are kept.

    `tf.train.CheckpointManager` writes each state's files first and then, atomically, the index
    naming the latest: a kill mid-write leaves the previous state to restore. `restore()` (called
    by the trainer before `fit`) loads the newest complete state and returns the data position,
    so the training data can continue where the killed run was (see `train()`). A torn or
    corrupted state (TensorFlow's reader checks every tensor's CRC32C) is reported in one line
    and the one before it is used.

    The run state advances once per batch whichever callback sees the batch first, so this
    callback may come anywhere among the others (see `run_state`).

    Args:
        model: the compiled model, its optimizer built (`optimizer.build(trainable_variables)`).
        directory: where states are read from (`WORKDIR/backup`).
        every: optimizer steps between states.
        keep: states kept.
        write_directory: where states are written, when not `directory` (a non-chief worker's
            temporary directory: TensorFlow's multi-worker guide has every worker save).
        iterator: the `tf.data` iterator the training batches come from, saved with the state
            (its position, shuffle buffer and partial buckets: TensorFlow's iterator
            checkpointing), so a resume finds its place in the data without reading the batches
            before it; None: the data position alone is saved (the trainer then skips that many
            batches).
        run_state: the run's `RunState`, shared with `StopAtStep` and `StopOnSignal` (None: one
            of its own).
        before_save: callables `step -> None` called before each state is written (under
            several workers, each worker's data iterator: `worker_batches.IteratorBackup`).

    Example:
    ```python
    state = ResumeState(model, Workdir(root).backup, every=1000, keep=2)
    position = state.restore()
    model.fit(dataset.skip(position), callbacks=[state, ...])
    ```
    """

    def __init__(
        self,
        model,
        directory,
        every,
        keep,
        write_directory=None,
        iterator=None,
        run_state=None,
        before_save=(),
    ):
        super().__init__(model, write_directory or directory, every, run_state, before_save)
        self.directory = directory
        # The run state's numbers, as the checkpoint's variables (their names are the states').
        self._position = tf.Variable(0, dtype=tf.int64, trainable=False, name="data_position")
        self._seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="training_seconds")
        self._checkpoint = tf.train.Checkpoint(
            model=[_tf_variable(v) for v in model.variables],
            optimizer=[_tf_variable(v) for v in model.optimizer.variables],
            data_position=self._position,
            training_seconds=self._seconds,
        )
        if iterator is not None:
            self._checkpoint.data_iterator = iterator
        self._manager = tf.train.CheckpointManager(
            self._checkpoint, self.write_directory, max_to_keep=int(keep)
        )

    def restore(self):
        """Loads the newest complete state of `directory` if there is one; returns the data
        position.

        Raises:
            DataError: there are states but none can be read (all torn, or of another model).
        """
        candidates = _resume_states(self.directory)
        latest, problems = None, []
        for path in candidates:
            try:
                self._checkpoint_for(path).restore(path).assert_existing_objects_matched()
            except Exception as e:  # torn, corrupted, or another model's
                problems.append(_first_line(e))
                print(f"skipping the torn or unreadable resume state {path} ({problems[-1]})")
                continue
            latest = path
            break
        if latest is None:
            if problems:
                raise DataError(
                    f"no readable resume state in {self.directory} ({len(problems)} torn or "
                    f"unreadable: {problems[0]}); delete {self.directory} to train from step 0"
                )
            return 0
        self._last_saved = optimizer_step(self.model)
        self.run_state.restored(self._seconds.numpy(), self._position.numpy())
        print(f"resuming from step {self._last_saved} (restored from {latest})", flush=True)
        return self.batches

    def _checkpoint_for(self, path):
        """The checkpoint that restores the state at `path`: without the data iterator when that
        state holds none (another strategy, an older version), and the caller then skips to the
        data position (`iterator_restored` says which)."""
        checkpoint = self._checkpoint
        self.iterator_restored = "data_iterator" in checkpoint._trackable_children()
        if self.iterator_restored and not self.holds_iterator(path):
            parts = dict(checkpoint._trackable_children())
            parts.pop("data_iterator")
            parts.pop("save_counter", None)
            checkpoint = tf.train.Checkpoint(**parts)
            self.iterator_restored = False
        return checkpoint

    def track_iterator(self, iterator):
        """Saves `iterator` with the state from now on (in place of the one given before)."""
        self._checkpoint.data_iterator = iterator

    @staticmethod
    def holds_iterator(path):
        """True when the state at `path` holds a `tf.data` iterator's state."""
        return any(name.startswith("data_iterator/") for name, _ in tf.train.list_variables(path))

    def write(self, step):
        self._position.assign(self.run_state.batches)
        self._seconds.assign(self.run_state.elapsed)
        self._manager.save(checkpoint_number=step)


def has_resume_state(directory):
    """True when `directory` holds a resume state (readable or not)."""
    return bool(_resume_states(directory))


def _first_line(error):
    """`Type: first line` of an error, without TensorFlow's `{{function_node ...}}` and
    `[Op:...]` decorations."""
    text = first_line(error) if str(error).strip() else ""
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\]$", "", text)
    return f"{type(error).__name__}: {text}"[:300]


def _resume_states(directory):
    """The resume states of `directory` (checkpoint prefixes), newest first: those named by its
    `checkpoint` index file and any other `ckpt-N.index` there (the index file may itself be
    torn or name only the latest)."""
    prefixes = set()
    state = None
    try:
        state = tf.train.get_checkpoint_state(directory)
    except Exception:  # a torn index file: the glob below still finds the states
        pass
    if state is not None:
        for path in state.all_model_checkpoint_paths:
            if not os.path.isabs(path) and "://" not in path:
                path = os.path.join(directory, path)
            if tf.io.gfile.exists(path + ".index"):
                prefixes.add(path)
    for index in tf.io.gfile.glob(os.path.join(directory, "ckpt-*.index")):
        prefixes.add(index[: -len(".index")])

    def number(prefix):
        match = re.search(r"ckpt-(\d+)$", prefix)
        return int(match.group(1)) if match else -1

    return sorted(prefixes, key=number, reverse=True)


def _tf_variable(variable):
    """The TensorFlow variable behind a Keras variable (a distributed one under a strategy)."""
    value = getattr(variable, "_value", None)
    return value if value is not None else variable
