"""Config schema: YAML loading, overrides and clear errors."""

import os

import pytest

from keras_transformer.config import (
    ConfigError,
    ExperimentConfig,
    config_reference,
    load_config,
    save_config,
)


def write(tmp_path, text, name="exp.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_defaults_are_the_paper_recipe():
    config = load_config()
    assert (config.model.num_layers, config.model.d_model, config.model.num_heads) == (6, 512, 8)
    assert config.model.d_ff == 2048 and config.model.dropout == 0.1
    assert config.train.label_smoothing == 0.1 and config.train.warmup_steps == 4000
    assert (config.train.adam_beta_1, config.train.adam_beta_2) == (0.9, 0.98)
    assert config.train.adam_epsilon == 1e-9
    assert config.decode.beam_size == 4 and config.decode.alpha == 0.6
    assert config.decode.max_extra_length == 50
    assert config.model.norm_first is False and config.model.share_embeddings is True


def test_configs_decode_as_chosen():
    """The paper configs decode as the paper (beam 4, alpha 0.6, their averages); small.yaml
    keeps beam 4 and lets each run's dev set choose the length penalty and the checkpoints."""
    configs = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs")
    for name in ("transformer_base.yaml", "transformer_big.yaml"):
        config = load_config(os.path.join(configs, name))
        assert (config.decode.beam_size, config.decode.alpha) == (4, 0.6), name
        assert isinstance(config.export.average_checkpoints, int), name
    small = load_config(os.path.join(configs, "small.yaml"))
    assert small.decode.beam_size == 4 and small.decode.alpha == "auto"
    assert small.export.average_checkpoints == "auto" and small.train.keep_best > 0


def test_yaml_and_overrides(tmp_path):
    path = write(tmp_path, "model:\n  d_model: 64\n  num_heads: 4\ntrain:\n  steps: 10\n")
    config = load_config(
        path, overrides=["train.steps=20", "data.train=tsv:x.tsv", "model.dropout=0"]
    )
    assert config.name == "exp"
    assert config.model.d_model == 64 and config.train.steps == 20
    assert config.data.train == "tsv:x.tsv"
    assert config.model.dropout == 0.0 and isinstance(config.model.dropout, float)


def test_a_flag_override_keeps_its_string_and_is_validated():
    """`("section.key", value)` overrides (what `--workdir` gives) are taken as they are, not
    read as YAML, and validated with the rest: an empty workdir is refused."""
    config = load_config(overrides=["runtime.workdir=a", ("runtime.workdir", "2024")])
    assert config.runtime.workdir == "2024"
    assert load_config(overrides=[("runtime.workdir", "null")]).runtime.workdir == "null"
    with pytest.raises(ConfigError, match="runtime.workdir must not be empty"):
        load_config(overrides=[("runtime.workdir", "")])


def test_save_and_load_round_trip(tmp_path):
    config = load_config(overrides=["model.d_model=128", "runtime.jit_compile=false"])
    path = str(tmp_path / "resolved.yaml")
    save_config(config, path)
    again = load_config(path)
    assert again.to_dict() == config.to_dict()
    assert isinstance(again, ExperimentConfig)


@pytest.mark.parametrize(
    "text, overrides, message",
    [
        ("model:\n  d_modle: 64\n", [], "model.d_modle"),
        ("model:\n  d_model: big\n", [], "model.d_model: expected int"),
        ("modle:\n  d_model: 64\n", [], "unknown config section 'modle'"),
        ("", ["train.steps=abc"], "train.steps"),
        ("", ["train.nope=1"], "train.nope"),
        ("", ["steps=3"], "section.key"),
        ("model:\n  d_model: 30\n  num_heads: 8\n", [], "divisible"),
        ("runtime:\n  strategy: gpus\n", [], "runtime.strategy"),
        ("model: [1, 2]\n", [], "model: expected a mapping"),
        ("", ["model.num_decoder_layers=0"], "model.num_decoder_layers must be in [1, 1000]"),
        ("", ["train.ema_momentum=1.0"], "train.ema_momentum must be in"),
    ],
)
def test_errors_name_the_key(tmp_path, text, overrides, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_config(path, overrides=overrides)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(write(tmp_path, "model: [\n"))


def test_reference_lists_every_key():
    reference = config_reference()
    for section in ("model", "data", "train", "decode", "runtime", "export"):
        assert f"### `{section}`" in reference
    assert "| `d_model` | `512` |" in reference
    assert "| `label_smoothing` | `0.1` |" in reference


def test_encoder_and_decoder_depths_reach_the_model(tmp_path):
    """`model.num_encoder_layers` / `num_decoder_layers` override `num_layers` per stack, survive
    the workdir's saved config, and build stacks of those depths (fewer decoder blocks, fewer
    parameters: one decoder block's worth each)."""
    import numpy as np

    from keras_transformer.models import build_transformer

    text = "model:\n  num_layers: 3\n  d_model: 32\n  num_heads: 4\n  d_ff: 48\n"
    config = load_config(write(tmp_path, text), overrides=["model.num_decoder_layers=1"])
    path = str(tmp_path / "saved.yaml")
    save_config(config, path)
    config = load_config(path)
    assert (config.model.num_encoder_layers, config.model.num_decoder_layers) == (None, 1)

    inputs = {"source_ids": np.ones((2, 5), "int32"), "target_ids": np.ones((2, 4), "int32")}
    shallow = build_transformer(config.model, vocab_size=40)
    full = build_transformer(load_config(write(tmp_path, text)).model, vocab_size=40)
    assert shallow(inputs).shape == full(inputs).shape == (2, 4, 40)
    assert (len(shallow.encoder.blocks), len(shallow.decoder.blocks)) == (3, 1)
    assert (len(full.encoder.blocks), len(full.decoder.blocks)) == (3, 3)
    per_block = full.decoder.blocks[0].count_params()
    assert full.count_params() - shallow.count_params() == 2 * per_block
