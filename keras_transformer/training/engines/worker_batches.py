"""Training batches under several workers, from an iterator each worker saves beside the resume
state.

Under MultiWorkerMirroredStrategy each worker reads its own shards (`prepared_dataset` with its
`tf.distribute.InputContext`), so each has its own data position in its own files: a resume that
does not read the batches before its position needs each worker's `tf.data` iterator state.
TensorFlow's distributed iterators cannot be saved (see `replica_batches`), so `WorkerBatches`
puts a plain iterator of the worker's dataset in their place and `IteratorBackup` writes its
state into the workdir at the steps of the resume state (`WORKDIR/backup/data-worker-K/`, one
directory per worker: only the chief's resume state is kept in the workdir).
"""

import dataclasses
import json
import os
import re

import tensorflow as tf

from keras_transformer.training.engines.replica_batches import iterated_from
from keras_transformer.training.engines.tf_state import _first_line
from keras_transformer.workdir import read_text, write_atomically


@dataclasses.dataclass
class WorkerInput:
    """This worker's training input from global step `start` on: `dataset`, its per-replica
    batches (read through its `context`), and `distributed`, the same made by
    `strategy.distribute_datasets_from_function` (the `tf.distribute.DistributedDataset` that
    Keras's `fit` takes; `WorkerBatches` iterates it)."""

    distributed: object
    dataset: object
    context: object
    start: int = 0

    @property
    def local_replicas(self):
        """The replicas of this worker (its GPUs; one on a CPU)."""
        return self.context.num_replicas_in_sync // self.context.num_input_pipelines

    @property
    def worker(self):
        """This worker's input pipeline (the index of its files among the workers')."""
        return self.context.input_pipeline_id


class WorkerBatches(tf.distribute.DistributedIterator):
    """Per-replica batches for `model.fit` under MultiWorkerMirroredStrategy, drawn inside the
    train function from `iterator`, a plain `tf.data` iterator of this worker's dataset, which
    `IteratorBackup` saves.

    Each step takes the next `local_replicas` batches of the worker's dataset and gives the
    i-th to the worker's i-th replica: what the iterator of
    `strategy.distribute_datasets_from_function` hands out (its elements go to the local
    devices in turn), so training sees the same batches either way. Batches are taken in the
    train function's graph (`get_next`), as from TensorFlow's own distributed iterator: every
    worker traces that function once whatever its batch shapes (a worker tracing again while
    the others do not would pair the wrong collectives). Outside a function, `next()` gives the
    batches' structure (their `tf.TensorSpec`s) and reads nothing: Keras takes one batch for its
    symbolic build before training.

    Args:
        strategy: a `MultiWorkerMirroredStrategy` (or, one worker, a `MirroredStrategy` with its
            dataset made by `distribute_datasets_from_function`).
        worker_input: a `WorkerInput`.
    """

    def __init__(self, strategy, worker_input):
        self.strategy = strategy
        self.reset(worker_input)

    def reset(self, worker_input):
        """Draws from `worker_input` (a `WorkerInput`) from now on, with a new iterator. Call it
        before `fit` traces its train function (which holds the iterator it found)."""
        self.input = worker_input
        self.iterator = iter(worker_input.dataset)

    @property
    def element_spec(self):
        """The spec of one replica's batch."""
        return self.input.dataset.element_spec

    def get_next(self):
        """The next step's batches, one per local replica (a per-replica value)."""
        local = self.input.local_replicas
        batches = [self.iterator.get_next() for _ in range(local)]

        def batch(context):
            return batches[context.replica_id_in_sync_group % local]

        return self.strategy.experimental_distribute_values_from_function(batch)

    def get_next_as_optional(self):
        """`get_next()` as a `tf.experimental.Optional` (the data is endless)."""
        return tf.experimental.Optional.from_value(self.get_next())

    def __iter__(self):
        return self

    def __next__(self):
        return self.element_spec

    def as_dataset(self):
        """The distributed dataset `fit` takes, iterated through this object."""
        return iterated_from(self.input.distributed, lambda: self)


class IteratorBackup:
    """One worker's data iterator (a `WorkerBatches`'), saved at the steps of the resume state
    in a directory of its own, the last `keep` kept; restored at the step the resume state was
    restored at.

    A state is `ckpt-STEP` (`tf.train.Checkpoint(data_iterator=...).write`, a local write, no
    collective) and then, last, `ckpt-STEP.json` (written whole or not at all), which names the
    data position, the workers and the step the worker's dataset started at: a state without
    it is torn and is not used. Any filesystem (`gs://...`).

    Args:
        directory: this worker's directory (`WORKDIR/backup/data-worker-K`).
        batches: the `WorkerBatches`.
        keep: states kept (`train.keep_backups`).
        position: `() -> int`, the data position (the run state's).
        worker_input: `start -> WorkerInput`, the worker's input from global step `start` on.

    Example:
    ```python
    backup = IteratorBackup(directory, batches, 2, lambda: run_state.batches, data.worker_input)
    resume = ResumeState(model, Workdir(root).backup, 1000, 2, before_save=[backup.save])
    restored = backup.restore(step, resume.restore())
    ```
    """

    def __init__(self, directory, batches, keep, position, worker_input):
        self.directory = directory
        self.batches = batches
        self.keep = int(keep)
        self.position = position
        self.worker_input = worker_input

    def prefix(self, step):
        return os.path.join(self.directory, f"ckpt-{int(step)}")

    def _facts(self):
        context = self.batches.input.context
        return {
            "data_position": int(self.position()),
            "workers": context.num_input_pipelines,
            "worker": context.input_pipeline_id,
            "start": int(self.batches.input.start),
        }

    def save(self, step):
        """Writes the iterator's state as of `step`, then prunes (see the class docstring)."""
        prefix = self.prefix(step)
        tf.io.gfile.makedirs(self.directory)
        tf.train.Checkpoint(data_iterator=self.batches.iterator).write(prefix)
        write_atomically(prefix + ".json", json.dumps(self._facts(), sort_keys=True))
        self._prune(step)

    def _steps(self):
        """`{step: [paths]}` of every file of a state in the directory (torn ones too)."""
        found = {}
        for path in tf.io.gfile.glob(os.path.join(self.directory, "ckpt-*")):
            match = re.search(r"ckpt-(\d+)\.", os.path.basename(path))
            if match:
                found.setdefault(int(match.group(1)), []).append(path)
        return found

    def _prune(self, step):
        """Keeps the last `keep` states up to `step`; those after it (a killed run's, which its
        resume state never reached) go too."""
        found = self._steps()
        kept = sorted(s for s in found if s <= step)[-self.keep :]
        for old, paths in found.items():
            if old in kept:
                continue
            for path in sorted(paths, key=lambda p: not p.endswith(".json")):  # marker first
                try:
                    tf.io.gfile.remove(path)
                except tf.errors.NotFoundError:
                    pass

    def restore(self, step, position):
        """Restores the iterator saved at `step` (where the resume state was restored, at data
        position `position`); prints one line saying whether it did. Returns False when there
        is none, or it is torn or of another data position or number of workers: the caller
        then skips to the data position (reading the batches before it)."""
        prefix = self.prefix(step)
        worker = self.batches.input.worker
        try:
            facts = json.loads(read_text(prefix + ".json"))
            expected = self._facts()
            expected["data_position"] = int(position)
            for key in ("data_position", "workers", "worker"):
                if facts.get(key) != expected[key]:
                    raise ValueError(f"{key} {facts.get(key)}, not {expected[key]}")
            if facts["start"] != self.batches.input.start:
                self.batches.reset(self.worker_input(facts["start"]))
            checkpoint = tf.train.Checkpoint(data_iterator=self.batches.iterator)
            checkpoint.read(prefix).assert_existing_objects_matched()
        except Exception as e:  # none (an older workdir), torn, or another run's
            print(
                f"worker {worker}: no usable data iterator at step {step} in {self.directory} "
                f"({_first_line(e)}); skipping {position} batches to the data position",
                flush=True,
            )
            return False
        print(f"worker {worker}: data iterator restored at step {step} ({prefix})", flush=True)
        return True
