"""What the `keras-transformer` subcommands do (argument parsing lives in `cli.py`).

`translate`, `evaluate` and `score` run an exported SavedModel through its signatures
(`serving_default`, `translate_nbest`, `score`), exactly as TF Serving would; `export` rebuilds
the model from a training workdir (SavedModel or CTranslate2); `prepare` runs
`keras_transformer.data.prepare` and `train` runs `keras_transformer.training.train`. User errors
are raised as `UsageError` (or another `keras_transformer.errors.KerasTransformerError`), which
`cli.py` prints as one line.
"""

import contextlib
import hashlib
import itertools
import json
import os
import sys
import tempfile
import time

from keras_transformer.config import export_name
from keras_transformer.errors import KerasTransformerError, UsageError, first_line
from keras_transformer.workdir import Workdir, read_json

# --------------------------------------------------------------------------- helpers


def import_tensorflow(verbose=False):
    """Imports TensorFlow (and tensorflow-text) without its C++ start-up log, unless asked.

    TensorFlow's native libraries log to file descriptor 2 while they load and probe devices:
    oneDNN notices, "Could not find cuda drivers" and, on machines without a GPU, an alarming
    `E0000 ... failed call to cuInit` line. Some of them come from absl before its logging is
    initialised and ignore `TF_CPP_MIN_LOG_LEVEL`, so the only way to keep them off the user's
    terminal is to point descriptor 2 elsewhere while TensorFlow loads and finds its devices.
    Nothing is hidden when `verbose` is set or the user chose their own `TF_CPP_MIN_LOG_LEVEL`;
    if the import itself fails, what was logged is written out after all.

    Args:
        verbose: keep TensorFlow's logs (`--verbose`).

    Returns:
        The `tensorflow` module.
    """
    if verbose or "TF_CPP_MIN_LOG_LEVEL" in os.environ or "tensorflow" in sys.modules:
        import tensorflow as tf

        return tf
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # and later C++ messages below ERROR
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            import tensorflow as tf
            import tensorflow_text  # noqa: F401  (loads its kernels: more start-up lines)

            tf.config.list_logical_devices()  # device probing (the cuInit line) happens here
        except BaseException:
            os.dup2(saved, 2)
            log.seek(0)
            sys.stderr.write(log.read().decode("utf-8", errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    return tf


def load_signatures(model_path, required=(None,)):
    """The loaded SavedModel at `model_path` (a version directory or the model's base directory,
    where the highest version is taken) and its signatures.

    Args:
        model_path: the directory.
        required: signature keys that must exist (None: `serving_default`).

    Returns:
        `(loaded, path, {key: concrete function})`; keep `loaded` alive while the functions are
        used.
    """
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops the graph uses)

    from keras_transformer.export.saved_model import SIGNATURE_KEY, resolve_model_dir

    path = resolve_model_dir(model_path)
    try:
        loaded = tf.saved_model.load(path)
    except Exception as e:  # a broken or foreign directory: a user error, not a traceback
        raise UsageError(f"cannot load the SavedModel in {path}: {first_line(e)}") from None
    for key in required:
        key = key or SIGNATURE_KEY
        if loaded.signatures.get(key) is None:
            hint = " (exported before this version of keras-transformer? export it again)"
            raise UsageError(
                f"{path} has no '{key}' signature" + (hint if key != SIGNATURE_KEY else "")
            )
    return loaded, path, dict(loaded.signatures)


def load_serving_function(model_path):
    """The `serving_default` function of the SavedModel at `model_path` (a version directory or
    the model's base directory, where the highest version is taken): `texts -> (translations,
    scores)`."""
    import tensorflow as tf

    loaded, _, signatures = load_signatures(model_path)
    signature = signatures["serving_default"]

    def translate(texts):
        outputs = signature(text=tf.constant(texts, dtype=tf.string))
        translations = [t.decode("utf-8", errors="replace") for t in outputs["translation"].numpy()]
        return translations, outputs["score"].numpy().tolist()

    # Keep the loaded object alive as long as the function is used.
    translate.loaded = loaded
    return translate


def load_nbest_function(model_path, n_best):
    """`texts -> [[(score, translation), ...] per text]` through the `translate_nbest`
    signature: the first `n_best` hypotheses (at most the number exported)."""
    import tensorflow as tf

    loaded, path, signatures = load_signatures(model_path, required=("translate_nbest",))
    signature = signatures["translate_nbest"]
    exported = signature.structured_outputs["translations"].shape[-1]
    if n_best > exported:
        raise UsageError(
            f"--n-best {n_best}: {path} was exported with {exported} hypotheses per input "
            "(export it again with --n-best, at most its --beam-size)"
        )

    def translate(texts):
        outputs = signature(text=tf.constant(texts, dtype=tf.string))
        rows = zip(outputs["scores"].numpy().tolist(), outputs["translations"].numpy().tolist())
        return [
            [(s, t.decode("utf-8", errors="replace")) for s, t in zip(scores, texts)][:n_best]
            for scores, texts in rows
        ]

    translate.loaded = loaded
    return translate


def load_prefix_function(model_path, prefix):
    """`texts -> (translations, scores)` through the `translate_prefix` signature, every
    translation starting with `prefix`."""
    import tensorflow as tf

    loaded, _, signatures = load_signatures(model_path, required=("translate_prefix",))
    signature = signatures["translate_prefix"]

    def translate(texts):
        prefixes = tf.constant([prefix] * len(texts), dtype=tf.string)
        outputs = signature(text=tf.constant(texts, dtype=tf.string), prefix=prefixes)
        translations = [t.decode("utf-8", errors="replace") for t in outputs["translation"].numpy()]
        return translations, outputs["score"].numpy().tolist()

    translate.loaded = loaded
    return translate


_SAMPLING_FLAGS = {
    "sampling_topk": "--sampling-topk",
    "sampling_temperature": "--temperature",
    "sampling_topp": "--top-p",
}


def sampling_request(args):
    """`{setting: value}` of the sampling flags given to `translate` (`--seed` as `seed`), or
    None when none is: the flags that ask for the `translate_sample` signature."""
    asked = {key: getattr(args, key, None) for key in (*_SAMPLING_FLAGS, "seed")}
    asked = {key: value for key, value in asked.items() if value is not None}
    if not asked:
        return None
    if getattr(args, "n_best", None) is not None or getattr(args, "prefix", None) is not None:
        raise UsageError("sampling flags cannot be combined with --n-best or --prefix")
    if not 0 <= asked.get("seed", 0) < 2**63:
        raise UsageError(f"--seed must be in [0, 2^63), got {asked['seed']}")
    return asked


def _line_seed(seed, text):
    """A line's int64 seed: a hash of `--seed` and the line's text, so that a line's sample
    depends on neither its position nor its batch (file translation sorts and resumes)."""
    digest = hashlib.blake2b(f"{seed}\0{text}".encode("utf-8", "replace"), digest_size=8)
    return int.from_bytes(digest.digest(), "little") >> 1


def load_sample_function(model_path, asked):
    """`texts -> (translations, scores)` through the `translate_sample` signature; each line's
    seed is a hash of `--seed` and its text, so a run repeats exactly (the same line twice in
    a run gets the same sample). The sampling settings are fixed at export: `asked` must name
    the exported ones."""
    import tensorflow as tf

    loaded, path, signatures = load_signatures(model_path, required=())
    signature = signatures.get("translate_sample")
    if signature is None:
        raise UsageError(f"{path} was exported without sampling: export it with --sampling-topk K")
    with tf.io.gfile.GFile(os.path.join(path, "assets.extra", "keras_transformer.json")) as f:
        exported = json.load(f)
    for key, flag in _SAMPLING_FLAGS.items():
        if key in asked and asked[key] != exported[key]:
            raise UsageError(
                f"{flag} {asked[key]}: {path} samples with {flag} {exported[key]} (fixed at "
                f"export; export again with {flag} {asked[key]})"
            )
    seed = asked.get("seed", 0)

    def translate(texts):
        seeds = [_line_seed(seed, text) for text in texts]
        outputs = signature(
            text=tf.constant(texts, dtype=tf.string), seed=tf.constant(seeds, tf.int64)
        )
        translations = [t.decode("utf-8", errors="replace") for t in outputs["translation"].numpy()]
        return translations, outputs["score"].numpy().tolist()

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


def _nbest_lines(translate_nbest, lines, batch_size):
    """`SCORE<TAB>TRANSLATION` lines, n-best per input, inputs in order."""
    for start in range(0, len(lines), batch_size):
        for hypotheses in translate_nbest(lines[start : start + batch_size]):
            for score, text in hypotheses:
                yield f"{score:.6f}\t{text}"


def read_lines(path, what):
    """The lines of a UTF-8 text file (line ends stripped); a one-line error naming `what`
    if it is missing or unreadable."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} file not found: {path}")
    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            return [line.rstrip("\r\n") for line in f.read().splitlines()]
    except OSError as e:
        raise UsageError(f"cannot read {what} file {path}: {e.strerror}") from None


# --------------------------------------------------------------------------- translate


def translate_command(args):
    """`keras-transformer translate --model DIR [--n-best K | --prefix TEXT] [TEXT ...]`: one
    translation per line; with `--n-best K`, K lines `SCORE<TAB>TRANSLATION` per input, best
    first; with `--prefix`, translations that start with TEXT (`translate_prefix` signature);
    with `--sampling-topk/--temperature/--top-p/--seed`, sampled translations
    (`translate_sample` signature). With `--input FILE --output FILE`:
    `translate_file_command`."""
    batch_size = _batch_size(args)
    n_best = getattr(args, "n_best", None)
    prefix = getattr(args, "prefix", None)
    if n_best is not None and n_best < 1:
        raise UsageError(f"--n-best must be a positive integer, got {n_best}")
    if n_best is not None and prefix is not None:
        raise UsageError("--prefix and --n-best cannot be combined")
    sampling = sampling_request(args)
    if getattr(args, "input", None) is not None or getattr(args, "output", None) is not None:
        return translate_file_command(args, batch_size, n_best)
    import_tensorflow(getattr(args, "verbose", False))
    if sampling is not None:
        translate = load_sample_function(args.model, sampling)

        def output_lines(lines, size):
            return translate_lines(translate, lines, size)
    elif prefix is not None:
        translate = load_prefix_function(args.model, prefix)

        def output_lines(lines, size):
            return translate_lines(translate, lines, size)
    elif n_best is None:
        translate = load_serving_function(args.model)

        def output_lines(lines, size):
            return translate_lines(translate, lines, size)
    else:
        translate = load_nbest_function(args.model, n_best)

        def output_lines(lines, size):
            return _nbest_lines(translate, lines, size)

    if args.text:
        for line in output_lines(list(args.text), batch_size):
            print(line)
        return
    # Streams stdin batch by batch; someone typing at a terminal gets each line back at once.
    if sys.stdin.isatty():
        batch_size = 1
    lines = (line.rstrip("\r\n") for line in sys.stdin)
    while True:
        batch = list(itertools.islice(lines, batch_size))
        if not batch:
            break
        for line in output_lines(batch, batch_size):
            print(line)
        sys.stdout.flush()


def translate_file_command(args, batch_size, n_best=None):
    """`keras-transformer translate --model DIR --input FILE --output FILE [--n-best K]
    [--chunk-lines N]`: streams FILE through the model into the output (K lines
    `SCORE<TAB>TRANSLATION` per input with `--n-best`), with progress on stderr and one summary
    line; run again after a kill, it continues (`keras_transformer.file_translation`)."""
    from keras_transformer.file_translation import CHUNK_LINES, check_paths, translate_file

    if args.input is None or args.output is None:
        raise UsageError("--input and --output go together (translate a file into a file)")
    if args.text:
        raise UsageError("--input translates a file: give no TEXT arguments with it")
    if getattr(args, "prefix", None) is not None:
        raise UsageError("--prefix applies to TEXT arguments and stdin, not to --input")
    chunk_lines = CHUNK_LINES if args.chunk_lines is None else args.chunk_lines
    if chunk_lines < 1:
        raise UsageError(f"--chunk-lines must be a positive integer, got {chunk_lines}")
    import_tensorflow(getattr(args, "verbose", False))
    check_paths(args.input, args.output)  # before the model loads: a typo fails at once
    from keras_transformer.export.saved_model import resolve_model_dir

    sampling = sampling_request(args)
    if n_best is None:
        if sampling is None:
            serve = load_serving_function(args.model)
        else:
            serve = load_sample_function(args.model, sampling)

        def translate(texts):
            return [[translation] for translation in serve(texts)[0]]
    else:
        serve = load_nbest_function(args.model, n_best)

        def translate(texts):
            return [[f"{s:.6f}\t{t}" for s, t in hypotheses] for hypotheses in serve(texts)]

    model = os.path.realpath(resolve_model_dir(args.model))
    result = translate_file(
        translate, args.input, args.output, batch_size, chunk_lines, model, n_best or 1
    )
    resumed = f" ({result['resumed_after']:,} done before)" if result["resumed_after"] else ""
    rate = result["translated"] / max(result["seconds"], 1e-9)
    print(
        f"{args.output}: {result['lines']:,} lines{resumed}; {result['translated']:,} "
        f"translated in {result['seconds']:.1f} s ({rate:,.1f} lines/s)"
    )


# --------------------------------------------------------------------------- evaluate


def evaluate_command(args):
    """`keras-transformer evaluate --model DIR --source F --reference F`: one JSON object."""
    from keras_transformer.evaluation import score_translations

    batch_size = _batch_size(args)
    sources = read_lines(args.source, "source")
    references = read_lines(args.reference, "reference")
    if len(sources) != len(references):
        raise UsageError(
            f"{args.source} has {len(sources)} lines but {args.reference} has "
            f"{len(references)}: they must align"
        )
    if not sources:
        raise UsageError(f"{args.source} is empty: nothing to evaluate")
    import_tensorflow(getattr(args, "verbose", False))
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


# --------------------------------------------------------------------------- score


def score_command(args):
    """`keras-transformer score --model DIR --source F --target F`: one log-probability per line
    (the target's tokens and EOS under the model, through the `score` signature)."""
    batch_size = _batch_size(args)
    sources = read_lines(args.source, "source")
    targets = read_lines(args.target, "target")
    if len(sources) != len(targets):
        raise UsageError(
            f"{args.source} has {len(sources)} lines but {args.target} has "
            f"{len(targets)}: they must align"
        )
    tf = import_tensorflow(getattr(args, "verbose", False))
    loaded, _, signatures = load_signatures(args.model, required=("score",))
    score = signatures["score"]
    for start in range(0, len(sources), batch_size):
        outputs = score(
            source=tf.constant(sources[start : start + batch_size], dtype=tf.string),
            target=tf.constant(targets[start : start + batch_size], dtype=tf.string),
        )
        for value in outputs["log_probability"].numpy().tolist():
            print(f"{value:.6f}")
    sys.stdout.flush()
    del loaded


# --------------------------------------------------------------------------- info


def info_command(args):
    """`keras-transformer info --model DIR`: prints the export's model card (Markdown)."""
    import_tensorflow(getattr(args, "verbose", False))
    from keras_transformer.export.card import read_card_markdown
    from keras_transformer.export.saved_model import resolve_model_dir

    path = resolve_model_dir(args.model)
    try:
        card = read_card_markdown(path)
    except FileNotFoundError:
        raise UsageError(
            f"{path} has no model card (assets.extra/model_card.md): exported before "
            "keras-transformer wrote one? export it again"
        ) from None
    sys.stdout.write(card)


# --------------------------------------------------------------------------- export


def load_workdir_model(workdir, average=None, select=None, alpha=None):
    """Rebuilds the model of a training workdir: the average of its last checkpoints, or the
    candidate its dev set chooses (`keras_transformer.final_model.final_model`, as `train`
    does at its end).

    Args:
        workdir: the training workdir (any TensorFlow filesystem).
        average: checkpoints to average (None: `export.average_checkpoints`).
        select: choose on the dev set (None: where the config says `auto` and no `average`).
        alpha: the length penalty, fixed (`export --alpha`).

    Returns:
        `(config, final, spm_model_bytes)`: `final` is a `FinalModel` (model, steps, the alpha
        chosen on dev or None, the selection).
    """
    import sentencepiece as spm
    import tensorflow as tf

    from keras_transformer.config import load_config
    from keras_transformer.final_model import final_model, selects_on_dev

    gfile = tf.io.gfile  # the workdir may be on any TensorFlow filesystem (gs://...)
    if not gfile.isdir(workdir):
        raise UsageError(f"workdir not found: {workdir}")
    layout = Workdir(workdir)
    config_path, spm_path = layout.config, layout.spm
    for path, what in ((config_path, "resolved config"), (spm_path, "SentencePiece model")):
        if not gfile.exists(path) or gfile.isdir(path):
            raise UsageError(f"{workdir} is not a training workdir: no {what} {path}")
    config = load_config(config_path)
    if average is not None and average < 1:
        raise UsageError(f"--average must be a positive integer, got {average}")
    if select is None:
        select = average is None and selects_on_dev(config)
    with gfile.GFile(spm_path, "rb") as f:
        spm_bytes = f.read()
    try:
        vocab_size = spm.SentencePieceProcessor(model_proto=spm_bytes).get_piece_size()
    except Exception:
        raise UsageError(f"{spm_path} is not a SentencePiece model") from None
    tokenizer, dev_pairs = _selection_inputs(config, spm_bytes) if select else (None, None)
    try:
        final = final_model(
            config, layout, vocab_size, tokenizer, dev_pairs, select, average=average, alpha=alpha
        )
    except (ValueError, OSError) as e:
        raise UsageError(f"cannot load checkpoints of {workdir}: {first_line(e)}") from None
    return config, final, spm_bytes


def _selection_inputs(config, spm_bytes):
    """The tokenizer and dev pairs that the dev-set choice decodes; `UsageError` without a
    dev set."""
    from keras_transformer.data import Tokenizer, read_pairs

    if not config.data.dev:
        raise UsageError("choosing on the dev set needs data.dev in the workdir's config")
    try:
        dev_pairs = read_pairs(config.data.dev)
    except (OSError, ValueError, KerasTransformerError) as e:
        raise UsageError(f"cannot read the dev set {config.data.dev}: {e}") from None
    return Tokenizer(model_proto=spm_bytes), dev_pairs


def _export_settings(config, args, chosen_alpha=None):
    """The export's `DecodingSettings`: the config with the command's flags applied (and the
    length penalty chosen on dev, `chosen_alpha`, unless `--alpha` fixes one)."""
    from keras_transformer.config import decoding_settings
    from keras_transformer.errors import ConfigError

    flags = {key: "--" + key.replace("_", "-") for key in ("beam_size", "alpha", "n_best")}
    flags.update(max_extra_length="--max-extra-length", **_SAMPLING_FLAGS)
    try:
        values = {key: getattr(args, key, None) for key in flags}
        values["alpha"] = chosen_alpha if values["alpha"] is None else values["alpha"]
        return decoding_settings(config, export=True, **values)
    except ConfigError as e:  # name the flag the user typed
        message = str(e)
        for key, flag in flags.items():
            section = "decode" if key in _SAMPLING_FLAGS else "export"
            message = message.replace(f"{section}.{key}", flag)
        raise UsageError(message) from None


def _card_inputs(workdir, config, vocab_size, selection=None):
    """The model card's facts from the workdir (manifest, `result.json`) and the dev pairs
    that calibrate the confidence (none when the dev set cannot be read)."""
    from keras_transformer.data import read_pairs
    from keras_transformer.data.prepare import read_manifest
    from keras_transformer.export.card import card_facts

    layout = Workdir(workdir)
    result = read_json(layout.result)
    if selection:  # this export's own choice on dev
        result = {**(result or {}), "selection": selection}
    try:
        dev_pairs = read_pairs(config.data.dev) if config.data.dev else None
    except (OSError, ValueError, KerasTransformerError):
        dev_pairs = None  # the export goes on; its card says the confidence is not fitted
    return card_facts(config, read_manifest(layout.prepared), result, vocab_size), dev_pairs


def _record_export(workdir, path, final):
    """Appends this export's choice on dev to `result.json`'s `exports` (written whole): the
    training's own figures stay those of the model it exported."""
    from keras_transformer.integrity import write_atomically

    layout = Workdir(workdir)
    result = read_json(layout.result) or {}
    result.setdefault("exports", []).append(
        {
            "saved_model": path,
            "checkpoint_steps": final.steps,
            "alpha": final.alpha,
            "selection": final.selection,
        }
    )
    write_atomically(layout.result, json.dumps(result, indent=2))


def export_command(args):
    """`keras-transformer export --workdir DIR [--average N] [--output DIR] [--beam-size K]
    [--alpha A] [--n-best N] [--max-extra-length L] [--sampling-topk K [--temperature T]
    [--top-p P]] [--format saved_model|ctranslate2] [--quantization TYPE]`."""
    export_format = getattr(args, "format", None) or "saved_model"
    quantization = getattr(args, "quantization", None)
    if export_format == "ctranslate2":
        from keras_transformer.export.ct2 import require_ctranslate2

        require_ctranslate2()  # before the slow part: say how to install it
    elif quantization is not None:
        raise UsageError("--quantization applies to --format ctranslate2 only")
    select = True if getattr(args, "select_on_dev", False) else None
    if select and args.average is not None:
        raise UsageError("--average and --select-on-dev exclude each other")
    import_tensorflow(getattr(args, "verbose", False))
    config, final, spm_bytes = load_workdir_model(
        args.workdir, args.average, select, getattr(args, "alpha", None)
    )
    model, steps = final.model, final.steps
    name = args.name or export_name(config, args.workdir)
    averaged = f"average of steps {', '.join(map(str, steps))}" if len(steps) > 1 else None
    if export_format == "ctranslate2":
        from keras_transformer.export.ct2 import export_ctranslate2

        output = args.output or os.path.join(config.export.base_dir, f"{name}-ctranslate2")
        path = export_ctranslate2(
            model,
            spm_bytes,
            output,
            quantization,
            config.data,
            _export_settings(config, args, final.alpha),
        )
        print(f"converted {averaged or f'step {steps[-1]}'} to CTranslate2 in {path}")
        return
    from keras_transformer.export.saved_model import export_saved_model

    settings = _export_settings(config, args, final.alpha)
    base_dir = args.output or config.export.base_dir
    facts, dev_pairs = _card_inputs(args.workdir, config, model.vocab_size, final.selection)
    path = export_saved_model(
        model,
        spm_bytes,
        settings,
        config.data,
        base_dir,
        name,
        facts,
        dev_pairs,
        # --jit-compile / --no-jit-compile win over the workdir's export.jit_compile.
        jit_compile=config.export.jit_compile if args.jit_compile is None else args.jit_compile,
    )
    if final.selection:
        _record_export(args.workdir, path, final)
    print(f"exported {averaged or f'step {steps[-1]}'} to {path}")


# --------------------------------------------------------------------------- prepare


def prepare_command(args):
    """`keras-transformer prepare --config FILE [--workdir DIR] [--set KEY=VALUE ...]`."""
    config = load_command_config(args)
    from keras_transformer.data.prepare import prepare

    import_tensorflow(getattr(args, "verbose", False))  # the lock is written with tf.io.gfile
    from keras_transformer.training.init_from import prepare_parent

    with workdir_lock(config, "prepare"):
        prepare_parent(config)  # train.init_from: the parent's vocabulary
        manifest = prepare(config)
    layout = Workdir.of(config)
    counts = manifest["counts"]
    print(
        f"{layout.prepared}: {counts['written']} pairs in {len(manifest['shards'])} shards; "
        f"vocabulary {layout.spm}"
    )


# --------------------------------------------------------------------------- train


def train_command(args):
    """`keras-transformer train --config FILE [--workdir DIR] [--init-from PATH] [--set KEY=VALUE
    ...]`."""
    # The config is checked before TensorFlow is imported: config mistakes fail in a blink.
    config = load_command_config(args)
    import keras

    if keras.backend.backend() == "jax":  # model.fit on JAX: no TensorFlow needed
        from keras_transformer.training import train

        with workdir_lock(config, "train"):
            train(config)
        return
    import_tensorflow(getattr(args, "verbose", False))
    from keras_transformer.training import train
    from keras_transformer.training.distribute import is_chief

    # The workers of a multi-worker job share the chief's lock.
    with workdir_lock(config, "train") if is_chief() else contextlib.nullcontext():
        train(config)


def load_command_config(args):
    """The config of `train` and `prepare`: `--config` with each `--set`, then `--workdir` and
    `--init-from` as the last overrides of `runtime.workdir` and `train.init_from`; validated as
    a whole, never changed after."""
    from keras_transformer.config import load_config

    config = load_config(args.config, overrides=args.set)  # every --set value is checked
    # The flags win over `--set runtime.workdir=...` (`train.init_from`), as the more specific.
    flags = [("runtime.workdir", args.workdir)]
    flags.append(("train.init_from", getattr(args, "init_from", None)))
    flags = [flag for flag in flags if flag[1] is not None]
    if not flags:
        return config
    return load_config(args.config, overrides=[*args.set, *flags])


def workdir_lock(config, command):
    """The lock on the config's workdir (`keras_transformer.lock.WorkdirLock`, a lease of
    `runtime.lock_lease_seconds`): one `train` or `prepare` at a time; a second one exits 2
    naming the holder."""
    from keras_transformer.lock import WorkdirLock

    return WorkdirLock(Workdir.of(config).root, command, config.runtime.lock_lease_seconds)
