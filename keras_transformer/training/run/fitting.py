"""Training itself: `fit` from the last resume state to `train.steps` (or the time budget), with
the run's callbacks (`callbacks`), on either engine."""

import dataclasses
import math
import sys

import keras

from keras_transformer.config import budget_seconds
from keras_transformer.errors import WorkerError
from keras_transformer.models import build_transformer
from keras_transformer.training.run import end_reserve
from keras_transformer.training.run.callbacks import (
    StepCheckpoint,
    StopAtStep,
    TrainingSummaries,
    optimizer_step,
    tensorboard,
)
from keras_transformer.training.run.dev_evaluation import DevEvaluator, KeepBest
from keras_transformer.training.run.preemption import CatchSignals, StopOnSignal
from keras_transformer.training.run.run_state import RunState


def read_split(spec):
    """The `[(source, reference)]` pairs of a corpus spec (`data.dev`, `data.test`); [] for
    none."""
    from keras_transformer.data.corpora import read_pairs

    return read_pairs(spec) if spec else []


def fit(run, model, data):
    """Restores the last resume state, then fits from there until `train.steps` (or the time
    budget); returns the `StopAtStep` callback (which knows why training stopped).

    One `RunState` holds the run's clock (seconds trained, across resumes) and data position;
    the stopper, the resume state and the signal handler share it and it advances once per
    batch, so the order of the callbacks does not matter to what they see or save.

    Exact resume: the engine restores its resume state (`training.engines`) and gives the
    batches from its data position. On TensorFlow, Keras's `fit` draws all epochs from one
    iterator when `steps_per_epoch` is set; under the default strategy, MirroredStrategy and
    MultiWorkerMirroredStrategy that iterator's state (file offsets, shuffle buffer, partial
    buckets) is saved with each resume state (under several workers each worker's beside it),
    so a resume continues where the killed run was at a cost that does not grow with the step.
    Under TPUStrategy, when no iterator state was saved, and on JAX (numpy batches), the
    batches are deterministic, so starting them at the data position gives the batches the
    uninterrupted run would have seen next. Training stops exactly at `train.steps`
    (`StopAtStep`), whatever `train.steps_per_epoch` and the step resumed from.
    """
    t, layout, engine = run.config.train, run.layout, run.engine
    run_state = RunState(agree=engine.agreement(), keeps_time=run.chief)
    with engine.backup_directory(layout.backup) as backup_dir:
        resume, batches = engine.restore(
            model, data, run_state, layout.backup, t.checkpoint_every, t.keep_backups, backup_dir
        )
        step = optimizer_step(model)
        stopper, signals, callbacks = make_callbacks(run, model, data, resume)
        if trained_out(stopper, step):
            end_without_fit(model, callbacks, step)
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
                    shuffle=False,  # the batches are shuffled (seeded: a resume starts exactly)
                )
        except Exception as e:
            if engine.lost_peers(e):
                raise WorkerError(
                    f"worker {'0 (chief)' if run.chief else 'task'} lost its peers during "
                    f"training ({type(e).__name__}); restart every worker with the same "
                    "command to resume from the last backup"
                ) from None
            raise
    step = optimizer_step(model)
    if step < t.steps and not stopper.out_of_time:
        raise RuntimeError(f"training stopped at step {step} of {t.steps} (NaN loss?)")
    return stopper


def trained_out(stopper, step):
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


def end_without_fit(model, callbacks, step):
    """The end of training for a resumed run with nothing left to train (`trained_out`): what
    `fit` would leave, less the step it would add (the step checkpoint of `step` kept, the older
    ones pruned as at the end of training)."""
    print(f"nothing left to train at step {step} (resumed after training ended)", flush=True)
    for callback in callbacks:
        if isinstance(callback, StepCheckpoint):
            callback.set_model(model)
            callback.end_at(step)


def make_callbacks(run, model, data, resume):
    """`(stopper, signals, callbacks)`: the callbacks of `fit`. The stopper, `resume` and the
    signal handler share `resume`'s run state, so their order does not matter to the state."""
    t, chief = run.config.train, run.chief
    stopper = StopAtStep(t.steps, budget_seconds(t)[0], run_state=resume.run_state)
    callbacks = [stopper, resume, keras.callbacks.TerminateOnNaN()]
    callbacks += chief_callbacks(run, model, data, stopper) if chief else []
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
            any_worker=run.engine.any_worker(),
            flush=[lambda: summaries.on_train_end()],
        )
    )
    return stopper, signals, callbacks


def chief_callbacks(run, model, data, stopper):
    """Step checkpoints, hyperparameters and dev-set evaluation (and, on a time budget, the
    end's estimate that moves `stopper`'s time: `end_reserve`): the chief's alone."""
    config, layout = run.config, run.layout
    t = config.train
    callbacks = [StepCheckpoint(layout.checkpoints, t.checkpoint_every, t.keep_checkpoints)]
    with_tensorboard = tensorboard() is not None
    if with_tensorboard:
        from keras_transformer.training.run.visuals import write_hparams

        write_hparams(layout.logs, config)
    # Not while training under several JAX processes (`engines.jax_engine`).
    dev_pairs = read_split(config.data.dev) if run.engine.decodes_while_training else []
    if not dev_pairs:
        return callbacks
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
    if end_reserve.estimates(t, run.engine.several_workers):
        test_pairs = read_split(config.data.test)
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
    if with_tensorboard:
        from keras_transformer.training.run.visuals import AttentionSummaries

        # Heatmaps of the first dev sentence at each evaluation (TensorBoard's Images tab).
        callbacks.append(
            AttentionSummaries(dev_pairs[0][0], data.tokenizer, config.data, layout.logs)
        )
    return callbacks
