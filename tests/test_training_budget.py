"""The wall-clock budget (train.max_minutes) stops fit early; the step limit still applies."""

import keras
import numpy as np
import pytest

from keras_transformer.config import ConfigError, load_config
from keras_transformer.training.run.callbacks import StopAtStep, optimizer_step


def _fit(stopper, epochs=3):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, y = np.ones((32, 4), "float32"), np.ones((32, 1), "float32")
    model.fit(x, y, batch_size=4, epochs=epochs, verbose=0, callbacks=[stopper])
    return optimizer_step(model)


def test_time_budget_stops_training():
    stopper = StopAtStep(steps=1000, max_seconds=0.0)
    assert _fit(stopper) == 1
    assert stopper.out_of_time


def test_step_limit_without_budget():
    stopper = StopAtStep(steps=5)
    assert _fit(stopper) == 5
    assert not stopper.out_of_time


def test_budget_config_validation():
    assert load_config(overrides=["train.max_minutes=30"]).train.max_minutes == 30.0
    try:
        load_config(overrides=["train.max_minutes=0"])
    except ConfigError as e:
        assert "train.max_minutes" in str(e)
    else:
        raise AssertionError("max_minutes=0 accepted")


def test_training_ends_the_end_minutes_before_the_budget():
    """`train.max_minutes` bounds the whole run: training (and the learning rate's decay) ends
    `train.end_minutes` before it (a tenth of the budget by default), the time the dev set's
    choice, the scoring and the export then fit into."""
    from keras_transformer.config import budget_seconds
    from keras_transformer.training.recipe import make_optimizer
    from keras_transformer.training.recipe.schedules import BudgetSchedule

    def train_config(*overrides):
        return load_config(overrides=["train.schedule=linear", *overrides]).train

    assert budget_seconds(train_config()) == (None, None)
    assert budget_seconds(train_config("train.max_minutes=50")) == (2700.0, 300.0)
    assert budget_seconds(train_config("train.max_minutes=50", "train.end_minutes=8")) == (
        2520.0,
        480.0,
    )
    config = load_config(overrides=["train.schedule=linear", "train.max_minutes=50"])
    schedule = make_optimizer(config, d_model=64)._learning_rate
    assert isinstance(schedule, BudgetSchedule) and schedule.total_seconds == 2700.0
    schedule.elapsed_seconds.assign(2700.0)
    assert float(schedule(config.train.warmup_steps)) == 0.0  # decayed when training ends
    try:
        load_config(overrides=["train.max_minutes=10", "train.end_minutes=10"])
    except ConfigError as e:
        assert "train.end_minutes" in str(e) and "train.max_minutes" in str(e)
    else:
        raise AssertionError("end_minutes >= max_minutes accepted")


@pytest.mark.scenario
def test_a_budgeted_run_stopped_after_training_exports_the_uninterrupted_runs_model(
    tmp_path, monkeypatch
):
    """A run on a time budget (with EMA) whose training ended on the budget at step 8, stopped
    in its end (the export: its workdir then holds what training left, without `result.json`
    or an export, a copy of the uninterrupted run's before its end), and run again: it trains
    no step more (its budget is spent), keeps the checkpoints as they were and exports the
    model of the run that was never stopped, weight for weight. Training time is a fake clock
    (four seconds a reading), so training stops at the same step wherever it runs; the export
    records the final model's weights (`finish.export`'s own work is the same for both)."""
    import shutil

    from training_helpers import tiny_config

    from keras_transformer.training import train
    from keras_transformer.training.run import finish, run_state
    from keras_transformer.workdir import list_checkpoints

    class Clock:  # what `RunState` reads: time.monotonic
        now = 0.0

        def monotonic(self):
            self.now += 4.0
            return self.now

    monkeypatch.setattr(run_state, "time", Clock())
    exported = []

    def export(run, model, tokenizer, result=None, alpha=None, plan=None):
        exported.append([np.array(w) for w in model.weights])
        return f"export {len(exported)}"

    monkeypatch.setattr(finish, "export", export)

    def config(workdir):
        budget = dict(steps=1000, max_minutes=1.0, end_minutes=0.5, ema_momentum=0.9)
        return tiny_config(workdir, train=budget, data=dict(dev=None))

    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    uninterrupted = train(config(whole))
    assert uninterrupted["step"] == 8 and uninterrupted["stopped_by_time_budget"]  # 30 s
    shutil.copytree(whole, stopped, ignore=shutil.ignore_patterns("result.json", "saved_models"))
    checkpoints = {step: open(path, "rb").read() for step, path in
                   list_checkpoints(stopped / "checkpoints")}  # fmt: skip

    resumed = train(config(stopped))
    for key in ("step", "checkpoint_steps", "stopped_by_time_budget"):
        assert resumed[key] == uninterrupted[key], key
    assert {step: open(path, "rb").read() for step, path in
            list_checkpoints(stopped / "checkpoints")} == checkpoints  # fmt: skip
    theirs, ours = exported
    assert len(ours) == len(theirs)
    for mine, reference in zip(ours, theirs):
        np.testing.assert_array_equal(mine, reference)
