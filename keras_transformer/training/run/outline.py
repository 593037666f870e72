"""`train(config)`: from a corpus spec to a trained, evaluated and exported Transformer, on the
backend Keras runs.

`train()` is an outline of named steps, each a function of the run's modules: the set-up
(`run.setup`: read the training data, build the model), training (`run.fitting`: fit, resuming
exactly where a killed run stopped) and the end (`run.finish`: the final model, its scores, the
export, `result.json`). What differs between the backends and between strategies is the engine's
(`training.engines`). Under several workers only the chief writes anything shared (see
`setup.Run`).
"""

import time

import keras

from keras_transformer import stopping
from keras_transformer.training.engines import engine_for
from keras_transformer.training.run import finish, fitting, setup
from keras_transformer.training.run.callbacks import optimizer_step
from keras_transformer.training.run.init_from import load_parent_weights, recorded_parent
from keras_transformer.workdir import Workdir


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
    `export.base_dir/<name>/<version>` (on TensorFlow; on JAX, `keras-transformer export
    --workdir` on TensorFlow exports the same model). The final choice and scores decode over
    the vocabulary shortlist the export decodes over (`WORKDIR/shortlist.npz`, built or rebuilt
    first where missing or stale; `finish.export_plan`), so result.json scores the export.

    Running it again on the same workdir resumes exactly: same weights, optimizer state,
    learning rate, dropout randomness and position in the training data as the uninterrupted
    run at the last backup. A finished run is not retrained (its result is printed and
    returned). Under `runtime.strategy: multi_worker` every worker runs the same command (with
    its `TF_CONFIG` on TensorFlow, its `KERAS_DISTRIBUTION_*` variables on JAX); the chief
    writes, the others train and exit.

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
    if keras.backend.backend() == "jax":
        from keras_transformer.training.engines.jax_engine import check_supported

        check_supported(config)  # what needs TensorFlow, refused in one line
    layout = Workdir.of(config)
    previous = finish.finished_result(layout, config)
    if previous:
        return previous
    run = setup.Run(config, layout, engine_for(config.runtime), started)
    # Seeding clears TensorFlow's kernel caches, which would drop the SentencePiece op's resource
    # (the tokenizer must be created after it).
    keras.utils.set_random_seed(config.train.seed)
    data = setup.prepare_data(run)
    if config.runtime.mixed_precision == "auto":
        run, data = setup.with_resolved_precision(run, data)
    return _train_resolved(run, data)


def _train_resolved(run, data):
    """Builds, fits, chooses the final model, scores and exports: every step reads the run's
    one resolved config (`run.config`)."""
    model = setup.build_model(run, data.tokenizer.vocab_size, data.num_pairs)
    parent = recorded_parent(run.config)  # fine-tuning: train.init_from
    load_parent_weights(model, run.config, parent, run.engine.has_resume_state)
    stopper = fitting.fit(run, model, data)
    step = optimizer_step(model)
    run.engine.end_training()  # under several JAX processes, the chief goes on alone
    if not run.chief:
        return finish.worker_done(run, step)
    end_started, t = time.perf_counter(), run.config.train
    # The end has what training left of the budget (`end_reserve`: at least the reserve).
    end_seconds = None if t.max_minutes is None else t.max_minutes * 60 - stopper.elapsed
    deadline = None if end_seconds is None else end_started + max(end_seconds, 0.0)
    # The export's shortlist, once: the choice and the scores decode over it as the export does.
    plan = finish.export_plan(run)
    shortlist = None if plan is None else plan.searched_shortlist
    final = finish.choose_final_model(run, data.tokenizer, deadline, shortlist=shortlist)
    result = finish.score(run, final, data.tokenizer, step, stopper, shortlist=shortlist)
    if parent:
        result["init_from"] = {key: parent[key] for key in ("path", "checkpoint", "step")}
    result["saved_model"] = finish.export(
        run, final.model, data.tokenizer, result, final.alpha, plan=plan
    )
    # What followed training (choice, scoring, export): within the budget's end.
    result["end_seconds"] = round(time.perf_counter() - end_started, 1)
    if t.max_minutes is not None:
        result["budget"] = finish.budget_json(run, stopper)
    return finish.finish(run, result)
