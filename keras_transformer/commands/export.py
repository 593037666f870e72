"""`keras-transformer export`: the model of a training workdir rebuilt (`load_workdir_model`: the
average of its last checkpoints, or the candidate its dev set chooses) and exported as a
SavedModel in TF Serving's layout (with its model card and calibrated confidence), a LiteRT
directory, a CTranslate2 model or a registered format's (`config.formats`), as the workdir's
`ExportPlan` (`export.plan`, the flags over its config) says."""

import dataclasses
import json
import os

from keras_transformer.commands import flags, startup
from keras_transformer.config import export_name
from keras_transformer.errors import KerasTransformerError, UsageError, first_line
from keras_transformer.workdir import Workdir, read_json


def load_workdir_model(workdir, average=None, select=None, alpha=None):
    """Rebuilds the model of a training workdir: the average of its last checkpoints, or the
    candidate its dev set chooses (`keras_transformer.final_model.final_model`, as `train`
    does at its end), decoding over the whole vocabulary.

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
    config, spm_bytes = _read_workdir(workdir)
    return config, _final(workdir, config, spm_bytes, average, select, alpha), spm_bytes


def _read_workdir(workdir):
    """`(config, spm_model_bytes)` of a training workdir; `UsageError` where it is not one."""
    import tensorflow as tf

    from keras_transformer.config import load_config

    gfile = tf.io.gfile  # the workdir may be on any TensorFlow filesystem (gs://...)
    if not gfile.isdir(workdir):
        raise UsageError(f"workdir not found: {workdir}")
    layout = Workdir(workdir)
    config_path, spm_path = layout.config, layout.spm
    for path, what in ((config_path, "resolved config"), (spm_path, "SentencePiece model")):
        if not gfile.exists(path) or gfile.isdir(path):
            raise UsageError(f"{workdir} is not a training workdir: no {what} {path}")
    config = load_config(config_path)
    with gfile.GFile(spm_path, "rb") as f:
        return config, f.read()


def _final(workdir, config, spm_bytes, average, select, alpha, shortlist=None):
    """The workdir's `FinalModel` (`load_workdir_model`); the choice on dev decodes over the
    lexical table `shortlist` (the export plan's `searched_shortlist`; None: the whole
    vocabulary)."""
    import sentencepiece as spm

    from keras_transformer.config import decoding_settings
    from keras_transformer.final_model import Plan, final_model

    # The choice decodes with the config's export settings (the command's decoding flags apply
    # to what is exported: `flags.export_settings`).
    plan = Plan.of(config, decoding_settings(config, export=True))
    if select is None:
        select = average is None and plan.selects
    try:
        vocab_size = spm.SentencePieceProcessor(model_proto=spm_bytes).get_piece_size()
    except Exception:
        raise UsageError(f"{Workdir(workdir).spm} is not a SentencePiece model") from None
    tokenizer, dev_pairs = _selection_inputs(config, spm_bytes) if select else (None, None)
    try:
        return final_model(
            plan, Workdir(workdir), vocab_size, tokenizer, dev_pairs, select, average=average,
            alpha=alpha, shortlist=shortlist,
        )  # fmt: skip
    except (ValueError, OSError) as e:
        raise UsageError(f"cannot load checkpoints of {workdir}: {first_line(e)}") from None


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


def export_command(args):
    """`keras-transformer export --workdir DIR [--average N] [--output DIR] [--beam-size K]
    [--alpha A] [--n-best N] [--max-extra-length L] [--sampling-topk K [--temperature T]
    [--top-p P]] [--format saved_model|ctranslate2|litert] [--quantization TYPE]
    [--shortlist] [--alignments] [--constraints] [--precision float32|bfloat16]`."""
    from keras_transformer.export.plan import resolve_export_plan, run_export

    export_format = flags.export_format(args)
    if export_format == "ctranslate2":
        from keras_transformer.export.ct2 import require_ctranslate2

        require_ctranslate2()  # before the slow part: say how to install it
    flags.check_export(args)
    select = True if getattr(args, "select_on_dev", False) else None
    startup.import_tensorflow(getattr(args, "verbose", False))
    config, spm_bytes = _read_workdir(args.workdir)
    # The same description as train's own export (`training.run.finish.export`), the flags
    # winning over the workdir's `export:` section, resolved before the choice on dev, which
    # decodes over its lexical table as train's does (`training.run.outline`).
    plan = resolve_export_plan(config, args.workdir, flags.export_settings(config, args), args)
    final = _final(args.workdir, config, spm_bytes, args.average, select,
                   getattr(args, "alpha", None), plan.searched_shortlist)  # fmt: skip
    model, steps = final.model, final.steps
    name = args.name or export_name(config, args.workdir)
    what = f"average of steps {', '.join(map(str, steps))}" if len(steps) > 1 else None
    what = what or f"step {steps[-1]}"
    plan = dataclasses.replace(plan, settings=flags.export_settings(config, args, final.alpha))
    card = (None, None)
    if export_format in ("saved_model", "litert"):  # a model card and a calibrated confidence
        card = _card_inputs(args.workdir, config, model.vocab_size, final.selection)
    if export_format == "saved_model":
        path = run_export(plan, model, spm_bytes, args.output or config.export.base_dir, name, card)
        if final.selection:
            _record_export(args.workdir, path, final)
        print(f"exported {what} to {path}")
        return
    if export_format == "litert":
        quantization = plan.quantization or "float32"
        default = os.path.join(config.export.base_dir, f"{name}-litert-{quantization}")
        output = args.output or default
        path = run_export(plan, model, spm_bytes, output, card=card)
        print(f"converted {what} to LiteRT ({quantization}) in {path}")
        return
    output = args.output or os.path.join(config.export.base_dir, f"{name}-{export_format}")
    path = run_export(plan, model, spm_bytes, output)
    print(f"converted {what} to {export_format} in {path}")
