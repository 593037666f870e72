"""The paper's learning-rate schedule as a serializable Keras `LearningRateSchedule`."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)`.

    Linear warm-up for `warmup_steps`, then decay with the inverse square root of the step; the
    peak, at `step == warmup_steps`, is `scale * (d_model * warmup_steps)^-0.5`. Step 0 (the
    optimizer's counter before its first update) is treated as step 1, so the first update is not
    a zero-learning-rate no-op.

    Args:
        d_model: model width.
        warmup_steps: warm-up steps (the paper uses 4000).
        scale: multiplier (`train.learning_rate_scale`).

    Call arguments:
        step: the optimizer step (int or scalar tensor).

    Returns:
        The float32 learning rate.

    Example:
    ```python
    schedule = TransformerSchedule(d_model=512, warmup_steps=4000)
    optimizer = keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    ```

    References:
        Vaswani et al., 2017, equation (3).
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        self.d_model = int(d_model)
        self.warmup_steps = int(warmup_steps)
        self.scale = float(scale)

    def __call__(self, step):
        step = ops.maximum(ops.cast(step, "float32"), 1.0)
        warmup = float(self.warmup_steps)
        return self.scale * self.d_model**-0.5 * ops.minimum(ops.rsqrt(step), step * warmup**-1.5)

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}
