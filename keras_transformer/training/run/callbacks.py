"""The run's Keras callbacks, the same on either backend: step checkpoints (`StepCheckpoint`), the
step limit and time budget (`StopAtStep`), TensorBoard's training scalars (`TrainingSummaries`),
and what every engine's resume state does in `fit` (`ResumeCallback`; the states themselves are
the engines': `training.engines`). The dev-set BLEU is `run.dev_evaluation`'s, the stop on a
signal `run.preemption`'s."""

import contextlib
import functools
import os
import sys
import time

import keras
import numpy as np

from keras_transformer import local_files
from keras_transformer.errors import write_refused
from keras_transformer.integrity import checkpoint_problem, remove_with_checksum
from keras_transformer.lock import fence
from keras_transformer.training.run.run_state import RunStateCallback, optimizer_step
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
        except Exception as e:
            tf = sys.modules.get("tensorflow")  # only TensorFlow raises it (loaded by then)
            if tf is None or not isinstance(e, tf.errors.OutOfRangeError):
                raise
            raise (write_refused(e) or RuntimeError(f"{type(e).__name__}: {e}")) from e

    return hook


def tensorboard():
    """`tf.summary`, which writes TensorBoard's files on either backend, where TensorFlow can be
    imported; None where it cannot (a JAX machine without it: no TensorBoard logs)."""
    try:
        import tensorflow as tf
    except ImportError:
        return None
    return tf.summary


class StepCheckpoint(keras.callbacks.Callback):
    """Saves `directory/ckpt-<step>.weights.h5` every `every` optimizer steps, keeping the last
    `keep`; also at the end of training.

    The files hold the model's weights only (what export and checkpoint averaging need: about a
    third of what Keras's `save_weights` writes for a compiled model, which adds Adam's two
    moments); the state for resuming lives in the engine's resume state (`ResumeCallback`).
    With an optimizer built with `use_ema=True` they hold the moving averages of the weights
    (`averaged_weights`).

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
        local_files.gfile().makedirs(self.directory)
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


class ResumeCallback(RunStateCallback):
    """What every engine's resume state does in `fit` (`training.engines`: a TensorFlow
    checkpoint, or an npz file on JAX): its state (the model's and the optimizer's variables and
    the run state) is written every `every` optimizer steps, at the end of training, and on a
    stop (`StopOnSignal` calls `save`); never twice for one step, never at step 0, never once
    the workdir's lock is lost (`lock.fence`).

    With EMA (`train.ema_momentum`), Keras's `fit` ends by putting the averages in place of
    the weights (`finalize_variable_values`) before `on_train_end`: the state is saved first,
    so that it holds the trained weights a resumed run goes on from.

    A subclass writes (`write(step)`, into `directory`) and restores (`restore()`: the data
    position, the run state set from the state).

    Args:
        model: the compiled model, its optimizer built.
        directory: where the states are written.
        every: optimizer steps between states.
        run_state: the run's `RunState`, shared with `StopAtStep` and `StopOnSignal` (None:
            one of its own).
        before_save: callables `step -> None` called before each state is written.
    """

    def __init__(self, model, directory, every, run_state=None, before_save=()):
        super().__init__(run_state)
        self.write_directory = directory
        self.every = int(every)
        self.before_save = list(before_save)
        self.iterator_restored = False  # the data iterator came back with the state
        self.set_model(model)

    @property
    def batches(self):
        """The data position: batches consumed (the run state's)."""
        return self.run_state.batches

    def set_model(self, model):
        super().set_model(model)
        self._last_saved = optimizer_step(model)

    def restore(self):
        raise NotImplementedError

    def write(self, step):
        raise NotImplementedError

    def save(self):
        step = optimizer_step(self.model)
        if step == self._last_saved or step == 0:
            return
        fence(self.write_directory, "the resume state")  # not once the lock is lost
        for save in self.before_save:
            save(step)
        self.write(step)
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
            finalize = optimizer.finalize_variable_values

            def save_then_finalize(var_list):
                self.save()
                return finalize(var_list)

            optimizer.finalize_variable_values = save_then_finalize

    def on_train_end(self, logs=None):
        vars(self.model.optimizer).pop("finalize_variable_values", None)
        self.save()


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
        self._writer = self._summary = None
        self._last_time = None
        self._last_sums = {}  # metric name -> (total, count) at the last write

    def _get_writer(self):
        if self._writer is None:
            self._summary = tensorboard()
            if self._summary is None:
                return None
            self._writer = self._summary.create_file_writer(os.path.join(self.logdir, "train"))
        return self._writer

    def on_epoch_begin(self, epoch, logs=None):
        # Keras resets the metrics at each epoch: the sums restart from zero.
        self._last_time = time.perf_counter()
        self._last_sums = {}

    def _window_means(self):
        """`{name: mean since the last write}` and the tokens counted since then."""
        from keras_transformer.training.recipe.metrics import Perplexity, TokenCount

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
        writer = self._get_writer()
        if writer is not None:
            with writer.as_default(step=step):
                for key in ("loss", "accuracy", "perplexity"):
                    if key in means:
                        self._summary.scalar(key, means[key])
                self._summary.scalar("learning_rate", learning_rate)
                if speed is not None:
                    self._summary.scalar("tokens_per_second", speed)
            writer.flush()
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
