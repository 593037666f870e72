"""The wall-clock budget (train.max_minutes) stops fit early; the step limit still applies."""

import keras
import numpy as np

from keras_transformer.config import ConfigError, load_config
from keras_transformer.training.callbacks import StopAtStep, optimizer_step


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
