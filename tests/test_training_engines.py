"""One training run, two engines: the same checks of `keras-transformer train` on the TensorFlow
engine and on the JAX engine (`KERAS_BACKEND=jax`), from one parametrized module.

Every run is a `keras-transformer train` subprocess (the backend is fixed per process), through
`tests/train_runner.py` where a test stops it at a known step: SIGTERM exits 75 and the same
command resumes to the weights of an uninterrupted run; a lock taken over stops the run after
its step, touching none of the new holder's files; `train.steps` that is not a multiple of
`train.steps_per_epoch`, resumed from a step that is not an epoch's end, ends exactly at
`train.steps`; with `train.ema_momentum`, the exported model scores on dev what `result.json`
reports; `train.init_from`, `train.max_minutes` and TensorBoard's scalars work.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
from shared_runs import run_root, shared_directory
from training_helpers import (
    RUNNER,
    cli_in_process,
    files_under,
    one_bucket_run_yaml,
    read_scalars,
    subprocess_env,
)

from keras_transformer.errors import PREEMPTED_EXIT_CODE

ENGINES = ["tensorflow", "jax"]  # jax[cpu] is in the `test` extra
TIMEOUT = 900  # seconds a run may take on a slow, busy machine
STEPS, STEPS_PER_EPOCH = 6, 4  # not a multiple: the last epoch is cut short at train.steps


def _config(tmp_path, name, **train):
    """A seconds-long run: one length bucket (one train-step shape to compile), checkpoints
    every 2 steps, EMA, TensorBoard scalars every step, the final model the last checkpoint."""
    values = dict(
        steps=STEPS, steps_per_epoch=STEPS_PER_EPOCH, checkpoint_every=2, keep_checkpoints=3,
        ema_momentum=0.9, log_every=1,
    )  # fmt: skip
    return one_bucket_run_yaml(tmp_path, name, **{**values, **train})


def _train(engine, config, *runner_flags):
    """`keras-transformer train --config CONFIG` on `engine`'s backend: `(exit code, stdout,
    stderr)`."""
    env = subprocess_env(KERAS_BACKEND=engine, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("KERAS_TRANSFORMER_SIGTERM_AT", None)
    done = subprocess.run(
        [sys.executable, RUNNER, *map(str, runner_flags), "--", "train", "--config", config],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    return done.returncode, done.stdout, done.stderr


def _ok(done):
    code, out, err = done
    assert code == 0, out[-3000:] + err[-3000:]
    return out


def _weights(path):
    import h5py

    found = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: found.__setitem__(n, o[()]) if hasattr(o, "shape") else None)
    return found


def _checkpoint_steps(workdir):
    from keras_transformer.workdir import list_checkpoints

    return [step for step, _ in list_checkpoints(str(workdir / "checkpoints"))]


@pytest.fixture(scope="module", params=ENGINES)
def uninterrupted(request, tmp_path_factory):
    """`(engine, workdir)`: the run of `_config` on `engine`, uninterrupted (one per test run,
    shared by the tests and pytest-xdist's workers)."""
    engine = request.param

    def build(path):
        config, _ = _config(path, "run")
        _ok(_train(engine, config))

    root = shared_directory(run_root(tmp_path_factory, request.config), f"engine_{engine}", build)
    return engine, root / "run"


@pytest.mark.scenario
def test_sigterm_exits_75_and_the_same_command_resumes_to_the_uninterrupted_weights(
    uninterrupted, tmp_path
):
    """SIGTERM after step 3 (off the checkpoint schedule, inside the first epoch of 4): exit 75
    with the resume state and a checkpoint of step 3; the same command resumes there and ends
    exactly at `train.steps` (6, not a multiple of the epoch's 4 steps) with the weights (EMA
    averages: the checkpoints hold them) of the uninterrupted run; TensorBoard's loss curve
    has every step once."""
    engine, reference = uninterrupted
    config, workdir = _config(tmp_path, "run")
    code, _, err = _train(engine, config, "--sigterm-at-step", 3)
    assert code == PREEMPTED_EXIT_CODE == 75, err[-3000:]
    assert "stopped by SIGTERM after step 3: saved the resume state and a step checkpoint" in err
    assert _checkpoint_steps(workdir) == [2, 3]
    assert not (workdir / "result.json").exists()

    out = _ok(_train(engine, config))
    assert "resum" in out and "from step 3" in out, out[-3000:]
    result = json.loads((workdir / "result.json").read_text())
    assert result["step"] == STEPS and result["backend"] == engine
    assert _checkpoint_steps(workdir) == _checkpoint_steps(reference) == [2, 4, 6]
    expected = _weights(reference / "checkpoints" / "ckpt-6.weights.h5")
    resumed = _weights(workdir / "checkpoints" / "ckpt-6.weights.h5")
    assert expected.keys() == resumed.keys() and expected
    for name in expected:
        np.testing.assert_allclose(resumed[name], expected[name], atol=1e-6, rtol=0)
    losses = read_scalars(str(workdir / "logs"))["loss"]
    assert [step for step, _ in losses] == list(range(1, STEPS + 1))


@pytest.mark.scenario
@pytest.mark.parametrize("engine", ENGINES)
def test_a_lock_taken_over_stops_the_run_after_its_step_leaving_the_new_holders_files(
    engine, tmp_path
):
    """Another run takes the workdir's lock over after step 2 (a checkpoint's and a resume
    state's step): the run stops after that step with exit 75, saving nothing (no resume state,
    no checkpoint), and leaves the new holder's lock and checkpoint as they were."""
    config, workdir = _config(tmp_path, "run")
    code, _, err = _train(engine, config, "--take-over-lock-at-step", 2)
    assert code == PREEMPTED_EXIT_CODE == 75, err[-3000:]
    assert "takeover of the workdir lock by another-machine" in err, err[-3000:]
    assert json.loads((workdir / "lock.json").read_text())["token"] == "new"
    ours = workdir / "checkpoints" / "ckpt-1000000.weights.h5"
    assert ours.read_text() == "the new holder's"
    left = files_under(workdir)
    assert [f for f in left if f.startswith("checkpoints/")] == [
        "checkpoints/ckpt-1000000.weights.h5"
    ], left
    assert not [f for f in left if f.startswith("backup/")], left
    assert "result.json" not in left


@pytest.mark.scenario
def test_with_ema_the_exported_model_scores_the_dev_bleu_that_result_json_reports(
    uninterrupted, tmp_path
):
    """With `train.ema_momentum`: the SavedModel (the run's own on TensorFlow; on JAX,
    `keras-transformer export --workdir` on TensorFlow, in this process) translates the dev
    set to the BLEU and chrF that `result.json` reports: scoring and export hold the same
    (averaged) weights."""
    from keras_transformer.commands import load_serving_function
    from keras_transformer.config import export_name, load_config
    from keras_transformer.data.corpora import read_pairs
    from keras_transformer.evaluation import score_translations

    engine, workdir = uninterrupted
    config = load_config(str(workdir / "config.yaml"))
    result = json.loads((workdir / "result.json").read_text())
    if engine == "tensorflow":
        export = result["saved_model"]
    else:
        assert result["saved_model"] is None
        export = tmp_path / "export"
        # In this process, whose backend is TensorFlow (the tests' own: conftest.py).
        code, _, err = cli_in_process("export", "--workdir", workdir, "--output", export)
        assert code == 0, err[-3000:]
        export = export / export_name(config, str(workdir))
    pairs = read_pairs(config.data.dev)
    translate = load_serving_function(str(export))
    served, _ = translate([source for source, _ in pairs])
    scores = score_translations(served, [reference for _, reference in pairs])
    assert result["dev"]["chrf"] > 0  # the model says something: the comparison means something
    assert (scores["bleu"], scores["chrf"]) == (result["dev"]["bleu"], result["dev"]["chrf"])


@pytest.mark.scenario
def test_init_from_a_trained_run_under_a_time_budget_with_tensorboard_scalars(
    uninterrupted, tmp_path
):
    """`train.init_from` names the uninterrupted run, `train.max_minutes` is a second's budget:
    the run starts from the parent's last checkpoint (step 6), stops by its time budget after
    its first steps, records both in `result.json`, and writes TensorBoard's training scalars
    from step 1."""
    engine, parent = uninterrupted
    config, workdir = _config(
        tmp_path, "child", steps=1000, init_from=str(parent), max_minutes=0.02, end_minutes=0.001
    )
    out = _ok(_train(engine, config))
    assert f"starting from {parent / 'checkpoints' / 'ckpt-6.weights.h5'} (step 6)" in out
    result = json.loads((workdir / "result.json").read_text())
    assert result["init_from"]["step"] == 6
    assert result["stopped_by_time_budget"] and 1 <= result["step"] < 1000
    assert result["budget"]["max_minutes"] == 0.02
    scalars = read_scalars(str(workdir / "logs"))
    for tag in ("loss", "accuracy", "perplexity", "learning_rate"):
        assert [step for step, _ in scalars[tag]] == list(range(1, result["step"] + 1)), tag
