"""`keras-transformer export --format litert`: the model as two LiteRT (TFLite) models for
phones, edge devices and the cheapest CPU, with a runtime that needs no TensorFlow
(`keras_transformer.litert`).

The directory holds:

- `encoder.tflite`: source ids to each decoder layer's cross-attention keys and values;
- `decoder_step.tflite`: one token of every hypothesis against the runtime's caches
  (`keras_transformer.export.litert_graphs` has the contract);
- `spm.model`, the SentencePiece model;
- with a vocabulary shortlist (`ExportPlan(shortlist=...)`, `export --format litert
  --shortlist`): `decoder_step_shortlist.tflite`, the step over a batch's shortlist alone, and
  `shortlist.npz`, the lexical table (`keras_transformer.data.shortlist`) the runtime makes
  each batch's shortlist from (with `litert.load(..., shortlist=True)`), and
  `shortlist_output.npz`, the projection's rows (`litert_graphs.shortlist_output_rows`), from
  which the runtime gathers the shortlist's columns once per batch. How the step keeps to the
  shortlist (`shortlist_head`): in float32 and float16 the step projects onto those columns
  alone (`litert_graphs.shortlist_step_function`); in `dynamic_int8` the step is the decoder
  stack alone (`litert_graphs.hidden_step_function`), the runtime projects its output with an
  int8 model of the columns it writes once per batch (`keras_transformer.litert.projection`),
  and `shortlist_head.tflite` (`litert_graphs.gathered_head_function`) gives the scores.
  The step without it stays, unchanged;
- for hard lexical constraints (`ExportPlan(constraints=True)`):
  `decoder_step_constrained.tflite`, the step that also gives the log-probabilities of the
  ids the runtime asks for (`litert_graphs.constrained_step_function`), with which
  `LiteRTTranslator.translate_constrained` searches; the step without it stays, unchanged;
  with a shortlist too, also `decoder_step_shortlist_constrained.tflite`, the same over a
  batch's shortlist (`litert_graphs.shortlist_constrained_step_function`; in `dynamic_int8`
  the constrained step with an `output_mask` over its own product,
  `litert_graphs.constrained_step_function(..., masked=True)`), with which it searches when
  loaded with `shortlist=True`;
- for word alignments (`ExportPlan(alignments=True)`, `export --format litert
  --alignments`): `alignment.tflite`, `source_ids` int32 `[B, S]` and the final hypotheses'
  `target_ids` int32 `[B, T]` -> `pieces` int32 `[B, T]`, the source piece each target piece
  attends to most in the chosen decoder layer's cross-attention averaged over heads
  (`export.alignment_graph.attended_pieces`, the SavedModel's own definition), run once per
  chunk after the search; the runtime maps pieces to words as the SavedModel does
  (`keras_transformer.alignment_rules.word_alignment`);
- `keras_transformer.json`: the format, the quantization, the shapes the runtime needs, the
  decoding settings (fixed here, as in the SavedModel) and the confidence's calibration;
- `model_card.json`, `model_card.md`.

Both graphs are converted with TensorFlow's converter from `TFLITE_BUILTINS` only (a
`SELECT_TF_OPS` fallback would need TensorFlow's kernels at run time). Quantization:

- `float32`: the model's weights as they are;
- `float16`: weights stored in float16 (half the size), computed in float32;
- `dynamic_int8`: weights int8 per output channel, activations quantized at run time
  (`Optimize.DEFAULT`; XNNPACK runs the fully-connected layers as int8 products). The decoder's
  embedding lookup reads an int8 copy of the rows it needs (`litert_graphs.quantized_rows`),
  each with its own scale, kept as int32 fixed point (`litert_graphs.fixed_point_scales`: the
  converter would quantize a float32 scale vector again, with one scale for all rows).

The directory is written next to its destination and renamed into place: it appears whole or
not at all, and an existing non-empty directory is never overwritten.
"""

import functools
import json
import os
import shutil

from keras_transformer import stopping
from keras_transformer.config.formats import check_quantization
from keras_transformer.errors import UsageError
from keras_transformer.export.plan import ExportPlan
from keras_transformer.workdir import staging_directory

METADATA_FILE = "keras_transformer.json"
SPM_FILE = "spm.model"
ENCODER_FILE = "encoder.tflite"
STEP_FILE = "decoder_step.tflite"
SHORTLIST_STEP_FILE = "decoder_step_shortlist.tflite"
SHORTLIST_TABLE_FILE = "shortlist.npz"
SHORTLIST_OUTPUT_FILE = "shortlist_output.npz"
SHORTLIST_HEAD_FILE = "shortlist_head.tflite"
CONSTRAINED_STEP_FILE = "decoder_step_constrained.tflite"
SHORTLIST_CONSTRAINED_STEP_FILE = "decoder_step_shortlist_constrained.tflite"
ALIGNMENT_FILE = "alignment.tflite"
FORMAT_VERSION = 1
PHASE = "the LiteRT conversion"  # what `stopping.check` names
# What `keras_transformer.litert.LiteRTTranslator` answers (the model card's "signatures").
RUNTIME_FUNCTIONS = {
    "translate": {
        "inputs": ["text"],
        "outputs": ["translation", "score", "token_scores", "confidence"],
    },
    "translate_nbest": {
        "inputs": ["text"],
        "outputs": ["translations", "scores", "token_scores", "confidence"],
    },
    "translate_prefix": {"inputs": ["text", "prefix"], "outputs": ["translation", "score"]},
}
# With the constrained step (`ExportPlan(constraints=True)`).
CONSTRAINED_FUNCTION = {
    "translate_constrained": {
        "inputs": ["text", "constraints"],
        "outputs": ["translation", "score", "constraints_met"],
    },
}


def _check(model, quantization):
    check_quantization("litert", quantization)  # the registry's (`config.formats`)
    if getattr(model, "decoder_only", False) or not hasattr(model, "encode"):
        raise UsageError("a LiteRT export needs an encoder-decoder Transformer")


def _specs(model, beams, shortlist=False, wanted=False):
    """The step's input signature (`litert_graphs` module docstring); `shortlist`: the
    shortlist step's, `"columns"` (or True) with its `output_ids`, `output_kernel` and
    `output_bias`, `"mask"` with its `output_mask` `[vocab]`, `"row_mask"` with its
    `output_mask` `[rows, vocab]`; `wanted`: the constrained step's, with its
    `wanted_ids`."""
    import tensorflow as tf

    heads, size = model.num_heads, model.head_dim
    caches = {}
    for i in range(len(model.decoder.blocks)):
        for name in ("self_keys", "self_values", "cross_keys", "cross_values"):
            key = f"{name}_{i}"
            caches[key] = tf.TensorSpec([None, heads, None, size], tf.float32, name=key)
    specs = [
        tf.TensorSpec([None], tf.int32, name="ids"),
        tf.TensorSpec([1], tf.int32, name="position"),
        tf.TensorSpec([None, 1, beams, None], tf.float32, name="self_bias"),
        tf.TensorSpec([None, 1, 1, None], tf.float32, name="cross_bias"),
        caches,
    ]
    if shortlist == "mask":
        specs.append(tf.TensorSpec([model.vocab_size], tf.float32, name="output_mask"))
    elif shortlist == "row_mask":  # one mask per hypothesis: each row's own shortlist
        specs.append(tf.TensorSpec([None, model.vocab_size], tf.float32, name="output_mask"))
    elif shortlist:
        specs.append(tf.TensorSpec([None], tf.int32, name="output_ids"))
        specs.append(tf.TensorSpec([model.d_model, None], tf.float32, name="output_kernel"))
        specs.append(tf.TensorSpec([None], tf.float32, name="output_bias"))
    if wanted:
        specs.append(tf.TensorSpec([None, None], tf.int32, name="wanted_ids"))
    return specs


def _convert(function, quantization):
    """`(flatbuffer, output names)` of a traced `tf.function` (variables frozen into
    constants); the names in the order of the LiteRT model's outputs (the function's output
    dict flattened: sorted keys), which the converted model does not keep."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    concrete = function.get_concrete_function()
    names = sorted(concrete.structured_outputs)
    frozen = convert_variables_to_constants_v2(concrete)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([frozen])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if quantization != "float32":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantization == "float16":
        converter.target_spec.supported_types = [tf.float16]
    return converter.convert(), names


def shortlist_head(quantization):
    """How an export of `quantization` decodes over a shortlist: `"gathered"` (`dynamic_int8`:
    the step's decoder stack alone, `litert_graphs.hidden_step_function`; the runtime projects
    its output with an int8 product of the shortlist's columns, a model it makes once per
    batch, `keras_transformer.litert.projection`, then runs the shortlist step's head,
    `litert_graphs.gathered_head_function`) or `"columns"` (float: a float32 product of the
    shortlist's columns, an input the runtime makes once per batch). A float32 input could
    not take the int8 product's place: at a served batch's row counts the int8 product of the
    whole vocabulary costs about what the float32 one of a third of it does
    (`benchmarks/litert_step.py --shortlist-width`). Exports made before the gathered head
    masked the step's whole product (`"mask"`, which the runtime still reads); the
    constrained shortlist step of a `dynamic_int8` export still does."""
    return "gathered" if quantization == "dynamic_int8" else "columns"


def convert_graphs(
    model, settings, quantization="float32", shortlist=False, constraints=False, alignment=None
):
    """`({"encoder": (bytes, output names), "decoder_step": (...)}, top_k)`: `model`'s two
    LiteRT graphs for `settings`' beam size (the step's `K`, the candidates kept per row:
    `2 * beam_size`); `shortlist`: also `"decoder_step_shortlist"`; `constraints`: also
    `"decoder_step_constrained"` (its `K`: `2 * beam_size + 1`); both: also
    `"decoder_step_shortlist_constrained"` (the same `K`); `alignment` (a non-negative
    decoder layer): also `"alignment"`, that layer's alignment graph (module docstring)."""
    import tensorflow as tf

    from keras_transformer.export import litert_graphs

    beams = settings.beam_size
    top_k = 2 * beams
    head = shortlist_head(quantization)
    quantized = None
    if quantization == "dynamic_int8":
        quantized = litert_graphs.quantized_rows(model.target_embedding.embeddings.numpy())
    encoder = tf.function(
        litert_graphs.encoder_function(model),
        input_signature=[tf.TensorSpec([None, None], tf.int32, name="source_ids")],
        autograph=False,
    )
    graphs = {"encoder": _convert(encoder, quantization)}
    banned = (settings.pad_id, settings.bos_id)
    if head == "gathered":  # the stack alone; the constrained step's own product masked
        listed_step = _hidden_step
        listed_constrained = functools.partial(litert_graphs.constrained_step_function, masked=True)
    else:
        listed_step = litert_graphs.shortlist_step_function
        listed_constrained = litert_graphs.shortlist_constrained_step_function
    listed_inputs = "columns" if head == "columns" else "row_mask"  # the constrained step's
    steps = {  # name: (graph function, its K, its shortlist inputs)
        "decoder_step": (litert_graphs.step_function, top_k, False),
        "decoder_step_shortlist": (listed_step, top_k, head == "columns"),
        "decoder_step_constrained": (litert_graphs.constrained_step_function, top_k + 1, False),
        "decoder_step_shortlist_constrained": (listed_constrained, top_k + 1, listed_inputs),
    }
    for name, (function, k, inputs) in steps.items():
        listed, wanted = "shortlist" in name, "constrained" in name
        if (listed and not shortlist) or (wanted and not constraints):
            continue
        step = tf.function(
            function(model, beams, k, banned, settings.eos_id, quantized),
            input_signature=_specs(model, beams, shortlist=inputs, wanted=wanted),
            autograph=False,
        )
        stopping.check(PHASE)
        graphs[name] = _convert(step, quantization)
    if shortlist and head == "gathered":
        stopping.check(PHASE)
        head_graph = _gathered_head(top_k, settings.eos_id)
        graphs["shortlist_head"] = _convert(head_graph, "float32")  # no weights
    if alignment is not None:
        stopping.check(PHASE)
        graphs["alignment"] = _convert(
            _alignment_function(model, alignment, settings), quantization
        )
    return graphs, top_k


def _hidden_step(model, beams, top_k, banned_ids, eos_id, quantized_embedding=None):
    """`litert_graphs.hidden_step_function` called as the other steps are (no head: no
    `top_k`, banned or EOS id)."""
    from keras_transformer.export import litert_graphs

    del top_k, banned_ids, eos_id
    return litert_graphs.hidden_step_function(model, beams, quantized_embedding)


def _gathered_head(top_k, eos_id):
    """The gathered shortlist head's graph (`litert_graphs.gathered_head_function`) as a
    `tf.function`: `banned [rows, n]`, `special [rows, s]`, `output_ids [n]`."""
    import tensorflow as tf

    from keras_transformer.export import litert_graphs

    head = litert_graphs.gathered_head_function(top_k, eos_id)
    specs = [
        tf.TensorSpec([None, None], tf.float32, name="banned"),
        tf.TensorSpec([None, None], tf.float32, name="special"),
        tf.TensorSpec([None], tf.int32, name="output_ids"),
    ]
    return tf.function(head, input_signature=specs, autograph=False)


def _alignment_function(model, layer, settings):
    """The alignment graph (module docstring) as a `tf.function`."""
    import tensorflow as tf

    from keras_transformer.export.alignment_graph import attended_pieces

    def align(source_ids, target_ids):
        return {"pieces": attended_pieces(model, layer, source_ids, target_ids, settings)}

    specs = [tf.TensorSpec([None, None], tf.int32, name=n) for n in ("source_ids", "target_ids")]
    return tf.function(align, input_signature=specs, autograph=False)


def _metadata(model, settings, quantization, lengths, top_k, calibration, outputs):
    from keras_transformer.search_rules import DEFAULT_CALIBRATION

    return {
        "format": "litert",
        "format_version": FORMAT_VERSION,
        "quantization": quantization,
        "encoder": ENCODER_FILE,
        "decoder_step": STEP_FILE,
        "tokenizer": SPM_FILE,
        "num_layers": len(model.decoder.blocks),
        "num_heads": model.num_heads,
        "head_dim": model.head_dim,
        "vocab_size": model.vocab_size,
        "top_k": top_k,
        "outputs": outputs,
        "max_source_length": lengths[0],
        "max_length": lengths[1],
        "decoding": {
            "beam_size": settings.beam_size,
            "alpha": settings.alpha,
            "n_best": settings.hypotheses,
            "max_extra_length": settings.max_extra_length,
            "batch_size": settings.batch_size,
            "pad_id": settings.pad_id,
            "bos_id": settings.bos_id,
            "eos_id": settings.eos_id,
        },
        "calibration": dict(calibration or DEFAULT_CALIBRATION),
    }


def export_litert(
    model, tokenizer, output_dir, plan=ExportPlan(format="litert"), card_facts=None,
    calibration=None, dev_pairs=None,
):  # fmt: skip
    """Exports `model` as a LiteRT directory (module docstring) that
    `keras_transformer.litert.load` translates with.

    Args:
        model: a trained `Transformer` (TensorFlow backend, float32 weights).
        tokenizer: SentencePiece model bytes, or an object with `.model_proto`.
        output_dir: the directory to create (it must not exist or be empty).
        plan: the `ExportPlan` it serves (its `format` is not read): `quantization`,
            `float32` (None too), `float16` or `dynamic_int8`; `data`, a `DataConfig` (or
            dict): `max_source_length` (inputs are truncated to it) and `max_target_length`
            (the longest output, EOS included); `settings`, the `DecodingSettings` fixed in the
            export (beam size, length penalty, n-best, extra length, batch size; sampling is
            not exported); `shortlist`, a vocabulary shortlist's lexical table (`keras_
            transformer.data.shortlist.LexicalTable`, a row per piece of the model's
            vocabulary): the export also holds the shortlist step and the table (module
            docstring), which the runtime decodes with when asked (`litert.load(path,
            shortlist=True)`), None: neither; `constraints`, also the constrained step (module
            docstring) for `LiteRTTranslator.translate_constrained` (hard lexical
            constraints); `alignments`, also the alignment graph (module docstring) for
            `LiteRTTranslator.translate(texts, alignments=True)`, of the decoder layer
            `alignment_layer` (-2: the second-to-last, a one-layer decoder's only one).
        card_facts: the training side of the model card (`export.card.card_facts`).
        calibration: the confidence's map (`Translator.set_calibration`'s three numbers);
            None: the default map, or the one fitted on `dev_pairs`.
        dev_pairs: `[(source, reference), ...]`: the first 1,000 are translated by this export
            itself (with `keras_transformer.litert`, when installed) to fit the confidence
            against sentence chrF, as the SavedModel's export does, and to time it for the card.

    Returns:
        `output_dir`.
    """
    from keras_transformer.export.alignment_graph import alignment_layer as resolve_layer
    from keras_transformer.export.translator import _model_proto

    quantization, shortlist = plan.quantization or "float32", plan.shortlist
    _check(model, quantization)
    layer = resolve_layer(model, plan.alignment_layer) if plan.alignments else None
    settings = plan.settings.without_sampling()
    if os.path.isdir(output_dir) and os.listdir(output_dir):
        raise UsageError(f"{output_dir} already exists and is not empty: choose another --output")
    if shortlist is not None and shortlist.vocab_size != model.vocab_size:
        raise UsageError(
            f"the shortlist table has {shortlist.vocab_size} source rows, the model's "
            f"vocabulary {model.vocab_size} pieces: build it again (keras-transformer shortlist)"
        )
    spm_bytes = _model_proto(tokenizer)
    graphs, top_k = convert_graphs(
        model, settings, quantization, shortlist is not None, plan.constraints, layer
    )
    (encoder, encoder_outputs), (step, step_outputs) = graphs["encoder"], graphs["decoder_step"]
    outputs = {"encoder": encoder_outputs, "decoder_step": step_outputs}
    metadata = _metadata(model, settings, quantization, plan.lengths, top_k, calibration, outputs)
    files = {ENCODER_FILE: encoder, STEP_FILE: step, SPM_FILE: spm_bytes}
    files.update(_optional_graphs(graphs, shortlist, metadata, model, quantization))
    functions = dict(RUNTIME_FUNCTIONS, **(CONSTRAINED_FUNCTION if plan.constraints else {}))
    if plan.alignments:
        metadata["alignments"] = {"graph": ALIGNMENT_FILE, "layer": layer}
        files[ALIGNMENT_FILE], metadata["outputs"]["alignment"] = graphs["alignment"]
        translate = functions["translate"]
        functions["translate"] = {**translate, "outputs": [*translate["outputs"], "alignment"]}
    card = {
        "functions": functions,
        "facts": card_facts,
        "name": os.path.basename(os.path.normpath(output_dir)),
        "sizes": {"encoder_bytes": len(encoder), "decoder_step_bytes": len(step)},
    }

    def finish(directory):  # the metadata and the card, once the export can translate
        _write_json(os.path.join(directory, METADATA_FILE), metadata)
        figures, speed = {"fitted": False, **metadata["calibration"]}, None
        if dev_pairs and calibration is None and _runtime_installed():
            figures, speed = _calibrate(directory, dev_pairs)
            metadata["calibration"] = {key: figures[key] for key in DEFAULT_KEYS}
            _write_json(os.path.join(directory, METADATA_FILE), metadata)
        _write_card(directory, metadata, card, figures, speed)

    return _write_directory(output_dir, files, finish)


def _optional_graphs(graphs, shortlist, metadata, model, quantization):
    """`{file name: bytes}` of the optional graphs in `graphs` (the shortlist step, its table
    and `model`'s projection rows as `quantization` holds them, the constrained step), named in
    `metadata` (its `outputs` too)."""
    from keras_transformer.export import litert_graphs

    files, outputs = {}, metadata["outputs"]
    if shortlist is not None:
        listed_step, outputs["decoder_step_shortlist"] = graphs["decoder_step_shortlist"]
        files[SHORTLIST_STEP_FILE] = listed_step
        files[SHORTLIST_TABLE_FILE] = _table_bytes(shortlist)
        head = shortlist_head(quantization)
        metadata["shortlist"] = {
            "decoder_step": SHORTLIST_STEP_FILE,
            "table": SHORTLIST_TABLE_FILE,
            "head": head,
            "settings": dict(shortlist.settings),
        }
        rows = litert_graphs.shortlist_output_rows(model, quantization)
        files[SHORTLIST_OUTPUT_FILE] = _npz_bytes(rows)
        metadata["shortlist"]["output"] = SHORTLIST_OUTPUT_FILE
        metadata["shortlist"]["column_block"] = litert_graphs.TOP_K_BLOCK
        # each row masked to its own shortlist: the masked steps' `output_mask` is per row
        metadata["shortlist"]["row_mask"] = True
        if head == "gathered":
            files[SHORTLIST_HEAD_FILE], outputs["shortlist_head"] = graphs["shortlist_head"]
            metadata["shortlist"]["head_graph"] = SHORTLIST_HEAD_FILE
    if "decoder_step_constrained" in graphs:
        constrained_step, outputs["decoder_step_constrained"] = graphs["decoder_step_constrained"]
        files[CONSTRAINED_STEP_FILE] = constrained_step
        metadata["constraints"] = {
            "decoder_step": CONSTRAINED_STEP_FILE,
            "top_k": metadata["top_k"] + 1,
        }
    if "decoder_step_shortlist_constrained" in graphs:
        name = "decoder_step_shortlist_constrained"
        files[SHORTLIST_CONSTRAINED_STEP_FILE], outputs[name] = graphs[name]
        metadata["constraints"]["shortlist_step"] = SHORTLIST_CONSTRAINED_STEP_FILE
    return files


def _table_bytes(table):
    """The lexical table as `shortlist.npz`'s bytes (`data.shortlist.save_lexical_table`)."""
    import tempfile

    from keras_transformer.data.shortlist import save_lexical_table

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, SHORTLIST_TABLE_FILE)
        save_lexical_table(table, path)
        with open(path, "rb") as f:
            return f.read()


def _npz_bytes(arrays):
    """`arrays` (`{name: array}`) as an uncompressed `.npz` file's bytes."""
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


DEFAULT_KEYS = ("score_weight", "margin_weight", "bias")  # the confidence's map
MAX_CALIBRATION_SENTENCES = 1000


def _runtime_installed():
    import importlib.util

    return importlib.util.find_spec("ai_edge_litert") is not None


def _write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, default=str)


def _calibrate(directory, dev_pairs):
    """`(calibration figures, speed)`: the export in `directory` translates the dev sources;
    the confidence's map is fitted on their sentence chrF (`export.calibration`)."""
    import time

    from keras_transformer import litert
    from keras_transformer.export import calibration as calib

    pairs = list(dev_pairs)[:MAX_CALIBRATION_SENTENCES]
    sources, references = [s for s, _ in pairs], [r for _, r in pairs]
    translator = litert.load(directory)
    started = time.perf_counter()
    out = translator._hypotheses(sources, 1)
    seconds = time.perf_counter() - started
    hypotheses = [row[0] for row in out["text"]]
    _, figures = calib.fit_on_dev(hypotheses, references, out["score"][:, 0], out["margin"][:, 0])
    request = f"all {len(sources)} dev sentences in one call (LiteRT runtime)"
    speed = calib.decoding_speed(len(sources), seconds, out["length"][:, 0].sum(), request)
    return figures, {**speed, "threads": os.cpu_count()}


def _write_card(directory, metadata, card, calibration, speed):
    from keras_transformer.export.card import build_card, render_markdown

    built = build_card(
        card["facts"], card["name"], metadata["decoding"], calibration, speed, card["functions"]
    )
    built["litert"] = {"quantization": metadata["quantization"], **card["sizes"]}
    _write_json(os.path.join(directory, "model_card.json"), built)
    with open(os.path.join(directory, "model_card.md"), "w", encoding="utf-8") as f:
        f.write(render_markdown(built))


def _write_directory(output_dir, files, finish):
    """`files` (`{name: bytes}`) written into a hidden directory beside `output_dir`, then
    `finish(directory)`, then the directory renamed into place."""
    tmp_dir = staging_directory(os.path.dirname(os.path.abspath(output_dir)), ".litert-")
    try:
        for name, data in files.items():
            with open(os.path.join(tmp_dir, name), "wb") as f:
                f.write(data)
        finish(tmp_dir)
        stopping.check(PHASE)  # the last moment: the directory does not appear
        if os.path.isdir(output_dir):
            os.rmdir(output_dir)  # empty: checked by the caller
        os.rename(tmp_dir, output_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return output_dir
