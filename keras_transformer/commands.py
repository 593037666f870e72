"""What the `keras-transformer` subcommands do (argument parsing lives in `cli.py`).

`translate` and `evaluate` run an exported SavedModel through its `serving_default` signature,
exactly as TF Serving would; `export` rebuilds the model from a training workdir; `prepare` runs
`keras_transformer.data.prepare` and `train` runs `keras_transformer.training.train`. User
errors are raised as `UsageError` (or another `keras_transformer.errors.KerasTransformerError`),
which `cli.py` prints as one line.
"""

import itertools
import json
import os
import sys
import time

from keras_transformer.errors import UsageError
from keras_transformer.workdir import Workdir, average_checkpoints

# --------------------------------------------------------------------------- helpers


def load_serving_function(model_path):
    """The `serving_default` function of the SavedModel at `model_path` (a version directory or
    the model's base directory, where the highest version is taken)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops the graph uses)

    from keras_transformer.export.saved_model import SIGNATURE_KEY, resolve_model_dir

    path = resolve_model_dir(model_path)
    try:
        loaded = tf.saved_model.load(path)
    except Exception as e:  # a broken or foreign directory: a user error, not a traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"cannot load the SavedModel in {path}: {first}") from None
    signature = loaded.signatures.get(SIGNATURE_KEY)
    if signature is None:
        raise UsageError(f"{path} has no '{SIGNATURE_KEY}' signature")

    def translate(texts):
        outputs = signature(text=tf.constant(texts, dtype=tf.string))
        translations = [t.decode("utf-8", errors="replace") for t in outputs["translation"].numpy()]
        return translations, outputs["score"].numpy().tolist()

    # Keep the loaded object alive as long as the function is used.
    translate.loaded = loaded
    return translate


def _batch_size(args):
    batch_size = getattr(args, "batch_size", 32)
    if batch_size is None or batch_size < 1:
        raise UsageError(f"--batch-size must be a positive integer, got {batch_size}")
    return batch_size


def translate_lines(translate, lines, batch_size):
    """Translates `lines` in batches of `batch_size`; yields translations in order."""
    for start in range(0, len(lines), batch_size):
        translations, _ = translate(lines[start : start + batch_size])
        yield from translations


def _read_lines(path, what):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} file not found: {path}")
    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            return [line.rstrip("\r\n") for line in f.read().splitlines()]
    except OSError as e:
        raise UsageError(f"cannot read {what} file {path}: {e.strerror}") from None


# --------------------------------------------------------------------------- translate


def translate_command(args):
    """`keras-transformer translate --model DIR [TEXT ...]`: one translation per line."""
    batch_size = _batch_size(args)
    translate = load_serving_function(args.model)
    if args.text:
        for translation in translate_lines(translate, list(args.text), batch_size):
            print(translation)
        return
    # Streams stdin batch by batch; someone typing at a terminal gets each line back at once.
    if sys.stdin.isatty():
        batch_size = 1
    lines = (line.rstrip("\r\n") for line in sys.stdin)
    while True:
        batch = list(itertools.islice(lines, batch_size))
        if not batch:
            break
        for translation in translate_lines(translate, batch, batch_size):
            print(translation)
        sys.stdout.flush()


# --------------------------------------------------------------------------- evaluate


def evaluate_command(args):
    """`keras-transformer evaluate --model DIR --source F --reference F`: one JSON object."""
    from keras_transformer.evaluation import score_translations

    batch_size = _batch_size(args)
    sources = _read_lines(args.source, "source")
    references = _read_lines(args.reference, "reference")
    if len(sources) != len(references):
        raise UsageError(
            f"{args.source} has {len(sources)} lines but {args.reference} has "
            f"{len(references)}: they must align"
        )
    if not sources:
        raise UsageError(f"{args.source} is empty: nothing to evaluate")
    translate = load_serving_function(args.model)
    translate(sources[:1])  # the first call traces and loads kernels; keep it out of the timing
    start = time.perf_counter()
    hypotheses = list(translate_lines(translate, sources, batch_size))
    seconds = time.perf_counter() - start
    result = score_translations(hypotheses, references)
    result["sentences_per_second"] = round(len(sources) / max(seconds, 1e-9), 2)
    result["seconds"] = round(seconds, 3)
    result["model"] = args.model
    print(json.dumps(result))


# --------------------------------------------------------------------------- export


def load_workdir_model(workdir, average=None):
    """Rebuilds the model of a training workdir and loads (the average of) its last checkpoints.

    Returns `(config, model, spm_model_bytes, steps)`.
    """
    import sentencepiece as spm

    from keras_transformer.config import load_config
    from keras_transformer.models import build_transformer

    if not os.path.isdir(workdir):
        raise UsageError(f"workdir not found: {workdir}")
    layout = Workdir(workdir)
    config_path, spm_path = layout.config, layout.spm
    for path, what in ((config_path, "resolved config"), (spm_path, "SentencePiece model")):
        if not os.path.isfile(path):
            raise UsageError(f"{workdir} is not a training workdir: no {what} {path}")
    config = load_config(config_path)
    average = config.export.average_checkpoints if average is None else average
    if average < 1:
        raise UsageError(f"--average must be a positive integer, got {average}")
    checkpoints = layout.list_checkpoints()
    if not checkpoints:
        raise UsageError(f"no checkpoints (ckpt-<step>.weights.h5) in {workdir}/checkpoints")
    if average > len(checkpoints):
        raise UsageError(
            f"cannot average {average} checkpoints: {workdir}/checkpoints has {len(checkpoints)}"
        )
    with open(spm_path, "rb") as f:
        spm_bytes = f.read()
    try:
        vocab_size = spm.SentencePieceProcessor(model_proto=spm_bytes).get_piece_size()
    except Exception:
        raise UsageError(f"{spm_path} is not a SentencePiece model") from None
    model = build_transformer(config.model, vocab_size)
    chosen = checkpoints[-average:]
    try:
        average_checkpoints(model, [path for _, path in chosen])
    except (ValueError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"cannot load checkpoints of {workdir}: {first}") from None
    return config, model, spm_bytes, [step for step, _ in chosen]


def export_command(args):
    """`keras-transformer export --workdir DIR [--average N] [--output DIR]`."""
    from keras_transformer.export.saved_model import export_saved_model

    config, model, spm_bytes, steps = load_workdir_model(args.workdir, args.average)
    base_dir = args.output or config.export.base_dir
    name = config.export.name or config.name
    path = export_saved_model(model, spm_bytes, config.decode, config.data, base_dir, name)
    averaged = f"average of steps {', '.join(map(str, steps))}" if len(steps) > 1 else None
    print(f"exported {averaged or f'step {steps[-1]}'} to {path}")


# --------------------------------------------------------------------------- prepare


def prepare_command(args):
    """`keras-transformer prepare --config FILE [--workdir DIR] [--set KEY=VALUE ...]`."""
    from keras_transformer.config import load_config

    config = load_config(args.config, overrides=args.set)
    if args.workdir:
        config.runtime.workdir = args.workdir
    from keras_transformer.data.prepare import prepare

    manifest = prepare(config)
    layout = Workdir.of(config)
    counts = manifest["counts"]
    print(
        f"{layout.prepared}: {counts['written']} pairs in {len(manifest['shards'])} shards; "
        f"vocabulary {layout.spm}"
    )


# --------------------------------------------------------------------------- train


def train_command(args):
    """`keras-transformer train --config FILE [--workdir DIR] [--set KEY=VALUE ...]`."""
    from keras_transformer.config import load_config

    # The config is checked before TensorFlow is imported: config mistakes fail in a blink.
    config = load_config(args.config, overrides=args.set)
    if args.workdir:
        config.runtime.workdir = args.workdir
    from keras_transformer.training import train

    train(config)
