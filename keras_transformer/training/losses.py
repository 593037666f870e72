"""The paper's training loss: label-smoothed cross-entropy over the non-padding target tokens."""

import keras
from keras import ops

from keras_transformer.tf_utils import in_xla_context


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
    statistics = None
    if keras.backend.backend() == "tensorflow" and FUSED_LOSS:
        losses, statistics = _tf_fused_cross_entropy(labels, logits, float(label_smoothing))
    else:
        # The straightforward form: the smoothed target distribution, built with one `where`.
        vocab_size = logits.shape[-1] or ops.shape(logits)[-1]
        is_label = ops.equal(ops.expand_dims(labels, -1), ops.arange(vocab_size, dtype="int32"))
        low = label_smoothing / vocab_size
        target = ops.where(is_label, 1.0 - label_smoothing + low, low)
        losses = ops.categorical_crossentropy(target, logits, from_logits=True)
    mask = ops.cast(ops.not_equal(labels, pad_id), "float32")
    return losses * mask, mask, statistics


# The fused TensorFlow loss (below) is the default; False selects the straightforward keras.ops
# form, which tests/test_fast_paths.py and benchmarks/ab_train.py compare it with.
FUSED_LOSS = True


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
        losses, _, _ = _losses_mask_and_statistics(
            y_true, y_pred, self.label_smoothing, self.pad_id
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
        >>> losses, weights, stats = loss.call_with_statistics(labels, logits)
        >>> accuracy.update_state_from_statistics(stats, weights)
        """
        with keras.name_scope(self.name):
            weights = self.token_weights(y_true, sample_weight)
            losses, _, statistics = _losses_mask_and_statistics(
                y_true, y_pred, self.label_smoothing, self.pad_id
            )
        return losses, weights, statistics

    def get_config(self):
        return {"name": self.name, "label_smoothing": self.label_smoothing, "pad_id": self.pad_id}


def _tf_fused_cross_entropy(labels, logits, eps):
    """`logsumexp(z) - (1 - eps) * z[label] - eps * mean(z)` with its gradient formed in one pass.

    The gradient `softmax(z) - target` is formed in the forward pass, so the backward pass is
    one multiplication, and one array of the logits' size ([tokens, vocab]) can carry the logits,
    then the softmax, then the gradient: the softmax runs after every read of the logits (their
    row maximum, mean and label logit), so TensorFlow may hand it the logits' buffer, and the
    gradient is written into the softmax's. (A `tf.custom_gradient` over the whole loss would
    keep the logits alive until its outputs exist, i.e. beside the softmax: so the custom
    gradient covers only the reads, and a zero "anchor" added to the loss carries the gradient.)
    The log-partition comes from the softmax: its largest value is `exp(0) / sum(exp(z - max z))`,
    so `logsumexp(z) = max z - log(max softmax(z))`, with no further pass over exponentials.

    Returns:
        `(losses [batch, length], statistics)`: `statistics` holds `label_logit`, `max_logit`
        and `logsumexp`, each `[batch, length]`, without gradient (see
        `MaskedSparseCrossEntropy.call_with_statistics`).

    tests/test_fast_paths.py checks values, gradient and statistics against the log-softmax
    formula; benchmarks/README.md has the time and memory measured.
    """
    import tensorflow as tf

    vocab_size = logits.shape[-1] or tf.shape(logits)[-1]  # static when known
    z = tf.reshape(logits, [-1, vocab_size])  # [tokens, vocab]
    flat_labels = tf.reshape(labels, [-1])
    backward = {}  # filled below, read when the gradient is taken

    @tf.custom_gradient
    def read(z):
        label_logit = tf.gather(z, flat_labels, batch_dims=1)
        max_logit = tf.reduce_max(z, axis=-1)
        mean_logit = tf.reduce_mean(z, axis=-1) if eps else tf.zeros_like(max_logit)
        anchor = tf.zeros_like(max_logit)  # added to the loss: d loss / d anchor = upstream

        def grad(d_anchor, *_):  # the read values enter the loss without gradient
            return backward["d_logits"] * tf.expand_dims(d_anchor, -1)

        return (anchor, label_logit, max_logit, mean_logit), grad

    anchor, *values = read(z)
    label_logit, max_logit, mean_logit = [tf.stop_gradient(v) for v in values]
    with tf.control_dependencies([anchor, label_logit, max_logit, mean_logit]):
        probs = tf.nn.softmax(tf.stop_gradient(z))  # after every read of z: may reuse its buffer
    max_prob = tf.reduce_max(probs, axis=-1)
    logsumexp = max_logit - tf.math.log(max_prob)
    loss = anchor + logsumexp - (1.0 - eps) * label_logit - eps * mean_logit
    with tf.control_dependencies([max_prob]):  # the last read of probs before it is overwritten
        low = eps / tf.cast(tf.shape(z)[-1], tf.float32)
        d_logits = probs - low if eps else probs
        backward["d_logits"] = _subtract_at_labels(d_logits, flat_labels, 1.0 - eps)
    shape = tf.shape(labels)
    statistics = {
        "label_logit": tf.reshape(label_logit, shape),
        "max_logit": tf.reshape(max_logit, shape),
        "logsumexp": tf.reshape(logsumexp, shape),
    }
    return tf.reshape(loss, shape), statistics


def _subtract_at_labels(values, labels, amount):
    """`values[n, labels[n]] -= amount` for every row n of `values` `[tokens, vocab]`.

    TensorFlow's `tensor_scatter_nd_sub` always copies its input (a second array of the logits'
    size), so outside XLA this is `InplaceSub` on `values` viewed as `[tokens * vocab / k, k]`
    (k in 8, 4, 2, 1 dividing vocab: int32 row indices suffice up to 2^31 * k elements), which
    writes into `values`' own buffer. That is safe here because `values` is a fresh tensor with
    no other reader (the loss orders its reads first). XLA, which has no `InplaceSub` and
    updates in place by itself, gets the scatter.
    """
    import tensorflow as tf

    tokens = tf.shape(labels)[0]
    vocab = values.shape[-1]
    if vocab is None or in_xla_context():
        index = tf.stack([tf.range(tokens), labels], axis=1)
        return tf.tensor_scatter_nd_sub(values, index, tf.fill([tokens], amount))
    k = next(k for k in (8, 4, 2, 1) if vocab % k == 0)
    rows = tf.range(tokens) * (vocab // k) + labels // k
    updates = tf.one_hot(labels % k, k, on_value=amount, off_value=0.0, dtype=values.dtype)
    out = tf.raw_ops.InplaceSub(x=tf.reshape(values, [-1, k]), i=rows, v=updates)
    return tf.reshape(out, tf.shape(values))
