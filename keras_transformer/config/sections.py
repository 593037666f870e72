"""The config's sections: one dataclass per YAML section (`model`, `data`, `train`, `decode`,
`runtime`, `export`, `distill`), each key declared once with its default, help and valid values
(`key()`), and `DecodingSettings`, the decoding settings made from the `decode:` section.

Every section (and the `ExperimentConfig` holding them) is frozen: a config is validated once,
where it is built (`keras_transformer.config`), and a changed one is a new config
(`dataclasses.replace`, or `load_config(..., overrides=[...])`, which validates it).

`ModelConfig`, the `model:` section, holds the model's hyper-parameters, declared with their
defaults in `keras_transformer.hyper_parameters` (below the layers, which never see the config):
its keys are those, in their order, with their defaults; it adds each key's help and valid values.
"""

import dataclasses
from typing import Optional, Union

from keras_transformer import hyper_parameters
from keras_transformer.config._schema import NON_EMPTY as _NON_EMPTY
from keras_transformer.config._schema import key
from keras_transformer.config.formats import precisions
from keras_transformer.hyper_parameters import ModelHyperParameters as _Model
from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID  # noqa: F401

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
_ACTIVATIONS = ("relu", "gelu", "silu", "swish", "relu6", "elu", "selu", "tanh", "sigmoid")
# `export.average_checkpoints: auto` and `decode.alpha: auto`: the dev set chooses (see
# `keras_transformer.final_model`).
AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Transformer sizes: the model's hyper-parameters (`keras_transformer.hyper_parameters`,
    which declares them and their defaults), with each key's help and valid values.
    `keras_transformer.models.Transformer` takes these keys as keyword arguments
    (`DecoderOnlyTransformer` those it has)."""

    num_layers: int = key(
        _Model.num_layers, "encoder and decoder blocks (N)", valid=f"[1, {_MAX_LAYERS}]"
    )
    num_encoder_layers: Optional[int] = key(
        _Model.num_encoder_layers, "encoder blocks; null: num_layers", valid=f"[1, {_MAX_LAYERS}]"
    )
    num_decoder_layers: Optional[int] = key(
        _Model.num_decoder_layers,
        "decoder blocks; null: num_layers (a shallow decoder trains and decodes faster)",
        valid=f"[1, {_MAX_LAYERS}]",
    )
    d_model: int = key(_Model.d_model, "model width", valid=f"[1, {_MAX_WIDTH}]")
    num_heads: int = key(
        _Model.num_heads, "attention heads (h); must divide d_model", valid=f"[1, {_MAX_WIDTH}]"
    )
    d_ff: int = key(_Model.d_ff, "feed-forward inner width", valid=f"[1, {_MAX_WIDTH}]")
    dropout: float = key(
        _Model.dropout,
        "residual dropout P_drop (sub-layer outputs, embedding sums)",
        valid="[0, 1)",
    )
    attention_dropout: float = key(
        _Model.attention_dropout, "dropout on attention weights", valid="[0, 1)"
    )
    activation_dropout: float = key(
        _Model.activation_dropout, "dropout inside the feed-forward network", valid="[0, 1)"
    )
    token_dropout: float = key(
        _Model.token_dropout,
        "word dropout: a token's whole input embedding zeroed (source and target)",
        valid="[0, 1)",
    )
    activation: str = key(_Model.activation, "feed-forward activation", valid=_ACTIVATIONS)
    norm_first: bool = key(_Model.norm_first, "pre-norm blocks instead of the paper's post-norm")
    share_embeddings: bool = key(
        _Model.share_embeddings, "one embedding for source, target and softmax"
    )
    layer_norm_epsilon: float = key(_Model.layer_norm_epsilon, "LayerNorm epsilon", valid="(0, 1]")


# The section's keys are the declared hyper-parameters, in their order (a key added to one only
# fails here, when the package loads).
if tuple(f.name for f in dataclasses.fields(ModelConfig)) != hyper_parameters.ALL:
    raise TypeError("ModelConfig's keys are not keras_transformer.hyper_parameters.ALL")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Corpora, vocabulary and batching."""

    train: Union[str, list] = key(
        "synthetic:",
        "training corpus spec: text:SRC,TGT | tsv:FILE | tfds:NAME[:SPLIT] | synthetic:...; or "
        "a list of them, each [N*][bt:]SPEC: N* repeats a corpus N times, bt: tags the sources "
        "of synthetic (back-translated) pairs with the reserved piece `<BT>`",
        valid=_NON_EMPTY,
    )
    dev: Optional[str] = key(None, "dev corpus spec (BLEU during training); None to skip")
    test: Optional[str] = key(None, "test corpus spec (BLEU at the end); None to skip")
    vocab_size: int = key(
        8000, "SentencePiece vocabulary size (shared source/target)", valid="[16, 1048576]"
    )
    spm_model_type: str = key(
        "unigram", "SentencePiece model type: unigram | bpe", valid=("unigram", "bpe")
    )
    spm_character_coverage: float = key(1.0, "SentencePiece character coverage", valid="(0, 1]")
    spm_max_sentences: int = key(
        1_000_000,
        "at most this many sentences (both sides) train the vocabulary",
        valid=f"[1, {_MAX_COUNT}]",
    )
    max_source_length: int = key(
        128, "longest source in tokens, EOS included", valid=f"[1, {_MAX_LENGTH}]"
    )
    max_target_length: int = key(
        128, "longest target in tokens, EOS (or BOS) included", valid=f"[1, {_MAX_LENGTH}]"
    )
    long_pairs: str = key(
        "drop",
        "training pairs longer than the max lengths: drop (the paper's recipe, counted as "
        "too_long in the prepared manifest) | truncate (cut, EOS kept)",
        valid=("drop", "truncate"),
    )
    subword_samples: int = key(
        0,
        "SentencePiece subword regularization (Kudo 2018): prepare writes this many sampled "
        "segmentations of every training pair instead of its single best one (0: off)",
        valid="[0, 64]",
    )
    subword_alpha: float = key(
        0.3,
        "smoothing of the sampled segmentations when data.subword_samples > 0: lower is more "
        "varied (and longer); unigram samples from all segmentations, bpe drops merges with "
        "this probability",
        valid="(0, 1]",
    )
    both_directions: bool = key(
        False,
        "prepare also writes every training pair reversed (target -> source), its source led by "
        "the BOS id as a direction tag; forward inputs carry no tag, so decoding and export are "
        "unchanged (an auxiliary task for small corpora)",
    )
    terminology: Optional[str] = key(
        None,
        "soft glossary training (Dinu et al. 2019): a TSV file, one source term, a tab and its "
        "target term a line; prepare annotates the source of a seeded fraction of the training "
        "pairs holding an entry (source term in the source, target term in the target) as "
        "`<term> SOURCE <trans> TARGET </term>`, and the vocabulary keeps those tags whole; "
        "null: off",
    )
    terminology_fraction: float = key(
        0.1,
        "with data.terminology: the fraction of the pairs holding an entry that are annotated "
        "(seeded by data.seed)",
        valid="[0, 1]",
    )
    train_alignments: Optional[str] = key(
        None,
        "word alignments of the training pairs for guided alignment training "
        "(train.guided_alignment_weight): a file in the Pharaoh form of fast_align, eflomal or "
        "awesome-align, one line of i-j pairs (source word i, target word j) per line of the "
        "corpus (data.train: one corpus); prepare stores them with the pairs; null: none",
    )
    tokens_per_batch: int = key(
        4096, "padded target tokens per batch (per replica)", valid=f"[1, {_MAX_BATCH}]"
    )
    bucket_boundaries: Optional[list] = key(
        None,
        "padded lengths of the buckets; None chooses a few up to the max lengths",
        valid=f"[1, {_MAX_LENGTH}]",
    )
    shuffle_buffer: int = key(10000, "examples in the shuffle buffer", valid=f"[1, {_MAX_BATCH}]")
    seed: int = key(
        1234, "seed for the synthetic corpus, shuffling and the vocabulary", valid=_SEEDS
    )
    prepare_workers: Optional[int] = key(
        None,
        "processes that tokenize the corpus and write the shards (null: the machine's cores; "
        "the vocabulary trains on every core whatever the number); the prepared data is the "
        "same whatever the number",
        valid="[1, 1024]",
    )


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The optimisation recipe (the paper's by default)."""

    steps: int = key(100000, "total optimizer steps", valid=f"[1, {_MAX_COUNT}]")
    warmup_steps: int = key(4000, "learning-rate warm-up steps", valid=f"[1, {_MAX_COUNT}]")
    learning_rate_scale: float = key(
        1.0,
        "multiplier of the learning rate: rsqrt is scale * d_model^-0.5 * min(step^-0.5, "
        "step * warmup^-1.5); every schedule peaks near scale * (d_model * warmup)^-0.5",
        valid="(0, 1000]",
    )
    schedule: str = key(
        "rsqrt",
        "learning-rate schedule: rsqrt (the paper's inverse square root) | linear | cosine "
        "(warm-up, then decay to zero where train.steps or train.max_minutes ends, whichever "
        "comes first; for budgeted runs)",
        valid=("rsqrt", "linear", "cosine"),
    )
    label_smoothing: float = key(0.1, "label smoothing epsilon_ls", valid="[0, 1)")
    guided_alignment_weight: float = key(
        0.0,
        "guided alignment (Garg et al. 2019): the weight of a cross-entropy between head 0 of "
        "the cross-attention of decoder layer export.alignment_layer and the alignments of "
        "data.train_alignments, added to the loss (OpenNMT-tf uses 1, Marian 0.1); 0: off",
        valid="[0, 100]",
    )
    adam_beta_1: float = key(0.9, "Adam beta_1", valid="[0, 1)")
    adam_beta_2: float = key(0.98, "Adam beta_2", valid="[0, 1)")
    adam_epsilon: float = key(1e-9, "Adam epsilon", valid="(0, 1]")
    gradient_accumulation_steps: int = key(
        1,
        "micro-batches per optimizer step (summed in the train step; see docs/guides/scale.md)",
        valid="[1, 1024]",
    )
    clip_norm: Optional[float] = key(
        None, "clip gradients to this global norm; None: off", valid="(0, 1000000]"
    )
    weight_decay: float = key(
        0.0,
        "decoupled weight decay (AdamW): w -= lr * weight_decay * w at every step, on all "
        "weights but biases and LayerNorm scales and offsets; 0: off (the paper's)",
        valid="[0, 1]",
    )
    ema_momentum: Optional[float] = key(
        None,
        "exponential moving average of the weights, a = m * a + (1 - m) * w after each step "
        "(Keras's use_ema): checkpoints, dev BLEU and the export use the average; null: off",
        valid="(0, 1)",
    )
    steps_per_epoch: int = key(
        1000, "steps between evaluations / Keras epochs", valid=f"[1, {_MAX_COUNT}]"
    )
    checkpoint_every: int = key(1000, "steps between checkpoints", valid=f"[1, {_MAX_COUNT}]")
    keep_checkpoints: int = key(5, "checkpoints kept (the last K)", valid="[1, 1000]")
    keep_best: int = key(
        0,
        "also keep the K checkpoints with the best dev BLEU (greedy, on train.eval_max_sentences "
        "sentences, scored every train.checkpoint_every steps) in WORKDIR/best; they join the "
        "candidates of export.average_checkpoints: auto; 0: off",
        valid="[0, 1000]",
    )
    keep_backups: int = key(
        2, "resume states kept in WORKDIR/backup (the last K)", valid="[1, 1000]"
    )
    log_every: int = key(100, "steps between TensorBoard scalar writes", valid=f"[1, {_MAX_COUNT}]")
    eval_max_sentences: int = key(
        500, "dev sentences decoded for BLEU during training", valid=f"[1, {_MAX_COUNT}]"
    )
    num_sample_translations: int = key(3, "sample translations logged as text", valid="[0, 1000]")
    max_minutes: Optional[float] = key(
        None,
        "the run's wall-clock budget in minutes (training counted across resumes): training, "
        "and the learning rate's decay, end train.end_minutes before it, which the dev set's "
        "choice, the scoring and the export then fit into; null: train all steps",
        valid=f"(0, {_MAX_MINUTES}]",
    )
    end_minutes: Optional[float] = key(
        None,
        "with train.max_minutes, the minutes kept for what follows training (the dev set's "
        "choice, scoring, export); null: a tenth of train.max_minutes, or more where the end "
        "needs more at the decoding speed measured at each dev evaluation (one process only)",
        valid=f"[0, {_MAX_MINUTES}]",
    )
    seed: int = key(42, "seed of weight initialisation and dropout", valid=_SEEDS)
    init_from: Optional[str] = key(
        None,
        "fine-tuning: a trained workdir (its last complete checkpoint) or a step checkpoint "
        "(WORKDIR/checkpoints/ckpt-<step>.weights.h5) whose weights and vocabulary start this "
        "run, with a fresh optimizer and schedule; the model: section and vocabulary must be "
        "the parent's (train --init-from PATH); null: random weights",
        valid=_NON_EMPTY,
    )


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Decoding settings (also fixed into the exported SavedModel)."""

    beam_size: int = key(4, "beam size k (1 = greedy)", valid=f"[1, {_MAX_BEAM}]")
    alpha: Union[float, str] = key(
        0.6,
        "length penalty ((5+len)/6)^alpha; auto: the dev set chooses among "
        "final_model.ALPHA_CANDIDATES at the end of train and in export --select-on-dev "
        "(elsewhere, e.g. dev BLEU during training, the paper's 0.6)",
        valid=(AUTO, "[0, 10]"),
    )
    max_extra_length: int = key(
        50, "outputs stop at source length + this", valid=f"[0, {_MAX_LENGTH}]"
    )
    batch_size: int = key(32, "sentences decoded together", valid=f"[1, {_MAX_BATCH}]")
    sampling_topk: int = key(
        0,
        "sample each token among the K most likely (0 = off: beam/greedy search)",
        valid=f"[0, {_MAX_WIDTH}]",
    )
    sampling_temperature: float = key(
        1.0, "sampling: logits divided by this (< 1 sharper, > 1 flatter)", valid="(0, 100]"
    )
    sampling_topp: float = key(
        1.0,
        "sampling: only the most likely tokens holding this probability mass (1 = all K)",
        valid="(0, 1]",
    )


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """Where and how training runs."""

    strategy: str = key(
        "auto",
        "auto | default | mirrored | multi_worker | tpu",
        valid=("auto", "default", "mirrored", "multi_worker", "tpu"),
    )
    tpu: str = key("", "TPU address for strategy=tpu ('' = local/auto)")
    jit_compile: Union[bool, str] = key(
        "auto", "XLA: true | false | auto (chosen per device)", valid=(True, False, "auto")
    )
    mixed_precision: Optional[str] = key(
        None,
        "None | mixed_bfloat16 | mixed_float16 (with loss scaling) | auto (timed on CPUs: "
        "bfloat16 if it trains at least 1.1x faster; bfloat16 on TPUs and GPUs from Ampere on)",
        valid=("mixed_bfloat16", "mixed_float16", "float32", "auto"),
    )
    workdir: Optional[str] = key(
        None, "output directory; default workdirs/<config name>", valid=_NON_EMPTY
    )
    wait_seconds: float = key(
        600.0,
        "multi-worker: how long other workers wait for the chief's vocabulary / data",
        valid=f"[0, {_MAX_SECONDS}]",
    )
    collective_timeout_seconds: Optional[float] = key(
        600.0,
        "multi-worker: a collective (gradient all-reduce) waiting longer than this fails, so a "
        "worker whose peer died exits instead of hanging; must exceed the chief's dev "
        "evaluation time; null: wait forever",
        valid=f"(0, {_MAX_SECONDS}]",
    )
    lock_lease_seconds: float = key(
        120.0,
        "the workdir lock's lease: `train` and `prepare` renew WORKDIR/lock.json every quarter "
        "of it; a lock not renewed for this long is stale on any host and is taken over (a "
        "run rescheduled on another machine waits at most this long for a dead holder's lock)",
        valid=f"[1, {_MAX_SECONDS}]",
    )


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """SavedModel export."""

    name: Optional[str] = key(
        None,
        "model name: saved_models/<name>/<version>; default: the workdir's last part "
        "(workdirs/de-en exports to saved_models/de-en; workdirs/<config name> by default)",
        valid=_NON_EMPTY,
    )
    base_dir: str = key("saved_models", "directory holding the named models", valid=_NON_EMPTY)
    average_checkpoints: Union[int, str] = key(
        1,
        "average the last N checkpoints before exporting; auto: the dev set chooses among the "
        "last checkpoint, the averages of the last 2, 3 and train.keep_checkpoints, and the "
        "train.keep_best ones (see final_model.py)",
        valid=(AUTO, "[1, 1000]"),
    )
    select_max_sentences: int = key(
        1000,
        "where the dev set chooses (auto), the dev sentences each candidate decodes (the first "
        "N): more than train.eval_max_sentences, as candidates often differ by 0.1 BLEU",
        valid=f"[1, {_MAX_COUNT}]",
    )
    select_screen_sentences: int = key(
        300,
        "where the dev set chooses, each checkpoint set is first screened by greedy decoding of "
        "the first N of those sentences, and only the best export.select_finalists sets are "
        "decoded with the export's beam (at every alpha); 0: every candidate at the beam",
        valid=f"[0, {_MAX_COUNT}]",
    )
    select_finalists: int = key(
        2,
        "checkpoint sets that the greedy screening passes on to the beam (fewer when the end of "
        "a train.max_minutes budget is short of time)",
        valid="[1, 100]",
    )
    beam_size: Optional[int] = key(
        None, "beam size fixed in the SavedModel; null: decode.beam_size", valid=f"[1, {_MAX_BEAM}]"
    )
    alpha: Optional[float] = key(
        None, "length-penalty exponent; null: decode.alpha", valid="[0, 10]"
    )
    n_best: Optional[int] = key(
        None,
        "hypotheses per input of the translate_nbest signature (<= beam size); null: the beam size",
        valid=f"[1, {_MAX_BEAM}]",
    )
    max_extra_length: Optional[int] = key(
        None,
        "outputs stop at source length + this; null: decode.max_extra_length",
        valid=f"[0, {_MAX_LENGTH}]",
    )
    jit_compile: bool = key(
        False,
        "compile the SavedModel's search with XLA: faster decoding on CPUs, one compile per new "
        "input shape; TF Serving needs --xla_cpu_compilation_enabled=true on a CPU",
    )
    shortlist: Optional[bool] = key(
        None,
        "decode over a vocabulary shortlist: each batch's outputs use only the target pieces the "
        "lexical table lists for its source pieces plus the most frequent ones "
        "(WORKDIR/shortlist.npz, built by keras-transformer shortlist, or by the export when "
        "missing or built for another vocabulary); its scores are log-probabilities over the "
        "shortlist, not the whole vocabulary. null (default): the SavedModel's searching "
        "signatures decode over it, where it is faster at the same BLEU, unless "
        "export.jit_compile or it cannot be built; the LiteRT export leaves it out. true: also "
        "the LiteRT export's shortlist step and the CTranslate2 export's vmap.txt "
        "(use_vmap=True), an error where it cannot be built; false: nowhere (speed and BLEU: "
        "docs/results.md)",
    )
    precision: str = key(
        "float32",
        "the dtype the SavedModel holds and runs the model in: float32, or bfloat16 (weights "
        "cast once: half the bytes, faster decoding on CPUs with AVX512-BF16 or AMX, emulated "
        "elsewhere, answers within bfloat16's rounding; speed and BLEU: "
        "docs/guides/export-serving.md); the LiteRT and CTranslate2 exports take --quantization",
        valid=precisions,  # the SavedModel format's quantizations (`config.formats`)
    )
    alignments: bool = key(
        False,
        "serving_default also returns each translation's word alignment (its 'alignment' "
        "output, which translate --alignments and --markup need; a LiteRT export holds the "
        "alignment graph); costs one more forward pass (encoder and decoder) per request, so "
        "off by default",
    )
    alignment_layer: int = key(
        -2,
        "the decoder layer whose cross-attention (averaged over heads) gives the alignment; "
        "negative: from the end (-2, the second-to-last; a one-layer decoder: its only layer)",
        valid=f"[-{_MAX_LAYERS}, {_MAX_LAYERS - 1}]",
    )


@dataclasses.dataclass(frozen=True)
class DistillConfig:
    """Sequence-level knowledge distillation (Kim & Rush 2016; `keras-transformer distill`): a
    trained teacher translates the sources of `data.train` with its beam search, and the
    student trains on those pairs."""

    keep_original: bool = key(
        False,
        "the student also trains on the original pairs of data.train: the distilled pairs "
        "plus the original ones (twice the pairs); false: the distilled pairs only",
    )
    beam_size: Optional[int] = key(
        None,
        "the teacher's beam size; null: the one fixed in the teacher's export (a SavedModel's "
        "search is fixed at export: another value is refused, export the teacher again with "
        "--beam-size)",
        valid=f"[1, {_MAX_BEAM}]",
    )
    batch_size: int = key(32, "sentences per call of the teacher", valid=f"[1, {_MAX_BATCH}]")
    chunk_lines: int = key(
        4096,
        "source lines translated and saved at a time: a stop waits for the chunk, a kill "
        "loses at most one",
        valid=f"[1, {_MAX_BATCH}]",
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


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """A whole experiment: one dataclass per YAML section."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)
    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
    export: ExportConfig = dataclasses.field(default_factory=ExportConfig)
    distill: DistillConfig = dataclasses.field(default_factory=DistillConfig)
    name: str = key("experiment", "experiment name (default: the config file's stem)")

    def to_dict(self):
        return dataclasses.asdict(self)


SECTIONS = {f.name: f.type for f in dataclasses.fields(ExperimentConfig) if f.name != "name"}
