"""Layer normalization for the blocks' residual connections."""

import keras

from keras_transformer.fast_paths import Kernels
from keras_transformer.layers import _fast_paths
from keras_transformer.layers._specs import CallTracedSpec


@keras.saving.register_keras_serializable(package="keras_transformer")
class LayerNormalization(CallTracedSpec, keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization`, with a faster gradient on TensorFlow.

    Same arguments, weights (`gamma`, `beta`), config and checkpoints as Keras's layer; the
    output is `(x - mean) / sqrt(var + epsilon) * gamma + beta` over the last axis, computed in
    at least float32. On TensorFlow the `fused_layer_norm` fast path (chosen by `kernels`,
    `keras_transformer.fast_paths`) computes the same numbers with a hand-written gradient that
    keeps fewer activation-sized tensors for the backward pass (docs/guides/performance.md).

    Args:
        Those of `keras.layers.LayerNormalization` (`axis`, `epsilon`, `center`, `scale`, ...).
        kernels: the fast paths (`keras_transformer.fast_paths.Kernels`, a setting such as
            `"none"`, or None for the current setting), chosen here once.

    Call arguments:
        inputs: any tensor; normalized over `axis`.

    Example:
    >>> import numpy as np
    >>> norm = LayerNormalization(epsilon=1e-6)
    >>> y = np.asarray(norm(np.arange(8, dtype="float32").reshape(2, 4)), "float64")
    >>> np.round(y.mean(-1), 4).tolist(), np.round(y.std(-1), 3).tolist()
    ([0.0, 0.0], [1.0, 1.0])

    References:
        Ba, Kiros & Hinton, 2016, "Layer Normalization".
    """

    def __init__(self, *args, kernels=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.kernels = Kernels.get(kernels)

    def call(self, inputs):
        fast = _fast_paths.layer_norm(self.kernels, self, inputs)
        return super().call(inputs) if fast is None else fast

    def get_config(self):
        return {**super().get_config(), "kernels": self.kernels.to_config()}
