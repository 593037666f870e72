"""`keras-transformer train` in a subprocess: user errors exit 2 with one line; SIGKILL resume."""

import os
import signal
import subprocess
import sys
import time

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


@pytest.mark.slow
def test_missing_corpus_file_and_mismatched_line_counts(tmp_path):
    config = _write_config(tmp_path / "tiny.yaml", TINY)
    missing = tmp_path / "nope.de"
    run = _run(_train_command(config, tmp_path / "w1", f"data.train=text:{missing},{missing}"))
    _assert_one_line_error(run, "nope.de")

    source, target = tmp_path / "train.de", tmp_path / "train.en"
    source.write_text("eins\nzwei\ndrei\n")
    target.write_text("one\ntwo\n")
    run = _run(_train_command(config, tmp_path / "w2", f"data.train=text:{source},{target}"))
    _assert_one_line_error(run, "3", "2")


@pytest.mark.slow
def test_sigkilled_run_resumes_from_its_last_checkpoint(tmp_path):
    config = _write_config(tmp_path / "tiny.yaml", TINY)
    workdir = tmp_path / "work"
    command = _train_command(config, workdir, "train.steps=100")
    process = subprocess.Popen(
        command, env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    metadata = workdir / "backup" / "training_metadata.json"
    deadline = time.time() + 240
    try:
        # Killed once the backup has been written at least twice (step 6 or later).
        while time.time() < deadline and process.poll() is None:
            checkpoints = (
                os.listdir(workdir / "checkpoints") if (workdir / "checkpoints").exists() else []
            )
            if metadata.exists() and any(name.startswith("ckpt-6") for name in checkpoints):
                break
            time.sleep(0.2)
        assert process.poll() is None, "the run ended before it could be killed"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGKILL
    assert not (workdir / "result.json").exists()

    run = _run(command, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    resumed = [line for line in run.stdout.splitlines() if line.startswith("resuming from step")]
    assert resumed, run.stdout[-2000:]
    assert int(resumed[0].split()[3]) >= 6
    assert "Finished tiny at step 100" in run.stdout


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
