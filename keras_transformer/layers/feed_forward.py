"""Position-wise feed-forward network."""

import keras

from keras_transformer.fast_paths import Kernels
from keras_transformer.layers import _fast_paths
from keras_transformer.layers._initializers import clone_initializer
from keras_transformer.layers._specs import CallTracedSpec


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionwiseFeedForward(CallTracedSpec, keras.layers.Layer):
    """`FFN(x) = max(0, x W1 + b1) W2 + b2`, applied to every position alike.

    Args:
        d_ff: inner width (2048 in the base model).
        activation: inner activation; the paper uses `"relu"`.
        dropout: dropout on the inner activations (0 in the paper).
        output_dim: output width; defaults to the input's last dimension.
        kernel_initializer: initializer of both kernels.
        kernels: the fast paths (`keras_transformer.fast_paths.Kernels`, a setting such as
            `"none"`, or None for the current setting), chosen here once.

    Call arguments:
        inputs: `[..., d_model]`.
        training: enables dropout.

    Example:
    >>> import numpy as np
    >>> ffn = PositionwiseFeedForward(d_ff=2048)
    >>> tuple(ffn(np.zeros((2, 10, 512), "float32")).shape)
    (2, 10, 512)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", section 3.3.
    """

    def __init__(
        self,
        d_ff,
        activation="relu",
        dropout=0.0,
        output_dim=None,
        kernel_initializer="glorot_uniform",
        kernels=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.kernels = Kernels.get(kernels)
        self.d_ff = int(d_ff)
        self.activation = keras.activations.get(activation)
        self.dropout = float(dropout)
        self.output_dim = output_dim
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def build(self, input_shape):
        self.inner = keras.layers.Dense(
            self.d_ff,
            activation=self.activation,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="inner",
        )
        self.inner.build(input_shape)
        self.inner_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.outer = keras.layers.Dense(
            self.output_dim or input_shape[-1],
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="outer",
        )
        self.outer.build(tuple(input_shape[:-1]) + (self.d_ff,))
        self.built = True

    def call(self, inputs, training=None):
        inner = _fast_paths.call_dense(self.kernels, self.inner, inputs, training)
        return _fast_paths.call_dense(
            self.kernels, self.outer, self.inner_dropout(inner, training=training), training
        )

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim or input_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "d_ff": self.d_ff,
                "activation": keras.activations.serialize(self.activation),
                "dropout": self.dropout,
                "output_dim": self.output_dim,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "kernels": self.kernels.to_config(),
            }
        )
        return config
