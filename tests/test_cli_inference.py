"""`keras-transformer translate | evaluate | export`: happy paths and exit code 2 on bad input."""

import io
import json
import os
import shutil
import subprocess
import sys

import _inference_fixtures as fx
import numpy as np
import pytest

from keras_transformer.config import from_dict, load_config, save_config
from keras_transformer.evaluation import score_translations
from keras_transformer.export.saved_model import list_versions
from keras_transformer.workdir import save_model_weights

SENTENCES = ["red apple cat", "dog dog fish bird", "blue", "plum pear white black green"]


def test_translate_arguments(model_base_dir, run_cli):
    code, out, err = run_cli("translate", "--model", model_base_dir, *SENTENCES)
    assert code == 0, err
    assert out.splitlines() == SENTENCES  # the copy model copies


def test_translate_stdin_in_batches(monkeypatch, exported_copy_model, run_cli):
    lines = SENTENCES * 3 + ["", "\xff weird"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    _, version = exported_copy_model
    code, out, err = run_cli("translate", "--model", version, "--batch-size", "5")
    assert code == 0, err
    outputs = out.split("\n")[:-1]
    assert len(outputs) == len(lines)
    assert outputs[: len(SENTENCES) * 3] == SENTENCES * 3


def test_evaluate_prints_one_json_object(tmp_path, model_base_dir, run_cli):
    source, reference = tmp_path / "src.txt", tmp_path / "ref.txt"
    references = SENTENCES[:3] + ["plum pear white black"]  # one imperfect reference
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    reference.write_text("\n".join(references) + "\n", encoding="utf-8")
    code, out, err = run_cli(
        "evaluate",
        "--model",
        model_base_dir,
        "--source",
        str(source),
        "--reference",
        str(reference),
    )
    assert code == 0, err
    result = json.loads(out)
    expected = score_translations(SENTENCES, references)
    assert result["bleu"] == expected["bleu"] and result["chrf"] == expected["chrf"]
    assert result["signature"]["bleu"].startswith("nrefs:1")
    assert result["sentences"] == len(SENTENCES) and result["sentences_per_second"] > 0


def _write_workdir(tmp_path, copy_model, toy_spm_path, steps=(100, 200, 300)):
    """A training workdir as the trainer leaves it: config.yaml, spm.model, checkpoints."""
    workdir = tmp_path / "workdir"
    os.makedirs(workdir / "checkpoints")
    config = from_dict(
        {
            "name": "toy",
            "model": fx.MODEL_KWARGS,
            "data": {"max_source_length": fx.MAX_SOURCE_LENGTH, "vocab_size": 40},
            "decode": {"beam_size": 2, "max_extra_length": 8},
            "export": {"base_dir": str(tmp_path / "saved_models")},
        }
    )
    save_config(config, str(workdir / "config.yaml"))
    shutil.copy(toy_spm_path, workdir / "spm.model")
    model = copy_model
    original = [w.numpy() for w in model.weights]
    rng = np.random.default_rng(0)
    for step in steps:
        # Slightly perturbed copies of the trained weights (the mean is still a good model).
        for w, value in zip(model.weights, original):
            w.assign(value + rng.normal(scale=1e-3, size=value.shape).astype(value.dtype))
        save_model_weights(model, workdir / "checkpoints" / f"ckpt-{step}.weights.h5")
    for w, value in zip(model.weights, original):
        w.assign(value)
    return workdir


@pytest.mark.scenario(
    slow="five exports (flags against config keys) and the three searches' translations"
)
def test_export_from_workdir(tmp_path, copy_model, toy_spm_path, run_cli):
    workdir = _write_workdir(tmp_path, copy_model, toy_spm_path)
    code, out, err = run_cli("export", "--workdir", str(workdir), "--average", "2")
    assert code == 0, err
    # Named after the workdir, not the config (every workdir of configs/small.yaml exported
    # to saved_models/small: two models became versions of one).
    model_dir = tmp_path / "saved_models" / "workdir"
    assert list_versions(str(model_dir)) == [1]
    assert not (tmp_path / "saved_models" / "toy").exists()
    assert "200, 300" in out and str(model_dir / "1") in out
    output = tmp_path / "elsewhere"
    code, out, err = run_cli(
        "export", "--workdir", str(workdir), "--output", str(output), "--name", "toy",
        "--jit-compile",
    )  # fmt: skip
    assert code == 0, err
    assert list_versions(str(output / "toy")) == [1]
    metadata = str(output / "toy" / "{}" / "assets.extra" / "keras_transformer.json")
    with open(metadata.format(1)) as f:
        assert json.load(f)["jit_compile"] is True
    # A workdir whose config compiles the search: --no-jit-compile turns it off.
    config = load_config(str(workdir / "config.yaml"), overrides=["export.jit_compile=true"])
    save_config(config, str(workdir / "config.yaml"))
    code, out, err = run_cli(
        "export", "--workdir", str(workdir), "--output", str(output), "--name", "toy",
        "--no-jit-compile",
    )  # fmt: skip
    assert code == 0, err
    with open(metadata.format(2)) as f:
        assert json.load(f)["jit_compile"] is False
    # export.precision: bfloat16 in the config, and --precision float32 winning over it.
    config = load_config(str(workdir / "config.yaml"), overrides=["export.precision=bfloat16"])
    save_config(config, str(workdir / "config.yaml"))
    for version, flags in ((3, ()), (4, ("--precision", "float32"))):
        code, out, err = run_cli(
            "export", "--workdir", str(workdir), "--output", str(output), "--name", "toy", *flags
        )
        assert code == 0, err
        with open(metadata.format(version)) as f:
            assert json.load(f)["precision"] == ("float32" if flags else "bfloat16")
    for exported in (model_dir, output / "toy" / "1", output / "toy" / "3"):
        # the graph search, XLA's, and the graph search in bfloat16
        code, out, err = run_cli("translate", "--model", str(exported), *SENTENCES)
        assert code == 0, err
        assert out.splitlines() == SENTENCES


@pytest.mark.parametrize(
    "argv_factory, message",
    [
        (lambda d: ["translate", "--model", str(d / "missing"), "x"], "not found"),
        (lambda d: ["translate", "--model", str(d), "x"], "no SavedModel"),
        (lambda d: ["translate", "--model", str(d / "broken"), "x"], "cannot load"),
        (
            lambda d: [
                "evaluate",
                "--model",
                str(d),
                "--source",
                str(d / "no.txt"),
                "--reference",
                str(d / "no.txt"),
            ],
            "not found",
        ),
        (lambda d: ["export", "--workdir", str(d / "missing")], "workdir not found"),
        (lambda d: ["export", "--workdir", str(d)], "not a training workdir"),
        (
            lambda d: [
                "export",
                "--workdir",
                str(d),
                "--format",
                "litert",
                "--precision",
                "bfloat16",
            ],
            "--precision applies to --format saved_model",
        ),  # fmt: skip
    ],
)
def test_usage_errors_exit_2(tmp_path, argv_factory, message, run_cli):
    os.makedirs(tmp_path / "broken")
    (tmp_path / "broken" / "saved_model.pb").write_bytes(b"not a protobuf")
    code, out, err = run_cli(*argv_factory(tmp_path))
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err
    assert "Traceback" not in err


def test_translate_bad_batch_size_exit_2(model_base_dir, run_cli):
    code, _, err = run_cli("translate", "--model", model_base_dir, "--batch-size", "0", "x")
    assert code == 2 and "--batch-size" in err


def test_evaluate_misaligned_files_exit_2(tmp_path, model_base_dir, run_cli):
    (tmp_path / "s.txt").write_text("a\nb\n")
    (tmp_path / "r.txt").write_text("a\n")
    code, _, err = run_cli(
        "evaluate", "--model", model_base_dir,
        "--source", str(tmp_path / "s.txt"), "--reference", str(tmp_path / "r.txt"),
    )  # fmt: skip
    assert code == 2 and "align" in err


def test_export_errors_exit_2(tmp_path, copy_model, toy_spm_path, run_cli):
    workdir = _write_workdir(tmp_path, copy_model, toy_spm_path, steps=(100,))
    code, _, err = run_cli("export", "--workdir", str(workdir), "--average", "3")
    assert code == 2 and "cannot average 3" in err
    code, _, err = run_cli("export", "--workdir", str(workdir), "--average", "0")
    assert code == 2 and "--average" in err
    for entry in os.listdir(workdir / "checkpoints"):
        os.remove(workdir / "checkpoints" / entry)
    code, _, err = run_cli("export", "--workdir", str(workdir))
    assert code == 2 and "no checkpoints" in err
    assert not os.path.exists(tmp_path / "saved_models" / "workdir" / "1")


@pytest.mark.scenario
def test_cli_as_a_program(tmp_path, model_base_dir):
    """The real entry point in a subprocess: stdout, stderr and exit codes."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="2")
    command = [sys.executable, "-m", "keras_transformer.cli", "translate", "--model"]
    done = subprocess.run(
        command + [model_base_dir], input="blue\nred apple cat\n", capture_output=True,
        text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["blue", "red apple cat"]
    done = subprocess.run(
        command + [str(tmp_path / "nothing"), "x"], capture_output=True, text=True, env=env,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
