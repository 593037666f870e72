"""Every subcommand, run as a user runs it (a fresh process, no `TF_CPP_MIN_LOG_LEVEL` or one of
the user's own), keeps TensorFlow's C++ start-up log off stderr, whichever module imports
TensorFlow first."""

import os
import re
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# TensorFlow's and absl's lines: `I0000 00:00:... port.cc:153] oneDNN custom operations ...`,
# "Could not find cuda drivers", `E0000 ... failed call to cuInit`, TensorRT notes, absl's
# "All log messages before absl::InitializeLog() ...", Python-side `WARNING:tensorflow:`.
TENSORFLOW_LOG = re.compile(
    r"^[IWEF]\d{4} |oneDNN|cuda|cuInit|TF-TRT|absl|^WARNING:tensorflow", re.M
)

TINY = {
    "name": "quiet",
    "model": dict(num_layers=1, d_model=16, num_heads=2, d_ff=32, dropout=0.0),
    "data": dict(
        train="synthetic:split=train,size=200,max_words=8",
        dev="synthetic:split=dev,size=3,max_words=8",
        test="synthetic:split=test,size=3,max_words=8",
        vocab_size=200,
        max_source_length=24,
        max_target_length=24,
        tokens_per_batch=384,
        bucket_boundaries=[24],
    ),
    "train": dict(
        steps=2,
        warmup_steps=1,
        steps_per_epoch=2,
        checkpoint_every=2,
        log_every=1,
        eval_max_sentences=3,
    ),  # fmt: skip
    "decode": dict(beam_size=1, batch_size=8),
    "export": dict(average_checkpoints=1),
    "runtime": dict(jit_compile=False),
}


def _quiet_run(tmp_path, *argv):
    env = dict(os.environ, PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the user chose nothing
    done = subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli", *argv],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, (argv, done.stderr[-3000:])
    logged = [line for line in done.stderr.splitlines() if TENSORFLOW_LOG.search(line)]
    assert not logged, (argv[0], logged)
    return done.stdout


@pytest.mark.scenario(
    slow="seven commands, each its own process: each process's stderr is what is tested"
)
def test_no_subcommand_prints_tensorflows_start_up_log(tmp_path):
    config = tmp_path / "quiet.yaml"
    config.write_text(yaml.safe_dump(TINY), encoding="utf-8")
    sentences = ["the tiny ship", "a purple sandwich keeps", "the ship"]
    (tmp_path / "src.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    workdir = ["--workdir", "workdirs/quiet"]
    _quiet_run(tmp_path, "prepare", "--config", str(config), *workdir)
    _quiet_run(tmp_path, "train", "--config", str(config), *workdir)
    assert os.path.isdir(tmp_path / "saved_models" / "quiet" / "1")
    assert "saved_models/quiet/2" in _quiet_run(tmp_path, "export", *workdir)
    model = ["--model", "saved_models/quiet"]
    assert len(_quiet_run(tmp_path, "translate", *model, *sentences).splitlines()) == 3
    files = ["--source", "src.txt"]
    assert '"bleu"' in _quiet_run(tmp_path, "evaluate", *model, *files, "--reference", "src.txt")
    assert len(_quiet_run(tmp_path, "score", *model, *files, "--target", "src.txt").split()) == 3
    assert "Model card" in _quiet_run(tmp_path, "info", *model)


@pytest.mark.scenario
@pytest.mark.parametrize("level", [None, "0", "1", "2", "3"])
def test_translate_is_quiet_whatever_tf_cpp_min_log_level(model_base_dir, tmp_path, level):
    """A user who quiets TensorFlow the usual way (`TF_CPP_MIN_LOG_LEVEL=2`), or sets any other
    level, or none, gets nothing on stderr from `translate`: only `--verbose` shows the log."""
    env = dict(os.environ, PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    if level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = level
    done = subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli", "translate", "--model", model_base_dir,
         "blue", "red apple cat"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["blue", "red apple cat"]
    assert done.stderr == "", done.stderr
