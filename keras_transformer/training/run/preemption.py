"""Preemption: SIGTERM and SIGINT stop training after the step in progress, with everything saved.

Spot and preemptible machines, TPU maintenance events and Kubernetes evictions send SIGTERM,
then SIGKILL after a grace period. `CatchSignals` turns SIGTERM and SIGINT into the process's
stop flag (`keras_transformer.stopping`, which the other phases check at their safe points);
`StopOnSignal` (a callback) looks at it after every step. Under several workers
they agree in one all-reduce per step whether any worker got a signal, so all of them stop after
the same step. Then each saves its resume state (the chief also a step checkpoint, and flushes
TensorBoard) and `Preempted` is raised: `keras-transformer train` prints its one line and exits
with `errors.PREEMPTED_EXIT_CODE` (75); the same command resumes exactly.

TensorFlow's `tf.distribute.experimental.PreemptionCheckpointHandler` does the same for custom
training loops (`handler.run(step_fn)`), saving with its own checkpoint counter and ending the
process itself; Keras 3's `model.fit` has no place for it, so this module does the same (one
all-reduce per step, then a save and an exit) as a Keras callback, saving the state `ResumeState`
already defines (which also holds the data position and the training clock).
"""

from keras_transformer import stopping
from keras_transformer.errors import Preempted
from keras_transformer.training.run.callbacks import writes_in_the_batch_loop
from keras_transformer.training.run.run_state import RunStateCallback, optimizer_step

SIGNALS = stopping.SIGNALS


class CatchSignals:
    """A context in which SIGTERM and SIGINT set the process's stop flag (`stopping.catching`)
    instead of ending the process; `received` is the signal's number. A second SIGINT (Ctrl-C
    twice) interrupts at once. The previous handlers come back when the outermost such block
    ends (the `keras-transformer` command holds one around the whole command).

    Example:
    ```python
    with CatchSignals() as signals:
        model.fit(..., callbacks=[StopOnSignal(signals, resume_state)])
    ```
    """

    def __init__(self):
        self._block = None

    @property
    def received(self):
        return stopping.received()

    def __enter__(self):
        self._block = stopping.catching()
        self._block.__enter__()
        return self

    def __exit__(self, *exc):
        block, self._block = self._block, None
        return block.__exit__(*exc) if block is not None else False


class StopOnSignal(RunStateCallback):
    """After each step: when a signal came (to this worker or, with `any_worker`, to any),
    saves `resume` (a `ResumeState`) and `checkpoint` (a `StepCheckpoint`, or None), calls
    `flush` (e.g. TensorBoard writers) and raises `Preempted`. The saved state counts the batch
    just consumed wherever this callback comes (it shares `resume`'s run state, which advances
    once per batch, see `run_state`); callbacks after it do not see the last batch, so the
    trainer puts it last.

    Args:
        signals: a `CatchSignals`.
        resume: the `ResumeState` callback.
        checkpoint: the chief's `StepCheckpoint`; None on the other workers.
        any_worker: `flag -> bool`, the strategy input's `any_worker()` (an all-reduce under
            several workers, `training.engines.strategies`); None: this process alone.
        flush: callables run before raising.
    """

    def __init__(self, signals, resume, checkpoint=None, any_worker=None, flush=()):
        super().__init__(resume.run_state)
        self.signals, self.resume, self.checkpoint = signals, resume, checkpoint
        self.any_worker = any_worker or bool
        self.flush = list(flush)

    @writes_in_the_batch_loop
    def on_train_batch_end(self, batch, logs=None):
        self.run_state.batch_ends()
        if not self.any_worker(self.signals.received is not None):
            return
        step = optimizer_step(self.model)
        if stopping.lost_the_workdir():  # another run writes it now: save nothing
            raise Preempted(
                f"stopped by {stopping.cause()} after step {step}: nothing saved (the workdir "
                "is the new holder's)",
                step,
            )
        self.resume.save()
        if self.checkpoint is not None:
            self.checkpoint.save_now(step)
        for flush in self.flush:
            flush()
        cause = stopping.cause() if self.signals.received else "a signal to another worker"
        raise Preempted(
            f"stopped by {cause} after step {step}: saved the resume state"
            + (" and a step checkpoint" if self.checkpoint is not None else "")
            + "; run the same command again to resume",
            step,
        )
