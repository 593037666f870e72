"""Token-level training metrics that ignore padding: accuracy, perplexity and a token counter."""

import keras
from keras import ops

from keras_transformer.config import PAD_ID


class _MaskedMean(keras.metrics.Metric):
    """Running mean of a per-token value over the non-padding tokens."""

    def __init__(self, pad_id=PAD_ID, name=None, dtype="float32"):
        super().__init__(name=name, dtype=dtype)
        self.pad_id = int(pad_id)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def _values(self, y_true, y_pred):
        raise NotImplementedError

    def _values_from_statistics(self, statistics):
        raise NotImplementedError

    def update_state(self, y_true, y_pred, sample_weight=None):
        values, mask = self._values(y_true, y_pred)
        self._add(values, mask)

    def update_state_from_statistics(self, statistics, weights):
        """Updates from the per-token statistics of the logits that
        `MaskedSparseCrossEntropy.call_with_statistics` returns (no second read of the logits);
        `weights` float32 `[batch, length]` (0 at padding)."""
        self._add(self._values_from_statistics(statistics), weights)

    def _add(self, values, weights):
        self.total.assign_add(ops.sum(values * weights))
        self.count.assign_add(ops.sum(weights))

    def result(self):
        return self.total / ops.maximum(self.count, 1.0)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype, "pad_id": self.pad_id}


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(_MaskedMean):
    """Fraction of non-padding target tokens whose argmax prediction is the label.

    Args:
        pad_id: padding id of the labels (0).
        name: metric name (default "accuracy").

    Example:
    ```python
    model.compile(..., metrics=[MaskedAccuracy()])
    ```
    """

    def __init__(self, pad_id=PAD_ID, name="accuracy", dtype="float32"):
        super().__init__(pad_id=pad_id, name=name, dtype=dtype)

    def _values(self, y_true, y_pred):
        # A hit: the label's logit is the largest. Cheaper than ops.argmax, which adds four
        # passes over [batch, length, vocab] for its -0.0 handling (differs only on exact ties).
        y_true = ops.cast(y_true, "int32")
        label_logit = ops.take_along_axis(y_pred, ops.expand_dims(y_true, -1), axis=-1)
        statistics = {"label_logit": label_logit[..., 0], "max_logit": ops.max(y_pred, axis=-1)}
        return (
            self._values_from_statistics(statistics),
            ops.cast(ops.not_equal(y_true, self.pad_id), "float32"),
        )

    def _values_from_statistics(self, statistics):
        return ops.cast(
            ops.greater_equal(statistics["label_logit"], statistics["max_logit"]), "float32"
        )


@keras.saving.register_keras_serializable(package="keras_transformer")
class Perplexity(_MaskedMean):
    """exp of the mean (unsmoothed) negative log-likelihood of the non-padding target tokens.

    Args:
        pad_id: padding id of the labels (0).
        name: metric name (default "perplexity").
    """

    def __init__(self, pad_id=PAD_ID, name="perplexity", dtype="float32"):
        super().__init__(pad_id=pad_id, name=name, dtype=dtype)

    def _values(self, y_true, y_pred):
        # -log p(label) = logsumexp - label logit: forward only (a metric has no gradient), so
        # no softmax-cross-entropy backprop buffer of the logits' size is made.
        y_true = ops.cast(y_true, "int32")
        y_pred = ops.cast(y_pred, "float32")
        label_logit = ops.take_along_axis(y_pred, ops.expand_dims(y_true, -1), axis=-1)
        statistics = {"label_logit": label_logit[..., 0], "logsumexp": ops.logsumexp(y_pred, -1)}
        return (
            self._values_from_statistics(statistics),
            ops.cast(ops.not_equal(y_true, self.pad_id), "float32"),
        )

    def _values_from_statistics(self, statistics):
        return statistics["logsumexp"] - statistics["label_logit"]

    def result(self):
        # Clipped so that an untrained model's first batches do not print inf.
        return ops.exp(ops.minimum(super().result(), 50.0))


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenCount(keras.metrics.Metric):
    """Non-padding target tokens seen since the last reset (feeds the tokens/s summary).

    Args:
        pad_id: padding id of the labels (0).
        name: metric name (default "tokens").
    """

    def __init__(self, pad_id=PAD_ID, name="tokens", dtype="float32"):
        super().__init__(name=name, dtype=dtype)
        self.pad_id = int(pad_id)
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.count.assign_add(ops.sum(ops.cast(ops.not_equal(y_true, self.pad_id), "float32")))

    def update_state_from_statistics(self, statistics, weights):
        """Counts the tokens of nonzero weight (`weights` as the loss returns them)."""
        self.count.assign_add(ops.sum(ops.cast(ops.not_equal(weights, 0.0), "float32")))

    def result(self):
        return ops.convert_to_tensor(self.count)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype, "pad_id": self.pad_id}
