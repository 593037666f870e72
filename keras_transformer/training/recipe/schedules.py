"""Learning-rate schedules as serializable Keras `LearningRateSchedule`s: the paper's, and one that
decays to zero at the end of a step or time budget."""

import math

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


DECAYS = ("linear", "cosine")


@keras.saving.register_keras_serializable(package="keras_transformer")
class BudgetSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Warm-up, then a decay that reaches zero exactly when the training budget ends.

    `lr = scale * (d_model * warmup_steps)^-0.5 * min(1, step / warmup_steps) * decay(p)`
    with `decay(p) = 1 - p` (linear) or `(1 + cos(pi * p)) / 2` (cosine) and `p`, the part of
    the budget used, `max(step / total_steps, elapsed_seconds / total_seconds)` clipped to
    [0, 1]. The peak factor is the paper schedule's peak (`TransformerSchedule` at
    `step == warmup_steps`), so `train.learning_rate_scale` means the same under both.

    Budgeted-training studies (Li et al., 2020) find that under a fixed budget a schedule
    decaying linearly to zero at the end beats schedules that never anneal, such as the paper's
    inverse square root; `train.schedule: linear` uses this one, and when `train.max_minutes`
    bounds the run the decay follows the training time: the trainer's `StopAtStep` writes the
    seconds trained so far (counted across resumes, kept in the resume state) into
    `elapsed_seconds` after every step, so the rate reaches zero when the time runs out, however
    many steps that is. The time part works where the train step reads the variable at run
    time (the TensorFlow backend, which `train()` uses); elsewhere only the steps count.

    Args:
        d_model: model width.
        warmup_steps: steps of linear warm-up.
        total_steps: the step budget (`train.steps`).
        scale: multiplier (`train.learning_rate_scale`).
        decay: "linear" or "cosine".
        total_seconds: the time budget (`train.max_minutes * 60`); None: steps only.

    Call arguments:
        step: the optimizer step (int or scalar tensor); step 0 counts as 1.

    Returns:
        The float32 learning rate.

    Example:
    ```python
    schedule = BudgetSchedule(256, warmup_steps=1000, total_steps=100000, total_seconds=1800)
    schedule.elapsed_seconds.assign(900.0)   # half the time budget used
    float(schedule(1000))                    # the peak, halved
    ```

    References:
        Li, Yumer & Ramanan, 2020, "Budgeted Training: Rethinking Deep Neural Network Training
        Under Resource Constraints" (ICLR).
    """

    def __init__(
        self, d_model, warmup_steps, total_steps, scale=1.0, decay="linear", total_seconds=None
    ):
        if decay not in DECAYS:
            raise ValueError(f"decay must be one of {DECAYS}, got {decay!r}")
        if int(total_steps) < 1 or (total_seconds is not None and total_seconds <= 0):
            raise ValueError("total_steps and total_seconds must be positive")
        self.d_model = int(d_model)
        self.warmup_steps = max(1, int(warmup_steps))
        self.total_steps = int(total_steps)
        self.scale = float(scale)
        self.decay = decay
        self.total_seconds = None if total_seconds is None else float(total_seconds)
        self.elapsed_seconds = keras.Variable(
            0.0, dtype="float32", trainable=False, name="budget_elapsed_seconds"
        )

    def progress(self, step):
        """The part of the budget used at `step` (and `elapsed_seconds`), in [0, 1]."""
        used = ops.cast(step, "float32") / float(self.total_steps)
        if self.total_seconds is not None:
            used = ops.maximum(used, ops.cast(self.elapsed_seconds, "float32") / self.total_seconds)
        return ops.clip(used, 0.0, 1.0)

    def __call__(self, step):
        step = ops.maximum(ops.cast(step, "float32"), 1.0)
        peak = self.scale * (self.d_model * self.warmup_steps) ** -0.5
        warm = ops.minimum(1.0, step / float(self.warmup_steps))
        p = self.progress(step)
        if self.decay == "linear":
            left = 1.0 - p
        else:
            left = 0.5 * (1.0 + ops.cos(math.pi * p))
        return peak * warm * left

    def get_config(self):
        return {
            "d_model": self.d_model,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "scale": self.scale,
            "decay": self.decay,
            "total_seconds": self.total_seconds,
        }
