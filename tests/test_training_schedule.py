"""The budget-aware learning-rate schedule (train.schedule: linear | cosine): values against the
formula, the time budget it follows, serialization, and resume continuing the same curve."""

import json
import math
import os
import re

import keras
import numpy as np
import pytest
from training_helpers import RecordRate, read_scalars, tiny_config

from keras_transformer.config import ConfigError, load_config
from keras_transformer.training import train
from keras_transformer.training.engines.tf_state import ResumeState
from keras_transformer.training.recipe import make_optimizer
from keras_transformer.training.recipe.optimizers import FusedAdam
from keras_transformer.training.recipe.schedules import BudgetSchedule
from keras_transformer.training.run.callbacks import StopAtStep
from keras_transformer.training.run.run_state import RunState

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def _formula(step, d_model, warmup, total_steps, scale, decay, elapsed=0.0, total_seconds=None):
    step = max(step, 1)
    used = step / total_steps
    if total_seconds is not None:
        used = max(used, elapsed / total_seconds)
    used = min(max(used, 0.0), 1.0)
    left = 1.0 - used if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * used))
    return scale * (d_model * warmup) ** -0.5 * min(1.0, step / warmup) * left


@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_step_budget_values_and_zero_at_the_end(decay):
    schedule = BudgetSchedule(256, warmup_steps=100, total_steps=1000, scale=2.0, decay=decay)
    peak = 2.0 * (256 * 100) ** -0.5
    for step in [0, 1, 50, 99, 100, 101, 400, 999, 1000, 1500]:
        expected = _formula(step, 256, 100, 1000, 2.0, decay)
        # float32: 1 - step / total loses ~1e-7 of the peak
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-5, abs=1e-6 * peak), step
    assert float(schedule(1000)) == 0.0 and float(schedule(5000)) == 0.0
    # The warm-up rises and the decay falls.
    values = [float(schedule(s)) for s in range(0, 1001, 10)]
    top = int(np.argmax(values))
    assert np.all(np.diff(values[: top + 1]) >= 0) and np.all(np.diff(values[top:]) <= 0)


def test_time_budget_follows_the_elapsed_seconds_it_is_given():
    schedule = BudgetSchedule(64, warmup_steps=10, total_steps=10**6, total_seconds=600.0)
    for elapsed in [0.0, 60.0, 300.0, 599.0, 600.0, 900.0]:
        schedule.elapsed_seconds.assign(elapsed)
        for step in [5, 10, 200]:
            expected = _formula(step, 64, 10, 10**6, 1.0, "linear", elapsed, 600.0)
            assert float(schedule(step)) == pytest.approx(expected, rel=1e-5, abs=1e-8)
    schedule.elapsed_seconds.assign(600.0)
    assert float(schedule(200)) == 0.0
    # Whichever budget ends first: the steps, here, before the time.
    schedule.elapsed_seconds.assign(1.0)
    assert float(schedule(10**6)) == 0.0


def test_serializable_alone_and_inside_the_optimizer():
    schedule = BudgetSchedule(128, 50, 700, scale=3.0, decay="cosine", total_seconds=90.0)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(restored, BudgetSchedule)
    assert restored.get_config() == schedule.get_config()
    for step in [1, 50, 300, 700]:
        assert float(restored(step)) == float(schedule(step))
    optimizer = FusedAdam(schedule)
    again = FusedAdam.from_config(optimizer.get_config())
    assert isinstance(again._learning_rate, BudgetSchedule)
    assert again._learning_rate.get_config() == schedule.get_config()


def test_config_chooses_the_schedule():
    config = load_config(
        os.path.join(CONFIGS, "small.yaml"),
        overrides=["train.schedule=cosine", "train.max_minutes=30", "train.steps=5000"],
    )
    schedule = make_optimizer(config)._learning_rate
    assert isinstance(schedule, BudgetSchedule)
    # Training's part of the 30 minutes: the last tenth is the end's (train.end_minutes).
    assert (schedule.decay, schedule.total_steps, schedule.total_seconds) == ("cosine", 5000, 1620)
    for paper in ("transformer_base.yaml", "transformer_big.yaml"):
        # the paper's schedule stays the paper configs' default
        config = load_config(os.path.join(CONFIGS, paper))
        assert type(make_optimizer(config)._learning_rate).__name__ == "TransformerSchedule"
    with pytest.raises(ConfigError, match="train.schedule"):
        load_config(overrides=["train.schedule=step"])


class _FakeTimer:
    """Ten seconds pass at every reading."""

    def __init__(self, start=0.0):
        self.now = start

    def __call__(self):
        self.now += 10.0
        return self.now


def _toy(schedule):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(FusedAdam(schedule), "mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _fit(model, callbacks, steps):
    x, y = np.ones((steps, 3), "float32"), np.ones((steps, 1), "float32")
    model.fit(x, y, batch_size=1, epochs=1, verbose=0, callbacks=callbacks, shuffle=False)


def test_stop_at_step_feeds_the_time_to_the_schedule_and_stops_at_zero():
    schedule = BudgetSchedule(16, warmup_steps=2, total_steps=10**6, total_seconds=100.0)
    model = _toy(schedule)
    record = RecordRate()
    stopper = StopAtStep(10**6, max_seconds=100.0, run_state=RunState(timer=_FakeTimer()))
    _fit(model, [stopper, record], steps=50)
    # The timer reads once at the start and once after each step: 10 s per step, the budget of
    # 100 s ends after step 10, when the rate reaches zero.
    assert int(model.optimizer.iterations) == 10 and stopper.out_of_time
    expected = [_formula(s, 16, 2, 10**6, 1.0, "linear", 10.0 * s, 100.0) for s in range(10)]
    np.testing.assert_allclose(record.rates, expected, rtol=1e-5)
    assert float(schedule(int(model.optimizer.iterations))) == 0.0


@pytest.mark.scenario
def test_resume_continues_the_same_curve(tmp_path):

    def run(steps, directory, timer):
        schedule = BudgetSchedule(16, warmup_steps=2, total_steps=10**6, total_seconds=200.0)
        model = _toy(schedule)
        run_state = RunState(timer=timer)
        state = ResumeState(model, str(directory), every=1, keep=1, run_state=run_state)
        state.restore()
        stopper = StopAtStep(10**6, max_seconds=200.0, run_state=run_state)
        record = RecordRate()
        # The clock is advanced before the state saves it (the trainer's order too).
        _fit(model, [stopper, state, record], steps=steps)
        return record.rates, model

    whole, _ = run(12, tmp_path / "whole", _FakeTimer())
    first, _ = run(5, tmp_path / "parts", _FakeTimer())
    # The restarted process's clock starts anywhere: only time spent training counts.
    second, model = run(7, tmp_path / "parts", _FakeTimer(start=12345.0))
    np.testing.assert_allclose(first + second, whole, rtol=1e-6)
    assert int(model.optimizer.iterations) == 12


@pytest.mark.scenario
def test_train_with_the_linear_schedule_ends_at_zero(tmp_path):
    config = tiny_config(tmp_path, train=dict(steps=8, schedule="linear"))
    result = train(config)
    assert result["step"] == 8 and result["training_seconds"] > 0
    _assert_documented_time_keys(tmp_path / "result.json")
    rates = read_scalars(tmp_path / "logs")["learning_rate"]
    expected = [_formula(s, 32, 4, 8, 3.0, "linear") for s, _ in rates]
    np.testing.assert_allclose([r for _, r in rates], expected, rtol=1e-5, atol=1e-9)
    assert rates[-1] == (8, 0.0)


def _assert_documented_time_keys(path):
    """result.json names its times as docs/guides/python-api.md does: one name per time (a
    budgeted run's `budget` adds the end's estimate; its training part reuses the name)."""
    with open(path) as f:
        result = json.load(f)
    times = {key for key in result if key.endswith("_seconds")}
    times |= {key for key in result.get("budget", {}) if key.endswith("_seconds")}
    guide = os.path.join(os.path.dirname(CONFIGS), "docs", "guides", "python-api.md")
    with open(guide) as f:
        documented = set(re.findall(r"`(\w+_seconds)`", f.read()))
    top = {"training_seconds", "end_seconds", "wall_seconds"}
    assert documented == top | {"end_estimate_seconds"}
    assert times == (documented if "budget" in result else top)
