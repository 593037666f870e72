"""`keras-transformer translate`: TEXT arguments, stdin lines, or a file streamed into a file and
resumable after a kill (`keras_transformer.file_translation`), through the SavedModel signature
its flags name (`signatures.load_serving_function`)."""

import itertools
import os
import sys

from keras_transformer.commands import flags, startup
from keras_transformer.commands.lines import output_lines, output_rows
from keras_transformer.commands.signatures import (
    load_aligning_function,
    load_litert_aligning_function,
    load_litert_function,
    load_serving_function,
)
from keras_transformer.litert.runtime import is_litert_export


def translate_command(args):
    """`keras-transformer translate --model DIR [--n-best K | --prefix TEXT] [TEXT ...]`: one
    translation per line; with `--n-best K`, K lines `SCORE<TAB>TRANSLATION` per input, best
    first; with `--prefix`, translations that start with TEXT (`translate_prefix` signature);
    with `--constraints FILE`, translations holding each line's terms (`translate_constrained`);
    with `--alignments`, `TRANSLATION<TAB>i-j ...` lines; with `--markup html|xml`, the tags of
    the input put back into the translation (`keras_transformer.markup`);
    with `--sampling-topk/--temperature/--top-p/--seed`, sampled translations
    (`translate_sample` signature). With `--input FILE --output FILE`: `_translate_file`."""
    request = flags.translate_request(args)
    flags.alignment_request(args)  # checked before the model loads
    if getattr(args, "glossary", None) is not None:
        return _translate_with_glossary(args, request)
    if request.chunk_lines is not None:
        return _translate_file(args, request)
    translate = _load(args, request.n_best, request.prefix, request.sampling, request.constraints)
    batch_size = request.batch_size
    if args.text:
        for line in output_lines(translate, list(args.text), batch_size, request.n_best):
            print(line)
        return
    # Streams stdin batch by batch; someone typing at a terminal gets each line back at once.
    if sys.stdin.isatty():
        batch_size = 1
    lines = (line.rstrip("\r\n") for line in sys.stdin)
    while batch := list(itertools.islice(lines, batch_size)):
        for line in output_lines(translate, batch, batch_size, request.n_best):
            print(line)
        sys.stdout.flush()


def _translate_with_glossary(args, request):
    """`translate --glossary FILE [TEXT ...]`: every source annotated with the glossary in the
    SavedModel's `translate_glossary` signature (`keras_transformer.glossary`); one translation
    per line. The glossary is read (and refused in one line) before the model loads."""
    from keras_transformer import glossary
    from keras_transformer.errors import UsageError

    if request.n_best is not None or request.prefix is not None or request.sampling:
        raise UsageError("--glossary cannot be combined with --n-best, --prefix or sampling")
    if request.chunk_lines is not None:
        raise UsageError("--glossary applies to TEXT arguments and stdin, not to --input")
    if is_litert_export(args.model):
        raise UsageError(
            f"{args.model} is a LiteRT export: annotate its inputs with "
            "keras_transformer.glossary.annotate (--glossary needs a SavedModel)"
        )
    try:
        entries = glossary.load_glossary(args.glossary)
    except glossary.GlossaryError as e:
        raise UsageError(str(e)) from None
    startup.import_tensorflow(getattr(args, "verbose", False))
    import tensorflow as tf

    from keras_transformer.commands.signatures import load_signature

    loaded, _, signature = load_signature(
        args.model,
        "translate_glossary",
        "{path} has no 'translate_glossary' signature: its model was not prepared with "
        "data.terminology (its vocabulary lacks the glossary tags)",
    )
    sources, targets = glossary.padded([entries])
    skipped = []

    def translate(texts):
        shape = [len(texts), len(entries)]
        outputs = signature(
            text=tf.constant(texts, tf.string),
            glossary_source=tf.reshape(tf.constant(sources * len(texts), tf.string), shape),
            glossary_target=tf.reshape(tf.constant(targets * len(texts), tf.string), shape),
        )
        used = outputs["annotated"].numpy().tolist()
        skipped.append(glossary.not_used(texts, [entries] * len(texts), used))
        decoded = [t.decode("utf-8", errors="replace") for t in outputs["translation"].numpy()]
        return decoded, outputs["score"].numpy().tolist()

    translate.loaded = loaded
    texts = list(args.text) or [line.rstrip("\r\n") for line in sys.stdin]
    for line in output_lines(translate, texts, request.batch_size):
        print(line)
    if sum(skipped):
        print(f"keras-transformer translate: {glossary.too_long_warning(sum(skipped))}",
              file=sys.stderr)  # fmt: skip


def _load(args, n_best, prefix=None, sampling=None, constraints=None):
    """The translation function of `--model`: a LiteRT export's (no TensorFlow), else the
    SavedModel signature the request names (`serving_default`'s alignments with
    `--alignments` or `--markup`)."""
    alignments, markup = flags.alignment_request(args)
    if alignments or markup is not None:
        if is_litert_export(args.model):
            return load_litert_aligning_function(args.model, alignments, markup)
        startup.import_tensorflow(getattr(args, "verbose", False))
        return load_aligning_function(args.model, alignments, markup)
    if is_litert_export(args.model):
        return load_litert_function(args.model, n_best, prefix, sampling, constraints)
    startup.import_tensorflow(getattr(args, "verbose", False))
    return load_serving_function(args.model, n_best, prefix, sampling, constraints)


def _translate_file(args, request):
    """`keras-transformer translate --model DIR --input FILE --output FILE [--n-best K]
    [--chunk-lines N]`: streams FILE through the model into the output (K lines
    `SCORE<TAB>TRANSLATION` per input with `--n-best`), with progress on stderr and one summary
    line; run again after a kill, it continues (`keras_transformer.file_translation`)."""
    from keras_transformer.file_translation import check_paths, translate_file

    check_paths(args.input, args.output)  # before the model loads: a typo fails at once
    n_best = request.n_best
    translate = _load(args, n_best, sampling=request.sampling)

    def rows(texts):
        return output_rows(*translate(texts), n_best)

    model = args.model
    if not is_litert_export(model):
        from keras_transformer.export.saved_model import resolve_model_dir

        model = resolve_model_dir(model)
    model = os.path.realpath(model)
    alignments, markup = flags.alignment_request(args)
    if alignments or markup is not None:  # other lines: a resume must ask for them again
        model += "".join([" --alignments"] * alignments + [f" --markup {markup}"] * bool(markup))
    result = translate_file(
        rows, args.input, args.output, request.batch_size, request.chunk_lines, model, n_best or 1
    )
    resumed = f" ({result['resumed_after']:,} done before)" if result["resumed_after"] else ""
    rate = result["translated"] / max(result["seconds"], 1e-9)
    print(
        f"{args.output}: {result['lines']:,} lines{resumed}; {result['translated']:,} "
        f"translated in {result['seconds']:.1f} s ({rate:,.1f} lines/s)"
    )
