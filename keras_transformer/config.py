"""Experiment configuration: dataclass schema, YAML loading, dotted overrides and validation.

A config file is YAML with the sections `model`, `data`, `train`, `decode`, `runtime` and
`export`. Every key has a default and its valid values (`valid=`: an interval, the choices, or
non-empty), declared together (see `config_reference()`); unknown keys, values of the wrong type
and values outside their range raise `ConfigError` naming the key.

Example:
```python
config = load_config("configs/quickstart.yaml", overrides=["train.steps=100"])
config.model.d_model
```
"""

import dataclasses
import os
import re
import typing
from typing import Optional, Union

import yaml

from keras_transformer.errors import ConfigError, first_line

# Sane upper bounds: far beyond any model that fits in memory, far below int64's limit.
_MAX_LAYERS = 1000
_MAX_WIDTH = 1 << 18
_MAX_LENGTH = 1 << 16
_MAX_COUNT = 10**12  # steps, sentences: counts that cost time, not memory
_MAX_BATCH = 10**8  # tokens or examples held in memory at once
_MAX_BEAM = 1024
_MAX_MINUTES = 10**7  # about 19 years
_MAX_SECONDS = 10**9
_SEEDS = f"[0, {2**31 - 1}]"
_NON_EMPTY = "non-empty"
# The special ids every SentencePiece model of ours is trained with, which decoding relies on.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
_ACTIVATIONS = ("relu", "gelu", "silu", "swish", "relu6", "elu", "selu", "tanh", "sigmoid")
_INTERVAL = re.compile(r"^([\[(])(-?[0-9.e+]+), (-?[0-9.e+]+)([\])])$")
# `export.average_checkpoints: auto` and `decode.alpha: auto`: the dev set chooses (see
# `keras_transformer.final_model`).
AUTO = "auto"


def _field(default, help, valid=None, **kwargs):
    """A dataclass field with its `help` and its `valid` values, checked on load: an interval
    such as `"[0, 1)"` (numbers; every item of a list), a tuple of choices, or `"non-empty"`
    (strings)."""
    if isinstance(valid, str) and valid != _NON_EMPTY and not _INTERVAL.match(valid):
        raise ValueError(f"bad interval {valid!r}")
    metadata = {"help": help, "valid": valid}
    if isinstance(default, (list, dict)):
        return dataclasses.field(
            default_factory=lambda: type(default)(default), metadata=metadata, **kwargs
        )
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def _in_interval(value, interval):
    opening, low, high, closing = _INTERVAL.match(interval).groups()
    low, high = float(low), float(high)
    above = value >= low if opening == "[" else value > low
    below = value <= high if closing == "]" else value < high
    return above and below  # NaN is in no interval


def _choices(valid):
    """`a, b or c`: the choices of a `valid` tuple (an interval among them shown as such)."""
    names = [str(c).lower() if isinstance(c, bool) else str(c) for c in valid]
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def _check_valid(key, value, valid):
    """Raises `ConfigError` naming `key` when a (well-typed) value is outside `valid`."""
    if value is None or valid is None:
        return
    if isinstance(valid, tuple) and isinstance(value, (int, float)) and not isinstance(value, bool):
        interval = next((v for v in valid if isinstance(v, str) and _INTERVAL.match(v)), None)
        if interval is not None:  # a number where the choices include an interval
            if not _in_interval(value, interval):
                others = _choices(tuple(v for v in valid if v != interval))
                raise ConfigError(f"{key} must be in {interval} or {others}, got {value!r}")
            return
    if isinstance(valid, tuple):
        ok = any(
            value is choice or (value == choice and type(value) is type(choice)) for choice in valid
        )
        if not ok:
            raise ConfigError(f"{key} must be one of {_choices(valid)}, got {value!r}")
    elif valid == _NON_EMPTY:
        items = value if isinstance(value, list) else [value]
        if not items:
            raise ConfigError(f"{key} must not be an empty list")
        for item in items:
            if not isinstance(item, str):
                raise ConfigError(f"{key}: expected a list of str, got {item!r} in it")
            if not item.strip():
                raise ConfigError(f"{key} must not be empty")
    elif isinstance(value, list):
        for item in value:
            if not isinstance(item, int) or isinstance(item, bool):
                raise ConfigError(f"{key}: expected a list of int, got {item!r} in it")
            if not _in_interval(item, valid):
                raise ConfigError(f"{key}: every item must be in {valid}, got {item!r}")
    elif not _in_interval(value, valid):
        raise ConfigError(f"{key} must be in {valid}, got {value!r}")


@dataclasses.dataclass
class ModelConfig:
    """Transformer sizes; the names are those of `keras_transformer.models.Transformer`."""

    num_layers: int = _field(6, "encoder and decoder blocks (N)", valid=f"[1, {_MAX_LAYERS}]")
    num_encoder_layers: Optional[int] = _field(
        None, "encoder blocks; null: num_layers", valid=f"[1, {_MAX_LAYERS}]"
    )
    num_decoder_layers: Optional[int] = _field(
        None,
        "decoder blocks; null: num_layers (a shallow decoder trains and decodes faster)",
        valid=f"[1, {_MAX_LAYERS}]",
    )
    d_model: int = _field(512, "model width", valid=f"[1, {_MAX_WIDTH}]")
    num_heads: int = _field(
        8, "attention heads (h); must divide d_model", valid=f"[1, {_MAX_WIDTH}]"
    )
    d_ff: int = _field(2048, "feed-forward inner width", valid=f"[1, {_MAX_WIDTH}]")
    dropout: float = _field(
        0.1, "residual dropout P_drop (sub-layer outputs, embedding sums)", valid="[0, 1)"
    )
    attention_dropout: float = _field(0.0, "dropout on attention weights", valid="[0, 1)")
    activation_dropout: float = _field(
        0.0, "dropout inside the feed-forward network", valid="[0, 1)"
    )
    token_dropout: float = _field(
        0.0,
        "word dropout: a token's whole input embedding zeroed (source and target)",
        valid="[0, 1)",
    )
    activation: str = _field("relu", "feed-forward activation", valid=_ACTIVATIONS)
    norm_first: bool = _field(False, "pre-norm blocks instead of the paper's post-norm")
    share_embeddings: bool = _field(True, "one embedding for source, target and softmax")
    layer_norm_epsilon: float = _field(1e-6, "LayerNorm epsilon", valid="(0, 1]")


@dataclasses.dataclass
class DataConfig:
    """Corpora, vocabulary and batching."""

    train: Union[str, list] = _field(
        "synthetic:",
        "training corpus spec: text:SRC,TGT | tsv:FILE | tfds:NAME[:SPLIT] | synthetic:...; or "
        "a list of them, each [N*][bt:]SPEC: N* repeats a corpus N times, bt: tags the sources "
        "of synthetic (back-translated) pairs with the reserved piece `<BT>`",
        valid=_NON_EMPTY,
    )
    dev: Optional[str] = _field(None, "dev corpus spec (BLEU during training); None to skip")
    test: Optional[str] = _field(None, "test corpus spec (BLEU at the end); None to skip")
    vocab_size: int = _field(
        8000, "SentencePiece vocabulary size (shared source/target)", valid="[16, 1048576]"
    )
    spm_model_type: str = _field(
        "unigram", "SentencePiece model type: unigram | bpe", valid=("unigram", "bpe")
    )
    spm_character_coverage: float = _field(1.0, "SentencePiece character coverage", valid="(0, 1]")
    spm_max_sentences: int = _field(
        1_000_000,
        "at most this many sentences (both sides) train the vocabulary",
        valid=f"[1, {_MAX_COUNT}]",
    )
    max_source_length: int = _field(
        128, "longest source in tokens, EOS included", valid=f"[1, {_MAX_LENGTH}]"
    )
    max_target_length: int = _field(
        128, "longest target in tokens, EOS (or BOS) included", valid=f"[1, {_MAX_LENGTH}]"
    )
    long_pairs: str = _field(
        "drop",
        "training pairs longer than the max lengths: drop (the paper's recipe, counted as "
        "too_long in the prepared manifest) | truncate (cut, EOS kept)",
        valid=("drop", "truncate"),
    )
    subword_samples: int = _field(
        0,
        "SentencePiece subword regularization (Kudo 2018): prepare writes this many sampled "
        "segmentations of every training pair instead of its single best one (0: off)",
        valid="[0, 64]",
    )
    subword_alpha: float = _field(
        0.3,
        "smoothing of the sampled segmentations when data.subword_samples > 0: lower is more "
        "varied (and longer); unigram samples from all segmentations, bpe drops merges with "
        "this probability",
        valid="(0, 1]",
    )
    both_directions: bool = _field(
        False,
        "prepare also writes every training pair reversed (target -> source), its source led by "
        "the BOS id as a direction tag; forward inputs carry no tag, so decoding and export are "
        "unchanged (an auxiliary task for small corpora)",
    )
    tokens_per_batch: int = _field(
        4096, "padded target tokens per batch (per replica)", valid=f"[1, {_MAX_BATCH}]"
    )
    bucket_boundaries: Optional[list] = _field(
        None,
        "padded lengths of the buckets; None chooses a few up to the max lengths",
        valid=f"[1, {_MAX_LENGTH}]",
    )
    shuffle_buffer: int = _field(
        10000, "examples in the shuffle buffer", valid=f"[1, {_MAX_BATCH}]"
    )
    seed: int = _field(
        1234, "seed for the synthetic corpus, shuffling and the vocabulary", valid=_SEEDS
    )
    prepare_workers: Optional[int] = _field(
        None,
        "processes that tokenize the corpus and write the shards (null: the machine's cores; "
        "the vocabulary trains on every core whatever the number); the prepared data is the "
        "same whatever the number",
        valid="[1, 1024]",
    )


@dataclasses.dataclass
class TrainConfig:
    """The optimisation recipe (the paper's by default)."""

    steps: int = _field(100000, "total optimizer steps", valid=f"[1, {_MAX_COUNT}]")
    warmup_steps: int = _field(4000, "learning-rate warm-up steps", valid=f"[1, {_MAX_COUNT}]")
    learning_rate_scale: float = _field(
        1.0,
        "multiplier of the learning rate: rsqrt is scale * d_model^-0.5 * min(step^-0.5, "
        "step * warmup^-1.5); every schedule peaks near scale * (d_model * warmup)^-0.5",
        valid="(0, 1000]",
    )
    schedule: str = _field(
        "rsqrt",
        "learning-rate schedule: rsqrt (the paper's inverse square root) | linear | cosine "
        "(warm-up, then decay to zero where train.steps or train.max_minutes ends, whichever "
        "comes first; for budgeted runs)",
        valid=("rsqrt", "linear", "cosine"),
    )
    label_smoothing: float = _field(0.1, "label smoothing epsilon_ls", valid="[0, 1)")
    adam_beta_1: float = _field(0.9, "Adam beta_1", valid="[0, 1)")
    adam_beta_2: float = _field(0.98, "Adam beta_2", valid="[0, 1)")
    adam_epsilon: float = _field(1e-9, "Adam epsilon", valid="(0, 1]")
    gradient_accumulation_steps: int = _field(
        1,
        "micro-batches per optimizer step (summed in the train step; see docs/guides/scale.md)",
        valid="[1, 1024]",
    )
    clip_norm: Optional[float] = _field(
        None, "clip gradients to this global norm; None: off", valid="(0, 1000000]"
    )
    weight_decay: float = _field(
        0.0,
        "decoupled weight decay (AdamW): w -= lr * weight_decay * w at every step, on all "
        "weights but biases and LayerNorm scales and offsets; 0: off (the paper's)",
        valid="[0, 1]",
    )
    ema_momentum: Optional[float] = _field(
        None,
        "exponential moving average of the weights, a = m * a + (1 - m) * w after each step "
        "(Keras's use_ema): checkpoints, dev BLEU and the export use the average; null: off",
        valid="(0, 1)",
    )
    steps_per_epoch: int = _field(
        1000, "steps between evaluations / Keras epochs", valid=f"[1, {_MAX_COUNT}]"
    )
    checkpoint_every: int = _field(1000, "steps between checkpoints", valid=f"[1, {_MAX_COUNT}]")
    keep_checkpoints: int = _field(5, "checkpoints kept (the last K)", valid="[1, 1000]")
    keep_best: int = _field(
        0,
        "also keep the K checkpoints with the best dev BLEU (greedy, on train.eval_max_sentences "
        "sentences, scored every train.checkpoint_every steps) in WORKDIR/best; they join the "
        "candidates of export.average_checkpoints: auto; 0: off",
        valid="[0, 1000]",
    )
    keep_backups: int = _field(
        2, "resume states kept in WORKDIR/backup (the last K)", valid="[1, 1000]"
    )
    log_every: int = _field(
        100, "steps between TensorBoard scalar writes", valid=f"[1, {_MAX_COUNT}]"
    )
    eval_max_sentences: int = _field(
        500, "dev sentences decoded for BLEU during training", valid=f"[1, {_MAX_COUNT}]"
    )
    num_sample_translations: int = _field(
        3, "sample translations logged as text", valid="[0, 1000]"
    )
    max_minutes: Optional[float] = _field(
        None,
        "the run's wall-clock budget in minutes (training counted across resumes): training, "
        "and the learning rate's decay, end train.end_minutes before it, which the dev set's "
        "choice, the scoring and the export then fit into; null: train all steps",
        valid=f"(0, {_MAX_MINUTES}]",
    )
    end_minutes: Optional[float] = _field(
        None,
        "with train.max_minutes, the minutes kept for what follows training (the dev set's "
        "choice, scoring, export); null: a tenth of train.max_minutes, or more where the end "
        "needs more at the decoding speed measured at each dev evaluation (one process only)",
        valid=f"[0, {_MAX_MINUTES}]",
    )
    seed: int = _field(42, "seed of weight initialisation and dropout", valid=_SEEDS)
    init_from: Optional[str] = _field(
        None,
        "fine-tuning: a trained workdir (its last complete checkpoint) or a step checkpoint "
        "(WORKDIR/checkpoints/ckpt-<step>.weights.h5) whose weights and vocabulary start this "
        "run, with a fresh optimizer and schedule; the model: section and vocabulary must be "
        "the parent's (train --init-from PATH); null: random weights",
        valid=_NON_EMPTY,
    )


@dataclasses.dataclass
class DecodeConfig:
    """Decoding settings (also fixed into the exported SavedModel)."""

    beam_size: int = _field(4, "beam size k (1 = greedy)", valid=f"[1, {_MAX_BEAM}]")
    alpha: Union[float, str] = _field(
        0.6,
        "length penalty ((5+len)/6)^alpha; auto: the dev set chooses among "
        "final_model.ALPHA_CANDIDATES at the end of train and in export --select-on-dev "
        "(elsewhere, e.g. dev BLEU during training, the paper's 0.6)",
        valid=(AUTO, "[0, 10]"),
    )
    max_extra_length: int = _field(
        50, "outputs stop at source length + this", valid=f"[0, {_MAX_LENGTH}]"
    )
    batch_size: int = _field(32, "sentences decoded together", valid=f"[1, {_MAX_BATCH}]")
    sampling_topk: int = _field(
        0,
        "sample each token among the K most likely (0 = off: beam/greedy search)",
        valid=f"[0, {_MAX_WIDTH}]",
    )
    sampling_temperature: float = _field(
        1.0, "sampling: logits divided by this (< 1 sharper, > 1 flatter)", valid="(0, 100]"
    )
    sampling_topp: float = _field(
        1.0,
        "sampling: only the most likely tokens holding this probability mass (1 = all K)",
        valid="(0, 1]",
    )


@dataclasses.dataclass
class RuntimeConfig:
    """Where and how training runs."""

    strategy: str = _field(
        "auto",
        "auto | default | mirrored | multi_worker | tpu",
        valid=("auto", "default", "mirrored", "multi_worker", "tpu"),
    )
    tpu: str = _field("", "TPU address for strategy=tpu ('' = local/auto)")
    jit_compile: Union[bool, str] = _field(
        "auto", "XLA: true | false | auto (chosen per device)", valid=(True, False, "auto")
    )
    mixed_precision: Optional[str] = _field(
        None,
        "None | mixed_bfloat16 | mixed_float16 (with loss scaling) | auto (timed on CPUs: "
        "bfloat16 if it trains at least 1.1x faster; bfloat16 on TPUs and GPUs from Ampere on)",
        valid=("mixed_bfloat16", "mixed_float16", "float32", "auto"),
    )
    workdir: Optional[str] = _field(
        None, "output directory; default workdirs/<config name>", valid=_NON_EMPTY
    )
    wait_seconds: float = _field(
        600.0,
        "multi-worker: how long other workers wait for the chief's vocabulary / data",
        valid=f"[0, {_MAX_SECONDS}]",
    )
    collective_timeout_seconds: Optional[float] = _field(
        600.0,
        "multi-worker: a collective (gradient all-reduce) waiting longer than this fails, so a "
        "worker whose peer died exits instead of hanging; must exceed the chief's dev "
        "evaluation time; null: wait forever",
        valid=f"(0, {_MAX_SECONDS}]",
    )
    lock_lease_seconds: float = _field(
        120.0,
        "the workdir lock's lease: `train` and `prepare` renew WORKDIR/lock.json every quarter "
        "of it; a lock not renewed for this long is stale on any host and is taken over (a "
        "run rescheduled on another machine waits at most this long for a dead holder's lock)",
        valid=f"[1, {_MAX_SECONDS}]",
    )


@dataclasses.dataclass
class ExportConfig:
    """SavedModel export."""

    name: Optional[str] = _field(
        None,
        "model name: saved_models/<name>/<version>; default: the workdir's last part "
        "(workdirs/de-en exports to saved_models/de-en; workdirs/<config name> by default)",
        valid=_NON_EMPTY,
    )
    base_dir: str = _field("saved_models", "directory holding the named models", valid=_NON_EMPTY)
    average_checkpoints: Union[int, str] = _field(
        1,
        "average the last N checkpoints before exporting; auto: the dev set chooses among the "
        "last checkpoint, the averages of the last 2, 3 and train.keep_checkpoints, and the "
        "train.keep_best ones (see final_model.py)",
        valid=(AUTO, "[1, 1000]"),
    )
    select_max_sentences: int = _field(
        1000,
        "where the dev set chooses (auto), the dev sentences each candidate decodes (the first "
        "N): more than train.eval_max_sentences, as candidates often differ by 0.1 BLEU",
        valid=f"[1, {_MAX_COUNT}]",
    )
    select_screen_sentences: int = _field(
        300,
        "where the dev set chooses, each checkpoint set is first screened by greedy decoding of "
        "the first N of those sentences, and only the best export.select_finalists sets are "
        "decoded with the export's beam (at every alpha); 0: every candidate at the beam",
        valid=f"[0, {_MAX_COUNT}]",
    )
    select_finalists: int = _field(
        2,
        "checkpoint sets that the greedy screening passes on to the beam (fewer when the end of "
        "a train.max_minutes budget is short of time)",
        valid="[1, 100]",
    )
    beam_size: Optional[int] = _field(
        None, "beam size fixed in the SavedModel; null: decode.beam_size", valid=f"[1, {_MAX_BEAM}]"
    )
    alpha: Optional[float] = _field(
        None, "length-penalty exponent; null: decode.alpha", valid="[0, 10]"
    )
    n_best: Optional[int] = _field(
        None,
        "hypotheses per input of the translate_nbest signature (<= beam size); null: the beam size",
        valid=f"[1, {_MAX_BEAM}]",
    )
    max_extra_length: Optional[int] = _field(
        None,
        "outputs stop at source length + this; null: decode.max_extra_length",
        valid=f"[0, {_MAX_LENGTH}]",
    )
    jit_compile: bool = _field(
        False,
        "compile the SavedModel's search with XLA: faster decoding on CPUs, one compile per new "
        "input shape; TF Serving needs --xla_cpu_compilation_enabled=true on a CPU",
    )


@dataclasses.dataclass(frozen=True)
class DecodingSettings:
    """How outputs are decoded: the one type that `translate_ids`, the dev evaluation, the
    `Translator` and the CTranslate2 export take (`decoding_settings(config)` makes it from a
    config). The defaults are the `decode:` section's.

    Args:
        beam_size: beams per input (1 = greedy search).
        alpha: length-penalty exponent of GNMT's `((5 + length) / 6) ** alpha`.
        max_extra_length: outputs stop at the source length plus this.
        batch_size: sentences decoded together.
        n_best: hypotheses kept per input (1 to `beam_size`); None: `beam_size`.
        sampling_topk: sample each token among the K most likely; 0: search (beam or greedy).
        sampling_temperature: sampling divides the logits by this.
        sampling_topp: sampling keeps the most likely tokens holding this probability mass.
        bos_id, eos_id, pad_id: the special ids of the vocabulary.

    Example:
    ```python
    settings = DecodingSettings(beam_size=5)
    greedy = dataclasses.replace(settings, beam_size=1)
    ```
    """

    beam_size: int = DecodeConfig.beam_size
    alpha: float = DecodeConfig.alpha
    max_extra_length: int = DecodeConfig.max_extra_length
    batch_size: int = DecodeConfig.batch_size
    n_best: Optional[int] = None
    sampling_topk: int = DecodeConfig.sampling_topk
    sampling_temperature: float = DecodeConfig.sampling_temperature
    sampling_topp: float = DecodeConfig.sampling_topp
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    pad_id: int = PAD_ID

    def __post_init__(self):
        for f in dataclasses.fields(self):  # plain Python numbers: hashable, JSON-ready
            value = getattr(self, f.name)
            if value is not None:
                object.__setattr__(self, f.name, float(value) if f.type is float else int(value))
        if self.beam_size < 1 or self.batch_size < 1:
            raise ValueError(f"beam_size and batch_size must be >= 1: {self}")
        if self.n_best is not None and not 1 <= self.n_best <= self.beam_size:
            raise ValueError(
                f"n_best must be between 1 and the beam size ({self.beam_size}), got {self.n_best}"
            )
        if self.sampling_topk < 0 or not self.sampling_temperature > 0:
            raise ValueError("sampling_topk must be >= 0 and sampling_temperature > 0")
        if not 0 < self.sampling_topp <= 1:
            raise ValueError(f"sampling_topp must be in (0, 1], got {self.sampling_topp}")

    @property
    def hypotheses(self):
        """Hypotheses kept per input: `n_best`, or the beam size."""
        return self.beam_size if self.n_best is None else self.n_best

    @property
    def sampling(self):
        """True when tokens are sampled (`sampling_topk > 0`) instead of searched."""
        return self.sampling_topk > 0

    def without_sampling(self):
        """These settings with sampling off: the beam (or greedy) search."""
        return dataclasses.replace(self, sampling_topk=0)


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
    config_name = _coerce("name", values.pop("name", None) or name or "experiment", str)
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
        package = os.path.dirname(os.path.abspath(__file__))
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
            _check_valid(f"{section}.{f.name}", getattr(values, f.name), f.metadata.get("valid"))
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
    decoding_settings(config, export=True)  # the export's settings must be possible too
    return config


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
                _check_valid(f"{section}.{key}", chosen, valid[key])
                values[key] = chosen
    if values["alpha"] == AUTO:  # chosen on dev where the final model is made (final_model.py)
        values["alpha"] = DecodingSettings.alpha
    if values["n_best"] is not None and values["n_best"] > values["beam_size"]:
        raise ConfigError(
            f"export.n_best must be between 1 and the beam size ({values['beam_size']}), "
            f"got {values['n_best']}"
        )
    return DecodingSettings(batch_size=d.batch_size, **values)


def _describe_valid(f, hint):
    """The `valid` column of the reference: an interval, the choices, or blank (any value of
    the type); `or null` where null is allowed."""
    valid = f.metadata.get("valid")
    if isinstance(valid, tuple):
        shown = ", ".join(
            f"`{c}`" if isinstance(c, str) and _INTERVAL.match(c)
            else f"`{yaml.safe_dump(c).splitlines()[0]}`"
            for c in valid
        )  # fmt: skip
    elif valid is None:
        shown = ""
    else:
        shown = valid if valid == _NON_EMPTY else f"`{valid}`"
    if type(None) in typing.get_args(hint):
        shown = f"{shown} or null" if shown else ""
    return shown


def _table_cell(text):
    """`text` as a Markdown table cell: a `|` (even in backticks) would end the cell, and
    `[a][b]` outside backticks would be a reference link (`[N*][bt:]SPEC` in a help text)."""
    parts = text.replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):  # outside backticks
        parts[i] = parts[i].replace("[", "\\[").replace("]", "\\]")
    return "`".join(parts)


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
            valid = _describe_valid(f, hints[f.name])
            cells = [f"`{f.name}`", f"`{shown}`", valid, f.metadata.get("help", "")]
            lines.append("| " + " | ".join(_table_cell(c) for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)
