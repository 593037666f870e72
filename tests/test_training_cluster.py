"""Training where cluster users train: a workdir and an export on a filesystem that is not the
local disk (TensorFlow's `ram://`), with nothing written locally."""

import json
import subprocess
import sys

import pytest
from training_helpers import RUNNER, files_under, subprocess_env


@pytest.mark.slow
def test_train_and_export_on_ram_filesystem_write_nothing_locally(tmp_path):
    cwd, tmp, home = tmp_path / "cwd", tmp_path / "tmp", tmp_path / "home"
    for directory in (cwd, tmp, home):
        directory.mkdir()
    report = tmp_path / "report.json"
    command = [sys.executable, RUNNER, "--call", "cluster_runs:train_on_ram", str(report)]
    run = subprocess.run(
        command,
        cwd=cwd,
        env=subprocess_env(
            TMPDIR=str(tmp),
            HOME=str(home),
            # Caches of libraries (not ours) that would otherwise go under HOME.
            KERAS_HOME=str(tmp_path / "keras"),
            MPLCONFIGDIR=str(tmp_path / "matplotlib"),
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    with open(report) as f:
        found = json.load(f)
    result, written = found["result"], found["written"]
    assert result["step"] == 8 and result["saved_model"].startswith("ram://cluster/saved_models/")
    assert result["test"]["sentences"] == 4
    work = "ram://cluster/work"
    for name in ("config.yaml", "spm.model", "result.json", "prepared/manifest.json"):
        assert f"{work}/{name}" in written, written
    assert any(p.startswith(f"{work}/prepared/train-") for p in written), written
    assert f"{work}/checkpoints/ckpt-8.weights.h5" in written, written
    assert f"{work}/backup/checkpoint" in written, written
    assert any(p.startswith(f"{work}/logs/train/events.out.tfevents") for p in written), written
    assert f"{result['saved_model']}/saved_model.pb" in written, written
    assert isinstance(found["translation"], str)
    assert "ram://cluster/exports/tiny/1/saved_model.pb" in written, written
    assert "ram://cluster/ct2/model.bin" in written and "ram://cluster/ct2/spm.model" in written
    # Nothing on the local disk: the process's cwd, TMPDIR and HOME stay empty.
    assert files_under(cwd) == [] and files_under(tmp) == [] and files_under(home) == []
