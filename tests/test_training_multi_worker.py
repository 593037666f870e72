"""`keras-transformer train` as two MultiWorkerMirroredStrategy workers on 127.0.0.1 (TF_CONFIG):
one decision to stop on the time budget, identical replicas, one set of shared files written by
the chief only, and a worker lost mid-run (SIGKILL) that the restarted pair resumes from.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from training_helpers import (
    RUNNER,
    assert_one_run_in_workdir,
    files_under,
    free_ports,
    load_npz_weights,
    subprocess_env,
    tiny_yaml,
    write_yaml,
)

TIMEOUT = 300  # seconds any worker may take before the test gives up on it


def _config(tmp_path, workdir, dev=True, runtime=(), **train):
    values = tiny_yaml(
        workdir,
        train=dict(
            dict(steps_per_epoch=20, checkpoint_every=5, gradient_accumulation_steps=2), **train
        ),
        runtime=dict(
            dict(strategy="multi_worker", collective_timeout_seconds=20, wait_seconds=120),
            **dict(runtime),
        ),
    )
    if not dev:  # no dev evaluation: a shorter run
        values["data"]["dev"] = None
    return write_yaml(tmp_path / "tiny.yaml", values)


class Workers:
    """Two worker processes running the same train command, each with its own cwd and TMPDIR."""

    def __init__(self, tmp_path, config, workdir):
        self.tmp_path, self.config, self.workdir = tmp_path, config, workdir
        self.ports = free_ports(2)
        self.processes = []
        self.chief_pids = []  # of every start

    def start(self, harness=((), ())):
        """Starts both; `harness`: each one's extra `train_runner.py` options."""
        cluster = {"worker": [f"127.0.0.1:{port}" for port in self.ports]}
        self.processes = []
        for index in range(2):
            cwd, tmp = self.tmp_path / f"cwd{index}", self.tmp_path / f"tmp{index}"
            cwd.mkdir(exist_ok=True)
            tmp.mkdir(exist_ok=True)
            task = {"cluster": cluster, "task": {"type": "worker", "index": index}}
            command = [sys.executable, RUNNER, *harness[index]]
            command += ["--dump-weights", str(self.dump(index)), "--"]
            command += ["train", "--config", self.config, "--workdir", str(self.workdir)]
            self.processes.append(
                subprocess.Popen(
                    command,
                    cwd=cwd,
                    env=subprocess_env(TF_CONFIG=json.dumps(task), TMPDIR=str(tmp)),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        self.chief_pids.append(self.processes[0].pid)
        return self.processes

    def dump(self, index):
        return self.tmp_path / f"weights{index}.npz"

    def wait(self, timeout=TIMEOUT):
        """`[(returncode, output), ...]` once both have exited."""
        return [
            (process.wait(timeout=timeout), process.communicate(timeout=timeout)[0])
            for process in self.processes
        ]

    def kill_all(self):
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)


def _final_steps(outputs):
    chief, worker = outputs[0][1], outputs[1][1]
    chief_lines = [line for line in chief.splitlines() if line.startswith("Finished tiny at step")]
    worker_lines = [line for line in worker.splitlines() if line.startswith("Worker finished")]
    assert chief_lines and worker_lines, (chief[-3000:], worker[-3000:])
    return int(chief_lines[-1].split()[4].rstrip(".")), int(worker_lines[-1].split()[5].rstrip(";"))


def _assert_finished_alike(workers, outputs, exported=True):
    """Both exited 0 after the same step, with identical weights; the workdir holds one run,
    written by the chief alone (and its export, when `exported`)."""
    for code, output in outputs:
        assert code == 0, output[-4000:]
    chief_step, worker_step = _final_steps(outputs)
    assert chief_step == worker_step
    first, data0 = load_npz_weights(workers.dump(0))
    second, data1 = load_npz_weights(workers.dump(1))
    assert int(data0["iterations"]) == int(data1["iterations"]) == chief_step
    assert len(first) == len(second) > 0
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    assert_one_run_in_workdir(workers.workdir, exported=exported)
    # TensorBoard event files name the writing process: all are the chief's (of any start).
    events = [f for f in files_under(workers.workdir) if "tfevents" in f]
    pids = {f".{pid}." for pid in workers.chief_pids}
    assert events and all(any(p in os.path.basename(f) for p in pids) for f in events), events
    # The second worker's resume-state directory (in its TMPDIR) is gone, and it wrote nothing
    # where it ran. (TMPDIR may hold TensorFlow's AutoGraph files of a SIGKILLed process.)
    leftovers = os.listdir(workers.tmp_path / "tmp1")
    assert not [name for name in leftovers if name.startswith("keras-transformer")], leftovers
    assert files_under(workers.tmp_path / "cwd1") == []
    return chief_step


@pytest.mark.scenario
def test_two_workers_stop_together_on_the_time_budget(tmp_path):
    workdir = tmp_path / "work"
    # The budget schedule follows the chief's clock: every worker's learning rate (and so its
    # weights) must be the same after every step. The precision too: with `auto` only the chief
    # times (the other worker waits for its answer in a collective, hence the longer timeout).
    runtime = dict(mixed_precision="auto", collective_timeout_seconds=90)
    config = _config(
        tmp_path, workdir, runtime=runtime, steps=100000, max_minutes=0.15, schedule="linear"
    )
    workers = Workers(tmp_path, config, workdir)
    try:
        workers.start()
        outputs = workers.wait()
    finally:
        workers.kill_all()
    step = _assert_finished_alike(workers, outputs)
    assert 0 < step < 100000
    with open(workdir / "result.json") as f:
        result = json.load(f)
    assert result["step"] == step and result["stopped_by_time_budget"]
    # Training's part of train.max_minutes 0.15: the last tenth is the end's.
    assert "training's time budget of 0.135 minutes reached at step" in outputs[0][1]
    with open(workdir / "precision.json") as f:
        chosen = json.load(f)
    assert result["precision"] == chosen["precision"] and "tokens_per_second" in chosen
    assert "precision auto: float32" in outputs[0][1]  # the chief's timing
    assert "precision auto" not in outputs[1][1]  # the worker did not time


@pytest.mark.scenario(
    slow="four worker processes and the 20 s collective timeout the chief waits out"
)
def test_a_lost_worker_fails_its_peer_and_the_restarted_pair_resumes(tmp_path):
    workdir = tmp_path / "work"
    config = _config(tmp_path, workdir, dev=False, steps=20)
    workers = Workers(tmp_path, config, workdir)
    try:
        chief, worker = workers.start()
        deadline = time.time() + TIMEOUT
        # The first backup: the chief's resume state at step 5.
        while not (workdir / "backup" / "checkpoint").exists():
            assert time.time() < deadline and chief.poll() is None and worker.poll() is None
            time.sleep(0.1)
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        # The chief notices within the collective timeout (20 s) and exits with one line.
        started = time.time()
        code, output = chief.wait(timeout=120), chief.communicate(timeout=30)[0]
        assert time.time() - started < 120
        assert code != 0, output[-3000:]
        errors = [line for line in output.splitlines() if line.startswith("keras-transformer")]
        assert len(errors) == 1 and "lost its peers" in errors[0], output[-3000:]
        assert "Traceback" not in output
        assert not (workdir / "result.json").exists()

        # What a cluster manager does after a preemption: the same commands again.
        workers.start()
        outputs = workers.wait()
    finally:
        workers.kill_all()
    assert _assert_finished_alike(workers, outputs) == 20
    resumed = [line for line in outputs[0][1].splitlines() if line.startswith("resuming from")]
    assert resumed and int(resumed[0].split()[3]) >= 5, outputs[0][1][-3000:]
