"""`keras-transformer export`: the model of a training workdir rebuilt (`load_workdir_model`: the
average of its last checkpoints, or the candidate its dev set chooses) and exported as a
SavedModel in TF Serving's layout (with its model card and calibrated confidence) or as a
CTranslate2 model."""

import json
import os

from keras_transformer.commands import flags, startup
from keras_transformer.commands.shortlist import workdir_shortlist
from keras_transformer.config import export_name, saved_model_shortlist
from keras_transformer.errors import KerasTransformerError, UsageError, first_line
from keras_transformer.workdir import Workdir, read_json


def load_workdir_model(workdir, average=None, select=None, alpha=None):
    """Rebuilds the model of a training workdir: the average of its last checkpoints, or the
    candidate its dev set chooses (`keras_transformer.final_model.final_model`, as `train`
    does at its end).

    Args:
        workdir: the training workdir (any TensorFlow filesystem).
        average: checkpoints to average, a positive count (None: `export.average_checkpoints`;
            `export --average` is checked by `flags.check_export`).
        select: choose on the dev set (None: where the config says `auto` and no `average`).
        alpha: the length penalty, fixed (`export --alpha`).

    Returns:
        `(config, final, spm_model_bytes)`: `final` is a `FinalModel` (model, steps, the alpha
        chosen on dev or None, the selection).
    """
    import sentencepiece as spm
    import tensorflow as tf

    from keras_transformer.config import decoding_settings, load_config
    from keras_transformer.final_model import Plan, final_model

    gfile = tf.io.gfile  # the workdir may be on any TensorFlow filesystem (gs://...)
    if not gfile.isdir(workdir):
        raise UsageError(f"workdir not found: {workdir}")
    layout = Workdir(workdir)
    config_path, spm_path = layout.config, layout.spm
    for path, what in ((config_path, "resolved config"), (spm_path, "SentencePiece model")):
        if not gfile.exists(path) or gfile.isdir(path):
            raise UsageError(f"{workdir} is not a training workdir: no {what} {path}")
    config = load_config(config_path)
    # The choice decodes with the config's export settings (the command's decoding flags apply
    # to what is exported: `flags.export_settings`).
    plan = Plan.of(config, decoding_settings(config, export=True))
    if select is None:
        select = average is None and plan.selects
    with gfile.GFile(spm_path, "rb") as f:
        spm_bytes = f.read()
    try:
        vocab_size = spm.SentencePieceProcessor(model_proto=spm_bytes).get_piece_size()
    except Exception:
        raise UsageError(f"{spm_path} is not a SentencePiece model") from None
    tokenizer, dev_pairs = _selection_inputs(config, spm_bytes) if select else (None, None)
    try:
        final = final_model(
            plan, layout, vocab_size, tokenizer, dev_pairs, select, average=average, alpha=alpha
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


def _export_litert(args, config, final, spm_bytes, name, averaged):
    """`export --format litert`: the LiteRT directory (`keras_transformer.export.litert`)."""
    from keras_transformer.export.litert import export_litert

    quantization = getattr(args, "quantization", None) or "float32"
    output = args.output or os.path.join(config.export.base_dir, f"{name}-litert-{quantization}")
    facts, dev_pairs = _card_inputs(args.workdir, config, final.model.vocab_size, final.selection)
    path = export_litert(
        final.model,
        spm_bytes,
        output,
        quantization,
        config.data,
        flags.export_settings(config, args, final.alpha),
        facts,
        dev_pairs=dev_pairs,
        # Not by default: its shortlist step is a second copy of the step's weights, and
        # not faster there (docs/guides/on-device.md).
        shortlist=_engine_shortlist(args, config, workdir_default=False),
        constraints=bool(getattr(args, "constraints", False)),
        alignments=_flag_or_config(args, "alignments", config.export.alignments),
        alignment_layer=config.export.alignment_layer,
    )
    what = averaged or f"step {final.steps[-1]}"
    print(f"converted {what} to LiteRT ({quantization}) in {path}")


def _engine_shortlist(args, config, workdir_default):
    """The lexical table a LiteRT or CTranslate2 export holds (it decodes with it only when
    asked: `litert.load(shortlist=True)`, CTranslate2's `use_vmap`), or None: `--shortlist`
    and `export.shortlist: true` read or build it, `--no-shortlist` and `export.shortlist:
    false` leave it out; with neither (`export.shortlist` null) it is in when
    `workdir_default` and the workdir has one (`WORKDIR/shortlist.npz`)."""
    from keras_transformer import local_files

    use = _flag_or_config(args, "shortlist", config.export.shortlist)
    if use is None:
        use = workdir_default and local_files.gfile().exists(Workdir(args.workdir).shortlist)
    return workdir_shortlist(args.workdir) if use else None


def _search_options(args, config):
    """`(jit_compile, shortlist)` of a SavedModel export: the flags win over the workdir's
    `export.jit_compile` and `export.shortlist` (`config.saved_model_shortlist`: by default
    the shortlist where it can be built, not with XLA); the lexical table is read (or
    built)."""
    jit_compile = config.export.jit_compile if args.jit_compile is None else args.jit_compile
    asked = getattr(args, "shortlist", None)
    use, required = saved_model_shortlist(config.export, asked, jit_compile)
    if use and jit_compile:
        raise UsageError(
            "the vocabulary shortlist does not compile with XLA yet: not both --shortlist "
            "(export.shortlist) and --jit-compile (export.jit_compile)"
        )
    return jit_compile, workdir_shortlist(args.workdir, required) if use else None


def _flag_or_config(args, name, configured):
    """`--NAME` / `--no-NAME` when given, else the workdir's `export.NAME`."""
    flag = getattr(args, name, None)
    return configured if flag is None else flag


def _exporter(export_format):
    """The registered exporter of `export_format` (`config.formats`), imported now."""
    import importlib

    from keras_transformer.config.formats import export_format as registered

    module, function = registered(export_format).exporter.split(":")
    return getattr(importlib.import_module(module), function)


def export_command(args):
    """`keras-transformer export --workdir DIR [--average N] [--output DIR] [--beam-size K]
    [--alpha A] [--n-best N] [--max-extra-length L] [--sampling-topk K [--temperature T]
    [--top-p P]] [--format saved_model|ctranslate2|litert] [--quantization TYPE]
    [--shortlist] [--alignments] [--constraints] [--precision float32|bfloat16]`."""
    export_format = flags.export_format(args)
    if export_format == "ctranslate2":
        from keras_transformer.export.ct2 import require_ctranslate2

        require_ctranslate2()  # before the slow part: say how to install it
    exporter = _exporter(export_format)
    flags.check_export(args)
    select = True if getattr(args, "select_on_dev", False) else None
    startup.import_tensorflow(getattr(args, "verbose", False))
    config, final, spm_bytes = load_workdir_model(
        args.workdir, args.average, select, getattr(args, "alpha", None)
    )
    model, steps = final.model, final.steps
    name = args.name or export_name(config, args.workdir)
    averaged = f"average of steps {', '.join(map(str, steps))}" if len(steps) > 1 else None
    if export_format == "litert":
        return _export_litert(args, config, final, spm_bytes, name, averaged)
    if export_format != "saved_model":  # a converted model: CTranslate2's, or a registered one
        output = args.output or os.path.join(config.export.base_dir, f"{name}-{export_format}")
        path = exporter(
            model,
            spm_bytes,
            output,
            getattr(args, "quantization", None),
            config.data,
            flags.export_settings(config, args, final.alpha),
            shortlist=_engine_shortlist(args, config, workdir_default=True),
        )
        print(f"converted {averaged or f'step {steps[-1]}'} to {export_format} in {path}")
        return
    export_saved_model = exporter

    settings = flags.export_settings(config, args, final.alpha)
    base_dir = args.output or config.export.base_dir
    facts, dev_pairs = _card_inputs(args.workdir, config, model.vocab_size, final.selection)
    jit_compile, shortlist = _search_options(args, config)
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
        jit_compile=jit_compile,
        shortlist=shortlist,
        alignments=_flag_or_config(args, "alignments", config.export.alignments),
        alignment_layer=config.export.alignment_layer,
        precision=_flag_or_config(args, "precision", config.export.precision),
    )
    if final.selection:
        _record_export(args.workdir, path, final)
    print(f"exported {averaged or f'step {steps[-1]}'} to {path}")
