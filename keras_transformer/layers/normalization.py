"""Layer normalization with a hand-written gradient (TensorFlow), for the blocks' residuals."""

import keras
from keras import ops

# True: the TensorFlow path below; False: Keras's own LayerNormalization arithmetic (the
# straightforward form tests/test_fast_paths.py and benchmarks/ab_train.py compare it with).
FUSED_LAYER_NORM = True


@keras.saving.register_keras_serializable(package="keras_transformer")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` whose TensorFlow gradient is written out by hand.

    Same arguments, weights (`gamma`, `beta`), config and checkpoints as Keras's layer; the
    output is `(x - mean) / sqrt(var + epsilon) * gamma + beta` over the last axis, computed in
    at least float32. Differentiated automatically, Keras's arithmetic keeps several
    activation-sized tensors per layer for the backward pass; here only the normalized input and
    `1 / sqrt(var + epsilon)` are kept, and the backward pass is the closed form
    `dx = (g - mean(g) - x_hat * mean(g * x_hat)) / sqrt(var + epsilon)` with `g = dy * gamma`.
    Other axes, `rms_scaling`, no `center`/`scale` and other backends use Keras's computation.

    References:
        Ba, Kiros & Hinton, 2016, "Layer Normalization".
    """

    def call(self, inputs):
        if (
            not FUSED_LAYER_NORM
            or keras.backend.backend() != "tensorflow"
            or self.rms_scaling
            or not (self.center and self.scale)
            or self.axis not in (-1, [-1], len(inputs.shape) - 1, [len(inputs.shape) - 1])
        ):
            return super().call(inputs)
        compute = keras.backend.result_type(inputs.dtype, "float32")
        outputs = _tf_layer_norm(
            ops.cast(inputs, compute),
            ops.cast(self.gamma, compute),
            ops.cast(self.beta, compute),
            self.epsilon,
        )
        return ops.cast(outputs, self.compute_dtype)


def _tf_layer_norm(x, gamma, beta, epsilon):
    import tensorflow as tf

    @tf.custom_gradient
    def layer_norm(x, gamma, beta):
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        inv_std = tf.math.rsqrt(variance + epsilon)
        x_hat = (x - mean) * inv_std
        outputs = x_hat * gamma + beta

        def grad(d_outputs):
            batch_axes = list(range(len(x.shape) - 1))
            d_beta = tf.reduce_sum(d_outputs, axis=batch_axes)
            d_gamma = tf.reduce_sum(d_outputs * x_hat, axis=batch_axes)
            g = d_outputs * gamma
            mean_g = tf.reduce_mean(g, axis=-1, keepdims=True)
            mean_g_x_hat = tf.reduce_mean(g * x_hat, axis=-1, keepdims=True)
            d_x = (g - mean_g - x_hat * mean_g_x_hat) * inv_std
            return d_x, d_gamma, d_beta

        return outputs, grad

    return layer_norm(x, gamma, beta)
