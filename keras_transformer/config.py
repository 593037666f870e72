"""Experiment configuration: dataclass schema, YAML loading, dotted overrides and validation.

A config file is YAML with the sections `model`, `data`, `train`, `decode`, `runtime` and
`export`. Every key has a default (see `config_reference()`); unknown keys and values of the
wrong type raise `ConfigError` naming the key.

Example:
```python
config = load_config("configs/quickstart.yaml", overrides=["train.steps=100"])
config.model.d_model
```
"""

import dataclasses
import os
import typing
from typing import Optional, Union

import yaml

from keras_transformer.errors import ConfigError


def _field(default, help, **kwargs):
    if isinstance(default, (list, dict)):
        return dataclasses.field(
            default_factory=lambda: type(default)(default), metadata={"help": help}, **kwargs
        )
    return dataclasses.field(default=default, metadata={"help": help}, **kwargs)


@dataclasses.dataclass
class ModelConfig:
    """Transformer sizes; the names are those of `keras_transformer.models.Transformer`."""

    num_layers: int = _field(6, "encoder and decoder blocks (N)")
    num_encoder_layers: Optional[int] = _field(None, "encoder blocks; null: num_layers")
    num_decoder_layers: Optional[int] = _field(
        None, "decoder blocks; null: num_layers (a shallow decoder trains and decodes faster)"
    )
    d_model: int = _field(512, "model width")
    num_heads: int = _field(8, "attention heads (h); must divide d_model")
    d_ff: int = _field(2048, "feed-forward inner width")
    dropout: float = _field(0.1, "residual dropout P_drop (sub-layer outputs, embedding sums)")
    attention_dropout: float = _field(0.0, "dropout on attention weights")
    activation_dropout: float = _field(0.0, "dropout inside the feed-forward network")
    token_dropout: float = _field(
        0.0, "word dropout: a token's whole input embedding zeroed (source and target)"
    )
    activation: str = _field("relu", "feed-forward activation")
    norm_first: bool = _field(False, "pre-norm blocks instead of the paper's post-norm")
    share_embeddings: bool = _field(True, "one embedding for source, target and softmax")
    layer_norm_epsilon: float = _field(1e-6, "LayerNorm epsilon")


@dataclasses.dataclass
class DataConfig:
    """Corpora, vocabulary and batching."""

    train: str = _field(
        "synthetic:",
        "training corpus spec: text:SRC,TGT | tsv:FILE | tfds:NAME[:SPLIT] | synthetic:...",
    )
    dev: Optional[str] = _field(None, "dev corpus spec (BLEU during training); None to skip")
    test: Optional[str] = _field(None, "test corpus spec (BLEU at the end); None to skip")
    vocab_size: int = _field(8000, "SentencePiece vocabulary size (shared source/target)")
    spm_model_type: str = _field("unigram", "SentencePiece model type: unigram | bpe")
    spm_character_coverage: float = _field(1.0, "SentencePiece character coverage")
    spm_max_sentences: int = _field(
        1_000_000, "at most this many sentences (both sides) train the vocabulary"
    )
    max_source_length: int = _field(128, "longest source in tokens, EOS included")
    max_target_length: int = _field(128, "longest target in tokens, EOS (or BOS) included")
    long_pairs: str = _field(
        "drop",
        "training pairs longer than the max lengths: drop (the paper's recipe, counted as "
        "too_long in the prepared manifest) | truncate (cut, EOS kept)",
    )
    subword_samples: int = _field(
        0,
        "SentencePiece subword regularization (Kudo 2018): prepare writes this many sampled "
        "segmentations of every training pair instead of its single best one (0: off)",
    )
    subword_alpha: float = _field(
        0.3,
        "smoothing of the sampled segmentations when data.subword_samples > 0: lower is more "
        "varied (and longer); unigram samples from all segmentations, bpe drops merges with "
        "this probability",
    )
    both_directions: bool = _field(
        False,
        "prepare also writes every training pair reversed (target -> source), its source led by "
        "the BOS id as a direction tag; forward inputs carry no tag, so decoding and export are "
        "unchanged (an auxiliary task for small corpora)",
    )
    tokens_per_batch: int = _field(4096, "padded target tokens per batch (per replica)")
    bucket_boundaries: Optional[list] = _field(
        None, "padded lengths of the buckets; None chooses a few up to the max lengths"
    )
    shuffle_buffer: int = _field(10000, "examples in the shuffle buffer")
    seed: int = _field(1234, "seed for the synthetic corpus, shuffling and the vocabulary")
    prepare_workers: Optional[int] = _field(
        None,
        "processes that tokenize the corpus in prepare (null: the machine's cores); the "
        "prepared data is the same whatever the number",
    )


@dataclasses.dataclass
class TrainConfig:
    """The optimisation recipe (the paper's by default)."""

    steps: int = _field(100000, "total optimizer steps")
    warmup_steps: int = _field(4000, "learning-rate warm-up steps")
    learning_rate_scale: float = _field(
        1.0,
        "multiplier of the learning rate: rsqrt is scale * d_model^-0.5 * min(step^-0.5, "
        "step * warmup^-1.5); every schedule peaks near scale * (d_model * warmup)^-0.5",
    )
    schedule: str = _field(
        "rsqrt",
        "learning-rate schedule: rsqrt (the paper's inverse square root) | linear | cosine "
        "(warm-up, then decay to zero where train.steps or train.max_minutes ends, whichever "
        "comes first; for budgeted runs)",
    )
    label_smoothing: float = _field(0.1, "label smoothing epsilon_ls")
    adam_beta_1: float = _field(0.9, "Adam beta_1")
    adam_beta_2: float = _field(0.98, "Adam beta_2")
    adam_epsilon: float = _field(1e-9, "Adam epsilon")
    gradient_accumulation_steps: int = _field(
        1, "micro-batches per optimizer step (summed in the train step; see the README)"
    )
    clip_norm: Optional[float] = _field(None, "clip gradients to this global norm; None: off")
    weight_decay: float = _field(
        0.0,
        "decoupled weight decay (AdamW): w -= lr * weight_decay * w at every step, on all "
        "weights but biases and LayerNorm scales and offsets; 0: off (the paper's)",
    )
    ema_momentum: Optional[float] = _field(
        None,
        "exponential moving average of the weights, a = m * a + (1 - m) * w after each step "
        "(Keras's use_ema): checkpoints, dev BLEU and the export use the average; null: off",
    )
    steps_per_epoch: int = _field(1000, "steps between evaluations / Keras epochs")
    checkpoint_every: int = _field(1000, "steps between checkpoints")
    keep_checkpoints: int = _field(5, "checkpoints kept (the last K)")
    keep_backups: int = _field(2, "resume states kept in WORKDIR/backup (the last K)")
    log_every: int = _field(100, "steps between TensorBoard scalar writes")
    eval_max_sentences: int = _field(500, "dev sentences decoded for BLEU during training")
    num_sample_translations: int = _field(3, "sample translations logged as text")
    max_minutes: Optional[float] = _field(
        None,
        "stop training after this many minutes of training (counted across resumes), then "
        "evaluate and export (a wall-clock budget); null: train all steps",
    )
    seed: int = _field(42, "seed of weight initialisation and dropout")


@dataclasses.dataclass
class DecodeConfig:
    """Decoding settings (also fixed into the exported SavedModel)."""

    beam_size: int = _field(4, "beam size k (1 = greedy)")
    alpha: float = _field(0.6, "length penalty ((5+len)/6)^alpha")
    max_extra_length: int = _field(50, "outputs stop at source length + this")
    batch_size: int = _field(32, "sentences decoded together")


@dataclasses.dataclass
class RuntimeConfig:
    """Where and how training runs."""

    strategy: str = _field("auto", "auto | default | mirrored | multi_worker | tpu")
    tpu: str = _field("", "TPU address for strategy=tpu ('' = local/auto)")
    jit_compile: Union[bool, str] = _field("auto", "XLA: true | false | auto (chosen per device)")
    mixed_precision: Optional[str] = _field(
        None,
        "None | mixed_bfloat16 | mixed_float16 (with loss scaling) | auto (timed on CPUs: "
        "bfloat16 if it trains at least 1.1x faster; bfloat16 on TPUs and GPUs from Ampere on)",
    )
    workdir: Optional[str] = _field(None, "output directory; default workdirs/<config name>")
    wait_seconds: float = _field(
        600.0, "multi-worker: how long other workers wait for the chief's vocabulary / data"
    )
    collective_timeout_seconds: Optional[float] = _field(
        600.0,
        "multi-worker: a collective (gradient all-reduce) waiting longer than this fails, so a "
        "worker whose peer died exits instead of hanging; must exceed the chief's dev "
        "evaluation time; null: wait forever",
    )


@dataclasses.dataclass
class ExportConfig:
    """SavedModel export."""

    name: Optional[str] = _field(
        None, "model name: saved_models/<name>/<version>; default: the config name"
    )
    base_dir: str = _field("saved_models", "directory holding the named models")
    average_checkpoints: int = _field(1, "average the last N checkpoints before exporting")
    beam_size: Optional[int] = _field(
        None, "beam size fixed in the SavedModel; null: decode.beam_size"
    )
    alpha: Optional[float] = _field(None, "length-penalty exponent; null: decode.alpha")
    n_best: Optional[int] = _field(
        None,
        "hypotheses per input of the translate_nbest signature (<= beam size); null: the beam size",
    )
    max_extra_length: Optional[int] = _field(
        None, "outputs stop at source length + this; null: decode.max_extra_length"
    )


@dataclasses.dataclass
class ExperimentConfig:
    """A whole experiment: one dataclass per YAML section."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)
    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
    export: ExportConfig = dataclasses.field(default_factory=ExportConfig)
    name: str = _field("experiment", "experiment name (default: the config file's stem)")

    def to_dict(self):
        return dataclasses.asdict(self)


SECTIONS = {f.name: f.type for f in dataclasses.fields(ExperimentConfig) if f.name != "name"}


def _type_name(tp):
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _coerce(key, value, tp):
    """Checks `value` against the annotation `tp`; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if origin is Union:
        errors = []
        for option in typing.get_args(tp):
            if option is type(None):
                if value is None:
                    return None
                continue
            try:
                return _coerce(key, value, option)
            except ConfigError as e:
                errors.append(e)
        raise ConfigError(
            f"{key}: expected {' or '.join(_type_name(t) for t in typing.get_args(tp))}, "
            f"got {type(value).__name__} {value!r}"
        )
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp in (bool, str, list, dict) and isinstance(value, tp):
        return value
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")


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
        kwargs[key] = _coerce(f"{name}.{key}", value, hints[key])
    return cls(**kwargs)


def from_dict(values, name=None):
    """Builds a validated `ExperimentConfig` from a (YAML-like) dict."""
    values = dict(values or {})
    config_name = values.pop("name", None) or name or "experiment"
    unknown = set(values) - set(SECTIONS)
    if unknown:
        raise ConfigError(
            f"unknown config section '{sorted(unknown)[0]}' (known: {', '.join(SECTIONS)})"
        )
    sections = {key: _build_section(key, cls, values.get(key)) for key, cls in SECTIONS.items()}
    config = ExperimentConfig(name=str(config_name), **sections)
    validate(config)
    return config


def _parse_override(text):
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
    """Applies `["section.key=value", ...]` (values parsed as YAML scalars) to a config dict."""
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
            raise ConfigError(f"{path}: invalid YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a mapping of sections at the top level")
        name = os.path.splitext(os.path.basename(path))[0]
    return from_dict(apply_overrides(values, overrides), name=name)


def _read_config_text(path):
    """The text of a config file: a local path, or any TensorFlow filesystem's (`gs://...`,
    TensorFlow loads only then)."""
    if "://" not in str(path):
        if not os.path.isfile(path):
            raise ConfigError(f"config file not found: {path}")
        with open(path, encoding="utf-8") as f:
            return f.read()
    from keras_transformer.workdir import read_text

    try:
        return read_text(path)
    except OSError:
        raise ConfigError(f"config file not found: {path}") from None


def save_config(config, path):
    """Writes the resolved config as YAML (what `load_config` reads back) to `path`, on any
    TensorFlow filesystem (`gs://...`), appearing whole."""
    from keras_transformer.workdir import write_atomically

    write_atomically(path, yaml.safe_dump(config.to_dict(), sort_keys=False))


def validate(config):
    """Checks values that are of the right type but impossible."""
    m, d, t, dec, r = config.model, config.data, config.train, config.decode, config.runtime
    checks = [
        (m.num_layers > 0, "model.num_layers must be positive"),
        (
            m.num_encoder_layers is None or m.num_encoder_layers > 0,
            "model.num_encoder_layers must be positive (or null)",
        ),
        (
            m.num_decoder_layers is None or m.num_decoder_layers > 0,
            "model.num_decoder_layers must be positive (or null)",
        ),
        (m.d_model > 0 and m.num_heads > 0, "model.d_model and model.num_heads must be positive"),
        (m.d_model % max(m.num_heads, 1) == 0, "model.d_model must be divisible by num_heads"),
        (0.0 <= m.dropout < 1.0, "model.dropout must be in [0, 1)"),
        (0.0 <= m.token_dropout < 1.0, "model.token_dropout must be in [0, 1)"),
        (d.vocab_size >= 16, "data.vocab_size must be at least 16"),
        (d.max_source_length > 0 and d.max_target_length > 0, "data max lengths must be positive"),
        (d.tokens_per_batch > 0, "data.tokens_per_batch must be positive"),
        (d.long_pairs in ("drop", "truncate"), "data.long_pairs must be drop or truncate"),
        (d.spm_max_sentences > 0, "data.spm_max_sentences must be positive"),
        (
            d.prepare_workers is None or d.prepare_workers >= 1,
            "data.prepare_workers must be at least 1 (or null)",
        ),
        (d.subword_samples >= 0, "data.subword_samples must not be negative"),
        (0.0 < d.subword_alpha <= 1.0, "data.subword_alpha must be in (0, 1]"),
        (t.steps > 0, "train.steps must be positive"),
        (t.warmup_steps > 0, "train.warmup_steps must be positive"),
        (
            t.schedule in ("rsqrt", "linear", "cosine"),
            f"train.schedule must be rsqrt, linear or cosine, got {t.schedule!r}",
        ),
        (0.0 <= t.label_smoothing < 1.0, "train.label_smoothing must be in [0, 1)"),
        (t.weight_decay >= 0.0, "train.weight_decay must not be negative"),
        (
            t.ema_momentum is None or 0.0 < t.ema_momentum < 1.0,
            "train.ema_momentum must be in (0, 1) (or null)",
        ),
        (t.gradient_accumulation_steps > 0, "train.gradient_accumulation_steps must be positive"),
        (t.steps_per_epoch > 0, "train.steps_per_epoch must be positive"),
        (t.checkpoint_every > 0, "train.checkpoint_every must be positive"),
        (t.keep_checkpoints > 0, "train.keep_checkpoints must be positive"),
        (t.keep_backups > 0, "train.keep_backups must be positive"),
        (r.wait_seconds >= 0, "runtime.wait_seconds must not be negative"),
        (
            r.collective_timeout_seconds is None or r.collective_timeout_seconds > 0,
            "runtime.collective_timeout_seconds must be positive (or null)",
        ),
        (t.max_minutes is None or t.max_minutes > 0, "train.max_minutes must be positive"),
        (dec.beam_size > 0, "decode.beam_size must be positive"),
        (dec.batch_size > 0, "decode.batch_size must be positive"),
        (
            r.strategy in ("auto", "default", "mirrored", "multi_worker", "tpu"),
            f"runtime.strategy must be auto|default|mirrored|multi_worker|tpu, got {r.strategy!r}",
        ),
        (
            r.jit_compile in (True, False, "auto"),
            f"runtime.jit_compile must be true, false or auto, got {r.jit_compile!r}",
        ),
        (
            r.mixed_precision in (None, "mixed_bfloat16", "mixed_float16", "float32", "auto"),
            "runtime.mixed_precision must be null, mixed_bfloat16, mixed_float16, float32 or "
            "auto, "
            f"got {r.mixed_precision!r}",
        ),
        (config.export.average_checkpoints > 0, "export.average_checkpoints must be positive"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    export_decoding(config)  # the export's decoding settings must be possible too
    return config


def export_decoding(config, **overrides):
    """The decoding settings fixed into an exported SavedModel.

    Each of `beam_size`, `alpha`, `n_best` and `max_extra_length` comes from, in order: a
    non-None keyword argument (e.g. `keras-transformer export --beam-size`), the `export:`
    section, the `decode:` section (`n_best`: the beam size). `batch_size` is `decode.batch_size`.

    Args:
        config: an `ExperimentConfig`.
        **overrides: `beam_size`, `alpha`, `n_best`, `max_extra_length` (None = not given).

    Returns:
        A dict with `beam_size`, `alpha`, `n_best`, `max_extra_length` and `batch_size`.

    Raises:
        ConfigError: a value is impossible (named as its `export.` key).

    Example:
    >>> export_decoding(from_dict({"decode": {"beam_size": 5}}), n_best=2)["n_best"]
    2
    """
    unknown = set(overrides) - {"beam_size", "alpha", "n_best", "max_extra_length"}
    if unknown:
        raise TypeError(f"export_decoding() got unknown settings {sorted(unknown)}")

    def pick(key, fallback):
        value = overrides.get(key)
        if value is None:
            value = getattr(config.export, key)
        return fallback if value is None else value

    beam_size = int(pick("beam_size", config.decode.beam_size))
    settings = {
        "beam_size": beam_size,
        "alpha": float(pick("alpha", config.decode.alpha)),
        "n_best": int(pick("n_best", beam_size)),
        "max_extra_length": int(pick("max_extra_length", config.decode.max_extra_length)),
        "batch_size": config.decode.batch_size,
    }
    if settings["beam_size"] < 1:
        raise ConfigError(f"export.beam_size must be positive, got {settings['beam_size']}")
    if not 1 <= settings["n_best"] <= beam_size:
        raise ConfigError(
            f"export.n_best must be between 1 and the beam size ({beam_size}), "
            f"got {settings['n_best']}"
        )
    if settings["max_extra_length"] < 0:
        raise ConfigError(
            f"export.max_extra_length must be 0 or more, got {settings['max_extra_length']}"
        )
    return settings


def config_reference():
    """Markdown tables listing every key with its default and meaning (used by the README)."""
    lines = []
    for section, cls in SECTIONS.items():
        lines.append(f"### `{section}`\n")
        lines.append("| key | default | meaning |")
        lines.append("|---|---|---|")
        instance = cls()
        for f in dataclasses.fields(cls):
            default = getattr(instance, f.name)
            shown = "null" if default is None else yaml.safe_dump(default).strip()
            shown = shown.removesuffix("\n...").removesuffix("...").strip()
            lines.append(f"| `{f.name}` | `{shown}` | {f.metadata.get('help', '')} |")
        lines.append("")
    return "\n".join(lines)
