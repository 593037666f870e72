"""Adam with TensorFlow's one-kernel update (the paper's optimizer, section 5.3)."""

import keras

from keras_transformer.fast_paths import Kernels
from keras_transformer.training.recipe import _fast_paths


@keras.saving.register_keras_serializable(package="keras_transformer")
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` whose TensorFlow update is one `ResourceApplyAdam` kernel.

    Keras's Adam updates each variable with about a dozen element-wise ops (each a pass over the
    variable, its moments or a temporary as large); TensorFlow's `ResourceApplyAdam` reads the
    gradient and writes the variable and both moments in one pass. At the base model's 60M
    parameters the optimizer's passes are memory-bound, so this is measurably faster on CPUs
    (docs/guides/performance.md). Same formula, arguments, variables and checkpoints as
    `keras.optimizers.Adam`: `m += (g - m)(1 - beta_1)`, `v += (g^2 - v)(1 - beta_2)`,
    `w -= lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + epsilon)`.

    The one-kernel update is the `fused_adam` fast path, chosen by the `kernels` argument (a
    `keras_transformer.fast_paths.Kernels`, a setting, or None for the current setting); other
    backends, `amsgrad=True` and unusual dtypes use Keras's own update. Clipping, weight
    decay, gradient accumulation, EMA and loss scaling are Keras's and work as with `Adam`,
    except that decoupled weight decay applies to matrices only (rank >= 2: kernels,
    embeddings), as in nanoGPT: vectors (biases, LayerNorm's scale and offset) are not decayed,
    whatever their names.

    Example:
    ```python
    optimizer = FusedAdam(TransformerSchedule(512), beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    ```

    References:
        Kingma & Ba, 2015, "Adam: A Method for Stochastic Optimization";
        Vaswani et al., 2017, section 5.3.
    """

    def __init__(self, *args, kernels=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.kernels = Kernels.get(kernels)

    def build(self, variables):
        if self.weight_decay:
            self.exclude_from_weight_decay(var_list=[v for v in variables if len(v.shape) < 2])
        super().build(variables)

    def update_step(self, gradient, variable, learning_rate):
        if not _fast_paths.apply_adam(self.kernels, self, gradient, variable, learning_rate):
            super().update_step(gradient, variable, learning_rate)

    def get_config(self):
        return {**super().get_config(), "kernels": self.kernels.to_config()}
