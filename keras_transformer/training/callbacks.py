"""Training callbacks: step checkpoints, a step limit, TensorBoard summaries and dev-set BLEU."""

import contextlib
import functools
import os
import time

import keras
import numpy as np
import tensorflow as tf

from keras_transformer.errors import DataError, first_line, write_refused
from keras_transformer.integrity import checkpoint_problem, remove_with_checksum
from keras_transformer.lock import fence
from keras_transformer.training.run_state import RunStateCallback, optimizer_step
from keras_transformer.workdir import checkpoint_path, list_checkpoints, save_model_weights


def _moving_averages(optimizer):
    """(weight, its moving average) pairs of an optimizer built with `use_ema=True`, or []."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's
    if not getattr(inner, "use_ema", False) or not getattr(inner, "built", False):
        return []
    averages = inner._model_variables_moving_average
    return [(w, a) for w, a in zip(inner._trainable_variables, averages) if a is not None]


@contextlib.contextmanager
def averaged_weights(model):
    """Inside the block the model's trainable weights are the optimizer's exponential moving
    averages (`train.ema_momentum`, Keras's `use_ema`); the trained weights come back after it.

    Without EMA (or before the optimizer is built) the block sees the weights as they are. This
    is what checkpoints, dev evaluation and so the export hold when EMA is on; training itself
    updates the raw weights, and the averages follow them in the optimizer's variables.

    Example:
    ```python
    with averaged_weights(model):
        model.save_weights("ema.weights.h5")
    ```
    """
    pairs = _moving_averages(model.optimizer) if model.optimizer is not None else []
    trained = [keras.ops.copy(weight.value) for weight, _ in pairs]
    for weight, average in pairs:
        weight.assign(average.value)
    try:
        yield model
    finally:
        for (weight, _), value in zip(pairs, trained):
            weight.assign(value)


def writes_in_the_batch_loop(method):
    """For a callback's batch hook that writes: an `OutOfRangeError` from it is a refused write
    (TensorFlow's file systems and SaveV2 raise EFBIG, "File too large", as one), never the end of
    the data. Keras's epoch loop takes any `OutOfRangeError` for an exhausted dataset and stops
    training without an error ("Your input ran out of data"), so it leaves as the
    `WriteRefusedError` it is (unrecognised: a RuntimeError)."""

    @functools.wraps(method)
    def hook(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except tf.errors.OutOfRangeError as e:
            raise (write_refused(e) or RuntimeError(f"{type(e).__name__}: {e}")) from e

    return hook


class StepCheckpoint(keras.callbacks.Callback):
    """Saves `directory/ckpt-<step>.weights.h5` every `every` optimizer steps, keeping the last
    `keep`; also at the end of training.

    The files hold the model's weights only (what export and checkpoint averaging need: about a
    third of what Keras's `save_weights` writes for a compiled model, which adds Adam's two
    moments); the state for resuming lives in `ResumeState`'s backup. With an optimizer built
    with `use_ema=True` they hold the moving averages of the weights (`averaged_weights`).

    Args:
        directory: where the checkpoints go.
        every: optimizer steps between checkpoints.
        keep: checkpoints kept (older ones are deleted).
        enabled: False on the non-chief workers of a multi-worker run.
    """

    def __init__(self, directory, every, keep, enabled=True):
        super().__init__()
        self.directory = directory
        self.every = int(every)
        self.keep = int(keep)
        self.enabled = enabled
        self._last_saved = None

    def _save(self, step, prune=True):
        if not self.enabled or step == self._last_saved or step == 0:
            return
        tf.io.gfile.makedirs(self.directory)
        # Atomic (written beside, then renamed): a kill mid-write leaves no broken ckpt.
        with averaged_weights(self.model):
            save_model_weights(self.model, checkpoint_path(self.directory, step))
        self._last_saved = step
        if prune:
            self._prune(step)

    def _prune(self, step):
        found = list_checkpoints(self.directory)
        # A preempted run's last checkpoint is off the schedule: once training goes on, it goes,
        # so the checkpoints kept (and averaged) are those of an uninterrupted run.
        for old_step, old in found:
            if old_step % self.every and old_step != step:
                remove_with_checksum(old)
        for _, old in [c for c in found if c[0] % self.every == 0 or c[0] == step][: -self.keep]:
            remove_with_checksum(old)

    def save_now(self, step):
        """Saves the checkpoint of `step` (a preemption's last), deleting none."""
        self._save(step, prune=False)

    def end_at(self, step):
        """What `on_train_end` does at `step` for a resumed run that had nothing left to train
        (`fit` is not called): the checkpoint of `step` kept (written where missing or torn, as
        after a kill before it was), the older ones pruned as at the end of training."""
        if self.enabled and step and not checkpoint_problem(checkpoint_path(self.directory, step)):
            self._last_saved = step  # there, whole: not written again
            self._prune(step)
            return
        self._save(step)

    @writes_in_the_batch_loop
    def on_train_batch_end(self, batch, logs=None):
        step = optimizer_step(self.model)
        if step % self.every == 0:
            self._save(step)

    def on_train_end(self, logs=None):
        self._save(optimizer_step(self.model))


class ResumeState(RunStateCallback):
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
        super().__init__(run_state)
        self.directory = directory
        self.every = int(every)
        self.before_save = list(before_save)
        self._checkpoint = tf.train.Checkpoint(
            model=[_tf_variable(v) for v in model.variables],
            optimizer=[_tf_variable(v) for v in model.optimizer.variables],
            data_position=self.run_state.position,
            training_seconds=_tf_variable(self.run_state.clock),
        )
        if iterator is not None:
            self._checkpoint.data_iterator = iterator
        self.iterator_restored = False
        self._manager = tf.train.CheckpointManager(
            self._checkpoint, write_directory or directory, max_to_keep=int(keep)
        )
        self.set_model(model)

    @property
    def batches(self):
        """The data position: batches consumed (the run state's)."""
        return self.run_state.batches

    @batches.setter
    def batches(self, value):
        self.run_state.position.assign(value)

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

    def set_model(self, model):
        super().set_model(model)
        self._last_saved = optimizer_step(model)

    def save(self):
        step = optimizer_step(self.model)
        if step == self._last_saved or step == 0:
            return
        fence(self._manager.directory, "the resume state")  # not once the lock is lost
        for save in self.before_save:
            save(step)
        self._manager.save(checkpoint_number=step)
        self._last_saved = step

    @writes_in_the_batch_loop
    def on_train_batch_end(self, batch, logs=None):
        self.run_state.batch_ends()
        if optimizer_step(self.model) % self.every == 0:
            self.save()

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        optimizer = self.model.optimizer
        vars(optimizer).pop("finalize_variable_values", None)  # an earlier fit's, if it failed
        if _moving_averages(optimizer):
            # With EMA, Keras's `fit` ends by putting the averages in place of the weights
            # (`finalize_variable_values`), before `on_train_end`: the state is saved first, so
            # that it holds the trained weights, which a resumed run goes on from.
            finalize = optimizer.finalize_variable_values

            def save_then_finalize(var_list):
                self.save()
                return finalize(var_list)

            optimizer.finalize_variable_values = save_then_finalize

    def on_train_end(self, logs=None):
        vars(self.model.optimizer).pop("finalize_variable_values", None)
        self.save()


def _first_line(error):
    """`Type: first line` of an error, without TensorFlow's `{{function_node ...}}` and
    `[Op:...]` decorations."""
    import re

    text = first_line(error) if str(error).strip() else ""
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\]$", "", text)
    return f"{type(error).__name__}: {text}"[:300]


def _resume_states(directory):
    """The resume states of `directory` (checkpoint prefixes), newest first: those named by its
    `checkpoint` index file and any other `ckpt-N.index` there (the index file may itself be
    torn or name only the latest)."""
    import re

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


class StopAtStep(RunStateCallback):
    """Stops `fit` once the optimizer has made `steps` updates (also after a resume), or once
    `max_seconds` of training time have passed (a time budget).

    Training time is the run state's clock (`RunState`), counted across resumes (the resume
    state holds it) and advanced after every batch, so a resumed run gets what is left of the
    budget, and a budget-aware learning rate continues the same curve. The run state advances
    once per batch whichever callback sees the batch first, so this callback may come anywhere
    among the others. Under several workers the clock is the chief's (see `RunState`), so all
    workers stop after the same step.

    Args:
        steps: the run's optimizer steps.
        max_seconds: the time budget; None: no budget.
        run_state: the run's `RunState`, shared with `ResumeState` (None: one of its own). Its
            clock, timer and the workers' agreement on the time are the run state's.
    """

    def __init__(self, steps, max_seconds=None, run_state=None):
        super().__init__(run_state)
        self.steps = int(steps)
        self.max_seconds = max_seconds
        self.out_of_time = False
        self.run_state.timed = self.run_state.timed or max_seconds is not None

    @property
    def elapsed(self):
        """Seconds trained so far (the run state's clock)."""
        return self.run_state.elapsed

    def on_train_batch_end(self, batch, logs=None):
        self.run_state.batch_ends()
        step = optimizer_step(self.model)
        if step >= self.steps:
            self.model.stop_training = True
            return
        if self.max_seconds is not None and self.elapsed >= self.max_seconds:
            if not self.out_of_time:
                print(
                    f"training's time budget of {self.max_seconds / 60:g} minutes reached at "
                    f"step {step}",
                    flush=True,
                )
            self.out_of_time = True
            self.model.stop_training = True


class TrainingSummaries(keras.callbacks.Callback):
    """Writes training scalars to TensorBoard every `every` optimizer steps.

    Tags (under `logdir/train`): `loss`, `accuracy`, `perplexity` (means over the steps since
    the last write, from the metrics' running sums: with `every=1`, each step's own values, so
    a resumed run's curve continues exactly), `learning_rate` and `tokens_per_second`
    (non-padding target tokens per second since the last write). The x axis is the optimizer
    step, so resumed runs continue their curves.

    Every worker reads the metrics (under several workers, a read sums the workers' shares: a
    collective all of them must join); only the one with `enabled=True` writes.

    Args:
        logdir: TensorBoard log directory (the run's `WORKDIR/logs`).
        every: optimizer steps between writes.
        enabled: False on the non-chief workers.
        total_steps: the run's length, shown in the printed lines.
        print_lines: also print one progress line per write (for logs, where Keras' progress
            bar is not shown).
    """

    def __init__(self, logdir, every=100, enabled=True, total_steps=None, print_lines=False):
        super().__init__()
        self.logdir = logdir
        self.every = max(1, int(every))
        self.enabled = enabled
        self.total_steps = total_steps
        self.print_lines = print_lines
        self._writer = None
        self._last_time = None
        self._last_sums = {}  # metric name -> (total, count) at the last write

    def _get_writer(self):
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self.logdir, "train"))
        return self._writer

    def on_epoch_begin(self, epoch, logs=None):
        # Keras resets the metrics at each epoch: the sums restart from zero.
        self._last_time = time.perf_counter()
        self._last_sums = {}

    def _window_means(self):
        """`{name: mean since the last write}` and the tokens counted since then."""
        from keras_transformer.training.metrics import Perplexity, TokenCount

        means, tokens = {}, None
        for metric in _flat_metrics(self.model):
            if isinstance(metric, TokenCount):
                count = float(keras.ops.convert_to_numpy(metric.count))
                tokens = count - self._last_sums.get(metric.name, (0.0, 0.0))[1]
                self._last_sums[metric.name] = (0.0, count)
                continue
            if not (hasattr(metric, "total") and hasattr(metric, "count")):
                continue
            total = float(keras.ops.convert_to_numpy(metric.total))
            count = float(keras.ops.convert_to_numpy(metric.count))
            last_total, last_count = self._last_sums.get(metric.name, (0.0, 0.0))
            self._last_sums[metric.name] = (total, count)
            if count > last_count:
                mean = (total - last_total) / (count - last_count)
                means[metric.name] = (
                    float(np.exp(min(mean, 50.0))) if isinstance(metric, Perplexity) else mean
                )
        return means, tokens

    @writes_in_the_batch_loop
    def on_train_batch_end(self, batch, logs=None):
        step = optimizer_step(self.model)
        if step % self.every:
            return
        means, tokens = self._window_means()  # on every worker (see the class docstring)
        now = time.perf_counter()
        last_time, self._last_time = self._last_time or now, now
        if not self.enabled:
            return
        learning_rate = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        speed = tokens / (now - last_time) if tokens and now > last_time else None
        with self._get_writer().as_default(step=step):
            for key in ("loss", "accuracy", "perplexity"):
                if key in means:
                    tf.summary.scalar(key, means[key])
            tf.summary.scalar("learning_rate", learning_rate)
            if speed is not None:
                tf.summary.scalar("tokens_per_second", speed)
        self._writer.flush()
        if self.print_lines:
            total = f"/{self.total_steps}" if self.total_steps else ""
            print(
                f"step {step}{total}: loss {means.get('loss', float('nan')):.4f}, "
                f"accuracy {means.get('accuracy', float('nan')):.4f}, "
                f"lr {learning_rate:.2e}" + (f", {speed:,.0f} tokens/s" if speed else ""),
                flush=True,
            )

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.flush()


def _flat_metrics(model):
    """The model's metric objects, the compiled ones taken out of Keras's container."""
    flat = []
    for metric in model.metrics:
        inner = getattr(metric, "metrics", None)
        if isinstance(inner, list):
            flat.extend(inner)
        else:
            flat.append(metric)
    return flat
