"""`KERAS_BACKEND=jax keras-transformer train` as two processes on 127.0.0.1 (the cluster from
Keras's `KERAS_DISTRIBUTION_*` variables, `runtime.strategy: auto`): equal weights in both, equal
to one process's over the same two devices on the same global batches, the workdir written by
the chief (process 0) alone; a SIGTERM to the other process stops both after the same step, and
the same commands resume to the uninterrupted pair's weights.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from training_helpers import (
    RUNNER,
    files_under,
    free_ports,
    load_npz_weights,
    one_bucket_run_yaml,
    subprocess_env,
)

TIMEOUT = 600  # seconds a process may take on a slow, busy machine before the test gives up
STEPS = 4


def _config(tmp_path, name, **train):
    """A seconds-long run: one length bucket (one step shape to compile), 4 steps in epochs of
    2, each of two micro-batches per device, a checkpoint and a resume state every 2; the final
    model is the last checkpoint."""
    values = dict(steps=STEPS, steps_per_epoch=2, checkpoint_every=2, keep_checkpoints=3)
    values.update(gradient_accumulation_steps=2)
    return one_bucket_run_yaml(tmp_path, name, **{**values, **train})


def _env(tmp, **extra):
    return subprocess_env(
        KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", TMPDIR=str(tmp),
        **extra,
    )  # fmt: skip


def _start(command, cwd, env):
    return subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _run_pair(tmp_path, config, name, harness=((), ())):
    """Both processes of `keras-transformer train --config CONFIG`, each with its own cwd and
    TMPDIR, `harness[k]` process k's extra `train_runner.py` options: `[(exit code, output,
    weights file, pid)]`, once both have exited (killed on any failure). A coordinator port taken
    between its choice and its use is chosen again."""
    for _ in range(3):
        port = free_ports(1)[0]
        processes, ends = [], []
        try:
            for index in range(2):
                cwd, tmp = tmp_path / f"{name}-cwd{index}", tmp_path / f"{name}-tmp{index}"
                cwd.mkdir(exist_ok=True)
                tmp.mkdir(exist_ok=True)
                weights = tmp_path / f"{name}-weights{index}.npz"
                command = [sys.executable, RUNNER, *harness[index], "--dump-weights", str(weights)]
                command += ["--", "train", "--config", config]
                env = _env(
                    tmp,
                    KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
                    KERAS_DISTRIBUTION_NUM_PROCESSES="2",
                    KERAS_DISTRIBUTION_PROCESS_ID=str(index),
                )
                processes.append((_start(command, cwd, env), weights))
            for process, weights in processes:
                output = process.communicate(timeout=TIMEOUT)[0]
                ends.append((process.returncode, output, weights, process.pid))
        finally:
            for process, _ in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait(timeout=30)
        if not any("address already in use" in end[1].lower() for end in ends):
            return ends
    return ends


def _weights(path):
    weights, data = load_npz_weights(path)
    return weights, int(data["iterations"])


def _assert_equal_weights(ends, step):
    (first, step0), (second, step1) = (_weights(end[2]) for end in ends)
    assert step0 == step1 == step
    assert len(first) == len(second) > 0
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    return first


def _assert_written_by_the_chief(tmp_path, name, workdir, chief_pids):
    """Process 1 wrote nothing: not in the workdir (TensorBoard's event files name the writing
    process: all are process 0's, of any start), not where it ran, and its temporary resume
    states are gone."""
    files = files_under(workdir)
    events = [f for f in files if "tfevents" in f]
    pids = {f".{pid}." for pid in chief_pids}
    assert events and all(any(p in f for p in pids) for f in events), (events, pids)
    assert files_under(tmp_path / f"{name}-cwd1") == []
    leftovers = os.listdir(tmp_path / f"{name}-tmp1")
    assert not [n for n in leftovers if n.startswith("keras-transformer")], leftovers
    return files


def test_several_processes_are_asked_for_by_the_strategy_or_keras_variables(monkeypatch):
    from keras_transformer.config import from_dict
    from keras_transformer.errors import UsageError
    from keras_transformer.training.engines.jax_engine import check_supported, several_processes

    def runtime(strategy):
        return from_dict({"runtime": {"strategy": strategy}}).runtime

    monkeypatch.delenv("KERAS_DISTRIBUTION_NUM_PROCESSES", raising=False)
    assert several_processes(runtime("multi_worker"))
    assert not several_processes(runtime("auto")) and not several_processes(runtime("default"))
    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "1")
    assert not several_processes(runtime("auto"))
    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "2")
    assert several_processes(runtime("auto")) and not several_processes(runtime("mirrored"))
    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "two")
    with pytest.raises(UsageError, match="KERAS_DISTRIBUTION_NUM_PROCESSES is not a number"):
        several_processes(runtime("auto"))
    monkeypatch.delenv("KERAS_DISTRIBUTION_NUM_PROCESSES")

    check_supported(from_dict({"runtime": {"strategy": "multi_worker"}}))  # no refusal
    # The dev evaluation KeepBest needs does not run while training under several processes.
    config = from_dict({"runtime": {"strategy": "multi_worker"}, "train": {"keep_best": 2}})
    with pytest.raises(UsageError, match="train.keep_best under several processes"):
        check_supported(config)
    check_supported(from_dict({"train": {"keep_best": 2}}))  # one process: evaluated


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """`(ends, workdir, tmp_path)`: the uninterrupted run of the two processes."""
    tmp_path = tmp_path_factory.mktemp("pair")
    config, workdir = _config(tmp_path, "pair")
    return _run_pair(tmp_path, config, "pair"), workdir, tmp_path


@pytest.mark.scenario
def test_two_processes_train_as_one_and_only_the_chief_writes(pair, tmp_path):
    ends, workdir, pair_path = pair
    for code, output, *_ in ends:
        assert code == 0, output[-4000:]
    chief, other = ends[0][1], ends[1][1]
    assert "DataParallel over 2 processes (2 replicas)" in chief, chief[-3000:]
    assert f"Finished tiny at step {STEPS}" in chief, chief[-3000:]
    assert f"Worker finished training at step {STEPS}" in other, other[-3000:]
    assert "Finished tiny" not in other
    weights = _assert_equal_weights(ends, STEPS)
    files = _assert_written_by_the_chief(pair_path, "pair", workdir, [ends[0][3]])
    assert "result.json" in files and "checkpoints/ckpt-4.weights.h5" in files, files
    assert [f for f in files if f.startswith("backup")] == [
        "backup/state-2.npz", "backup/state-4.npz"
    ], files  # fmt: skip

    # One process over two devices (XLA's host platform split in two), the same global batches.
    config, _ = _config(tmp_path, "one")
    dump = tmp_path / "one-weights.npz"
    command = [sys.executable, RUNNER, "--dump-weights", str(dump), "--"]
    command += ["train", "--config", config]
    env = _env(tmp_path, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "DataParallel (2 replicas)" in done.stdout, done.stdout[-3000:]
    one, step = _weights(dump)
    assert step == STEPS
    for a, b in zip(weights, one):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.scenario(
    slow="two two-process JAX runs (stopped by SIGTERM, then resumed): four processes, each "
    "importing JAX and TensorFlow"
)
def test_sigterm_to_one_process_stops_both_and_the_same_commands_resume(pair, tmp_path):
    """SIGTERM to process 1 after step 1 (off the checkpoint schedule): both stop after that
    step and exit 75, the chief having saved its resume state and a checkpoint of step 1; the
    same two commands resume there and end at `train.steps` with the uninterrupted pair's
    weights."""
    ends, _, _ = pair
    config, workdir = _config(tmp_path, "stopped")
    stopped = _run_pair(tmp_path, config, "stopped", harness=((), ("--sigterm-at-step", "1")))
    for code, output, *_ in stopped:
        assert code == 75, output[-4000:]
    assert "stopped by SIGTERM after step 1" in stopped[1][1], stopped[1][1][-3000:]
    chief = stopped[0][1]
    assert "stopped by a signal to another worker after step 1" in chief, chief[-3000:]
    files = files_under(workdir)
    assert "backup/state-1.npz" in files and "checkpoints/ckpt-1.weights.h5" in files, files
    assert "result.json" not in files

    resumed = _run_pair(tmp_path, config, "stopped")
    for code, output, *_ in resumed:
        assert code == 0, output[-4000:]
        assert "resumed from step 1" in output, output[-3000:]
    _assert_written_by_the_chief(tmp_path, "stopped", workdir, [stopped[0][3], resumed[0][3]])
    for a, b in zip(_assert_equal_weights(resumed, STEPS), _assert_equal_weights(ends, STEPS)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


@pytest.mark.scenario
def test_the_time_budget_is_the_chiefs_clock_and_both_stop_after_the_same_step(tmp_path):
    big = dict(steps=100000, steps_per_epoch=1000, checkpoint_every=1000, max_minutes=0.1)
    config, workdir = _config(tmp_path, "budget", **big)
    ends = _run_pair(tmp_path, config, "budget")
    for code, output, *_ in ends:
        assert code == 0, output[-4000:]
    step = _weights(ends[0][2])[1]
    assert 0 < step < 100000
    _assert_equal_weights(ends, step)
    with open(workdir / "result.json") as f:
        result = json.load(f)
    assert result["step"] == step and result["stopped_by_time_budget"]
    # Each process says so after the same step: the chief's clock decided for both.
    said = [
        [line for line in output.splitlines() if "time budget of" in line] for _, output, *_ in ends
    ]
    assert said[0] == said[1] and said[0] and f"reached at step {step}" in said[0][-1], said
