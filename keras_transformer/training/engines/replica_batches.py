"""Training batches for the replicas of one machine, drawn from an iterator a checkpoint can save.

TensorFlow's distributed iterators (`iter(strategy.experimental_distribute_dataset(...))`)
cannot be saved in a checkpoint: their multi-device prefetching buffers have no saved form
(tensorflow/tensorflow#24408, #56372). `ReplicaBatches` puts a plain `tf.data` iterator of
global batches in their place (which `tf.train.Checkpoint` saves with its file offsets, shuffle
buffer and partial buckets) and splits each global batch into one equal, contiguous share per
replica, as `experimental_distribute_dataset` splits it. So a resume under MirroredStrategy
restores the iterator instead of reading the batches before its position.
"""

import tensorflow as tf


class ReplicaBatches:
    """Per-replica batches for `model.fit` under a one-worker multi-replica strategy.

    `iterator` is the `tf.data` iterator of global batches to save with the resume state (it
    yields exactly the batches handed to training: nothing reads ahead of it but its own
    pipeline, whose buffers its checkpoint holds). `as_dataset()` is what `fit` takes: a
    distributed dataset whose iterator is this object. Keras's `fit` makes an iterator twice (one
    batch for its symbolic build, then one for training): each new one continues at the data
    position (`position()`), handing out again a batch that was taken but not trained on.

    Args:
        strategy: a `MirroredStrategy` (one worker).
        dataset: the global batches, each a multiple of the replicas in size.
        position: `() -> int`, the batches trained so far (the run state's data position).
        start: the data position of `dataset`'s first batch.
    """

    def __init__(self, strategy, dataset, position, start=0):
        self.strategy = strategy
        self.position = position
        self.reset(dataset, start)

    def reset(self, dataset, start):
        """Draws from `dataset` from now on, whose first batch is batch `start` of the run."""
        self.dataset = dataset
        self.iterator = iter(dataset)
        self.reset_position(start)

    def reset_position(self, position):
        """`iterator` was restored (or made) at data position `position`."""
        self._pulled = position  # the data position of the iterator's next batch
        self._next = position  # the data position of the batch handed out next
        self._last = None  # (position, per-replica batch) of the last batch pulled

    def __iter__(self):
        return self

    def __next__(self):
        index = self._next
        if self._last is not None and self._last[0] == index:
            value = self._last[1]
        elif index == self._pulled:
            value = self._split(next(self.iterator))
            self._last = (index, value)
            self._pulled += 1
        else:
            raise RuntimeError(f"batch {index} was asked for; the data is at {self._pulled}")
        self._next += 1
        return value

    def _split(self, batch):
        """One global batch as a per-replica value: replica i gets the i-th of equal slices."""
        count = self.strategy.num_replicas_in_sync
        flat = tf.nest.flatten(batch)
        slices = [tf.split(tensor, count) for tensor in flat]

        def share(context):
            index = context.replica_id_in_sync_group
            return tf.nest.pack_sequence_as(batch, [pieces[index] for pieces in slices])

        return self.strategy.experimental_distribute_values_from_function(share)

    def restart(self):
        """An iterator continuing at the data position (`fit` calls `iter` on the dataset)."""
        self._next = self.position()
        return self

    def as_dataset(self):
        """The distributed dataset `fit` takes, iterated through this object."""
        distributed = self.strategy.experimental_distribute_dataset(self.dataset)
        return iterated_from(distributed, self.restart)


def iterated_from(dataset, make_iterator):
    """`dataset` (a `tf.data.Dataset` or a distributed dataset), changed in place so that
    `iter(dataset)` returns `make_iterator()`: Keras's `fit` then draws its batches from an
    iterator of ours (one a checkpoint saves) while it still sees the dataset's own type and
    element spec."""

    class Resumed(type(dataset)):
        """The dataset, iterated from `make_iterator()` (Keras's `fit` calls `iter` on it)."""

        def __iter__(self):
            return make_iterator()

    dataset.__class__ = Resumed
    return dataset
