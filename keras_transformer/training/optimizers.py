"""Adam with TensorFlow's one-kernel update (the paper's optimizer, section 5.3)."""

import keras

# The dtypes TensorFlow's ResourceApplyAdam kernel takes on every device.
_FUSED_DTYPES = ("float16", "bfloat16", "float32", "float64")


@keras.saving.register_keras_serializable(package="keras_transformer")
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` whose TensorFlow update is one `ResourceApplyAdam` kernel.

    Keras's Adam updates each variable with about a dozen element-wise ops (each a pass over the
    variable, its moments or a temporary as large); TensorFlow's `ResourceApplyAdam` reads the
    gradient and writes the variable and both moments in one pass. At the base model's 60M
    parameters the optimizer's passes are memory-bound, so this is measurably faster on CPUs
    (benchmarks/README.md). Same formula, arguments, variables and checkpoints as
    `keras.optimizers.Adam`: `m += (g - m)(1 - beta_1)`, `v += (g^2 - v)(1 - beta_2)`,
    `w -= lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + epsilon)`.

    Other backends, `amsgrad=True` and unusual dtypes use Keras's own update. Clipping, weight
    decay, gradient accumulation, EMA and loss scaling are Keras's and work as with `Adam`.

    Example:
    >>> optimizer = FusedAdam(TransformerSchedule(512), beta_1=0.9, beta_2=0.98, epsilon=1e-9)

    References:
        Kingma & Ba, 2015, "Adam: A Method for Stochastic Optimization";
        Vaswani et al., 2017, section 5.3.
    """

    def update_step(self, gradient, variable, learning_rate):
        if (
            keras.backend.backend() != "tensorflow"
            or self.amsgrad
            or keras.backend.standardize_dtype(variable.dtype) not in _FUSED_DTYPES
        ):
            return super().update_step(gradient, variable, learning_rate)
        import tensorflow as tf

        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        dtype = variable.dtype
        if isinstance(gradient, tf.IndexedSlices):  # what Keras's Adam does implicitly
            gradient = tf.convert_to_tensor(gradient)
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable),
            m=_handle(m),
            v=_handle(v),
            beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype),
        )


def _handle(variable):
    """The resource handle of a Keras or TensorFlow variable (per replica under tf.distribute)."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle
