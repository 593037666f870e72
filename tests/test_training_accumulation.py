"""Gradient accumulation in the model's train step: k micro-batches make the same update as one
step on their concatenation (the loss is a mean over the whole batch's non-padding tokens),
under the default strategy, with XLA, and under MirroredStrategy over two logical CPUs.
"""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.models import Transformer
from keras_transformer.training.recipe.losses import MaskedSparseCrossEntropy
from keras_transformer.training.recipe.metrics import MaskedAccuracy, Perplexity, TokenCount

# Numerically sensitive: CI runs this module again with oneDNN off and with one thread.
pytestmark = pytest.mark.numerics

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def batch(rows=8, vocab=40):
    """One batch whose micro-batches (halves; under two replicas, each replica's halves) have
    different token counts, so a mean of micro-batch means would not equal the batch's mean."""
    rng = np.random.default_rng(5)
    source = rng.integers(4, vocab, size=(rows, 7)).astype("int32")
    target = rng.integers(4, vocab, size=(rows, 6)).astype("int32")
    for row, keep in enumerate([6, 6, 6, 2, 6, 2, 2, 2][:rows]):
        target[row, keep:] = 0
    labels = np.concatenate([target[:, 1:], np.zeros((rows, 1), "int32")], axis=1)
    return {"source_ids": source, "target_ids": target}, labels


def weights_after_one_step(strategy, k, jit_compile=False):
    """A tiny Transformer's weights and logs after one update of `k` micro-batches (SGD, so
    any difference in the gradient's scale shows; Adam's first step would hide it)."""
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = Transformer(40, num_layers=1, d_model=16, num_heads=2, d_ff=32, dropout=0.0)
        model.gradient_accumulation_steps = k
        model.compile(
            optimizer=keras.optimizers.SGD(1.0),
            loss=MaskedSparseCrossEntropy(0.1),
            metrics=[MaskedAccuracy(), Perplexity(), TokenCount()],
            jit_compile=jit_compile,
        )
    x, y = batch()
    history = model.fit(tf.data.Dataset.from_tensors((x, y)), epochs=1, verbose=0)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 1
    logs = {key: values[-1] for key, values in history.history.items()}
    return [np.asarray(w) for w in model.get_weights()], logs


def assert_same_update(strategy, jit_compile=False):
    large, large_logs = weights_after_one_step(strategy, 1)
    accumulated, logs = weights_after_one_step(strategy, 2, jit_compile)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        initial = Transformer(40, num_layers=1, d_model=16, num_heads=2, d_ff=32, dropout=0.0)
    assert any(np.abs(a - b).max() > 1e-3 for a, b in zip(large, initial.get_weights())), (
        "the step changed nothing"
    )
    for a, b in zip(accumulated, large):
        np.testing.assert_allclose(a, b, atol=1e-5)
    for key in ("loss", "accuracy", "perplexity", "tokens"):
        np.testing.assert_allclose(logs[key], large_logs[key], rtol=1e-5)


@pytest.mark.scenario
def test_two_micro_batches_equal_one_large_batch():
    assert_same_update(tf.distribute.get_strategy())


@pytest.mark.scenario  # ~30 s of XLA compilation on a 2-core CPU
def test_two_micro_batches_equal_one_large_batch_with_xla():
    assert_same_update(tf.distribute.get_strategy(), jit_compile=True)


def mirrored_check():
    """Run by `train_runner.py --logical-cpus 2` in a fresh process."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    assert_same_update(strategy)


@pytest.mark.scenario
def test_two_micro_batches_equal_one_large_batch_under_mirrored_strategy():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    run = subprocess.run(
        [
            sys.executable,
            os.path.join(HERE, "train_runner.py"),
            "--logical-cpus",
            "2",
            "--call",
            "test_training_accumulation:mirrored_check",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
