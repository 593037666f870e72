"""`keras-transformer train`: user errors exit 2 with one line (in a subprocess, and in this
process for the data errors); SIGKILL resume (subprocesses)."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _train_command(config_path, workdir, *sets):
    command = [sys.executable, "-m", "keras_transformer.cli", "train", "--config", str(config_path)]
    command += ["--workdir", str(workdir)]
    for item in sets:
        command += ["--set", item]
    return command


def _run(command, timeout=240):
    return subprocess.run(
        command, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def _write_config(path, values):
    with open(path, "w") as f:
        yaml.safe_dump(values, f)
    return path


TINY = {
    "model": dict(num_layers=1, d_model=32, num_heads=2, d_ff=64, dropout=0.0),
    "data": dict(
        train="synthetic:split=train,size=300,max_words=8",
        vocab_size=200,
        max_source_length=24,
        max_target_length=24,
        tokens_per_batch=384,
        bucket_boundaries=[12, 24],
    ),
    "train": dict(warmup_steps=4, steps_per_epoch=20, checkpoint_every=3, log_every=1),
    "decode": dict(beam_size=1, batch_size=8),
    "runtime": dict(jit_compile=False),
}


def _assert_one_line_error(run, *needles):
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    # TensorFlow's C++ start-up lines may precede it (they bypass TF_CPP_MIN_LOG_LEVEL); ours is
    # the one line naming the command.
    lines = [line for line in run.stderr.splitlines() if line.startswith("keras-transformer")]
    assert len(lines) == 1, run.stderr[-2000:]
    assert lines[0].startswith("keras-transformer train: error: ")
    assert "Traceback" not in run.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_unknown_key_wrong_type_and_missing_config(tmp_path):
    config = _write_config(tmp_path / "bad.yaml", {"train": {"stepz": 3}})
    _assert_one_line_error(_run(_train_command(config, tmp_path / "w")), "train.stepz")

    config = _write_config(tmp_path / "bad_type.yaml", {"model": {"d_model": "wide"}})
    _assert_one_line_error(_run(_train_command(config, tmp_path / "w")), "model.d_model")

    _assert_one_line_error(
        _run(_train_command(tmp_path / "missing.yaml", tmp_path / "w")), "missing.yaml"
    )


def test_workdir_is_an_override_validated_with_the_config(tmp_path, monkeypatch, capsys):
    """`--workdir` is the last override, applied before validation (the config is never changed
    after): an empty one is refused like `--set runtime.workdir=''` (which is refused beside a
    `--workdir` too), it wins over `--set runtime.workdir=...`, and a name YAML would read as a
    number stays a string."""
    from keras_transformer import cli, training
    from keras_transformer.commands import startup

    loaded = []
    monkeypatch.setattr(startup, "import_tensorflow", lambda verbose=False: None)
    monkeypatch.setattr(training, "train", loaded.append)
    monkeypatch.chdir(tmp_path)
    argv = ["--config", str(_write_config(tmp_path / "tiny.yaml", TINY))]
    for command in ("train", "prepare"):
        for bad in (["--workdir", ""], ["--workdir", "w", "--set", "runtime.workdir=''"]):
            assert cli.main([command, *argv, *bad]) == 2
            expected = f"keras-transformer {command}: error: runtime.workdir must not be empty\n"
            assert capsys.readouterr().err == expected
    assert cli.main(["train", *argv, "--workdir", "2024"]) == 0
    assert cli.main(["train", *argv, "--workdir", "w", "--set", "runtime.workdir=elsewhere"]) == 0
    assert [c.runtime.workdir for c in loaded] == ["2024", "w"]


def _run_in_process(command):
    """`_train_command`'s command run in this process (`training_helpers.cli_in_process`), as
    a `subprocess.CompletedProcess`."""
    from training_helpers import cli_in_process

    code, out, err = cli_in_process(*command[3:])  # after `python -m keras_transformer.cli`
    return subprocess.CompletedProcess(command, code, out, err)


@pytest.mark.scenario
def test_missing_corpus_file_and_mismatched_line_counts(tmp_path, monkeypatch):
    """In this process: the one-line errors are the command's, not the process's."""
    monkeypatch.chdir(tmp_path)
    config = _write_config(tmp_path / "tiny.yaml", TINY)
    missing = tmp_path / "nope.de"
    run = _run_in_process(
        _train_command(config, tmp_path / "w1", f"data.train=text:{missing},{missing}")
    )
    _assert_one_line_error(run, "nope.de")

    source, target = tmp_path / "train.de", tmp_path / "train.en"
    source.write_text("eins\nzwei\ndrei\n")
    target.write_text("one\ntwo\n")
    run = _run_in_process(
        _train_command(config, tmp_path / "w2", f"data.train=text:{source},{target}")
    )
    _assert_one_line_error(run, "3", "2")


def _h5_arrays(path):
    """`{dataset path: array}` of a Keras weights file."""
    import h5py

    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, item: (
                arrays.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None
            )
        )
    return arrays


def _losses_by_step(logdir, pid=None):
    """`{step: loss}` from the TensorBoard files of `logdir/train` (of process `pid` only)."""
    from training_helpers import read_scalars

    directory = os.path.join(logdir, "train")
    if pid is not None:  # event file names carry the writing process's id
        keep = [name for name in os.listdir(directory) if f".{pid}." in name]
        assert keep, os.listdir(directory)
        scratch = os.path.join(logdir, f"only-{pid}")
        os.makedirs(scratch)
        for name in keep:
            os.link(os.path.join(directory, name), os.path.join(scratch, name))
        directory = scratch
    return dict(read_scalars(directory)["loss"])


@pytest.mark.scenario(
    slow="three `train` processes (whole, killed, resumed): the process boundary is tested"
)
@pytest.mark.numerics
def test_sigkilled_run_resumes_exactly(tmp_path):
    """Killed (SIGKILL) after a backup and started again with the same command, the run sees
    the data, learning rate, optimizer state and dropout randomness of the uninterrupted run:
    the same loss at every later step and the same final weights."""
    from keras_transformer.config import load_config
    from keras_transformer.training import train

    values = {
        **TINY,
        "model": {**TINY["model"], "dropout": 0.1},
        "train": dict(
            TINY["train"],
            steps=24,
            steps_per_epoch=10,  # the resume lands inside an epoch
            checkpoint_every=4,
            gradient_accumulation_steps=2,
        ),
    }
    config = _write_config(tmp_path / "tiny.yaml", values)
    reference_dir = tmp_path / "reference"
    reference = load_config(str(config), overrides=[f"runtime.workdir={reference_dir}"])
    assert train(reference)["step"] == 24

    workdir = tmp_path / "work"
    command = _train_command(config, workdir)
    process = subprocess.Popen(
        command, env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 240
    try:
        # Killed as soon as the first backup (step 4) is there.
        while not (workdir / "backup" / "checkpoint").exists():
            assert time.time() < deadline and process.poll() is None, "no backup was written"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGKILL
    assert not (workdir / "result.json").exists()

    resumed = subprocess.Popen(
        command, env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = resumed.communicate(timeout=300)
    finally:
        if resumed.poll() is None:
            resumed.kill()
    assert resumed.returncode == 0, err[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("resuming from step")]
    assert lines, out[-2000:]
    start = int(lines[0].split()[3])
    assert start >= 4 and start % 4 == 0
    assert "Finished tiny at step 24" in out

    expected = _losses_by_step(reference_dir / "logs")
    got = _losses_by_step(workdir / "logs", pid=resumed.pid)
    assert sorted(got) == list(range(start + 1, 25)), sorted(got)
    for step in got:
        np.testing.assert_allclose(got[step], expected[step], atol=1e-4, err_msg=f"step {step}")
    final, final_reference = (
        _h5_arrays(directory / "checkpoints" / "ckpt-24.weights.h5")
        for directory in (workdir, reference_dir)
    )
    assert final.keys() == final_reference.keys() and final
    for name, value in final.items():
        np.testing.assert_allclose(value, final_reference[name], atol=1e-4, err_msg=name)


@pytest.mark.parametrize("name", ["quickstart", "small", "transformer_base", "transformer_big"])
def test_shipped_configs_load(name):
    from keras_transformer.config import load_config

    config = load_config(os.path.join(ROOT, "configs", f"{name}.yaml"))
    assert config.name == name
    assert config.data.train and config.data.dev
    if name == "small":
        assert (config.model.d_model, config.model.num_layers) == (256, 3)
        assert (config.model.num_heads, config.model.d_ff) == (4, 1024)
    if name.startswith("transformer_"):
        assert config.data.train.startswith("tfds:wmt14_translate/de-en")
