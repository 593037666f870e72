"""The training recipe without TensorFlow: `make_optimizer` (Adam on the paper's schedule) and
`compile_model` (that optimizer, the masked label-smoothed loss and the metrics). Both backends'
trainers use them; `keras_transformer.training.run.outline` (TensorFlow) re-exports them."""

import keras

from keras_transformer.config import budget_seconds
from keras_transformer.models.guided_alignment import GuidedAlignment, resolve_alignment_layer
from keras_transformer.training.recipe.losses import MaskedSparseCrossEntropy
from keras_transformer.training.recipe.metrics import MaskedAccuracy, Perplexity, TokenCount
from keras_transformer.training.recipe.optimizers import FusedAdam
from keras_transformer.training.recipe.schedules import BudgetSchedule, TransformerSchedule


def make_optimizer(config, d_model=None, kernels=None):
    """Adam(beta_1, beta_2, epsilon) on the config's schedule (`train.schedule`: the paper's
    `TransformerSchedule`, or a `BudgetSchedule` ending with the step or time budget), with the
    config's global-norm clipping, decoupled weight decay (`train.weight_decay`, Keras's
    `weight_decay`: AdamW on matrices only, see `FusedAdam`; biases and LayerNorm's gamma and
    beta are vectors and are not decayed) and, with
    `train.ema_momentum`, Keras's moving average of the weights (`use_ema`; see
    `callbacks.averaged_weights`); wrapped in a `LossScaleOptimizer` for mixed_float16.
    (Gradient accumulation is the model's train step's, see `compile_model`.)

    The Adam is `FusedAdam`: Keras's Adam with TensorFlow's one-kernel update (same formula,
    variables and checkpoints; faster, see docs/guides/performance.md).
    """
    t = config.train
    d_model = d_model or config.model.d_model
    if t.schedule == "rsqrt":
        schedule = TransformerSchedule(d_model, t.warmup_steps, t.learning_rate_scale)
    else:
        schedule = BudgetSchedule(
            d_model,
            t.warmup_steps,
            t.steps,
            t.learning_rate_scale,
            decay=t.schedule,
            total_seconds=budget_seconds(t)[0],  # training's part of train.max_minutes
        )
    optimizer = FusedAdam(
        learning_rate=schedule,
        beta_1=t.adam_beta_1,
        beta_2=t.adam_beta_2,
        epsilon=t.adam_epsilon,
        global_clipnorm=t.clip_norm,
        weight_decay=t.weight_decay or None,
        use_ema=t.ema_momentum is not None,
        ema_momentum=0.99 if t.ema_momentum is None else t.ema_momentum,
        kernels=kernels,
    )
    if config.runtime.mixed_precision == "mixed_float16":
        # float16 gradients underflow without loss scaling.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def compile_model(model, config, jit_compile=False, steps_per_execution=1):
    """Compiles `model` with the paper's loss, optimizer and schedule from `config`.

    Call it inside `strategy.scope()` when training distributed. Afterwards `model.fit` on
    `keras_transformer.data.make_dataset(...)` trains with the same recipe as `train(config)`.
    A built model (as `build_transformer` returns it) gets its optimizer's variables now (Adam's
    moments), so an optimizer state can be restored before the first step.

    `train.gradient_accumulation_steps` (k) goes to the model's train step
    (`model.gradient_accumulation_steps`): each batch fed to `fit` holds k micro-batches (build
    the dataset with k times the tokens per batch and `batch_multiple` a multiple of k times the
    replicas), one optimizer update per batch. Keras's own accumulation option is not used: it
    applies the update inside a `cond`, which fails under tf.distribute strategies.

    `train.guided_alignment_weight` > 0 gives the model its guided alignment
    (`model.guided_alignment`, head 0 of decoder layer `export.alignment_layer`): on batches
    that carry the pairs' link matrices (data prepared with `data.train_alignments`) the model
    adds the loss, and the train steps add it to the label-smoothed one.

    Args:
        model: a `keras_transformer.models.Transformer`.
        config: an `ExperimentConfig`.
        jit_compile: XLA-compile the train step.
        steps_per_execution: batches per compiled call.

    Returns:
        The model.

    Example:
    ```python
    with strategy.scope():
        model = build_transformer(config.model, tokenizer.vocab_size)
        compile_model(model, config)
    model.fit(make_dataset(pairs, tokenizer, config.data), steps_per_epoch=100, epochs=3)
    ```
    """
    model.gradient_accumulation_steps = int(config.train.gradient_accumulation_steps)
    weight = config.train.guided_alignment_weight
    if hasattr(model, "guided_alignment"):  # the Transformer adds the loss
        model.guided_alignment = None
        if weight > 0:
            layers = len(model.decoder.blocks)
            layer = resolve_alignment_layer(layers, config.export.alignment_layer)
            model.guided_alignment = GuidedAlignment(float(weight), layer)
    kernels = getattr(model, "kernels", None)  # the model's fast paths, for its loss and Adam
    model.compile(
        optimizer=make_optimizer(config, getattr(model, "d_model", None), kernels),
        loss=MaskedSparseCrossEntropy(
            label_smoothing=config.train.label_smoothing, kernels=kernels
        ),
        metrics=[MaskedAccuracy(), Perplexity(), TokenCount()],
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    if model.built and not model.optimizer.built:
        # Adam's moments exist from here on, as in `train`: a saved optimizer state restores
        # into them before any step, and the first step's peak memory already holds them
        # (Keras's TensorFlow trainer otherwise creates them inside the first step, after
        # that step's peak, so the second step's peak touches ~2 model sizes of fresh pages).
        model.optimizer.build(model.trainable_variables)
    return model
