"""The paper's training loss: label-smoothed cross-entropy over the non-padding target tokens."""

import keras
from keras import ops


def masked_token_cross_entropy(labels, logits, label_smoothing=0.0, pad_id=0):
    """Per-token cross-entropy against label-smoothed targets, and the non-padding mask.

    The smoothed target distribution is `(1 - eps) * one_hot(label) + eps / vocab_size` (eps
    spread uniformly over the whole vocabulary, as in Szegedy et al. and the paper), so the loss is
    `(1 - eps) * -log p(label) + eps * mean_v(-log p(v))`.

    Args:
        labels: int `[batch, length]` target ids; `pad_id` marks padding.
        logits: float `[batch, length, vocab_size]` unnormalised scores.
        label_smoothing: eps in `[0, 1)`.
        pad_id: the id whose positions carry no loss.

    Returns:
        `(losses, mask)`: float32 `[batch, length]` per-token losses (0 at padding) and the
        float32 `[batch, length]` mask of real tokens.
    """
    logits = ops.cast(logits, "float32")
    labels = ops.cast(labels, "int32")
    if keras.backend.backend() == "tensorflow":
        losses = _tf_smoothed_cross_entropy(labels, logits, float(label_smoothing))
    else:
        # The smoothed target distribution, built with one `where`.
        vocab_size = logits.shape[-1] or ops.shape(logits)[-1]
        is_label = ops.equal(ops.expand_dims(labels, -1), ops.arange(vocab_size, dtype="int32"))
        low = label_smoothing / vocab_size
        target = ops.where(is_label, 1.0 - label_smoothing + low, low)
        losses = ops.categorical_crossentropy(target, logits, from_logits=True)
    mask = ops.cast(ops.not_equal(labels, pad_id), "float32")
    return losses * mask, mask


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedSparseCrossEntropy(keras.losses.Loss):
    """Label-smoothed sparse cross-entropy averaged over the non-padding tokens of a batch.

    Padding positions (`labels == pad_id`) contribute nothing, and the mean is over real tokens
    only, so batches with much padding are not down-weighted.

    Args:
        label_smoothing: eps_ls (the paper uses 0.1).
        pad_id: padding id of the labels (0).
        name: loss name.

    Call arguments:
        y_true: int `[batch, length]` labels.
        y_pred: float `[batch, length, vocab_size]` logits.

    Returns:
        A float32 scalar.

    Example:
    >>> model.compile(optimizer="adam", loss=MaskedSparseCrossEntropy(label_smoothing=0.1))

    References:
        Vaswani et al., 2017, section 5.4; Szegedy et al., 2016, "Rethinking the Inception
        Architecture" (label smoothing).
    """

    def __init__(self, label_smoothing=0.1, pad_id=0, name="masked_sparse_cross_entropy", **kw):
        # "mean_with_sample_weight" divides by the sum of the weights (here: the real tokens) and
        # lets Keras scale the loss for tf.distribute (one replica's share of the global mean).
        kw.pop("reduction", None)
        super().__init__(name=name, reduction="mean_with_sample_weight", **kw)
        self.label_smoothing = float(label_smoothing)
        self.pad_id = int(pad_id)

    def __call__(self, y_true, y_pred, sample_weight=None):
        mask = ops.cast(ops.not_equal(ops.cast(y_true, "int32"), self.pad_id), "float32")
        if sample_weight is not None:
            mask = mask * ops.cast(sample_weight, "float32")
        return super().__call__(y_true, y_pred, sample_weight=mask)

    def call(self, y_true, y_pred):
        losses, _ = masked_token_cross_entropy(y_true, y_pred, self.label_smoothing, self.pad_id)
        return losses

    def get_config(self):
        return {"name": self.name, "label_smoothing": self.label_smoothing, "pad_id": self.pad_id}


def _tf_smoothed_cross_entropy(labels, logits, eps):
    """`logsumexp(z) - (1 - eps) * z[label] - eps * mean(z)` with a hand-written gradient.

    The gradient `softmax(z) - target` is formed in the backward pass only, so nothing of the
    logits' size ([batch, length, vocab]) is kept from the forward pass: no target distribution,
    no softmax-cross-entropy backprop buffer, no scatter of the label gradient (the
    take_along_axis gradient). Measured in benchmarks/README.md (time and peak memory);
    tests/test_fast_paths.py checks value and gradient against the log-softmax formula.
    """
    import tensorflow as tf

    vocab_size = tf.shape(logits)[-1]

    @tf.custom_gradient
    def cross_entropy(z):
        lse = tf.reduce_logsumexp(z, axis=-1)  # [batch, length]
        label_logit = tf.gather(z, labels, batch_dims=len(z.shape) - 1)  # [batch, length]
        loss = lse - (1.0 - eps) * label_logit - eps * tf.reduce_mean(z, axis=-1)

        def grad(upstream):  # [batch, length] -> [batch, length, vocab]
            low = eps / tf.cast(vocab_size, z.dtype)
            is_label = tf.equal(tf.expand_dims(labels, -1), tf.range(vocab_size))
            probs = tf.exp(z - tf.expand_dims(lse, -1))
            probs = probs - tf.where(is_label, 1.0 - eps + low, low)
            return probs * tf.expand_dims(upstream, -1)

        return loss, grad

    return cross_entropy(logits)
