"""Every fast path equals the straightforward computation it replaces (to 1e-5).

The fast paths (benchmarks/README.md explains why each is the default): fused query/key/value
projections, einsum attention logits, per-layer (keys, values) decoding caches written by
scatter, the fused softmax-cross-entropy loss and the argmax-free accuracy.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_transformer.decoding import translate_ids
from keras_transformer.layers import MultiHeadAttention, scaled_dot_product_attention
from keras_transformer.layers import attention as attention_module
from keras_transformer.models import Transformer
from keras_transformer.training.losses import masked_token_cross_entropy
from keras_transformer.training.metrics import MaskedAccuracy

ATOL = 1e-5


def rand(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def tiny_model(**kwargs):
    params = dict(vocab_size=40, num_layers=2, d_model=32, num_heads=4, d_ff=64, dropout=0.1)
    params.update(kwargs)
    return Transformer(**params)


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture
def unfused(monkeypatch):
    """Runs the body with the straightforward separate projections."""

    def switch(flag):
        monkeypatch.setattr(attention_module, "FUSE_PROJECTIONS", flag)

    return switch


# ----------------------------------------------------------------------- attention


def test_einsum_logits_match_numpy_attention():
    q, k, v = rand((2, 3, 5, 8), 1), rand((2, 3, 7, 8), 2), rand((2, 3, 7, 4), 3)
    mask = np.random.default_rng(4).random((2, 1, 5, 7)) > 0.3
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    logits = q @ np.swapaxes(k, -1, -2) / np.sqrt(8.0)
    expected = np.where(mask, np_softmax(np.where(mask, logits, -1e9)), 0.0)
    np.testing.assert_allclose(np.asarray(weights), expected, atol=ATOL)
    np.testing.assert_allclose(np.asarray(out), expected @ v, atol=ATOL)


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_fused_projections_equal_separate(unfused, kind):
    layer = MultiHeadAttention(num_heads=4, key_dim=8)
    x, memory = rand((2, 5, 32), 1), rand((2, 7, 32), 2)
    mask = np.random.default_rng(3).random((2, 5, 5 if kind == "self" else 7)) > 0.2
    other = x if kind == "self" else memory

    def run():
        with tf.GradientTape() as tape:
            xt, ot = tf.constant(x), tf.constant(other) if kind == "cross" else None
            tape.watch(xt)
            if ot is not None:
                tape.watch(ot)
            value = xt if kind == "self" else ot
            out = layer(xt, value, attention_mask=mask, use_causal_mask=kind == "self")
            loss = tf.reduce_sum(out * rand(out.shape, 9))
        grads = tape.gradient(loss, [xt] + [w.value for w in layer.trainable_weights])
        return np.asarray(out), [np.asarray(g) for g in grads]

    unfused(True)
    fused_out, fused_grads = run()
    unfused(False)
    plain_out, plain_grads = run()
    np.testing.assert_allclose(fused_out, plain_out, atol=ATOL)
    for a, b in zip(fused_grads, plain_grads):
        np.testing.assert_allclose(a, b, atol=ATOL)


def test_fused_training_step_equals_separate(unfused):
    """One optimizer step of the whole model (dropout on) gives the same weights either way."""
    src = np.random.default_rng(0).integers(1, 40, (3, 6)).astype("int32")
    tgt = np.random.default_rng(1).integers(1, 40, (3, 5)).astype("int32")

    def train_once(fused):
        unfused(fused)
        keras.utils.set_random_seed(7)
        model = tiny_model()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=_sparse_loss, jit_compile=False)
        model.train_on_batch({"source_ids": src, "target_ids": tgt}, tgt)
        return [np.asarray(w) for w in model.weights]

    for a, b in zip(train_once(True), train_once(False)):
        np.testing.assert_allclose(a, b, atol=ATOL)


def _sparse_loss(y_true, y_pred):
    return ops.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)


def test_key_value_cache_forms_agree(unfused):
    layer = MultiHeadAttention(num_heads=4, key_dim=8)
    memory = rand((2, 7, 32), 1)
    layer(rand((2, 3, 32)), memory)
    stacked = np.asarray(layer.compute_key_value_cache(memory))
    keys, values = layer.compute_key_value_cache(memory, stacked=False)
    np.testing.assert_allclose(np.asarray(keys), stacked[:, 0], atol=ATOL)
    np.testing.assert_allclose(np.asarray(values), stacked[:, 1], atol=ATOL)
    unfused(False)
    np.testing.assert_allclose(
        np.asarray(layer.compute_key_value_cache(memory)), stacked, atol=ATOL
    )


@pytest.mark.parametrize("mode", ["scatter", "where", "slice"])
def test_cache_writes_equal_slice_update(monkeypatch, mode):
    monkeypatch.setattr(attention_module, "CACHE_WRITE", mode)
    cache, update = rand((3, 2, 6, 4), 1), rand((3, 2, 1, 4), 2)
    for index in (0, 4, 5):
        got = np.asarray(attention_module._write_at(cache, update, index))
        expected = cache.copy()
        expected[:, :, index : index + 1] = update
        np.testing.assert_array_equal(got, expected)
    prefix = rand((3, 2, 3, 4), 3)  # several positions at once: always slice_update
    expected = cache.copy()
    expected[:, :, 2:5] = prefix
    np.testing.assert_array_equal(
        np.asarray(attention_module._write_at(cache, prefix, 2)), expected
    )


# ----------------------------------------------------------------------- decoding caches


def test_split_cache_decoding_equals_stacked_and_full_pass():
    model = tiny_model()
    rng = np.random.default_rng(0)
    src = rng.integers(1, 40, (2, 6)).astype("int32")
    src[1, 4:] = 0
    tgt = rng.integers(1, 40, (2, 5)).astype("int32")
    full = np.asarray(model({"source_ids": src, "target_ids": tgt}, training=False))
    memory, source_mask = model.encode(src)
    stacked = model.init_cache(memory, max_length=5)
    split = model.init_cache(memory, max_length=5, stacked=False)
    for t in range(5):
        a, stacked = model.decode_step(tgt[:, t : t + 1], t, stacked, source_mask)
        b, split = model.decode_step(tgt[:, t : t + 1], t, split, source_mask)
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=ATOL)
        np.testing.assert_allclose(np.asarray(b)[:, 0], full[:, t], atol=1e-4)
    # The final caches hold the same numbers.
    for layer, (keys, values) in enumerate(split["self_attention"]):
        np.testing.assert_allclose(
            np.asarray(keys), np.asarray(stacked["self_attention"])[:, layer, 0]
        )
        np.testing.assert_allclose(
            np.asarray(values), np.asarray(stacked["self_attention"])[:, layer, 1]
        )


@pytest.mark.parametrize("beam_size", [1, 4])
def test_cached_translation_equals_uncached(beam_size):
    model = tiny_model()
    src = np.random.default_rng(5).integers(4, 40, (3, 5)).astype("int32")
    src[2, 3:] = 0
    ids, scores = translate_ids(model, src, beam_size=beam_size, max_extra_length=4)
    ref_ids, ref_scores = translate_ids(
        model, src, beam_size=beam_size, max_extra_length=4, use_cache=False
    )
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(ref_ids))
    np.testing.assert_allclose(np.asarray(scores), np.asarray(ref_scores), atol=1e-4)


# ----------------------------------------------------------------------- loss and metrics


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_fused_loss_equals_log_softmax_formula(smoothing):
    logits = rand((3, 4, 11), 1) * 3
    labels = np.random.default_rng(2).integers(0, 11, (3, 4)).astype("int32")
    labels[0, 2:] = 0  # padding
    losses, mask = masked_token_cross_entropy(labels, logits, smoothing)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    expected = (1 - smoothing) * nll + smoothing * -log_probs.mean(-1)
    real = labels != 0
    np.testing.assert_allclose(np.asarray(mask), real.astype("float32"))
    np.testing.assert_allclose(np.asarray(losses), np.where(real, expected, 0.0), atol=ATOL)


def test_fused_loss_gradient_equals_formula():
    logits = tf.constant(rand((2, 3, 7), 1))
    labels = np.random.default_rng(3).integers(1, 7, (2, 3)).astype("int32")
    eps = 0.1
    with tf.GradientTape() as tape:
        tape.watch(logits)
        losses, _ = masked_token_cross_entropy(labels, logits, eps)
        total = tf.reduce_sum(losses)
    grad = np.asarray(tape.gradient(total, logits))
    target = np.eye(7, dtype="float32")[labels] * (1 - eps) + eps / 7
    np.testing.assert_allclose(grad, np_softmax(np.asarray(logits)) - target, atol=ATOL)


def test_accuracy_equals_argmax_accuracy():
    logits = rand((4, 6, 9), 1)
    labels = np.argmax(logits, -1).astype("int32")
    flip = np.random.default_rng(2).random(labels.shape) > 0.5
    labels = np.where(flip, (labels + 1) % 9, labels)
    labels[1, 4:] = 0  # padding, not counted
    metric = MaskedAccuracy()
    metric.update_state(labels, logits)
    real = labels != 0
    expected = ((np.argmax(logits, -1) == labels) & real).sum() / real.sum()
    np.testing.assert_allclose(float(metric.result()), expected, atol=ATOL)


def test_perplexity_equals_exp_of_mean_nll():
    from keras_transformer.training.metrics import Perplexity

    logits = rand((3, 5, 13), 4) * 2
    labels = np.random.default_rng(5).integers(1, 13, (3, 5)).astype("int32")
    labels[2, 3:] = 0
    metric = Perplexity()
    metric.update_state(labels, logits)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    real = labels != 0
    expected = np.exp((nll * real).sum() / real.sum())
    np.testing.assert_allclose(float(metric.result()), expected, rtol=1e-5)
