"""What a user installs: the distribution's name and version (written once), the configs that
ship with it, and the changelog."""

import os
import subprocess
import sys

import pytest

import keras_transformer
from keras_transformer.cli import main
from keras_transformer.config import load_config
from keras_transformer.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_version_names_the_distribution_on_stdout(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    out, err = capsys.readouterr()
    package = os.path.dirname(os.path.abspath(keras_transformer.__file__))
    assert out == (
        f"keras-nmt-transformer {keras_transformer.__version__} "
        f"(import package keras_transformer in {package})\n"
    )
    assert err == ""


def test_setup_reads_the_one_version():
    out = subprocess.run(
        [sys.executable, "setup.py", "--name", "--version"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert out[-2:] == [keras_transformer.__distribution__, keras_transformer.__version__]
    with open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8") as f:
        changelog = f.read()
    assert f"## [{keras_transformer.__version__}] - " in changelog
    assert "## [Unreleased]" in changelog
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert "`keras-nmt-transformer`" in readme and "is another project" in readme


def test_shipped_configs_load_without_a_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here: the package's own copies
    assert load_config("configs/quickstart.yaml").name == "quickstart"
    assert load_config("small.yaml").name == "small"
    for missing in ("configs/nothing.yaml", "elsewhere/quickstart.yaml"):
        with pytest.raises(ConfigError, match="config file not found"):
            load_config(missing)
    # A local file of that path wins over the shipped one.
    os.makedirs("configs")
    (tmp_path / "configs" / "quickstart.yaml").write_text("model:\n  d_model: 64\n")
    assert load_config("configs/quickstart.yaml").model.d_model == 64
