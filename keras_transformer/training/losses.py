"""The paper's training loss: label-smoothed cross-entropy over the non-padding target tokens."""

import threading

import keras
from keras import ops

from keras_transformer.training import _fast_paths


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
    losses, mask, _ = _losses_mask_and_statistics(labels, logits, label_smoothing, pad_id)
    return losses, mask


def _losses_mask_and_statistics(labels, logits, label_smoothing, pad_id):
    """`(losses, mask, statistics)`; `statistics` is None unless the fused TF path ran."""
    logits = ops.cast(logits, "float32")
    labels = ops.cast(labels, "int32")
    fast = _fast_paths.cross_entropy(labels, logits, float(label_smoothing))
    if fast is not None:
        losses, statistics = fast
    else:
        # The smoothed target distribution, built with one `where`.
        vocab_size = logits.shape[-1] or ops.shape(logits)[-1]
        is_label = ops.equal(ops.expand_dims(labels, -1), ops.arange(vocab_size, dtype="int32"))
        low = label_smoothing / vocab_size
        target = ops.where(is_label, 1.0 - label_smoothing + low, low)
        losses, statistics = ops.categorical_crossentropy(target, logits, from_logits=True), None
    mask = ops.cast(ops.not_equal(labels, pad_id), "float32")
    return losses * mask, mask, statistics


# Per-token statistics of the last logits the loss saw, per thread (tf.distribute traces each
# replica in a thread of its own): the training metrics read them instead of the logits.
_LAST = threading.local()


def token_statistics(y_true, y_pred):
    """The per-token statistics `MaskedSparseCrossEntropy` computed for exactly these tensors.

    Keras computes a step's loss and then its metrics from the same `y_true` and `y_pred`
    objects; the loss leaves `{"label_logit", "max_logit", "logsumexp"}` (float32,
    `[batch, length]`, no gradient) behind for them, so the metrics need not read the logits
    again and the logits' buffer can be freed (or overwritten by the softmax) before the
    backward pass. Returns None for any other tensors (then the metrics compute from the logits).
    """
    entry = getattr(_LAST, "entry", None)
    if entry is not None and entry[0] is y_true and entry[1] is y_pred:
        return entry[2]
    return None


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
    ```python
    model.compile(optimizer="adam", loss=MaskedSparseCrossEntropy(label_smoothing=0.1))
    ```

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
        # Keras converts both before `call`; the statistics are left under the tensors the
        # metrics will be given, i.e. these.
        _LAST.inputs = (y_true, y_pred)
        try:
            return super().__call__(y_true, y_pred, sample_weight=mask)
        finally:
            _LAST.inputs = None

    def call(self, y_true, y_pred):
        losses, _, statistics = _losses_mask_and_statistics(
            y_true, y_pred, self.label_smoothing, self.pad_id
        )
        inputs = getattr(_LAST, "inputs", None)
        _LAST.entry = None if statistics is None or inputs is None else (*inputs, statistics)
        return losses

    def get_config(self):
        return {"name": self.name, "label_smoothing": self.label_smoothing, "pad_id": self.pad_id}
