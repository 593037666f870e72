"""The JAX engine (`KERAS_BACKEND=jax`): numpy batches, an npz resume state, and
`keras.distribution.DataParallel` over every local device; no TensorFlow needed once the data is
prepared.

The run (`training.run`) is the TensorFlow engine's: the same workdir, lock, stop on SIGTERM or
a lost lock, step limit, time budget and end reserve, step checkpoints, dev evaluation, EMA,
TensorBoard scalars (written with `tf.summary` where TensorFlow is installed), `train.init_from`,
the final model's choice on dev, the scoring and `result.json`. What is this engine's own:

- the batches are numpy (`data.records`: the prepared TFRecord shards read in plain Python), in
  the same order on every run with the same seed, so a resume starts them at its data position;
- the resume state is `backup/state-<step>.npz` (`NpzResumeState`: every model variable,
  dropout's seed states included, every optimizer variable, the data position and the seconds
  trained), so a run killed at any point and run again ends with the weights of an
  uninterrupted run;
- with several local devices the model trains under `keras.distribution.DataParallel` over all
  of them; as on TensorFlow, `data.tokens_per_batch` is per device and micro-batch.

What needs TensorFlow is not here: tf.distribute strategies (multi-worker, TPUStrategy),
`runtime.mixed_precision: auto` (timed under the strategy) and the SavedModel itself (export the
workdir with `keras-transformer export --workdir ...` on TensorFlow). Not here either: a
learning rate that decays with the time budget (`train.schedule` other than `rsqrt` with
`train.max_minutes`): Keras's JAX step does not see a variable set between steps.
"""

import contextlib
import io
import os

import keras
import numpy as np

from keras_transformer.errors import UsageError
from keras_transformer.training.run.callbacks import ResumeCallback
from keras_transformer.training.run.run_state import optimizer_step
from keras_transformer.workdir import write_atomically

STATE_PREFIX, STATE_SUFFIX = "state-", ".npz"


def check_supported(config):
    """Refuses, in one line, what needs TensorFlow (see the module)."""
    runtime, t = config.runtime, config.train
    problems = []
    if t.max_minutes is not None and t.schedule != "rsqrt":
        # Keras's JAX step carries the optimizer's state through `fit`: a schedule variable set
        # between steps (`RunState`) is not seen inside it, so the decay could not follow time.
        problems.append(f"train.schedule: {t.schedule} with train.max_minutes (decay by time)")
    if runtime.mixed_precision == "auto":
        problems.append("runtime.mixed_precision: auto (name float32 or mixed_bfloat16)")
    if runtime.strategy not in ("auto", "default", "mirrored"):
        problems.append(f"runtime.strategy: {runtime.strategy}")
    if problems:
        raise UsageError(
            "on the JAX backend, not supported: " + "; ".join(problems)
            + " (train with the TensorFlow backend for these)"
        )  # fmt: skip


class _Devices:
    """What the run asks of a strategy: where to build the model (`scope`) and over how many
    replicas a step's batch is split (`num_replicas_in_sync`)."""

    def __init__(self, count):
        self.num_replicas_in_sync = count

    def scope(self):
        return contextlib.nullcontext()


class JaxEngine:
    """The engine of `training.engines` on Keras's JAX backend (see the module)."""

    backend = "jax"
    several_workers = False
    chief = True
    exports = False  # the SavedModel needs TensorFlow: `keras-transformer export --workdir`

    def __init__(self, runtime):
        devices = keras.distribution.list_devices()
        if len(devices) > 1:
            keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
        self.strategy = _Devices(len(devices))
        self.strategy_name = "DataParallel" if len(devices) > 1 else "one device"

    def heartbeat(self, path):
        return contextlib.nullcontext()

    def agreement(self):
        return float

    def any_worker(self):
        return bool

    def lost_peers(self, error):
        return False

    def jit_compile(self, value):
        """Keras compiles the train step with XLA on JAX whatever `runtime.jit_compile` says."""
        return True

    def backup_directory(self, backup):
        return contextlib.nullcontext(backup)

    def prepare(self, config, layout):
        """The workdir's prepared shards (`data.prepare` where TensorFlow, which writes them, is
        installed); without TensorFlow they must be there (`keras-transformer prepare` on a
        machine with it). Returns the manifest."""
        try:
            import tensorflow  # noqa: F401
        except ImportError:
            from keras_transformer.data.prepare import check_prepared

            manifest = check_prepared(config)
            if manifest is None:
                raise UsageError(
                    f"no prepared data in {layout.prepared}: without TensorFlow, run "
                    "`keras-transformer prepare` on a machine with it and copy the workdir"
                ) from None
            return manifest
        from keras_transformer.data.prepare import prepare

        return prepare(config)

    def batches(self, data, position):
        """The (deterministic, endless) numpy batches from data position `position` on:
        `data.tokens_per_batch` x devices x accumulation tokens each (rows a multiple of
        devices x accumulation)."""
        from keras_transformer.data.records import numpy_batches, prepared_pairs

        share = self.strategy.num_replicas_in_sync * data.accumulation
        d = data.data_config
        return numpy_batches(
            prepared_pairs(data.prepared), d, seed=data.seed, start=position,
            tokens_per_batch=d.tokens_per_batch * share, batch_multiple=share,
        )  # fmt: skip

    def restore(self, model, data, run_state, backup, every, keep, write_directory):
        """`(resume, batches)`: the resume state (`NpzResumeState`), restored, and the batches
        from its data position."""
        resume = NpzResumeState(model, backup, every, keep, run_state=run_state)
        position = resume.restore()
        return resume, self.batches(data, position)

    @staticmethod
    def has_resume_state(directory):
        return bool(state_files(directory))


def state_files(directory):
    """`[(step, path)]` of the npz resume states in `directory`, oldest first."""
    if not os.path.isdir(directory):
        return []
    names = [
        n for n in os.listdir(directory) if n.startswith(STATE_PREFIX) and n.endswith(STATE_SUFFIX)
    ]
    steps = [(n[len(STATE_PREFIX) : -len(STATE_SUFFIX)], n) for n in names]
    return sorted((int(s), os.path.join(directory, n)) for s, n in steps if s.isdigit())


class NpzResumeState(ResumeCallback):
    """The JAX engine's resume state: `directory/state-<step>.npz` (written whole or not at
    all), holding every variable of the model and of its optimizer by position, the data
    position and the seconds trained; the last `keep` are kept. What it does in `fit` is
    `run.callbacks.ResumeCallback`'s.

    Example:
    ```python
    resume = NpzResumeState(model, Workdir(root).backup, every=1000, keep=2)
    position = resume.restore()  # 0 without a state
    model.fit(batches_from(position), callbacks=[resume, ...])
    ```
    """

    def __init__(self, model, directory, every, keep, run_state=None):
        super().__init__(model, directory, every, run_state)
        self.directory = directory
        self.keep = int(keep)

    def write(self, step):
        model = self.model
        arrays = {f"m{i}": np.asarray(v.numpy()) for i, v in enumerate(model.variables)}
        optimizer = model.optimizer.variables
        arrays.update({f"o{i}": np.asarray(v.numpy()) for i, v in enumerate(optimizer)})
        buffer = io.BytesIO()
        np.savez(
            buffer,
            position=np.int64(self.run_state.batches),
            seconds=np.float64(self.run_state.elapsed),
            **arrays,
        )
        path = os.path.join(self.directory, f"{STATE_PREFIX}{step}{STATE_SUFFIX}")
        write_atomically(path, buffer.getvalue())
        for _, old in state_files(self.directory)[: -self.keep]:
            os.remove(old)

    def restore(self):
        """Restores the last state into the model (built and compiled) and the run state;
        returns the data position (0 without a state)."""
        states = state_files(self.directory)
        if not states:
            return 0
        model = self.model
        with np.load(states[-1][1]) as saved:
            for prefix, variables in (("m", model.variables), ("o", model.optimizer.variables)):
                for i, v in enumerate(variables):
                    v.assign(saved[f"{prefix}{i}"])
            seconds = float(saved["seconds"]) if "seconds" in saved else 0.0
            self.run_state.restored(seconds, int(saved["position"]))
        self._last_saved = optimizer_step(model)
        print(f"resumed from step {self._last_saved} ({states[-1][1]})", flush=True)
        return self.batches
