"""The set-up of a run: what its steps share (`Run`), its training data (`prepare_data`), its
precision (`with_resolved_precision`) and its compiled model (`build_model`)."""

import dataclasses
import functools
import os

import keras

from keras_transformer import local_files
from keras_transformer.config import decoding_settings, save_config
from keras_transformer.final_model import Plan
from keras_transformer.models import build_transformer
from keras_transformer.training.recipe import compile_model
from keras_transformer.training.run.init_from import prepare_parent
from keras_transformer.workdir import Workdir

# The chief's heartbeat file in the workdir while it prepares the data (multi-worker).
PREPARE_HEARTBEAT = "prepare.heartbeat"


def model_dtype(config):
    """The model's dtype policy of `runtime.mixed_precision` (None: float32)."""
    policy = config.runtime.mixed_precision
    if policy == "auto":
        raise ValueError("runtime.mixed_precision 'auto' is resolved by train() only")
    return None if policy in (None, "float32") else policy


@dataclasses.dataclass(frozen=True)
class Run:
    """What the steps of one `train()` call share, resolved once at its start: the config
    (after `with_resolved_precision`, the precision it names is concrete), the workdir's
    layout, the engine (`training.engines`: everything that differs between the backends and
    between strategies) and the start time; and from the config, the decoding settings
    (`decoding`, `export_decoding`) and how the final model is made (`plan`), so that the
    modules below get those values and the sections they read, never the config to make them
    again.

    The whole config still goes where a step records or compares all of it: `save_config`
    (the workdir's `config.yaml`), `write_hparams` (TensorBoard's hyperparameters),
    `card_facts` (the model card embeds it), `prepare(config)` and `check_prepared` (the
    manifest records the data settings and refuses a workdir whose differ; `prepare` is public
    API), `prepare_parent` / `recorded_parent` / `load_parent_weights` (`train.init_from`
    compares the parent's `config.yaml` with this one), `compile_model` (the public recipe for
    your own `model.fit`, which reads `train`, `model` and `runtime`), `Workdir.of` and
    `export_name` (the config package's own).

    Under several workers the chief (worker 0) is the only one that writes anything shared:
    config, vocabulary, checkpoints, backups, TensorBoard, result, export. The others read what
    it makes, keep their resume states in a temporary directory of their own (deleted at the
    end) and skip evaluation, scoring and export.
    """

    config: object
    layout: Workdir
    engine: object
    started: float

    @property
    def chief(self):
        """True in the process that writes the workdir."""
        return self.engine.chief

    @property
    def strategy(self):
        return self.engine.strategy

    @functools.cached_property
    def decoding(self):
        """The `decode:` section's `DecodingSettings` (the dev and test scoring)."""
        return decoding_settings(self.config)

    @functools.cached_property
    def export_decoding(self):
        """The export's `DecodingSettings` (the `export:` section over `decode:`): the choice
        of the final model decodes with its search, the SavedModel fixes it in its graph."""
        return decoding_settings(self.config, export=True)

    @functools.cached_property
    def plan(self):
        """How the final model is made (`final_model.Plan`)."""
        return Plan.of(self.config, self.export_decoding)


@dataclasses.dataclass(frozen=True)
class TrainingData:
    """The tokenizer and where the training batches come from: the prepared shards of
    `prepared`, batched by the engine (`tf.data` or numpy) under the `data:` section
    `data_config`, shuffled with `seed`; `accumulation` is `train.gradient_accumulation_steps`
    (the micro-batches of a replica's share)."""

    tokenizer: object
    num_pairs: int
    prepared: str
    data_config: object
    accumulation: int
    seed: int


def prepare_data(run):
    """The vocabulary and the training data, streamed from the workdir's prepared shards: the
    one place that reads the training data.

    The chief runs `prepare` (which streams the corpus into `WORKDIR/prepared` when it is not
    there, and otherwise checks that it matches the config: a `DataError` names any difference,
    before `config.yaml` is overwritten), then writes `config.yaml`. The other workers wait for
    the prepared data's manifest (`runtime.wait_seconds`) and check it; they see the chief's
    heartbeat (`distribute.Heartbeat`) and fail within a minute when it stops. The engine
    batches the shards: global batches of `data.tokens_per_batch` x replicas x
    `train.gradient_accumulation_steps` tokens (sizes a multiple of replicas x accumulation:
    each replica's share splits into the micro-batches), in the same order on every run with
    the same seed, so a resume restores the saved iterator or starts at its data position.
    """
    from keras_transformer.data.prepare import VOCABULARY
    from keras_transformer.data.tokenizer import Tokenizer

    config, layout, engine = run.config, run.layout, run.engine
    heartbeat = os.path.join(layout.root, PREPARE_HEARTBEAT)
    if run.chief:
        local_files.gfile().makedirs(layout.root)
        with engine.heartbeat(heartbeat):  # seen by the workers waiting for the data
            prepare_parent(config)  # fine-tuning: the parent's vocabulary, before prepare
            manifest = engine.prepare(config, layout)
        save_config(config, layout.config)
    else:
        manifest = engine.wait_for_prepared(config, layout, heartbeat)
    tokenizer = Tokenizer(os.path.join(layout.prepared, VOCABULARY))
    return TrainingData(
        tokenizer,
        manifest["counts"]["written"],
        layout.prepared,
        config.data,  # data.tokens_per_batch is per replica and micro-batch
        config.train.gradient_accumulation_steps,
        config.train.seed,
    )


def _with_precision(config, policy):
    return dataclasses.replace(
        config, runtime=dataclasses.replace(config.runtime, mixed_precision=policy)
    )


def with_resolved_precision(run, data):
    """`(run, data)` for `runtime.mixed_precision: auto` (TensorFlow): a new run whose config
    names the precision that `engines.precision.resolve_precision` chose (on a CPU, by timing a
    few train steps of this model on these batches in float32 and mixed_bfloat16; read back
    from the workdir on a resume), and the data with a new tokenizer. The random seed is set
    again afterwards, so the model starts from the same weights as a run that named the chosen
    precision itself."""
    from keras_transformer.data.tokenizer import Tokenizer
    from keras_transformer.training.engines.precision import resolve_precision

    config, vocab_size = run.config, data.tokenizer.vocab_size

    def build(policy):
        concrete = _with_precision(config, policy)
        model = build_transformer(concrete.model, vocab_size, dtype=model_dtype(concrete))
        return compile_model(model, concrete)

    policy, _ = resolve_precision(
        run.layout.root,
        run.strategy,
        build,
        lambda: run.engine.first_batches(data),
        chief=run.chief,
        agree=run.engine.agreement(),
    )
    keras.utils.set_random_seed(config.train.seed)
    # Seeding drops the SentencePiece op's resource: the tokenizer is made again.
    tokenizer = Tokenizer(data.tokenizer.model_path)
    resolved = dataclasses.replace(run, config=_with_precision(config, policy))
    return resolved, dataclasses.replace(data, tokenizer=tokenizer)


def build_model(run, vocab_size, num_pairs):
    """The compiled model (in the strategy's scope), its optimizer's variables created (by
    `compile_model`) so the resume state can be restored into them."""
    config, strategy = run.config, run.strategy
    jit_compile = run.engine.jit_compile(config.runtime.jit_compile)
    with strategy.scope():
        model = build_transformer(config.model, vocab_size, dtype=model_dtype(config))
        compile_model(model, config, jit_compile=jit_compile)
    t = config.train
    print(
        f"Training {config.name} on {run.engine.backend}: {model.count_params():,} parameters, "
        f"vocabulary {vocab_size}, {num_pairs:,} training pairs, {t.steps} steps, "
        f"strategy {run.engine.strategy_name} ({strategy.num_replicas_in_sync} replicas), "
        f"gradient accumulation {t.gradient_accumulation_steps}, jit_compile={jit_compile}, "
        f"precision {config.runtime.mixed_precision or 'float32'}"
        + ("" if t.ema_momentum is None else f", weights averaged (EMA {t.ema_momentum})"),
        flush=True,
    )
    return model
