"""`train(config)`: from a corpus spec to a trained, evaluated and exported Transformer.

`train()` is an outline of named steps, each a small function below: read the training data,
build the model, fit (resuming exactly where a killed run stopped), average checkpoints, score
and export. Under several workers only the chief writes anything shared (see `_Run`).
"""

import dataclasses
import functools
import json
import math
import os
import sys
import time

import keras
import tensorflow as tf

from keras_transformer import stopping
from keras_transformer.config import (
    budget_seconds,
    decoding_settings,
    export_name,
    save_config,
)
from keras_transformer.errors import WorkerError
from keras_transformer.evaluation import evaluate_bleu
from keras_transformer.final_model import (
    KEPT_FIGURES,
    KeptFigures,
    Plan,
    figures_key,
    final_model,
    reused_dev_scores,
)
from keras_transformer.models import build_transformer
from keras_transformer.training import end_reserve
from keras_transformer.training.callbacks import (
    StepCheckpoint,
    StopAtStep,
    TrainingSummaries,
    optimizer_step,
)
from keras_transformer.training.dev_evaluation import DevEvaluator, KeepBest
from keras_transformer.training.distribute import (
    WorkerTempDir,
    get_strategy,
    is_chief,
    wait_for_path,
)
from keras_transformer.training.init_from import (
    load_parent_weights,
    prepare_parent,
    recorded_parent,
)
from keras_transformer.training.preemption import CatchSignals, StopOnSignal
from keras_transformer.training.recipe import compile_model, make_optimizer  # noqa: F401
from keras_transformer.training.run_state import RunState
from keras_transformer.training.strategies import resolve_jit_compile, strategy_input
from keras_transformer.training.visuals import AttentionSummaries, write_hparams
from keras_transformer.workdir import Workdir, join, read_json, write_atomically

# The chief's heartbeat file in the workdir while it prepares the data (multi-worker).
PREPARE_HEARTBEAT = "prepare.heartbeat"


def _model_dtype(config):
    policy = config.runtime.mixed_precision
    if policy == "auto":
        raise ValueError("runtime.mixed_precision 'auto' is resolved by train() only")
    return None if policy in (None, "float32") else policy


def _export(run, model, tokenizer, result=None, alpha=None):
    """Exports the SavedModel; returns its path.

    Its model card gets the run's (resolved) config, the manifest's counts and `result`'s
    steps, time, precision and scores; the dev set calibrates its confidence."""
    from keras_transformer.data.prepare import read_manifest
    from keras_transformer.export import export_saved_model
    from keras_transformer.export.card import card_facts

    config = run.config
    try:
        manifest = read_manifest(run.layout.prepared)
    except (OSError, ValueError):
        manifest = None

    settings = run.export_decoding
    if alpha is not None:  # chosen on dev
        settings = dataclasses.replace(settings, alpha=alpha)
    return export_saved_model(
        model,
        tokenizer,
        settings,
        config.data,
        config.export.base_dir,
        export_name(config, run.layout.root),
        card_facts=card_facts(config, manifest, result, tokenizer.vocab_size),
        dev_pairs=_read_split(config.data.dev),
        jit_compile=config.export.jit_compile,
    )


def _print_summary(result):
    lines = [f"Finished {result['name']} at step {result['step']}."]
    for split in ("dev", "test"):
        scores = result.get(split)
        if scores:
            lines.append(
                f"  {split} sacreBLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  "
                f"({scores['sentences']} sentences, beam {result['beam_size']})"
            )
    selection = result.get("selection")
    if selection:
        lines.append(
            f"  chosen on {selection['sentences']} dev sentences in {selection['seconds']}s: "
            f"{selection['chosen']['description']}"
        )
        for c in selection["candidates"]:
            lines.append(f"    dev BLEU {c['dev_bleu']:6.2f}  {c['description']}")
    lines.append(f"  checkpoints: {result['checkpoints']}")
    lines.append(f"  TensorBoard: tensorboard --logdir {result['logs']}")
    if result.get("saved_model"):
        lines.append(f"  SavedModel:  {result['saved_model']}")
    else:
        lines.append("  SavedModel:  not exported")
    print("\n".join(lines), flush=True)


@dataclasses.dataclass(frozen=True)
class _Run:
    """What the steps of one `train()` call share, resolved once at its start: the config
    (after `_with_resolved_precision`, the precision it names is concrete), the workdir's
    layout, the strategy's input object (`training.strategies`: everything that differs
    between strategies), whether this worker is the chief, and the start time; and from the
    config, the decoding settings (`decoding`, `export_decoding`) and how the final model is
    made (`plan`), so that the modules below get those values and the sections they read,
    never the config to make them again.

    The whole config still goes where a step records or compares all of it: `save_config`
    (the workdir's `config.yaml`), `write_hparams` (TensorBoard's hyperparameters),
    `card_facts` (the model card embeds it), `prepare(config)` and `check_prepared` (the
    manifest records the data settings and refuses a workdir whose differ; `prepare` is public
    API), `prepare_parent` / `recorded_parent` / `load_parent_weights` (`train.init_from`
    compares the parent's `config.yaml` with this one), `compile_model` (the public recipe for
    your own `model.fit`, which reads `train`, `model` and `runtime`), `Workdir.of` and
    `export_name` (the config package's own).

    Under several workers the chief (worker 0) is the only one that writes anything shared:
    config, vocabulary, checkpoints, backups, TensorBoard, result, export. The others read what
    it makes, keep their resume states in a temporary directory of their own (deleted at the
    end) and skip evaluation, scoring and export.
    """

    config: object
    layout: Workdir
    inputs: object
    chief: bool
    started: float

    @property
    def strategy(self):
        return self.inputs.strategy

    @functools.cached_property
    def decoding(self):
        """The `decode:` section's `DecodingSettings` (the dev and test scoring)."""
        return decoding_settings(self.config)

    @functools.cached_property
    def export_decoding(self):
        """The export's `DecodingSettings` (the `export:` section over `decode:`): the choice
        of the final model decodes with its search, the SavedModel fixes it in its graph."""
        return decoding_settings(self.config, export=True)

    @functools.cached_property
    def plan(self):
        """How the final model is made (`final_model.Plan`)."""
        return Plan.of(self.config, self.export_decoding)


@dataclasses.dataclass(frozen=True)
class _TrainingData:
    """The tokenizer and where the training batches come from: `shards(multiple)` are the
    prepared shards in batches of `multiple` shares of `data.tokens_per_batch` (the strategy's
    input object makes the global batches of them), `accumulation` the micro-batches of a
    replica's share (`train.gradient_accumulation_steps`)."""

    tokenizer: object
    num_pairs: int
    prepared: str
    data_config: object
    accumulation: int

    def shards(self, multiple, **kwargs):
        """Batches of `multiple` shares of data.tokens_per_batch, a multiple of `multiple`."""
        from keras_transformer.data import prepared_dataset

        return prepared_dataset(
            self.prepared,
            self.data_config,
            training=True,
            tokens_per_batch=self.data_config.tokens_per_batch * multiple,
            batch_multiple=multiple,
            **kwargs,
        )

    def first_batches(self, count=3):
        """A few batches of one replica, for timing."""
        return list(self.shards(self.accumulation, verbose=False).take(count))


def train(config):
    """Trains, evaluates and exports the model described by `config` (an `ExperimentConfig`).

    Writes the workdir (`runtime.workdir`, default `workdirs/<name>`): `config.yaml` (the
    resolved config), `spm.model` and `prepared/` (the training corpus as tokenized shards, made
    by `keras_transformer.data.prepare` unless already there and matching the config),
    `checkpoints/ckpt-<step>.weights.h5` (the model's weights, last `train.keep_checkpoints`),
    `backup/` (the resume state, last `train.keep_backups`), `logs/` (TensorBoard) and
    `result.json`. Training runs `train.steps` optimizer steps as Keras epochs of
    `train.steps_per_epoch` steps, with dev BLEU (greedy) after each epoch; the final model is
    scored on the dev (and test) set with the `decode` settings and exported to
    `export.base_dir/<name>/<version>`.

    Running it again on the same workdir resumes exactly: same weights, optimizer state,
    learning rate, dropout randomness and position in the training data as the uninterrupted
    run at the last backup. A finished run is not retrained (its result is printed and
    returned). Under `runtime.strategy: multi_worker` every worker runs the same command (with
    its `TF_CONFIG`); the chief writes, the others train and exit.

    On SIGTERM or SIGINT (to any worker) training finishes its step, saves the resume state and
    a checkpoint of that step, and raises `errors.Preempted` (`keras-transformer train` exits
    with `errors.PREEMPTED_EXIT_CODE`, 75); running it again resumes exactly. The other phases
    (prepare, the precision timing, the final model's choice on dev, scoring, the export) stop
    at a safe point of theirs with nothing half-written (`keras_transformer.stopping`) and raise
    it too; running it again goes on from the last phase whose result was written. Every path
    (workdir, export) may be on any TensorFlow filesystem (`gs://...`).

    Returns:
        The result dict written to `result.json` (a non-chief worker returns a short one).

    Raises:
        Preempted: stopped by a signal, everything saved.

    Example:
    ```python
    from keras_transformer.config import load_config
    result = train(load_config("configs/quickstart.yaml"))
    result["dev"]["bleu"]
    ```
    """
    # SIGTERM/SIGINT set the stop flag that every phase checks at its safe points.
    with stopping.catching():
        return _train(config)


def _train(config):
    started = time.time()
    layout = Workdir.of(config)
    previous = _finished_result(layout, config)
    if previous:
        return previous
    # The strategy first: multi-worker and TPU setups must precede any device use.
    strategy = get_strategy(config.runtime)
    run = _Run(config, layout, strategy_input(strategy), is_chief(strategy), started)
    # Seeding clears TensorFlow's kernel caches, which would drop the SentencePiece op's resource
    # (the tokenizer must be created after it).
    keras.utils.set_random_seed(config.train.seed)
    data = _prepare_data(run)
    if config.runtime.mixed_precision == "auto":
        run, data = _with_resolved_precision(run, data)
    return _train_resolved(run, data)


def _train_resolved(run, data):
    """Builds, fits, chooses the final model, scores and exports: every step reads the run's
    one resolved config (`run.config`)."""
    model = _build_model(run, data.tokenizer.vocab_size, data.num_pairs)
    parent = recorded_parent(run.config)  # fine-tuning: train.init_from
    load_parent_weights(model, run.config, parent)
    stopper = _fit(run, model, data)
    if not run.chief:
        return _worker_done(run, model)
    step = optimizer_step(model)
    end_started, t = time.perf_counter(), run.config.train
    # The end has what training left of the budget (`end_reserve`: at least the reserve).
    end_seconds = None if t.max_minutes is None else t.max_minutes * 60 - stopper.elapsed
    deadline = None if end_seconds is None else end_started + max(end_seconds, 0.0)
    final = _final_model(run, data.tokenizer, deadline)
    result = _score(run, final, data.tokenizer, step, stopper)
    if parent:
        result["init_from"] = {key: parent[key] for key in ("path", "checkpoint", "step")}
    result["saved_model"] = _export(run, final.model, data.tokenizer, result, final.alpha)
    # What followed training (choice, scoring, export): within the budget's end.
    result["end_seconds"] = round(time.perf_counter() - end_started, 1)
    if t.max_minutes is not None:
        result["budget"] = _budget_json(run, stopper)
    return _finish(run, result)


def _budget_json(run, stopper):
    """result.json's `budget`: the minutes, training's part of them (moved by the end's
    estimate, `end_reserve`) and that estimate (None where the reserve was fixed)."""
    kept = end_reserve.read_estimate(run.layout.root, run.config.train)
    return {
        "max_minutes": run.config.train.max_minutes,
        "training_seconds": round(stopper.max_seconds, 1),
        "end_estimate_seconds": kept["end_seconds"] if kept else None,
    }


def _finished_result(layout, config):
    """The result of a finished run in this workdir (printed), or None."""
    previous = read_json(layout.result)
    budget = budget_seconds(config.train)[0]
    out_of_time = (
        previous
        and budget is not None
        and previous.get("stopped_by_time_budget")
        and previous.get("training_seconds", 0) >= _training_budget(previous, config, budget)
    )
    if previous and (previous.get("step", 0) >= config.train.steps or out_of_time):
        print(f"{layout.root} already holds a finished run ({previous['step']} steps).", flush=True)
        _print_summary(previous)
        return previous
    return None


def _prepare_data(run):
    """The vocabulary and the training dataset, streamed from the workdir's prepared shards: the
    one place that reads the training data.

    The chief runs `prepare` (which streams the corpus into `WORKDIR/prepared` when it is not
    there, and otherwise checks that it matches the config: a `DataError` names any difference,
    before `config.yaml` is overwritten), then writes `config.yaml`. The other workers wait for
    the prepared data's manifest (`runtime.wait_seconds`) and check it. Each worker then reads
    its own shards (the dataset's auto-shard policy is FILE). The dataset yields global batches
    of `data.tokens_per_batch` x replicas x `train.gradient_accumulation_steps` tokens (batch
    sizes a multiple of replicas x accumulation: each replica's share splits into the
    micro-batches), in the same order on every run with the same seed, so `_fit` can resume by
    restoring the saved iterator (each worker its own) or skipping the batches already consumed.
    A waiting worker sees the chief's heartbeat (`distribute.Heartbeat`) and fails within a
    minute when it stops.
    """
    from keras_transformer.data import Tokenizer, prepare
    from keras_transformer.data.prepare import MANIFEST, VOCABULARY, check_prepared, read_manifest

    config, layout = run.config, run.layout
    heartbeat = os.path.join(layout.root, PREPARE_HEARTBEAT)
    if run.chief:
        tf.io.gfile.makedirs(layout.root)
        with run.inputs.heartbeat(heartbeat):  # seen by the workers waiting for the data
            prepare_parent(config)  # fine-tuning: the parent's vocabulary, before prepare
            manifest = prepare(config)
        save_config(config, layout.config)
    else:
        wait_for_path(
            os.path.join(layout.prepared, MANIFEST),
            config.runtime.wait_seconds,
            "prepared data",
            heartbeat=heartbeat,
        )
        manifest = check_prepared(config, read_manifest(layout.prepared), repair=False)
    tokenizer = Tokenizer(os.path.join(layout.prepared, VOCABULARY))
    return _TrainingData(
        tokenizer,
        manifest["counts"]["written"],
        layout.prepared,
        config.data,  # data.tokens_per_batch is per replica and micro-batch
        config.train.gradient_accumulation_steps,
    )


def _with_precision(config, policy):
    return dataclasses.replace(
        config, runtime=dataclasses.replace(config.runtime, mixed_precision=policy)
    )


def _with_resolved_precision(run, data):
    """`(run, data)` for `runtime.mixed_precision: auto`: a new run whose config names the
    precision that `training.precision.resolve_precision` chose (on a CPU, by timing a few train
    steps of this model on these batches in float32 and mixed_bfloat16; read back from the
    workdir on a resume), and the data with a new tokenizer. The random seed is set again
    afterwards, so the model starts from the same weights as a run that named the chosen
    precision itself."""
    from keras_transformer.data import Tokenizer
    from keras_transformer.training.precision import resolve_precision

    config, vocab_size = run.config, data.tokenizer.vocab_size

    def build(policy):
        concrete = _with_precision(config, policy)
        model = build_transformer(concrete.model, vocab_size, dtype=_model_dtype(concrete))
        return compile_model(model, concrete)

    policy, _ = resolve_precision(
        run.layout.root,
        run.strategy,
        build,
        data.first_batches,
        chief=run.chief,
        agree=run.inputs.agreement(),
    )
    keras.utils.set_random_seed(config.train.seed)
    # Seeding drops the SentencePiece op's resource: the tokenizer is made again.
    tokenizer = Tokenizer(data.tokenizer.model_path)
    resolved = dataclasses.replace(run, config=_with_precision(config, policy))
    return resolved, dataclasses.replace(data, tokenizer=tokenizer)


def _build_model(run, vocab_size, num_pairs):
    """The compiled model (in the strategy's scope), its optimizer's variables created (by
    `compile_model`) so the resume state can be restored into them."""
    config, strategy = run.config, run.strategy
    jit_compile = resolve_jit_compile(config.runtime.jit_compile, strategy)
    with strategy.scope():
        model = build_transformer(config.model, vocab_size, dtype=_model_dtype(config))
        compile_model(model, config, jit_compile=jit_compile)
    t = config.train
    print(
        f"Training {config.name}: {model.count_params():,} parameters, vocabulary "
        f"{vocab_size}, {num_pairs:,} training pairs, {t.steps} steps, "
        f"strategy {type(strategy).__name__} ({strategy.num_replicas_in_sync} replicas), "
        f"gradient accumulation {t.gradient_accumulation_steps}, jit_compile={jit_compile}, "
        f"precision {config.runtime.mixed_precision or 'float32'}"
        + ("" if t.ema_momentum is None else f", weights averaged (EMA {t.ema_momentum})"),
        flush=True,
    )
    return model


def _fit(run, model, data):
    """Restores the last resume state, then fits from there until `train.steps` (or the time
    budget); returns the `StopAtStep` callback (which knows why training stopped).

    One `RunState` holds the run's clock (seconds trained, across resumes) and data position;
    the stopper, the resume state and the signal handler share it and it advances once per
    batch, so the order of the callbacks does not matter to what they see or save.

    Exact resume: Keras's `fit` draws all epochs from one iterator when `steps_per_epoch` is
    set. Under the default strategy, MirroredStrategy and MultiWorkerMirroredStrategy that
    iterator's state (file offsets, shuffle buffer, partial buckets) is saved at each resume
    state (with it; under several workers each worker's beside it, see `training.strategies`), so a
    resume continues where the killed run was at a cost that does not grow with the step. Under
    TPUStrategy, or when no iterator state was saved (an older workdir, a worker killed before
    it wrote its own), the dataset is deterministic, so skipping the batches the killed run
    consumed gives the batches the uninterrupted run would have seen next (reading through
    them once).
    """
    t, layout, chief = run.config.train, run.layout, run.chief
    run_state = RunState(agree=run.inputs.agreement(), keeps_time=chief)
    with WorkerTempDir(chief, layout.backup) as backup_dir:
        resume, batches = run.inputs.restore(
            model, data, run_state, layout.backup, t.checkpoint_every, t.keep_backups, backup_dir
        )
        step = optimizer_step(model)
        stopper, signals, callbacks = _callbacks(run, model, data, resume)
        if _trained_out(stopper, step):
            _end_without_fit(model, callbacks, step)
            return stopper
        # Epochs count from the restored step: evaluations stay at multiples of
        # steps_per_epoch after a resume at an epoch boundary.
        initial_epoch = step // t.steps_per_epoch
        epochs = initial_epoch + math.ceil(max(0, t.steps - step) / t.steps_per_epoch)
        try:
            with signals:
                model.fit(
                    batches,
                    initial_epoch=initial_epoch,
                    epochs=epochs,
                    steps_per_epoch=t.steps_per_epoch,
                    callbacks=callbacks,
                    # A live progress bar in a terminal; in logs, one line per epoch (and
                    # TrainingSummaries' lines every log_every steps).
                    verbose=1 if sys.stdout.isatty() else 2,
                    shuffle=False,  # prepared_dataset shuffles (seeded, so a resume skips exactly)
                )
        except tf.errors.OpError as e:
            if run.inputs.lost_peers(e):
                raise WorkerError(
                    f"worker {'0 (chief)' if chief else 'task'} lost its peers during training "
                    f"({type(e).__name__}); restart every worker with the same command to "
                    "resume from the last backup"
                ) from None
            raise
    step = optimizer_step(model)
    if step < t.steps and not stopper.out_of_time:
        raise RuntimeError(f"training stopped at step {step} of {t.steps} (NaN loss?)")
    return stopper


def _trained_out(stopper, step):
    """True when a resumed run has nothing left to train: its steps made, or its time budget
    spent (`stopper.max_seconds`, where the kept estimate of the end moved it). Such a run was
    stopped after training (in the dev set's choice, the scoring, the export): calling `fit`
    would train one step more (the budget is looked at after a step), and the final model
    would not be the uninterrupted run's."""
    if step >= stopper.steps:
        return True
    if stopper.max_seconds is None or stopper.elapsed < stopper.max_seconds:
        return False
    stopper.out_of_time = True
    return True


def _end_without_fit(model, callbacks, step):
    """The end of training for a resumed run with nothing left to train (`_trained_out`): what
    `fit` would leave, less the step it would add (the step checkpoint of `step` kept, the older
    ones pruned as at the end of training)."""
    print(f"nothing left to train at step {step} (resumed after training ended)", flush=True)
    for callback in callbacks:
        if isinstance(callback, StepCheckpoint):
            callback.set_model(model)
            callback.end_at(step)


def _callbacks(run, model, data, resume):
    """`(stopper, signals, callbacks)`: the callbacks of `fit`. The stopper, `resume` and the
    signal handler share `resume`'s run state, so their order does not matter to the state."""
    t, chief = run.config.train, run.chief
    stopper = StopAtStep(
        t.steps,
        budget_seconds(t)[0],
        run_state=resume.run_state,
    )
    callbacks = [stopper, resume, keras.callbacks.TerminateOnNaN()]
    callbacks += _chief_callbacks(run, model, data, stopper) if chief else []
    # TrainingSummaries reads the metrics on every worker (a collective under several).
    summaries = TrainingSummaries(
        run.layout.logs,
        t.log_every,
        chief,
        total_steps=t.steps,
        print_lines=chief and not sys.stdout.isatty(),
    )
    callbacks.append(summaries)
    # Last: on SIGTERM/SIGINT it stops `fit`, after the step every other callback has seen.
    checkpoint = next((c for c in callbacks if isinstance(c, StepCheckpoint)), None)
    signals = CatchSignals()
    callbacks.append(
        StopOnSignal(
            signals,
            resume,
            checkpoint,
            any_worker=run.inputs.any_worker(),
            flush=[lambda: summaries.on_train_end()],
        )
    )
    return stopper, signals, callbacks


def _chief_callbacks(run, model, data, stopper):
    """Step checkpoints, hyperparameters and dev-set evaluation (and, on a time budget, the
    end's estimate that moves `stopper`'s time: `end_reserve`): the chief's alone."""
    config, layout = run.config, run.layout
    t = config.train
    callbacks = [StepCheckpoint(layout.checkpoints, t.checkpoint_every, t.keep_checkpoints)]
    write_hparams(layout.logs, config)
    dev_pairs = _read_split(config.data.dev)
    if dev_pairs:
        greedy = dataclasses.replace(run.decoding.without_sampling(), beam_size=1)
        evaluator = DevEvaluator(
            dev_pairs[: t.eval_max_sentences],
            data.tokenizer,
            config.data,
            logdir=layout.logs,
            settings=greedy,  # cheap during training
            num_samples=t.num_sample_translations,
            skip_at_step=t.steps,
        )
        callbacks.append(evaluator)
        if end_reserve.estimates(t, run.inputs.several_workers):
            test_pairs = _read_split(config.data.test)
            scoring = run.decoding.without_sampling()
            callbacks.append(
                end_reserve.EndReserve(
                    t,
                    config.data,
                    run.export_decoding.without_sampling(),
                    evaluator,
                    stopper,
                    end_reserve.end_work(run.plan, scoring, len(dev_pairs), len(test_pairs)),
                    lambda: build_transformer(config.model, data.tokenizer.vocab_size),
                    root=layout.root,
                )
            )
        if t.keep_best:
            callbacks.append(KeepBest(evaluator, layout.best, t.keep_best, t.checkpoint_every))
        # Heatmaps of the first dev sentence at each evaluation (TensorBoard's Images tab).
        callbacks.append(
            AttentionSummaries(dev_pairs[0][0], data.tokenizer, config.data, layout.logs)
        )
    return callbacks


def _read_split(spec):
    from keras_transformer.data import read_pairs

    return read_pairs(spec) if spec else []


def _worker_done(run, model):
    """A non-chief worker's end: the chief averages, scores and exports."""
    step = optimizer_step(model)
    print(f"Worker finished training at step {step}; the chief evaluates and exports.", flush=True)
    return {"name": run.config.name, "step": step, "chief": False}


def _training_budget(previous, config, budget):
    """Training's seconds of the budget: where a finished run moved them (`end_reserve`) under
    the same `train.max_minutes`, its own."""
    kept = previous.get("budget") or {}
    if kept.get("max_minutes") == config.train.max_minutes and "training_seconds" in kept:
        return min(budget, kept["training_seconds"])
    return budget


def _final_model(run, tokenizer, deadline=None):
    """The final model (`final_model.final_model`, as `keras-transformer export` makes it): the
    average of the last `export.average_checkpoints` checkpoints (the paper's final models), or
    the candidate the dev set chooses where the config says `auto`.

    It is float32 whatever the training precision, and outside the strategy (decoding and export
    need no replicas): the dev/test figures of `result.json` are those of the exported
    SavedModel, which gives the same answers as a later re-export of the workdir and runs on any
    CPU (bfloat16 decoding is slow on CPUs without bfloat16 instructions).

    `deadline` (`time.perf_counter()`): the end of `train.max_minutes`; the choice leaves time
    to score the dev and test sets and to calibrate the export on dev after it."""
    config, plan = run.config, run.plan
    dev_pairs = _read_split(config.data.dev) if plan.selects else None
    after = 0
    if deadline is not None and dev_pairs:
        from keras_transformer.export.saved_model import MAX_CALIBRATION_SENTENCES

        test_pairs = _read_split(config.data.test) or []
        reuses = end_reserve.scoring_reuses_the_choice(plan, run.decoding, len(dev_pairs))
        scoring = 0 if reuses else 1
        after = (scoring * len(dev_pairs) + len(test_pairs)
                 + min(len(dev_pairs), MAX_CALIBRATION_SENTENCES))  # fmt: skip
    return final_model(
        plan, run.layout, tokenizer.vocab_size, tokenizer, dev_pairs, strict=False,
        kept=_kept_figures(run.layout), deadline=deadline, after_sentences=after,
    )  # fmt: skip


def _kept_figures(layout):
    """The figures of the last phases kept so far (a stopped run goes on from them)."""
    return KeptFigures(join(layout.root, KEPT_FIGURES))


def _score(run, final, tokenizer, step, stopper):
    """sacreBLEU / chrF of the final model (a `FinalModel`) on the dev and test sets (the
    `decode` settings, with the length penalty chosen on dev if any)."""
    config, layout = run.config, run.layout
    settings = run.decoding.without_sampling()  # BLEU of the search
    if final.alpha is not None:
        settings = dataclasses.replace(settings, alpha=final.alpha)
    result = {
        "name": config.name,
        "step": step,
        "stopped_by_time_budget": stopper.out_of_time,
        "training_seconds": round(stopper.elapsed, 1),
        "beam_size": config.decode.beam_size,
        "checkpoints": layout.checkpoints,
        "averaged_checkpoints": len(final.steps),
        "checkpoint_steps": final.steps,
        "alpha": settings.alpha,
        "precision": config.runtime.mixed_precision or "float32",
        "logs": layout.logs,
    }
    if final.selection:
        result["selection"] = final.selection
    cache, kept = {}, _kept_figures(layout)
    key = figures_key(steps=final.steps, settings=dataclasses.asdict(settings), data=config.data)
    for split, spec in (("dev", config.data.dev), ("test", config.data.test)):
        pairs = _read_split(spec)
        if not pairs:
            continue
        scores = kept.get("scores", key, split)
        if scores is None and split == "dev":
            # The choice decoded these sentences with these settings already: not twice.
            scores = reused_dev_scores(final, settings, len(pairs))
        if scores is None:
            scores, _ = evaluate_bleu(
                final.model, tokenizer, pairs, config.data, settings, _cache=cache,
                stop_phase="the final model's scoring",
            )  # fmt: skip
            kept.put("scores", key, split, scores)
        result[split] = scores
        writer = tf.summary.create_file_writer(os.path.join(layout.logs, split))
        with writer.as_default(step=step):
            tf.summary.scalar(f"final_{split}_bleu", scores["bleu"])
        writer.flush()
    return result


def _finish(run, result):
    result["wall_seconds"] = round(time.time() - run.started, 1)
    # Whole or absent (a full disk leaves no torn result.json that would end the next run).
    write_atomically(run.layout.result, json.dumps(result, indent=2))
    kept = join(run.layout.root, KEPT_FIGURES)
    if tf.io.gfile.exists(kept):
        tf.io.gfile.remove(kept)
    _print_summary(result)
    return result
