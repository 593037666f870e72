"""The workdir lock and the stop flag: a lost workdir wins over an earlier SIGTERM."""

import json
import os
import signal
import time

import pytest

from keras_transformer import stopping
from keras_transformer.errors import Preempted
from keras_transformer.lock import WorkdirLock


def _lock_file(root):
    return json.loads((root / "lock.json").read_text())


def _wait_for(condition, seconds=20):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def _write_lock(workdir, **holder):
    """A lock of another run (as its holder writes it), over whatever is there."""
    os.makedirs(workdir, exist_ok=True)
    values = dict(host="another-machine", pid=4242, command="train", started="then", token="new")
    values.update(holder)
    with open(os.path.join(workdir, "lock.json"), "w") as f:
        json.dump(values, f)


# ------------------------------------------------------------------ a lost workdir wins


def test_a_takeover_after_a_sigterm_marks_the_workdir_lost():
    """SIGTERM first, then the lock's renewal thread finds it taken over: the stop is the
    takeover's (nothing more is saved), not the signal's."""
    with stopping.catching():
        os.kill(os.getpid(), signal.SIGTERM)
        assert _wait_for(lambda: stopping.received() is not None)
        assert not stopping.lost_the_workdir()
        assert stopping.request("the takeover of the workdir lock by X", lost_the_workdir=True)
        assert stopping.lost_the_workdir()
        assert stopping.received() == signal.SIGTERM
        with pytest.raises(Preempted, match="stopped by the takeover of the workdir lock by X"):
            stopping.check("a phase")
        # A later request without a lost workdir changes nothing.
        assert stopping.request("something else")
        assert stopping.lost_the_workdir() and "takeover" in stopping.cause()
    assert stopping.received() is None and not stopping.lost_the_workdir()


def test_training_stopping_on_sigterm_saves_nothing_once_its_lock_is_taken_over(tmp_path):
    """SIGTERM, and in the same step the workdir's lock changes hands (its renewal thread
    notices: the stop flag says the workdir is lost): `StopOnSignal` saves no resume state and
    no checkpoint."""
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_transformer.training.callbacks import ResumeState, StepCheckpoint
    from keras_transformer.training.preemption import CatchSignals, StopOnSignal
    from keras_transformer.training.run_state import RunState

    workdir = tmp_path / "workdir"

    class SigtermThenTakeover(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                os.kill(os.getpid(), signal.SIGTERM)
                assert _wait_for(lambda: stopping.received() is not None)
                _write_lock(workdir, lease_seconds=60, renewed=time.time())
                # What the renewal thread does when it looks.
                assert stopping.request("the takeover of the workdir lock by X", True)

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    backup, checkpoints = workdir / "backup", workdir / "checkpoints"
    resume = ResumeState(model, str(backup), every=1000, keep=1, run_state=RunState())
    checkpoint = StepCheckpoint(str(checkpoints), every=1000, keep=1)
    x, y = np.ones((20, 3), "float32"), np.ones((20, 1), "float32")
    with CatchSignals() as signals, WorkdirLock(workdir, "train", lease_seconds=60):
        with pytest.raises(Preempted) as stopped:
            model.fit(x, y, batch_size=1, epochs=1, verbose=0, callbacks=[
                SigtermThenTakeover(), checkpoint, StopOnSignal(signals, resume, checkpoint)
            ])  # fmt: skip
    assert "takeover of the workdir lock" in str(stopped.value), stopped.value
    assert "saved the resume state" not in str(stopped.value)
    assert tf.train.latest_checkpoint(str(backup)) is None
    assert not checkpoints.exists() or not os.listdir(checkpoints)
    assert _lock_file(workdir)["token"] == "new"
