"""The loss, metrics and learning-rate schedule against numpy references and the paper's formula."""

import keras
import numpy as np
import pytest

from keras_transformer.training.recipe.losses import MaskedSparseCrossEntropy
from keras_transformer.training.recipe.metrics import MaskedAccuracy, Perplexity, TokenCount
from keras_transformer.training.recipe.schedules import TransformerSchedule


def _paper_rate(step, d_model, warmup, scale=1.0):
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@pytest.mark.parametrize("d_model,warmup,scale", [(512, 4000, 1.0), (64, 100, 2.0)])
def test_schedule_matches_the_paper(d_model, warmup, scale):
    schedule = TransformerSchedule(d_model, warmup, scale)
    for step in (1, warmup // 2, warmup, 10 * warmup):
        got = float(keras.ops.convert_to_numpy(schedule(step)))
        np.testing.assert_allclose(got, _paper_rate(step, d_model, warmup, scale), rtol=1e-5)
    # The peak is at the end of warm-up, and step 0 is treated as step 1.
    peak = float(keras.ops.convert_to_numpy(schedule(warmup)))
    assert peak > float(keras.ops.convert_to_numpy(schedule(warmup - 1)))
    assert peak > float(keras.ops.convert_to_numpy(schedule(warmup + 1)))
    np.testing.assert_allclose(
        float(keras.ops.convert_to_numpy(schedule(0))), _paper_rate(1, d_model, warmup, scale)
    )


def test_schedule_serializes_and_drives_adam():
    schedule = TransformerSchedule(128, 50, 3.0)
    restored = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule)
    )
    assert isinstance(restored, TransformerSchedule)
    assert restored.get_config() == schedule.get_config()
    optimizer = keras.optimizers.Adam(schedule)
    optimizer.build([keras.Variable(np.zeros(2, "float32"))])
    optimizer.iterations.assign(49)
    np.testing.assert_allclose(
        float(keras.ops.convert_to_numpy(optimizer.learning_rate)),
        _paper_rate(49, 128, 50, 3.0),
        rtol=1e-5,
    )


def _numpy_loss(labels, logits, eps):
    """Cross-entropy against (1 - eps) * one_hot + eps / V, mean over labels != 0."""
    vocab = logits.shape[-1]
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    target = np.full(logits.shape, eps / vocab)
    np.put_along_axis(target, labels[..., None], 1.0 - eps + eps / vocab, axis=-1)
    per_token = -(target * log_probs).sum(-1)
    mask = labels != 0
    return per_token[mask].mean(), log_probs, mask


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_loss_matches_numpy_reference_with_padding(eps):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 11)).astype("float32") * 3
    labels = rng.integers(1, 11, size=(3, 5)).astype("int32")
    labels[0, 3:] = 0
    labels[2, 1:] = 0
    expected, _, _ = _numpy_loss(labels, logits, eps)
    got = MaskedSparseCrossEntropy(label_smoothing=eps)(labels, logits)
    np.testing.assert_allclose(float(keras.ops.convert_to_numpy(got)), expected, rtol=1e-5)
    # Padding positions do not matter, whatever the logits there.
    noisy = logits.copy()
    noisy[labels == 0] = rng.normal(size=(int((labels == 0).sum()), 11)) * 100
    got_noisy = MaskedSparseCrossEntropy(label_smoothing=eps)(labels, noisy)
    np.testing.assert_allclose(float(keras.ops.convert_to_numpy(got_noisy)), expected, rtol=1e-5)


def test_loss_config_round_trip():
    loss = MaskedSparseCrossEntropy(label_smoothing=0.2)
    restored = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(restored, MaskedSparseCrossEntropy)
    assert restored.label_smoothing == 0.2 and restored.pad_id == 0


def test_metrics_match_numpy_and_ignore_padding():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 6, 9)).astype("float32")
    labels = rng.integers(1, 9, size=(2, 6)).astype("int32")
    labels[:, :2] = np.argmax(logits[:, :2], -1)  # some hits
    labels[1, 4:] = 0
    _, log_probs, mask = _numpy_loss(labels, logits, 0.0)
    accuracy, perplexity, tokens = MaskedAccuracy(), Perplexity(), TokenCount()
    for metric in (accuracy, perplexity, tokens):
        # Two updates: the running values are over all tokens seen.
        metric.update_state(labels[:1], logits[:1])
        metric.update_state(labels[1:], logits[1:])
    expected_accuracy = (np.argmax(logits, -1) == labels)[mask].mean()
    nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    np.testing.assert_allclose(float(accuracy.result()), expected_accuracy, rtol=1e-6)
    np.testing.assert_allclose(float(perplexity.result()), np.exp(nll[mask].mean()), rtol=1e-5)
    assert float(tokens.result()) == mask.sum()
