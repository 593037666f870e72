"""`keras-transformer translate --n-best`, `score`, export's decoding options and quiet logs."""

import json
import os
import subprocess
import sys

import _inference_fixtures as fx
import numpy as np
import pytest
import tensorflow as tf
from test_cli_inference import _write_workdir

from keras_transformer.commands import load_workdir_model
from keras_transformer.decoding import translate_ids

SENTENCES = ["red apple cat", "dog dog fish bird", "blue", "plum pear white black green"]


@pytest.mark.scenario
def test_translate_n_best_prints_k_scored_lines_per_input(model_base_dir, run_cli):
    code, out, err = run_cli("translate", "--model", model_base_dir, "--n-best", "2", *SENTENCES)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 2 * len(SENTENCES)
    for i, sentence in enumerate(SENTENCES):
        (s1, t1), (s2, t2) = (line.split("\t") for line in lines[2 * i : 2 * i + 2])
        assert t1 == sentence and t2 != t1 and float(s1) >= float(s2)
    code, _, err = run_cli("translate", "--model", model_base_dir, "--n-best", "9", "x")
    assert code == 2 and "exported with 3 hypotheses" in err and len(err.splitlines()) == 1


def test_score_prints_one_log_probability_per_line(
    tmp_path, model_base_dir, exported_copy_model, run_cli
):
    translator, _ = exported_copy_model
    targets = SENTENCES[:2] + ["cat", ""]
    (tmp_path / "s.txt").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    (tmp_path / "t.txt").write_text("\n".join(targets) + "\n", encoding="utf-8")
    code, out, err = run_cli(
        "score", "--model", model_base_dir, "--batch-size", "3",
        "--source", str(tmp_path / "s.txt"), "--target", str(tmp_path / "t.txt"),
    )  # fmt: skip
    assert code == 0, err
    expected = translator.score(tf.constant(SENTENCES), tf.constant(targets))["log_probability"]
    np.testing.assert_allclose([float(v) for v in out.split()], expected, atol=1e-5)
    (tmp_path / "short.txt").write_text("blue\n", encoding="utf-8")
    code, out, err = run_cli(
        "score", "--model", model_base_dir,
        "--source", str(tmp_path / "s.txt"), "--target", str(tmp_path / "short.txt"),
    )  # fmt: skip
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "has 4 lines" in err and "has 1" in err


@pytest.mark.scenario
def test_export_options_override_the_config(tmp_path, copy_model, toy_spm_path, run_cli):
    workdir = _write_workdir(tmp_path, copy_model, toy_spm_path, steps=(100,))
    code, out, err = run_cli(
        "export", "--workdir", str(workdir), "--beam-size", "1", "--alpha", "0",
        "--n-best", "1", "--max-extra-length", "5",
    )  # fmt: skip
    assert code == 0, err
    path = os.path.join(tmp_path, "saved_models", "workdir", "1")  # the workdir's name
    with open(os.path.join(path, "assets.extra", "keras_transformer.json")) as f:
        metadata = json.load(f)
    assert (metadata["beam_size"], metadata["alpha"], metadata["n_best"]) == (1, 0.0, 1)
    assert metadata["max_extra_length"] == 5
    # Beam size 1 is greedy search: the SavedModel answers what greedy decoding gives.
    texts = SENTENCES + ["red red red red green green green blue"]
    loaded = tf.saved_model.load(path)
    out = loaded.signatures["serving_default"](text=tf.constant(texts))
    exported = load_workdir_model(str(workdir))[1].model  # the checkpoint's weights
    greedy, _, _ = translate_ids(exported, fx.encode_sources(texts), beam_size=1, alpha=0.0,
                              max_extra_length=5)  # fmt: skip
    assert [t.decode() for t in out["translation"].numpy()] == fx.decode_outputs(greedy)
    nbest = loaded.signatures["translate_nbest"](text=tf.constant(texts))
    assert nbest["translations"].shape == (len(texts), 1)
    code, _, err = run_cli("export", "--workdir", str(workdir), "--beam-size", "2", "--n-best", "3")
    assert code == 2 and "--n-best must be between 1 and the beam size (2)" in err


def test_export_ctranslate2_without_the_package_says_how_to_install(monkeypatch, tmp_path, run_cli):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # `import ctranslate2` fails
    code, out, err = run_cli("export", "--workdir", str(tmp_path), "--format", "ctranslate2")
    assert code == 2 and out == ""
    assert (
        len(err.strip().splitlines()) == 1 and 'pip install "keras-transformer[ctranslate2]"' in err
    )


@pytest.mark.scenario
def test_translate_prints_only_translations(model_base_dir):
    """A real run in a fresh process: TensorFlow's C++ start-up log (oneDNN notices, CUDA
    probing, cuInit errors on machines without a GPU) stays off stderr."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the user chose nothing
    done = subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli", "translate", "--model", model_base_dir,
         "blue", "red apple cat"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["blue", "red apple cat"]
    assert done.stderr == ""


def test_export_decoding_settings_resolve_and_validate():
    from keras_transformer.config import decoding_settings, from_dict
    from keras_transformer.errors import ConfigError

    def export_decoding(config, **overrides):
        settings = decoding_settings(config, export=True, **overrides)
        keys = ("beam_size", "alpha", "max_extra_length", "batch_size")
        return {**{key: getattr(settings, key) for key in keys}, "n_best": settings.hypotheses}

    config = from_dict({"decode": {"beam_size": 5, "alpha": 0.8}, "export": {"n_best": 2}})
    assert export_decoding(config) == {
        "beam_size": 5, "alpha": 0.8, "n_best": 2, "max_extra_length": 50, "batch_size": 32,
    }  # fmt: skip
    assert export_decoding(config, beam_size=1, n_best=1)["beam_size"] == 1  # the command's
    with pytest.raises(ConfigError, match="export.n_best"):
        export_decoding(config, beam_size=1)  # the config's n_best 2 > beam 1
    assert export_decoding(from_dict({"export": {"beam_size": 3}}))["n_best"] == 3
    with pytest.raises(ConfigError, match="export.n_best"):
        from_dict({"decode": {"beam_size": 2}, "export": {"n_best": 3}})
    with pytest.raises(ConfigError, match="export.max_extra_length"):
        from_dict({"export": {"max_extra_length": -1}})
