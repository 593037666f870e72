"""Test settings: quiet TensorFlow logs, deterministic seeds."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402

from keras_transformer import fast_paths  # noqa: E402


@pytest.fixture(autouse=True)
def _seed_policy_and_fast_paths():
    keras.utils.set_random_seed(1234)
    policy = keras.config.dtype_policy()
    enabled = fast_paths.enabled_names()
    yield
    keras.config.set_dtype_policy(policy)
    fast_paths.set_fast_paths(enabled)
