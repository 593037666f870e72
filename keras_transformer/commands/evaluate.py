"""`keras-transformer evaluate` (sacreBLEU and chrF of an export, a SavedModel or a LiteRT
directory, on a test set) and `score` (the log-probability of each target given its source, a
SavedModel's): an export on two aligned files."""

import json
import sys
import time

from keras_transformer.commands import flags, startup
from keras_transformer.commands.lines import output_lines, output_rows, read_lines
from keras_transformer.commands.signatures import (
    load_litert_function,
    load_serving_function,
    load_signature,
)
from keras_transformer.errors import UsageError
from keras_transformer.litert.runtime import is_litert_export


def _aligned_lines(source, other, what):
    """The lines of `source` and of `other` (the `what` file), which must align."""
    sources = read_lines(source, "source")
    others = read_lines(other, what)
    if len(sources) != len(others):
        raise UsageError(
            f"{source} has {len(sources)} lines but {other} has {len(others)}: they must align"
        )
    return sources, others


def evaluate_command(args):
    """`keras-transformer evaluate --model DIR --source F --reference F`: one JSON object."""
    from keras_transformer.evaluation import score_translations

    batch_size = flags.batch_size_flag(args)
    sources, references = _aligned_lines(args.source, args.reference, "reference")
    if not sources:
        raise UsageError(f"{args.source} is empty: nothing to evaluate")
    if is_litert_export(args.model):
        translate = load_litert_function(args.model)
    else:
        startup.import_tensorflow(getattr(args, "verbose", False))
        translate = load_serving_function(args.model)
    translate(sources[:1])  # the first call traces and loads kernels; keep it out of the timing
    start = time.perf_counter()
    hypotheses = list(output_lines(translate, sources, batch_size))
    seconds = time.perf_counter() - start
    result = score_translations(hypotheses, references)
    result["sentences_per_second"] = round(len(sources) / max(seconds, 1e-9), 2)
    result["seconds"] = round(seconds, 3)
    result["model"] = args.model
    print(json.dumps(result))


def score_command(args):
    """`keras-transformer score --model DIR --source F --target F`: one log-probability per line
    (the target's tokens and EOS under the model, through the `score` signature)."""
    batch_size = flags.batch_size_flag(args)
    if is_litert_export(args.model):
        raise UsageError(
            f"{args.model} is a LiteRT export: it has no score function (score with the SavedModel)"
        )
    sources, targets = _aligned_lines(args.source, args.target, "target")
    tf = startup.import_tensorflow(getattr(args, "verbose", False))
    loaded, _, score = load_signature(args.model, "score")
    for start in range(0, len(sources), batch_size):
        outputs = score(
            source=tf.constant(sources[start : start + batch_size], dtype=tf.string),
            target=tf.constant(targets[start : start + batch_size], dtype=tf.string),
        )
        for (line,) in output_rows(None, outputs["log_probability"].numpy().tolist()):
            print(line)
    sys.stdout.flush()
    del loaded
