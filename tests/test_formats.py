"""The export formats and quantizations are declared once (`config.formats`): a format or a
quantization registered from outside the package shows in `export`'s choices and checks, the
config's validation and the generated references, and `export --format` runs its exporter."""

import dataclasses
import os

import pytest

from keras_transformer.config import formats
from keras_transformer.errors import ConfigError, UsageError

TOY_EXPORTS = []


def toy_exporter(model, spm_bytes, output, quantization, data, settings, shortlist=None):
    """A toy format's exporter (the converted formats' call: `commands.export`)."""
    os.makedirs(output)
    with open(os.path.join(output, "toy.txt"), "w") as f:
        f.write(f"{model.vocab_size} {quantization} {settings.beam_size}")
    TOY_EXPORTS.append(output)
    return output


@pytest.fixture
def toy(monkeypatch):
    """A toy format and a toy SavedModel quantization, registered as a user would (the
    registry restored after the test)."""
    monkeypatch.setattr(formats, "_FORMATS", dict(formats._FORMATS))
    formats.register_format(
        formats.ExportFormat(
            "toyformat", "a toy format of the tests", f"{__name__}:toy_exporter",
            quantizations=("toy4", "float32"), default_quantization="float32",
        )
    )  # fmt: skip
    saved_model = formats.export_format("saved_model")
    quantizations = saved_model.quantizations + ("toy16",)
    formats.register_format(dataclasses.replace(saved_model, quantizations=quantizations))


def _export_parser():
    from keras_transformer.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    export = commands.choices["export"]
    return {a.dest: a for a in export._actions}


def test_a_registered_format_and_quantization_are_everywhere(toy):
    from keras_transformer.cli import cli_reference
    from keras_transformer.config import config_reference, from_dict

    actions = _export_parser()
    assert "toyformat" in actions["format"].choices
    assert "toy4" in actions["quantization"].choices
    assert "toy16" in actions["precision"].choices
    assert "toyformat" in actions["format"].help
    # The config's validation and the references read the registry when asked.
    assert from_dict({"export": {"precision": "toy16"}}).export.precision == "toy16"
    assert "toy16" in config_reference() and "toyformat" in cli_reference()
    # Each format takes its own quantizations.
    formats.check_quantization("toyformat", "toy4")
    with pytest.raises(UsageError, match="--format toyformat takes toy4, float32"):
        formats.check_quantization("toyformat", "dynamic_int8")
    with pytest.raises(UsageError, match=r"toy4 \(toyformat's\): --format litert takes"):
        formats.check_quantization("litert", "toy4")


def test_without_the_registration_they_are_refused():
    from keras_transformer.cli import cli_reference
    from keras_transformer.config import from_dict

    actions = _export_parser()
    assert "toyformat" not in actions["format"].choices
    assert "toy16" not in actions["precision"].choices
    with pytest.raises(ConfigError, match="export.precision must be one of float32 or bfloat16"):
        from_dict({"export": {"precision": "toy16"}})
    assert "toyformat" not in cli_reference()
    with pytest.raises(UsageError, match="the formats are saved_model, ctranslate2, litert"):
        formats.export_format("toyformat")


def test_the_builtin_formats_quantizations():
    assert formats.format_names()[0] == "saved_model"
    assert formats.precisions() == ("float32", "bfloat16")
    assert formats.quantizations("litert") == ("float32", "float16", "dynamic_int8")
    with pytest.raises(UsageError, match="a SavedModel takes --precision float32 or bfloat16"):
        formats.check_quantization("saved_model", "int8")
    with pytest.raises(UsageError, match=r"dynamic_int8 \(litert's\): --format ctranslate2"):
        formats.check_quantization("ctranslate2", "dynamic_int8")


@pytest.mark.scenario
def test_export_runs_a_registered_formats_exporter(toy, toy_quickstart, tmp_path, run_cli):
    output = tmp_path / "toy"
    workdir = os.path.join(toy_quickstart, "workdirs", "quickstart")
    code, out, err = run_cli(
        "export", "--workdir", workdir, "--format", "toyformat",
        "--quantization", "toy4", "--output", str(output),
    )  # fmt: skip
    assert code == 0, err
    assert TOY_EXPORTS[-1] == str(output)
    assert (output / "toy.txt").read_text().split()[1] == "toy4"
    assert f"to toyformat in {output}" in out
