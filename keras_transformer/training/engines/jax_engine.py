"""The JAX engine (`KERAS_BACKEND=jax`): numpy batches, an npz resume state, and
`keras.distribution.DataParallel` over every device of every process; no TensorFlow needed once
the data is prepared.

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
- with several devices the model trains under `keras.distribution.DataParallel` over all
  of them; as on TensorFlow, `data.tokens_per_batch` is per device and micro-batch;
- several processes (hosts): `runtime.strategy: multi_worker` (or `auto` with
  `KERAS_DISTRIBUTION_NUM_PROCESSES` above 1) joins them with `keras.distribution.initialize()`,
  whose cluster comes from Keras's `KERAS_DISTRIBUTION_JOB_ADDRESSES` (the coordinator, process
  0, first), `KERAS_DISTRIBUTION_NUM_PROCESSES` and `KERAS_DISTRIBUTION_PROCESS_ID`, or, without
  them, from JAX's own detection (SLURM, Open MPI, Cloud TPU). Every process reads the same
  global batches and feeds its own rows of each (`DataParallel` averages the gradients over all
  devices), so the weights stay equal everywhere and equal those of one process over the same
  devices; only process 0, the chief, writes the workdir (the others keep their resume states
  in a temporary directory); a signal to any process stops all after the same step (one
  all-gather of the flags per step); after training they leave the cluster together and the
  chief ends the run alone. Not under several processes: the dev evaluation while training
  (the chief scores its final model at the end; `train.keep_best` and the end's estimate need
  it).

What needs TensorFlow is not here: tf.distribute strategies (MultiWorkerMirrored, TPUStrategy),
`runtime.mixed_precision: auto` (timed under the strategy) and the SavedModel itself (export the
workdir with `keras-transformer export --workdir ...` on TensorFlow). Not here either: a
learning rate that decays with the time budget (`train.schedule` other than `rsqrt` with
`train.max_minutes`): Keras's JAX step does not see a variable set between steps.
"""

import contextlib
import io
import os
import tempfile

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
    if runtime.strategy not in ("auto", "default", "mirrored", "multi_worker"):
        problems.append(f"runtime.strategy: {runtime.strategy}")
    if t.keep_best and several_processes(runtime):
        problems.append("train.keep_best under several processes (no dev evaluation in training)")
    if problems:
        raise UsageError(
            "on the JAX backend, not supported: " + "; ".join(problems)
            + " (train with the TensorFlow backend for these)"
        )  # fmt: skip


NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"


def several_processes(runtime):
    """Whether the `runtime:` section asks for a run over several processes:
    `strategy: multi_worker`, or `auto` with `KERAS_DISTRIBUTION_NUM_PROCESSES` above 1."""
    if runtime.strategy == "multi_worker":
        return True
    if runtime.strategy != "auto":
        return False
    try:
        return int(os.environ.get(NUM_PROCESSES, "1")) > 1
    except ValueError:
        value = os.environ[NUM_PROCESSES]
        raise UsageError(f"{NUM_PROCESSES} is not a number: {value!r}") from None


def join_processes(runtime):
    """`(index, count)` of this process among the run's processes, joining them first
    (`keras.distribution.initialize()`, once per process) where the `runtime:` section asks
    for several (`several_processes`); `(0, 1)` otherwise. Must come before any computation on
    the JAX backend (`keras-transformer train` calls it before taking the workdir's lock, which
    only process 0 takes)."""
    import jax

    if several_processes(runtime) and not jax.distributed.is_initialized():
        # On CPUs the processes' collectives need an implementation (Gloo is JAX's default
        # from 0.5 on; an older one has none).
        if jax.config.jax_cpu_collectives_implementation in (None, "none"):
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        try:
            keras.distribution.initialize()
        except (ValueError, RuntimeError) as e:
            raise UsageError(
                "runtime.strategy: multi_worker on JAX could not join the processes (set "
                "KERAS_DISTRIBUTION_JOB_ADDRESSES, KERAS_DISTRIBUTION_NUM_PROCESSES and "
                f"KERAS_DISTRIBUTION_PROCESS_ID, or run under SLURM or Open MPI): {e}"
            ) from None
    return jax.process_index(), jax.process_count()


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
    exports = False  # the SavedModel needs TensorFlow: `keras-transformer export --workdir`

    def __init__(self, runtime):
        self.process, self.processes = join_processes(runtime)
        self.chief = self.process == 0
        self.several_workers = self.processes > 1
        # The chief's model is decoded while training only where every device is its own.
        self.decodes_while_training = not self.several_workers
        devices = keras.distribution.list_devices()  # every process's
        if len(devices) > 1:
            # The batches are this process's rows already (`batches`).
            distribution = keras.distribution.DataParallel(
                devices=devices, auto_shard_dataset=False
            )
            keras.distribution.set_distribution(distribution)
        self.strategy = _Devices(len(devices))
        self.strategy_name = "DataParallel" if len(devices) > 1 else "one device"
        if self.several_workers:
            self.strategy_name += f" over {self.processes} processes"
            self.block = _block_of_this_process()

    def heartbeat(self, path):
        """Around the chief's `prepare`, the other processes see that it is alive (where
        TensorFlow, which prepares the data, is installed)."""
        if not self.several_workers or not _has_tensorflow():
            return contextlib.nullcontext()
        from keras_transformer.training.engines.distribute import Heartbeat

        return Heartbeat(path)

    def wait_for_prepared(self, config, layout, heartbeat):
        """Another process's: waits for the chief's prepared data (`runtime.wait_seconds`,
        seeing its heartbeat) and checks it; returns the manifest. Without TensorFlow the data
        was prepared before the run (nothing to wait for)."""
        from keras_transformer.data.prepare import MANIFEST, check_prepared, read_manifest

        if _has_tensorflow():
            from keras_transformer.training.engines.distribute import wait_for_path

            path = os.path.join(layout.prepared, MANIFEST)
            wait_for_path(path, config.runtime.wait_seconds, "prepared data", heartbeat=heartbeat)
            return check_prepared(config, read_manifest(layout.prepared), repair=False)
        manifest = check_prepared(config, repair=False)
        if manifest is None:
            raise UsageError(f"no prepared data in {layout.prepared} (see the chief's error)")
        return manifest

    def agreement(self):
        """`value -> float`: process 0's value on every process (one broadcast)."""
        if not self.several_workers:
            return float
        from jax.experimental import multihost_utils

        def agree(value):
            return float(multihost_utils.broadcast_one_to_all(np.float64(value)))

        return agree

    def any_worker(self):
        """`flag -> bool`: True on every process when any process's flag is (one all-gather
        per call, after each step)."""
        if not self.several_workers:
            return bool
        from jax.experimental import multihost_utils

        def any_worker(flag):
            return bool(np.any(multihost_utils.process_allgather(np.bool_(flag))))

        return any_worker

    def lost_peers(self, error):
        """A collective that failed because another process is gone (its connection reset,
        or the coordination service missing its heartbeats)."""
        if not self.several_workers:
            return False
        message = str(error).lower()
        signs = ("gloo", "connection reset", "heartbeat", "coordination service", "nccl")
        return any(sign in message for sign in signs)

    def end_training(self):
        """After `fit`, on every process: they leave the cluster together (`jax.distributed
        .shutdown`, a barrier), and what comes after (the chief's choice of the final model,
        its scores) runs on this process's devices alone."""
        if not self.several_workers:
            return
        import jax

        keras.distribution.set_distribution(None)
        jax.distributed.shutdown()

    def jit_compile(self, value):
        """Keras compiles the train step with XLA on JAX whatever `runtime.jit_compile` says."""
        return True

    def backup_directory(self, backup):
        """Where this process writes its resume states: `backup` for the chief, a temporary
        directory (removed at the end) for the others."""
        if self.chief:
            return contextlib.nullcontext(backup)
        return tempfile.TemporaryDirectory(prefix=f"keras-transformer-process{self.process}-")

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
        devices x accumulation). Under several processes, every process makes the same global
        batches and gives `fit` its own block of rows of each: the rows `DataParallel` places
        on its devices."""
        from keras_transformer.data.records import numpy_batches, prepared_pairs

        share = self.strategy.num_replicas_in_sync * data.accumulation
        d = data.data_config
        batches = numpy_batches(
            prepared_pairs(data.prepared), d, seed=data.seed, start=position,
            tokens_per_batch=d.tokens_per_batch * share, batch_multiple=share,
        )  # fmt: skip
        if not self.several_workers:
            return batches
        return _rows_of_process(batches, *self.block)

    def restore(self, model, data, run_state, backup, every, keep, write_directory):
        """`(resume, batches)`: the resume state (`NpzResumeState`), restored, and the batches
        from its data position."""
        resume = NpzResumeState(
            model, backup, every, keep, run_state=run_state, write_directory=write_directory
        )
        position = resume.restore()
        return resume, self.batches(data, position)

    @staticmethod
    def has_resume_state(directory):
        return bool(state_files(directory))


def _has_tensorflow():
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return False
    return True


def _block_of_this_process():
    """`(first, count, devices)`: this process's devices are `count` consecutive ones of the
    `devices` of the mesh (`list_devices()`, every process's), from the `first`."""
    import jax

    owners = [device.process_index for device in jax.devices()]
    mine = [i for i, owner in enumerate(owners) if owner == jax.process_index()]
    if mine != list(range(mine[0], mine[0] + len(mine))):
        raise RuntimeError(f"this process's devices are not consecutive in the mesh: {owners}")
    return mine[0], len(mine), len(owners)


def _rows_of_process(batches, first, count, devices):
    """The rows of each global batch of `batches` that `DataParallel` places on this
    process's devices (`_block_of_this_process`): its devices' equal shares."""
    for batch in batches:
        share = len(batch[1]) // devices
        yield keras.tree.map_structure(
            lambda array: array[first * share : (first + count) * share], batch
        )


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

    def __init__(self, model, directory, every, keep, run_state=None, write_directory=None):
        super().__init__(model, write_directory or directory, every, run_state)
        self.directory = directory  # read by `restore`
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
        path = os.path.join(self.write_directory, f"{STATE_PREFIX}{step}{STATE_SUFFIX}")
        write_atomically(path, buffer.getvalue())
        for _, old in state_files(self.write_directory)[: -self.keep]:
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
