"""`train(config)`: from a corpus spec to a trained, evaluated and exported Transformer."""

import json
import math
import os
import sys
import time

import keras
import tensorflow as tf

from keras_transformer.config import save_config
from keras_transformer.models import build_transformer
from keras_transformer.training.callbacks import (
    DevEvaluator,
    ResumeLogger,
    StepCheckpoint,
    StopAtStep,
    TrainingSummaries,
    evaluate_bleu,
    optimizer_step,
)
from keras_transformer.training.distribute import get_strategy, is_chief, resolve_jit_compile
from keras_transformer.training.losses import MaskedSparseCrossEntropy
from keras_transformer.training.metrics import MaskedAccuracy, Perplexity, TokenCount
from keras_transformer.training.optimizers import FusedAdam
from keras_transformer.training.schedules import TransformerSchedule
from keras_transformer.training.visuals import AttentionSummaries, write_hparams
from keras_transformer.workdir import Workdir, list_checkpoints, load_last_checkpoints


def make_optimizer(config, d_model=None):
    """Adam(beta_1, beta_2, epsilon) on the paper's schedule, with the config's gradient
    accumulation and global-norm clipping; wrapped in a `LossScaleOptimizer` for mixed_float16.

    The Adam is `FusedAdam`: Keras's Adam with TensorFlow's one-kernel update (same formula,
    variables and checkpoints; faster, see benchmarks/README.md).
    """
    t = config.train
    schedule = TransformerSchedule(
        d_model or config.model.d_model, t.warmup_steps, t.learning_rate_scale
    )
    optimizer = FusedAdam(
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


def resolve_workdir(config):
    """`runtime.workdir`, or `workdirs/<config name>` when it is not set."""
    return Workdir.of(config).root


def _read_result(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _model_dtype(config):
    policy = config.runtime.mixed_precision
    return None if policy in (None, "float32") else policy


def _export(model, tokenizer, config):
    """Exports the SavedModel if the export module is available; returns its path or None."""
    try:
        from keras_transformer.export import export_saved_model
    except ImportError:
        print("SavedModel export skipped: keras_transformer.export is not available", flush=True)
        return None
    return export_saved_model(
        model,
        tokenizer,
        config.decode,
        config.data,
        config.export.base_dir,
        config.export.name or config.name,
    )


def _maybe_average(model, directory, count):
    """Averages the last `count` checkpoints into `model` (the paper's final models); returns
    how many were averaged (1: the model is left as trained)."""
    if count <= 1 or len(list_checkpoints(directory)) < 2:
        return 1
    steps = load_last_checkpoints(model, directory, count)
    print(f"averaged the last {len(steps)} checkpoints", flush=True)
    return len(steps)


def _print_summary(result):
    lines = [f"Finished {result['name']} at step {result['step']}."]
    for split in ("dev", "test"):
        scores = result.get(split)
        if scores:
            lines.append(
                f"  {split} sacreBLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  "
                f"({scores['sentences']} sentences, beam {result['beam_size']})"
            )
    lines.append(f"  checkpoints: {result['checkpoints']}")
    lines.append(f"  TensorBoard: tensorboard --logdir {result['logs']}")
    if result.get("saved_model"):
        lines.append(f"  SavedModel:  {result['saved_model']}")
    else:
        lines.append("  SavedModel:  not exported")
    print("\n".join(lines), flush=True)


def _training_data(config, layout, strategy):
    """The vocabulary and the training batches, streamed from the workdir's prepared shards.

    The chief runs `prepare` (which streams the corpus into `WORKDIR/prepared` when it is not
    there, and otherwise checks that it matches the config: a `DataError` names any difference);
    other workers of a multi-worker job wait for its manifest. Each worker then reads its own
    shards (the dataset's auto-shard policy is FILE).

    Returns:
        `(tokenizer, dataset, num_pairs)`: the `Tokenizer`, the repeated training dataset of
        `prepared_dataset` (global batches of `data.tokens_per_batch` x replicas tokens) and the
        number of prepared training pairs.
    """
    from keras_transformer.data import Tokenizer, prepare, prepared_dataset, wait_for_prepared
    from keras_transformer.data.prepare import VOCABULARY

    manifest = prepare(config) if is_chief(strategy) else wait_for_prepared(config)
    tokenizer = Tokenizer(os.path.join(layout.prepared, VOCABULARY))
    # data.tokens_per_batch is per replica; the strategy splits each global batch evenly.
    replicas = strategy.num_replicas_in_sync
    dataset = prepared_dataset(
        layout.prepared,
        config.data,
        training=True,
        tokens_per_batch=config.data.tokens_per_batch * replicas,
        batch_multiple=replicas,
    )
    return tokenizer, dataset, manifest["counts"]["written"]


def train(config):
    """Trains, evaluates and exports the model described by `config` (an `ExperimentConfig`).

    Writes the workdir (`runtime.workdir`, default `workdirs/<name>`): `config.yaml` (the
    resolved config), `spm.model` and `prepared/` (the training corpus as tokenized shards, made
    by `keras_transformer.data.prepare` unless already there and matching the config),
    `checkpoints/ckpt-<step>.weights.h5` (last
    `train.keep_checkpoints`), `backup/` (resume state), `logs/` (TensorBoard) and `result.json`.
    Training runs `train.steps` optimizer steps as Keras epochs of `train.steps_per_epoch` steps,
    with dev BLEU (greedy) after each epoch; the final model is scored on the dev (and test) set
    with the `decode` settings and exported to `export.base_dir/<name>/<version>`.

    Running it again on the same workdir resumes from the last backup; a finished run is not
    retrained (its result is printed and returned).

    Returns:
        The result dict written to `result.json`.

    Example:
    >>> from keras_transformer.config import load_config
    >>> result = train(load_config("configs/quickstart.yaml"))
    >>> result["dev"]["bleu"]
    """
    started = time.time()
    layout = Workdir.of(config)
    workdir = layout.root
    t = config.train
    previous = _read_result(layout.result)
    if previous and previous.get("step", 0) >= t.steps:
        print(f"{workdir} already holds a finished run ({previous['step']} steps).", flush=True)
        _print_summary(previous)
        return previous

    # The strategy first: multi-worker and TPU setups must precede any device use.
    strategy = get_strategy(config.runtime)
    chief = is_chief(strategy)
    from keras_transformer.data import read_pairs

    # Seeding clears TensorFlow's kernel caches, which would drop the SentencePiece op's resource
    # (the tokenizer must be created after it).
    keras.utils.set_random_seed(t.seed)
    os.makedirs(workdir, exist_ok=True)
    # Data first: a workdir whose prepared data does not match the config is refused before
    # its config.yaml is overwritten.
    tokenizer, dataset, num_pairs = _training_data(config, layout, strategy)
    if chief:
        save_config(config, layout.config)
    dev_pairs = read_pairs(config.data.dev) if config.data.dev else []
    test_pairs = read_pairs(config.data.test) if config.data.test else []

    jit_compile = resolve_jit_compile(config.runtime.jit_compile, strategy)
    with strategy.scope():
        model = build_transformer(config.model, tokenizer.vocab_size, dtype=_model_dtype(config))
        compile_model(model, config, jit_compile=jit_compile)
    print(
        f"Training {config.name}: {model.count_params():,} parameters, vocabulary "
        f"{tokenizer.vocab_size}, {num_pairs:,} training pairs, {t.steps} steps, "
        f"strategy {type(strategy).__name__} ({strategy.num_replicas_in_sync} replicas), "
        f"jit_compile={jit_compile}, precision {config.runtime.mixed_precision or 'float32'}",
        flush=True,
    )

    # Keras counts batches; the config counts optimizer updates.
    accumulation = t.gradient_accumulation_steps
    tty = sys.stdout.isatty()
    epochs = math.ceil(t.steps / t.steps_per_epoch)
    stopper = StopAtStep(t.steps, None if t.max_minutes is None else t.max_minutes * 60)
    callbacks = [
        # double_checkpoint: a kill in the middle of writing the backup leaves the previous one
        # to restore from (the write is not atomic).
        keras.callbacks.BackupAndRestore(
            layout.backup,
            save_freq=t.checkpoint_every * accumulation,
            double_checkpoint=True,
            delete_checkpoint=False,
        ),
        ResumeLogger(),
        keras.callbacks.TerminateOnNaN(),
        stopper,
        StepCheckpoint(layout.checkpoints, t.checkpoint_every, t.keep_checkpoints, chief),
        TrainingSummaries(
            layout.logs, t.log_every, chief, total_steps=t.steps, print_lines=chief and not tty
        ),
    ]
    if chief:
        write_hparams(layout.logs, config)
    if dev_pairs:
        callbacks.append(
            DevEvaluator(
                dev_pairs[: t.eval_max_sentences],
                tokenizer,
                config.data,
                logdir=layout.logs,
                beam_size=1,
                max_extra_length=config.decode.max_extra_length,
                batch_size=config.decode.batch_size,
                num_samples=t.num_sample_translations,
                skip_at_step=t.steps,
                enabled=chief,
            )
        )
        # Heatmaps of the first dev sentence at each evaluation (TensorBoard's Images tab).
        callbacks.append(
            AttentionSummaries(dev_pairs[0][0], tokenizer, config.data, layout.logs, chief)
        )
    model.fit(
        dataset,
        epochs=epochs,
        steps_per_epoch=t.steps_per_epoch * accumulation,
        callbacks=callbacks,
        # A live progress bar in a terminal; in logs, one line per epoch (and TrainingSummaries'
        # lines every log_every steps).
        verbose=1 if tty else 2,
        shuffle=False,  # the dataset shuffles
    )
    step = optimizer_step(model)
    if step < t.steps and not stopper.out_of_time:
        raise RuntimeError(f"training stopped at step {step} of {t.steps} (NaN loss?)")
    train_seconds = time.time() - started
    averaged = _maybe_average(model, layout.checkpoints, config.export.average_checkpoints)

    result = {
        "name": config.name,
        "step": step,
        "stopped_by_time_budget": stopper.out_of_time,
        "beam_size": config.decode.beam_size,
        "train_seconds": round(train_seconds, 1),
        "checkpoints": layout.checkpoints,
        "averaged_checkpoints": averaged,
        "logs": layout.logs,
    }
    decode_kwargs = dict(
        beam_size=config.decode.beam_size,
        alpha=config.decode.alpha,
        max_extra_length=config.decode.max_extra_length,
        batch_size=config.decode.batch_size,
    )
    cache = {}
    for split, split_pairs in (("dev", dev_pairs), ("test", test_pairs)):
        if split_pairs:
            scores, _ = evaluate_bleu(
                model, tokenizer, split_pairs, config.data, _cache=cache, **decode_kwargs
            )
            result[split] = scores
            if chief:
                with tf.summary.create_file_writer(os.path.join(layout.logs, split)).as_default(
                    step=step
                ):
                    tf.summary.scalar(f"final_{split}_bleu", scores["bleu"])
    result["saved_model"] = _export(model, tokenizer, config) if chief else None
    result["total_seconds"] = round(time.time() - started, 1)
    if chief:
        with open(layout.result, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    _print_summary(result)
    return result
