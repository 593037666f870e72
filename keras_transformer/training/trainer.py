"""`train(config)`: from a corpus spec to a trained, evaluated and exported Transformer."""

import keras

from keras_transformer.training.losses import MaskedSparseCrossEntropy
from keras_transformer.training.metrics import MaskedAccuracy, Perplexity, TokenCount
from keras_transformer.training.schedules import TransformerSchedule


def make_optimizer(config, d_model=None):
    """Adam(beta_1, beta_2, epsilon) on the paper's schedule, with the config's gradient
    accumulation and global-norm clipping; wrapped in a `LossScaleOptimizer` for mixed_float16.
    """
    t = config.train
    schedule = TransformerSchedule(
        d_model or config.model.d_model, t.warmup_steps, t.learning_rate_scale
    )
    optimizer = keras.optimizers.Adam(
        learning_rate=schedule,
        beta_1=t.adam_beta_1,
        beta_2=t.adam_beta_2,
        epsilon=t.adam_epsilon,
        global_clipnorm=t.clip_norm,
        # Keras wants None (not 1) for "no accumulation".
        gradient_accumulation_steps=(
            t.gradient_accumulation_steps if t.gradient_accumulation_steps > 1 else None
        ),
    )
    if config.runtime.mixed_precision == "mixed_float16":
        # float16 gradients underflow without loss scaling.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def compile_model(model, config, jit_compile=False, steps_per_execution=1):
    """Compiles `model` with the paper's loss, optimizer and schedule from `config`.

    Call it inside `strategy.scope()` when training distributed. Afterwards `model.fit` on
    `keras_transformer.data.make_dataset(...)` trains with the same recipe as `train(config)`.

    Args:
        model: a `keras_transformer.models.Transformer`.
        config: an `ExperimentConfig`.
        jit_compile: XLA-compile the train step.
        steps_per_execution: batches per compiled call.

    Returns:
        The model.

    Example:
    >>> with strategy.scope():
    ...     model = build_transformer(config.model, tokenizer.vocab_size)
    ...     compile_model(model, config)
    >>> model.fit(make_dataset(pairs, tokenizer, config.data), steps_per_epoch=100, epochs=3)
    """
    model.compile(
        optimizer=make_optimizer(config, getattr(model, "d_model", None)),
        loss=MaskedSparseCrossEntropy(label_smoothing=config.train.label_smoothing),
        metrics=[MaskedAccuracy(), Perplexity(), TokenCount()],
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model
