"""The paper's training loss: label-smoothed cross-entropy over the non-padding target tokens."""

import keras
from keras import ops

from keras_transformer.config import PAD_ID
from keras_transformer.fast_paths import Kernels
from keras_transformer.training.recipe import _fast_paths


def masked_token_cross_entropy(labels, logits, label_smoothing=0.0, pad_id=PAD_ID, kernels=None):
    """Per-token cross-entropy against label-smoothed targets, and the non-padding mask.

    The smoothed target distribution is `(1 - eps) * one_hot(label) + eps / vocab_size` (eps
    spread uniformly over the whole vocabulary, as in Szegedy et al. and the paper), so the loss is
    `(1 - eps) * -log p(label) + eps * mean_v(-log p(v))`.

    Args:
        labels: int `[batch, length]` target ids; `pad_id` marks padding.
        logits: float `[batch, length, vocab_size]` unnormalised scores.
        label_smoothing: eps in `[0, 1)`.
        pad_id: the id whose positions carry no loss.
        kernels: the fast paths (`keras_transformer.fast_paths.Kernels` or a setting such as
            `"all"`; None: the plain formula, since a function called while a graph is traced
            must not read the current setting): `fused_loss` computes the same numbers faster
            on TensorFlow. `MaskedSparseCrossEntropy` passes the `kernels` it was built with.

    Returns:
        `(losses, mask)`: float32 `[batch, length]` per-token losses (0 at padding) and the
        float32 `[batch, length]` mask of real tokens.
    """
    kernels = Kernels.get("none" if kernels is None else kernels)
    losses, mask, _ = _losses_mask_and_statistics(labels, logits, label_smoothing, pad_id, kernels)
    return losses, mask


def _losses_mask_and_statistics(labels, logits, label_smoothing, pad_id, kernels):
    """`(losses, mask, statistics)`; `statistics` is None unless the fused TF path ran."""
    logits = ops.cast(logits, "float32")
    labels = ops.cast(labels, "int32")
    fast = _fast_paths.cross_entropy(kernels, labels, logits, float(label_smoothing))
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


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedSparseCrossEntropy(keras.losses.Loss):
    """Label-smoothed sparse cross-entropy averaged over the non-padding tokens of a batch.

    Padding positions (`labels == pad_id`) contribute nothing, and the mean is over real tokens
    only, so batches with much padding are not down-weighted.

    Args:
        label_smoothing: eps_ls (the paper uses 0.1).
        pad_id: padding id of the labels (0).
        kernels: the fast paths (`keras_transformer.fast_paths.Kernels`, a setting, or None for
            the current setting), chosen here once: `fused_loss` computes the same numbers with
            less memory on TensorFlow.
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

    def __init__(
        self,
        label_smoothing=0.1,
        pad_id=PAD_ID,
        name="masked_sparse_cross_entropy",
        kernels=None,
        **kw,
    ):
        # "mean_with_sample_weight" divides by the sum of the weights (here: the real tokens) and
        # lets Keras scale the loss for tf.distribute (one replica's share of the global mean).
        kw.pop("reduction", None)
        super().__init__(name=name, reduction="mean_with_sample_weight", **kw)
        self.label_smoothing = float(label_smoothing)
        self.pad_id = int(pad_id)
        self.kernels = Kernels.get(kernels)

    def token_weights(self, y_true, sample_weight=None):
        """The weight of each target token in the mean: 1 for real tokens, 0 for padding
        (times `sample_weight` when given); float32 `[batch, length]`."""
        mask = ops.cast(ops.not_equal(ops.cast(y_true, "int32"), self.pad_id), "float32")
        if sample_weight is not None:
            mask = mask * ops.cast(sample_weight, "float32")
        return mask

    def __call__(self, y_true, y_pred, sample_weight=None):
        # "mean_with_sample_weight" over the token weights: the mean over real tokens.
        return super().__call__(
            y_true, y_pred, sample_weight=self.token_weights(y_true, sample_weight)
        )

    def call(self, y_true, y_pred):
        losses, _ = masked_token_cross_entropy(
            y_true, y_pred, self.label_smoothing, self.pad_id, self.kernels
        )
        return losses

    def call_with_statistics(self, y_true, y_pred, sample_weight=None):
        """Per-token losses, their weights and the statistics of the logits, for a train step.

        The loss of the batch is `sum(losses * weights) / sum(weights)` (what calling the loss
        returns, before tf.distribute's scaling). The statistics let the metrics
        (`MaskedAccuracy`, `Perplexity`, `update_state_from_statistics`) skip reading the
        logits again, so the logits' buffer can be freed (or overwritten by the softmax) before
        the backward pass.

        Args:
            y_true: int `[batch, length]` labels.
            y_pred: float `[batch, length, vocab_size]` logits.
            sample_weight: optional `[batch, length]` or `[batch, 1]` weights.

        Returns:
            `(losses, weights, statistics)`: float32 `[batch, length]` per-token losses (0 at
            padding), the float32 `[batch, length]` token weights, and a dict of float32
            `[batch, length]` tensors without gradient (`label_logit`, `max_logit`,
            `logsumexp`), or None when the fused TensorFlow path did not run (then metrics
            compute from the logits).

        Example:
        ```python
        losses, weights, stats = loss.call_with_statistics(labels, logits)
        accuracy.update_state_from_statistics(stats, weights)
        ```
        """
        with keras.name_scope(self.name):
            weights = self.token_weights(y_true, sample_weight)
            losses, _, statistics = _losses_mask_and_statistics(
                y_true, y_pred, self.label_smoothing, self.pad_id, self.kernels
            )
        return losses, weights, statistics

    def get_config(self):
        return {
            "name": self.name,
            "label_smoothing": self.label_smoothing,
            "pad_id": self.pad_id,
            "kernels": self.kernels.to_config(),
        }
