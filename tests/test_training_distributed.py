"""model.fit under MirroredStrategy (two logical CPUs) and MultiWorkerMirroredStrategy (two
worker processes on 127.0.0.1): the replicas and the workers end with identical weights.

Each run happens in a fresh subprocess (`distributed_worker.py`): logical devices and the
multi-worker cluster must be set up before TensorFlow initialises.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from training_helpers import free_ports, subprocess_env

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "distributed_worker.py")


def _weights(path):
    data = np.load(path)
    return [data[f"w{i}"] for i in range(sum(k.startswith("w") for k in data.files))], data


@pytest.mark.scenario
def test_mirrored_strategy_two_cpu_replicas(tmp_path):
    output = tmp_path / "mirrored.npz"
    run = subprocess.run(
        [sys.executable, WORKER, "mirrored", str(output)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    weights, data = _weights(output)
    assert int(data["iterations"]) == 6
    assert int(data["local_copies"]) == 2  # one copy of each variable per replica
    assert bool(data["local_copies_equal"])
    assert all(np.isfinite(w).all() for w in weights)


@pytest.mark.scenario
def test_multi_worker_mirrored_strategy_two_processes(tmp_path):
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes, outputs = [], []
    for index in range(2):
        output = tmp_path / f"worker{index}.npz"
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        processes.append(
            subprocess.Popen(
                [sys.executable, WORKER, "multi_worker", str(output)],
                env=subprocess_env(TF_CONFIG=tf_config),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
        outputs.append(output)
    logs = []
    try:
        for process in processes:
            logs.append(process.communicate(timeout=300)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    for process, log in zip(processes, logs):
        assert process.returncode == 0, log[-3000:]
    (first, data0), (second, data1) = _weights(outputs[0]), _weights(outputs[1])
    assert int(data0["iterations"]) == int(data1["iterations"]) == 6
    assert len(first) == len(second) > 0
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
