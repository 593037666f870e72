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
    # One fused softmax-cross-entropy kernel against the dense smoothed targets (gradient computed
    # in the same pass) instead of log_softmax + take_along_axis, whose gradient scatters into a
    # [batch, length, vocab] zero tensor; the sparse kernel is slower still on CPUs. Measured in
    # benchmarks/README.md; tests/test_fast_paths.py checks it against the log-softmax formula.
    vocab_size = logits.shape[-1] or ops.shape(logits)[-1]
    target = ops.one_hot(labels, vocab_size, dtype="float32")
    if label_smoothing:
        target = target * (1.0 - label_smoothing) + label_smoothing / vocab_size
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
