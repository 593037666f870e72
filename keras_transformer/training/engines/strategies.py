"""The TensorFlow engine: the run's `tf.distribute` strategy as one input object per kind, chosen
once.

`strategy_input(strategy)` takes the strategy `distribute.get_strategy` made and returns the
object that answers every question the run (`training.run`) asks of its engine
(`training.engines`):

- the default strategy (one device), `DefaultInput`: `fit` draws from the `tf.data` iterator of
  the global batches, which the resume state saves;
- `MirroredStrategy` (one worker, several replicas), `MirroredInput`: a `ReplicaBatches` over
  it, whose plain iterator the resume state saves (TensorFlow's distributed iterators cannot
  be saved), and which splits each global batch between the replicas as Keras's own
  distribution of the dataset would;
- `MultiWorkerMirroredStrategy` (several workers), `MultiWorkerInput`: a `WorkerBatches` over
  this worker's own shards, whose iterator each worker saves in `WORKDIR/backup/data-worker-K`
  at the steps of the resume state (`IteratorBackup`: only the chief's resume state is kept in
  the workdir);
- `TPUStrategy` (and any other), `TPUInput`: `fit` makes its own iterator, and the data
  position is found by skipping, which reads the batches before it.

Each has `batches` (the global batches from a data position), `iterate` (the batches and what
`fit` draws them from), `restore` (the resume state, restored, and what `fit` trains on from its
position), the agreements of the workers (`agreement`: the chief's value; `any_worker`: whether
any worker's flag is up), the chief's `heartbeat` while it prepares, and `lost_peers` (whether a
failed collective means a worker is gone). This is the one module of the package that looks at a
strategy's type (`tests/test_structure.py` checks it); `models/_train_step.py`, below the
training level, asks the strategy itself (`extended._in_multi_worker_mode()`, which this module's
choice also reads).
"""

import contextlib
import functools
import os

import tensorflow as tf

from keras_transformer.training.engines.distribute import (
    Heartbeat,
    WorkerTempDir,
    is_chief,
    wait_for_path,
)
from keras_transformer.training.engines.replica_batches import ReplicaBatches, iterated_from
from keras_transformer.training.engines.tf_state import ResumeState, has_resume_state
from keras_transformer.training.engines.worker_batches import (
    IteratorBackup,
    WorkerBatches,
    WorkerInput,
)
from keras_transformer.training.run.run_state import optimizer_step


def strategy_input(strategy):
    """The input object of `strategy` (see the module): chosen here, once per run."""
    if strategy is tf.distribute.get_strategy():
        return DefaultInput(strategy)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        if strategy.extended._in_multi_worker_mode():
            return MultiWorkerInput(strategy)
    elif isinstance(strategy, tf.distribute.MirroredStrategy):
        return MirroredInput(strategy)
    return TPUInput(strategy)  # TPUStrategy, a one-worker MultiWorkerMirroredStrategy


def device_kind(strategy=None):
    """'tpu', 'gpu' or 'cpu': the kind of device the replicas run on."""
    if strategy is not None and type(strategy).__name__.startswith("TPUStrategy"):
        return "tpu"
    if tf.config.list_logical_devices("TPU"):
        return "tpu"
    if tf.config.list_logical_devices("GPU"):
        return "gpu"
    return "cpu"


def resolve_jit_compile(value, strategy=None):
    """`runtime.jit_compile` as a bool: `auto` compiles with XLA on GPUs and TPUs only.

    On CPUs XLA does not pay: measured on a 2-core CPU with the quickstart model, steps were
    slower with XLA than without, after a long compile of each bucket shape (the figures are in
    docs/guides/performance.md); so `auto` leaves it off there.
    """
    if value == "auto":
        return device_kind(strategy) in ("gpu", "tpu")
    return bool(value)


class DefaultInput:
    """The default strategy (one device): `fit` draws from the `tf.data` iterator of the global
    batches, which the resume state saves. The other kinds change what differs from it.

    `data` (in the methods) is the run's `TrainingData`: `shards(data, multiple)` makes the
    prepared batches of `multiple` shares of `data.tokens_per_batch`, and `data.accumulation`
    is `train.gradient_accumulation_steps` (each replica's share splits into that many
    micro-batches).
    """

    backend = "tensorflow"
    #: Several workers (processes) train together: the end's estimate is not made
    #: (`end_reserve.estimates`).
    several_workers = False
    exports = True  # the final model is exported as a SavedModel at the end of the run
    decodes_while_training = True  # the chief's dev evaluation after each epoch

    def __init__(self, strategy):
        self.strategy = strategy
        self.chief = is_chief(strategy)  # the worker that writes (the only one but under several)
        self.strategy_name = type(strategy).__name__

    def jit_compile(self, value):
        """`runtime.jit_compile` as a bool for this strategy's devices."""
        return resolve_jit_compile(value, self.strategy)

    def backup_directory(self, backup):
        """The context giving where this worker writes its resume states: `backup` for the
        chief, a temporary directory of its own for another worker (`WorkerTempDir`)."""
        return WorkerTempDir(self.chief, backup)

    def prepare(self, config, layout):
        """The chief's preparation of the data (`data.prepare`); returns the manifest."""
        from keras_transformer.data import prepare

        return prepare(config)

    def wait_for_prepared(self, config, layout, heartbeat):
        """Another worker's: waits for the chief's prepared data (seeing its `heartbeat`);
        returns the manifest."""
        from keras_transformer.data.prepare import MANIFEST, check_prepared, read_manifest

        wait_for_path(
            os.path.join(layout.prepared, MANIFEST),
            config.runtime.wait_seconds,
            "prepared data",
            heartbeat=heartbeat,
        )
        return check_prepared(config, read_manifest(layout.prepared), repair=False)

    has_resume_state = staticmethod(has_resume_state)

    @staticmethod
    def shards(data, multiple, **kwargs):
        """The prepared batches (`data.prepared_dataset`) of `multiple` shares of
        `data.tokens_per_batch`, their sizes a multiple of `multiple`."""
        from keras_transformer.data import prepared_dataset

        d = data.data_config
        return prepared_dataset(
            data.prepared, d, training=True, tokens_per_batch=d.tokens_per_batch * multiple,
            batch_multiple=multiple, **kwargs,
        )  # fmt: skip

    def first_batches(self, data, count=3):
        """A few batches of one replica, for the precision's timing."""
        return list(self.shards(data, data.accumulation, verbose=False).take(count))

    def heartbeat(self, path):
        """The context around the chief's `prepare`: nobody waits for it under one process."""
        return contextlib.nullcontext()

    def agreement(self):
        """`value -> float`, called by every worker at the same point, giving the chief's value
        everywhere: under one process, the value itself at no cost."""
        return float

    def any_worker(self):
        """`flag -> bool`, called by every worker after each step: True on all of them when any
        worker's flag is; under one process, the flag itself."""
        return bool

    def lost_peers(self, error):
        """Whether `error` (a failed `fit`) means a worker disappeared: never under one."""
        return False

    def end_training(self):
        """After `fit`, on every worker: nothing to do on TensorFlow."""

    def batches(self, data, position):
        """The (deterministic, endless) global batches from global step `position` on: data
        .tokens_per_batch x replicas x accumulation tokens each."""
        share = self.strategy.num_replicas_in_sync * data.accumulation
        return self.shards(data, share).skip(position)

    def iterate(self, data, run_state):
        """`(dataset, feeder)`: the batches from position 0, and what `fit` will draw them
        from."""
        dataset = self.batches(data, 0)
        return dataset, iter(dataset)

    def _saved(self, feeder):
        """The iterator the resume state saves (None: none)."""
        return feeder

    def restore(self, model, data, run_state, backup, every, keep, write_directory):
        """`(resume, batches)`: the resume state (a `ResumeState` kept in `backup`, written to
        `write_directory`, every `every` steps, the last `keep`), restored, and what `fit`
        trains on from its data position."""
        dataset, feeder = self.iterate(data, run_state)
        resume = ResumeState(
            model, backup, every, keep, write_directory=write_directory,
            iterator=self._saved(feeder), run_state=run_state,
        )  # fmt: skip
        position = resume.restore()
        return resume, self.resumed(data, dataset, feeder, position, resume)

    def resumed(self, data, dataset, iterator, position, resume):
        """What `fit` trains on from the restored data `position`: the restored iterator, or
        (a state without one) the batches from `position` on."""
        if position and not resume.iterator_restored:
            dataset = self.batches(data, position)
            iterator = iter(dataset)
            resume.track_iterator(iterator)
        return iterated_from(dataset, lambda: iterator)


class MirroredInput(DefaultInput):
    """`MirroredStrategy` (one worker, several replicas): a `ReplicaBatches` over the iterator of
    the global batches, whose plain `tf.data` iterator the resume state saves."""

    def iterate(self, data, run_state):
        dataset = self.batches(data, 0)
        return dataset, ReplicaBatches(self.strategy, dataset, lambda: run_state.batches)

    def _saved(self, feeder):
        return feeder.iterator

    def resumed(self, data, dataset, feeder, position, resume):
        if position and not resume.iterator_restored:
            feeder.reset(self.batches(data, position), position)
            resume.track_iterator(feeder.iterator)
        feeder.reset_position(position)
        return feeder.as_dataset()


class TPUInput(DefaultInput):
    """`TPUStrategy` (and a strategy the others do not cover): `fit` makes its own iterator of
    the batches from the data position, which it finds by skipping."""

    def iterate(self, data, run_state):
        return None, None

    def _saved(self, feeder):
        return None

    def resumed(self, data, dataset, feeder, position, resume):
        return self.batches(data, position)


class MultiWorkerInput(DefaultInput):
    """`MultiWorkerMirroredStrategy` over several workers: each reads its own shards (every
    num_workers-th file) into a `WorkerBatches`, and saves its iterator beside the resume state
    (`IteratorBackup`, before the state) and restores it at the restored step."""

    several_workers = True

    def heartbeat(self, path):
        """Workers waiting for the prepared data see that the chief is alive."""
        return Heartbeat(path)

    def agreement(self):
        """An all-reduce in which only the first replica, the chief's, contributes: only the
        chief's clock counts for the time budget, so every worker stops after the same step
        (not at its own moment, which would leave the others waiting in the next all-reduce)
        with the same budget-aware learning rate."""
        strategy = self.strategy

        @tf.function
        def chief_value(value):
            def replica_fn():
                context = tf.distribute.get_replica_context()
                first = tf.equal(context.replica_id_in_sync_group, 0)
                # A copy on this replica's device (the collective needs one to reduce onto).
                local = tf.where(first, tf.identity(value), tf.zeros_like(value))
                return context.all_reduce(tf.distribute.ReduceOp.SUM, local)

            return strategy.run(replica_fn)

        def agree(value):
            total = chief_value(tf.constant(float(value), tf.float64))
            return float(strategy.experimental_local_results(total)[0])

        return agree

    def any_worker(self):
        """One all-reduce of the workers' flags per call."""
        strategy = self.strategy

        @tf.function
        def total(flag):
            def replica_fn():
                context = tf.distribute.get_replica_context()
                return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(flag))

            return strategy.run(replica_fn)

        def any_worker(flag):
            summed = total(tf.constant(1.0 if flag else 0.0, tf.float32))
            return float(strategy.experimental_local_results(summed)[0]) > 0

        return any_worker

    def lost_peers(self, error):
        """A collective that timed out or was aborted because a worker disappeared."""
        if not isinstance(error, tf.errors.OpError):
            return False
        lost = (
            tf.errors.DeadlineExceededError,
            tf.errors.UnavailableError,
            tf.errors.CancelledError,
            tf.errors.AbortedError,
        )
        if isinstance(error, lost):
            return True
        message = str(error).lower()
        return "collective" in message or "peer" in message or "heartbeat" in message

    def worker_input(self, data, position):
        """This worker's `WorkerInput` from global step `position` on: its own shards for its
        replicas (`shards(input_context=...)` makes the per-replica batches); a global step takes
        one batch for each replica."""
        shards = functools.partial(self.shards, data, data.accumulation, verbose=False)
        made = []

        def per_worker(context):
            local_replicas = context.num_replicas_in_sync // context.num_input_pipelines
            made.append((shards(input_context=context).skip(position * local_replicas), context))
            return made[-1][0]

        distributed = self.strategy.distribute_datasets_from_function(per_worker)
        return WorkerInput(distributed, *made[-1], start=position)

    def batches(self, data, position):
        return self.worker_input(data, position).distributed

    def iterate(self, data, run_state):
        feeder = WorkerBatches(self.strategy, self.worker_input(data, 0))
        return feeder.input.distributed, feeder

    def restore(self, model, data, run_state, backup, every, keep, write_directory):
        dataset, feeder = self.iterate(data, run_state)
        iterator_backup = IteratorBackup(
            os.path.join(backup, f"data-worker-{feeder.input.worker}"),
            feeder, keep, lambda: run_state.batches, functools.partial(self.worker_input, data),
        )  # fmt: skip
        resume = ResumeState(
            model, backup, every, keep, write_directory=write_directory, run_state=run_state,
            before_save=[iterator_backup.save],  # each worker's iterator, beside the state
        )  # fmt: skip
        position = resume.restore()
        if position:
            resume.iterator_restored = iterator_backup.restore(optimizer_step(model), position)
        return resume, self.resumed(data, dataset, feeder, position, resume)

    def resumed(self, data, dataset, feeder, position, resume):
        if position and not resume.iterator_restored:
            feeder.reset(self.worker_input(data, position))
        return feeder.as_dataset()
