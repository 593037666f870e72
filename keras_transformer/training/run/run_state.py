"""The state of one training run that its callbacks share: the step, the clock, the data position.

The step is the optimizer's (`optimizer.iterations`); the clock (seconds trained, across resumes)
and the data position (batches consumed) are two numbers of a `RunState`, saved and restored with
the resume state (each engine's: `training.engines`). Each batch advances them once, whichever
callback comes first: every callback that reads them (`StopAtStep`, the resume state,
`StopOnSignal`) is a `RunStateCallback`, whose `on_train_batch_begin` marks a batch as running and
whose `on_train_batch_end` first calls `RunState.batch_ends()` (the first call of a batch advances,
the others find it done). Keras runs every callback's batch-begin before any batch-end, so the
order of the callbacks in `fit` does not change what any of them sees."""

import time

import keras


def optimizer_step(model):
    """The number of optimizer updates so far (accumulated batches count once)."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def _time_schedule(optimizer):
    """The optimizer's learning-rate schedule when it follows training time, else None."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer
    schedule = getattr(optimizer, "_learning_rate", None)
    if getattr(schedule, "total_seconds", None) is None:
        return None
    return schedule


class RunState:
    """The clock and the data position of a run, advanced once per batch.

    `elapsed` holds the seconds trained so far, counted across resumes: at the start of `fit` it
    holds what the restored resume state said, and after each batch it becomes that plus the
    time since (`timer`). A `BudgetSchedule` of the optimizer follows it. `batches` counts the
    batches consumed (optimizer steps, unless a float16 loss scale skipped non-finite updates,
    which still consumed their batch). Both are plain numbers, on any backend: the engine's
    resume state saves them and puts them back (`restored`).

    Under several workers the time is one decision: with `agree` (the strategy input's
    `agreement()`, `training.engines.strategies`, which returns the value the chief passed), every
    worker takes the chief's seconds after each batch when the time counts (`timed`, or a budget
    schedule), so all stop after the same step and use the same learning rate; only the clock
    of the worker with `keeps_time=True` counts.

    Args:
        timer: the clock function (`time.monotonic`; tests pass their own).
        agree: `seconds -> seconds`, the chief's value on every worker; None: the value itself.
        keeps_time: False on the workers whose clock does not count.

    Example:
    ```python
    run_state = RunState()
    callbacks = [ResumeState(model, backup, 1000, 2, run_state=run_state),
                 StopAtStep(100_000, run_state=run_state)]  # in any order
    ```
    """

    def __init__(self, timer=None, agree=None, keeps_time=True):
        self._elapsed = 0.0
        self._batches = 0
        self.timer = timer or time.monotonic
        self.agree = agree
        self.keeps_time = keeps_time
        self.timed = False  # a time budget: the clock is agreed on after every batch
        # The budget schedule's time runs this much faster than the clock: training stops
        # before the schedule's total_seconds (`end_reserve.EndReserve`) and the decay follows.
        self.schedule_scale = 1.0
        self.model = None
        self._start = None
        self._offset = 0.0
        self._schedule = None
        self._running = False  # a batch has begun and not yet been counted
        self._begun = False  # train_begins ran and no batch has ended since

    @property
    def elapsed(self):
        """Seconds trained so far."""
        return self._elapsed

    @property
    def batches(self):
        """Batches consumed so far (the data position)."""
        return self._batches

    def restored(self, elapsed, batches):
        """The clock and the data position of a restored resume state."""
        self._elapsed, self._batches = float(elapsed), int(batches)

    @property
    def step(self):
        """The optimizer's step."""
        return optimizer_step(self.model)

    def train_begins(self, model):
        """The start of `fit` (the first call of its callbacks' `on_train_begin`; the others
        find it done): the clock continues from what it holds."""
        if self._begun and self.model is model:
            return
        self.model, self._begun = model, True
        self._start = self.timer()
        self._offset = self.elapsed
        self._schedule = _time_schedule(model.optimizer)
        if self._schedule is not None:
            self._schedule.elapsed_seconds.assign(self._offset * self.schedule_scale)

    def batch_begins(self):
        self._running = True

    def batch_ends(self):
        """Counts the batch that ran and advances the clock: once per batch, whoever calls."""
        if not self._running:
            return
        self._running = self._begun = False
        elapsed = self._offset + (self.timer() - self._start)
        if self.agree is not None and (self.timed or self._schedule is not None):
            # Every worker must take part in the agreement (after every batch).
            elapsed = float(self.agree(elapsed if self.keeps_time else 0.0))
        self._elapsed = float(elapsed)
        if self._schedule is not None:
            self._schedule.elapsed_seconds.assign(elapsed * self.schedule_scale)
        self._batches += 1


class RunStateCallback(keras.callbacks.Callback):
    """A callback that reads a `RunState`: it tells the run state when training and each batch
    begin; its `on_train_batch_end` must call `self.run_state.batch_ends()` before reading it.

    Args:
        run_state: the run's `RunState` (None: one of its own).
    """

    def __init__(self, run_state=None):
        super().__init__()
        self.run_state = RunState() if run_state is None else run_state

    def on_train_begin(self, logs=None):
        self.run_state.train_begins(self.model)

    def on_train_batch_begin(self, batch, logs=None):
        self.run_state.batch_begins()
