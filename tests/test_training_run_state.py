"""The run state (the clock, the data position and the step) that the stopper, the resume state
and the signal handler share: whatever the order of these callbacks in `fit`, each sees the same
run state, the saved resume state holds the same clock and position, and training stops after
the same step."""

import itertools
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf
from training_helpers import RecordRate

from keras_transformer.errors import Preempted
from keras_transformer.training.engines.tf_state import ResumeState
from keras_transformer.training.recipe.optimizers import FusedAdam
from keras_transformer.training.recipe.schedules import BudgetSchedule
from keras_transformer.training.run.callbacks import StopAtStep, optimizer_step
from keras_transformer.training.run.preemption import StopOnSignal
from keras_transformer.training.run.run_state import RunState


class _FakeTimer:
    """10 seconds pass between two readings."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 10.0
        return self.now


class _SignalAfter:
    """A `CatchSignals` stand-in: SIGTERM has come once the model has made `step` steps."""

    def __init__(self, step):
        self.step, self.model = step, None

    @property
    def received(self):
        if self.step is None or optimizer_step(self.model) < self.step:
            return None
        return signal.SIGTERM


def _run(directory, order, signal_after=None):
    """Fits a toy model with the stopper (a 75-second budget), the resume state (every step)
    and the signal handler in `order`; returns what they decided and saved."""
    keras.utils.set_random_seed(1)
    schedule = BudgetSchedule(16, warmup_steps=2, total_steps=10**6, total_seconds=100.0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(FusedAdam(schedule), "mse")
    model.optimizer.build(model.trainable_variables)
    run_state = RunState(timer=_FakeTimer())
    resume = ResumeState(model, str(directory), every=1, keep=1, run_state=run_state)
    stopper = StopAtStep(10**6, max_seconds=75.0, run_state=run_state)
    signals = _SignalAfter(signal_after)
    signals.model = model
    parts = {"stopper": stopper, "resume": resume, "signal": StopOnSignal(signals, resume)}
    record = RecordRate()
    x, y = np.ones((50, 3), "float32"), np.ones((50, 1), "float32")
    fit = dict(batch_size=1, epochs=1, verbose=0, shuffle=False)
    try:
        model.fit(x, y, callbacks=[parts[name] for name in order] + [record], **fit)
        preempted = None
    except Preempted as e:
        preempted = e.step
    latest = tf.train.latest_checkpoint(str(directory))
    saved = {
        name: tf.train.load_variable(latest, f"{name}/.ATTRIBUTES/VARIABLE_VALUE").item()
        for name in ("data_position", "training_seconds")
    }
    return {
        "step": optimizer_step(model),
        "out_of_time": stopper.out_of_time,
        "elapsed": stopper.elapsed,
        "preempted": preempted,
        "saved": saved,
        "rates": record.rates,
    }


ORDERS = list(itertools.permutations(["stopper", "resume", "signal"]))


def test_any_order_of_the_callbacks_saves_the_same_state_and_stops_at_the_same_step(tmp_path):
    found = [_run(tmp_path / f"{i}", order) for i, order in enumerate(ORDERS)]
    # 10 s per step: the 75-second budget ends after step 8, whose state holds 8 batches and
    # 80 seconds.
    expected = found[0]
    assert expected["step"] == 8 and expected["out_of_time"] and expected["elapsed"] == 80.0
    assert expected["saved"] == {"data_position": 8, "training_seconds": 80.0}
    assert len(expected["rates"]) == 8 and expected["rates"][-1] > 0
    for order, result in zip(ORDERS, found):
        assert result == expected, order


@pytest.mark.scenario
def test_a_signal_saves_the_batch_just_consumed_in_any_order(tmp_path):
    found = [_run(tmp_path / f"{i}", order, signal_after=3) for i, order in enumerate(ORDERS)]
    for order, result in zip(ORDERS, found):
        assert result["preempted"] == result["step"] == 3, order
        assert result["saved"] == {"data_position": 3, "training_seconds": 30.0}, order
        assert result["rates"] == found[0]["rates"], order
