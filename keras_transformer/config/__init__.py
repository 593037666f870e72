"""Experiment configuration: YAML loading, dotted overrides and validation.

A config file is YAML with the sections `model`, `data`, `train`, `decode`, `runtime`,
`export` and `distill` (the dataclasses of `sections.py`, re-exported here). Every key has a
default and its valid values (`valid=`: an interval, the choices, or non-empty), declared
together (see `config_reference()`); unknown keys, values of the wrong type and values outside
their range raise `ConfigError` naming the key. How a key is declared and checked is in
`_schema.py`.

Example:
```python
config = load_config("configs/quickstart.yaml", overrides=["train.steps=100"])
config.model.d_model
```
"""

import dataclasses
import os
import typing

import yaml

from keras_transformer.config._schema import check_valid, coerce, describe_valid, table_cell
from keras_transformer.config.formats import precisions  # noqa: F401 (export.precision's values)

# Also re-exported: the package, its tests and users import the sections and the special ids from
# `keras_transformer.config`.
from keras_transformer.config.sections import (  # noqa: F401
    AUTO,
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SECTIONS,
    UNK_ID,
    DataConfig,
    DecodeConfig,
    DecodingSettings,
    DistillConfig,
    ExperimentConfig,
    ExportConfig,
    ModelConfig,
    RuntimeConfig,
    TrainConfig,
)
from keras_transformer.errors import ConfigError, first_line


def _build_section(name, cls, values):
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"{name}: expected a mapping of keys, got {type(values).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(
                f"unknown config key '{name}.{key}' (known: {', '.join(sorted(fields))})"
            )
        kwargs[key] = coerce(f"{name}.{key}", value, hints[key])
    return cls(**kwargs)


def from_dict(values, name=None):
    """Builds a validated `ExperimentConfig` from a (YAML-like) dict."""
    values = dict(values or {})
    config_name = coerce("name", values.pop("name", None) or name or "experiment", str)
    unknown = set(values) - set(SECTIONS)
    if unknown:
        raise ConfigError(
            f"unknown config section '{sorted(unknown)[0]}' (known: {', '.join(SECTIONS)})"
        )
    sections = {key: _build_section(key, cls, values.get(key)) for key, cls in SECTIONS.items()}
    config = ExperimentConfig(name=config_name, **sections)
    validate(config)
    return config


def _parse_override(text):
    if isinstance(text, tuple):  # `(key, value)`: a command-line flag's value, taken as is
        return text
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like section.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if key.count(".") != 1 and key != "name":
        raise ConfigError(f"override key '{key}' must look like section.key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value


def apply_overrides(values, overrides):
    """Applies `["section.key=value", ...]` (values parsed as YAML scalars) to a config dict.

    An override may also be a `("section.key", value)` pair, its value taken as it is (the
    string of a flag such as `--workdir`, which YAML would read as a number or null)."""
    values = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (values or {}).items()}
    for text in overrides or []:
        key, value = _parse_override(text)
        if key == "name":
            values["name"] = value
            continue
        section, field = key.split(".")
        if section not in SECTIONS:
            raise ConfigError(f"unknown config section '{section}' in override '{text}'")
        if values.get(section) is None:
            values[section] = {}
        values[section][field] = value
    return values


def export_name(config, workdir=None):
    """The name an export of `config` takes under `export.base_dir`: `export.name`, else the
    last part of the workdir (`workdir`, `runtime.workdir`, or `workdirs/<config name>`), so
    two models trained from one config file into two workdirs never become versions of one."""
    if config.export.name:
        return config.export.name
    root = str(workdir or config.runtime.workdir or config.name).rstrip("/")
    if "://" not in root:
        root = os.path.abspath(root)
    return os.path.basename(root) or config.name


def load_config(path=None, overrides=None):
    """Loads a YAML config file (or only defaults when `path` is None) and applies overrides.

    Raises:
        ConfigError: the file is missing or malformed, a key is unknown or a value has the wrong
            type; the message names the file or key.
    """
    values, name = {}, None
    if path is not None:
        text = _read_config_text(path)
        try:
            values = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: invalid YAML ({first_line(e)})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a mapping of sections at the top level")
        name = os.path.splitext(os.path.basename(path))[0]
    return from_dict(apply_overrides(values, overrides), name=name)


def _read_config_text(path):
    """The text of a config file: a local path, or any TensorFlow filesystem's (`gs://...`,
    TensorFlow loads only then)."""
    if "://" not in str(path):
        if not os.path.isfile(path):
            path = _packaged_config(path)
        with open(path, encoding="utf-8") as f:
            return f.read()
    from keras_transformer.workdir import read_text

    try:
        return read_text(path)
    except OSError:
        raise ConfigError(f"config file not found: {path}") from None


def _packaged_config(path):
    """The shipped config a missing `configs/NAME.yaml` names: the wheel carries the repository's
    `configs/*.yaml` as `keras_transformer/configs/`, so the README's commands run where no
    checkout is beside them (a checkout's own `configs/` is found first)."""
    head, name = os.path.split(os.path.normpath(str(path)))
    if head in ("", "configs") and name.endswith(".yaml"):
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # keras_transformer/
        for folder in (os.path.join(package, "configs"), os.path.join(package, "..", "configs")):
            if os.path.isfile(os.path.join(folder, name)):
                return os.path.join(folder, name)
    raise ConfigError(f"config file not found: {path}")


def save_config(config, path):
    """Writes the resolved config as YAML (what `load_config` reads back) to `path`, on any
    TensorFlow filesystem (`gs://...`), appearing whole."""
    from keras_transformer.workdir import write_atomically

    write_atomically(path, yaml.safe_dump(config.to_dict(), sort_keys=False))


def validate(config):
    """Checks values that are of the right type but impossible: each key against its `valid`
    range or choices, then the rules that involve several keys."""
    for section in SECTIONS:
        values = getattr(config, section)
        for f in dataclasses.fields(values):
            check_valid(f"{section}.{f.name}", getattr(values, f.name), f.metadata.get("valid"))
    # Each key's own range is declared beside its default (`valid=`); these involve several.
    m = config.model
    if m.d_model % m.num_heads:
        raise ConfigError(
            f"model.d_model ({m.d_model}) must be divisible by model.num_heads ({m.num_heads})"
        )
    t = config.train
    if t.max_minutes is not None and t.end_minutes is not None and t.end_minutes >= t.max_minutes:
        raise ConfigError(
            f"train.end_minutes ({t.end_minutes:g}) must be less than train.max_minutes "
            f"({t.max_minutes:g}): training needs some of the budget"
        )
    if t.guided_alignment_weight > 0 and not config.data.train_alignments:
        raise ConfigError(
            "train.guided_alignment_weight > 0 needs the training pairs' word alignments: set "
            "data.train_alignments"
        )
    layers, layer = m.num_decoder_layers or m.num_layers, config.export.alignment_layer
    if t.guided_alignment_weight > 0 and not (-layers <= layer < layers or layer == -2):
        raise ConfigError(
            f"export.alignment_layer ({layer}), the layer guided alignment trains, is not a "
            f"layer of the {layers}-layer decoder"
        )
    if config.data.train_alignments and config.data.terminology:
        raise ConfigError(
            "data.train_alignments and data.terminology cannot be combined (the annotations "
            "change the source words that the alignments index)"
        )
    if config.export.shortlist and config.export.jit_compile:
        raise ConfigError(
            "export.shortlist and export.jit_compile cannot be combined: the vocabulary "
            "shortlist does not compile with XLA yet"
        )
    decoding_settings(config, export=True)  # the export's settings must be possible too
    return config


def saved_model_shortlist(export, asked=None, jit_compile=None):
    """`(use, required)`: whether a SavedModel export (an `ExportConfig`) decodes over the
    vocabulary shortlist, and whether one that cannot be built is an error.

    `asked`: a command's `--shortlist` / `--no-shortlist` (None: `export.shortlist`);
    `jit_compile`: the export's XLA setting (None: `export.jit_compile`). `export.shortlist`
    null (the default) uses it where it can be built and the search is not compiled with XLA
    (which it does not compile with yet); true and false are kept to."""
    use = export.shortlist if asked is None else asked
    jit_compile = export.jit_compile if jit_compile is None else jit_compile
    if use is None:
        return not jit_compile, False
    return bool(use), bool(use)


def budget_seconds(train):
    """`(training seconds, end seconds)` of a `TrainConfig`'s `max_minutes` budget: training
    (and its learning-rate decay) stops `end_minutes` (default a tenth of the budget) before the
    budget, which the dev set's choice, the scoring and the export then fit into. `(None, None)`
    without a budget."""
    if train.max_minutes is None:
        return None, None
    end = train.max_minutes / 10 if train.end_minutes is None else train.end_minutes
    return (train.max_minutes - end) * 60, end * 60


_EXPORT_KEYS = ("beam_size", "alpha", "n_best", "max_extra_length")
_SAMPLING_KEYS = ("sampling_topk", "sampling_temperature", "sampling_topp")


def decoding_settings(config, export=False, **overrides):
    """The `DecodingSettings` of `config`: the one place where they are made.

    Without `export`, the `decode:` section (the dev and test evaluation). With `export`, what
    an export fixes into its graph: each of `beam_size`, `alpha`, `n_best` and
    `max_extra_length` comes from, in order, a non-None keyword argument (e.g.
    `keras-transformer export --beam-size`), the `export:` section, the `decode:` section
    (`n_best`: the beam size); the `sampling_*` settings from a keyword argument or `decode:`.

    Args:
        config: an `ExperimentConfig`.
        export: apply the `export:` section and the overrides.
        **overrides: `beam_size`, `alpha`, `n_best`, `max_extra_length`, `sampling_topk`,
            `sampling_temperature`, `sampling_topp` (None = not given).

    Returns:
        A `DecodingSettings`.

    Raises:
        ConfigError: a value is impossible (named as its `export.` or `decode.` key).

    Example:
    >>> decoding_settings(from_dict({"decode": {"beam_size": 5}}), True, n_best=2).n_best
    2
    """
    unknown = set(overrides) - set(_EXPORT_KEYS) - set(_SAMPLING_KEYS)
    if unknown or (overrides and not export):
        raise TypeError(f"decoding_settings() got unexpected settings {sorted(overrides)}")
    d = config.decode
    values = {key: getattr(d, key) for key in ("beam_size", "alpha", "max_extra_length")}
    values.update({key: getattr(d, key) for key in _SAMPLING_KEYS}, n_best=None)
    if export:
        export_valid = {f.name: f.metadata["valid"] for f in dataclasses.fields(ExportConfig)}
        decode_valid = {f.name: f.metadata["valid"] for f in dataclasses.fields(DecodeConfig)}
        for key in _EXPORT_KEYS + _SAMPLING_KEYS:
            chosen = overrides.get(key)
            if chosen is None and key in _EXPORT_KEYS:
                chosen = getattr(config.export, key)
            if chosen is not None:
                section, valid = ("export", export_valid) if key in _EXPORT_KEYS else (
                    "decode", decode_valid)  # fmt: skip
                check_valid(f"{section}.{key}", chosen, valid[key])
                values[key] = chosen
    if values["alpha"] == AUTO:  # chosen on dev where the final model is made (final_model.py)
        values["alpha"] = DecodingSettings.alpha
    if values["n_best"] is not None and values["n_best"] > values["beam_size"]:
        raise ConfigError(
            f"export.n_best must be between 1 and the beam size ({values['beam_size']}), "
            f"got {values['n_best']}"
        )
    return DecodingSettings(batch_size=d.batch_size, **values)


def config_reference():
    """Markdown tables listing every key with its default, valid values and meaning
    (docs/reference/config.md)."""
    lines = []
    for section, cls in SECTIONS.items():
        lines.append(f"### `{section}`\n")
        lines.append("| key | default | valid | meaning |")
        lines.append("|---|---|---|---|")
        instance = cls()
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = getattr(instance, f.name)
            shown = "null" if default is None else yaml.safe_dump(default).strip()
            shown = shown.removesuffix("\n...").removesuffix("...").strip()
            valid = describe_valid(f, hints[f.name])
            cells = [f"`{f.name}`", f"`{shown}`", valid, f.metadata.get("help", "")]
            lines.append("| " + " | ".join(table_cell(c) for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)
