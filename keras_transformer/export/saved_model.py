"""SavedModel export in TF Serving's layout: `BASE_DIR/NAME/VERSION/` with integer versions."""

import json
import os
import platform
import shutil
import time

import numpy as np
import tensorflow as tf

from keras_transformer import glossary as glossaries
from keras_transformer import stopping
from keras_transformer.export import calibration as calib
from keras_transformer.export.card import build_card, write_card
from keras_transformer.export.card import card_facts as facts_of_workdir
from keras_transformer.export.plan import ExportPlan
from keras_transformer.export.translator import Translator
from keras_transformer.export.warmup import (
    sentence_of_length,
    warmup_requests,
    write_warmup,
)
from keras_transformer.workdir import (
    copy_tree,
    is_local,
    local_directory,
    staging_directory,
    write_atomically,
)

SIGNATURE_KEY = "serving_default"
METADATA_FILE = "keras_transformer.json"
PHASE = "the export"  # what `stopping.check` names: no version appears, the next one is the same


def list_versions(model_dir):
    """Integer version numbers under `model_dir`, ascending (other names are ignored, as TF
    Serving does). `model_dir` may be on any TensorFlow filesystem."""
    gfile = tf.io.gfile
    if not gfile.isdir(model_dir):
        return []
    versions = []
    for entry in gfile.listdir(model_dir):
        entry = entry.rstrip("/")
        if entry.isdigit() and gfile.isdir(os.path.join(model_dir, entry)):
            versions.append(int(entry))
    return sorted(versions)


def resolve_model_dir(path):
    """A SavedModel directory from `path`: itself when it holds `saved_model.pb`, else its
    highest integer version (TF Serving's model base path). Raises FileNotFoundError."""
    gfile = tf.io.gfile
    if gfile.exists(os.path.join(path, "saved_model.pb")):
        return path
    if not gfile.isdir(path):
        raise FileNotFoundError(f"model directory not found: {path}")
    for version in reversed(list_versions(path)):
        candidate = os.path.join(path, str(version))
        if gfile.exists(os.path.join(candidate, "saved_model.pb")):
            return candidate
    raise FileNotFoundError(f"no SavedModel (saved_model.pb or numbered versions) in {path}")


def export_translator(model, tokenizer, plan=ExportPlan()):
    """The `Translator` that `export_saved_model` saves of `plan` (an `ExportPlan`: its decoding
    settings, length limits, XLA, shortlist, alignments and their layer, precision); use it to
    decode with exactly the graph an export would serve (e.g. `benchmarks/decode_sweep.py`).
    """
    max_source_length, max_length = plan.lengths
    return Translator(
        model,
        tokenizer,
        plan.settings,
        max_source_length=max_source_length,
        max_length=max_length,
        jit_compile=plan.jit_compile,
        shortlist=plan.shortlist,
        alignments=plan.alignments,
        alignment_layer=plan.alignment_layer,
        precision=plan.quantization or "float32",
    )


# Dev sentences at most that calibrate the confidence and time the decoding at export.
MAX_CALIBRATION_SENTENCES = 1000


def export_saved_model(
    model, tokenizer, plan=ExportPlan(), base_dir="saved_models", name="model", card_facts=None,
    dev_pairs=None,
):  # fmt: skip
    """Exports `Translator(model, tokenizer)` as the next version of `base_dir/name`.

    The SavedModel has five signatures (more with sampling, alignments or glossary tags; see
    `Translator`): `serving_default`
    (text -> translation, score, token_scores, confidence; and alignment with `alignments`),
    `translate_nbest` (text -> translations, scores, token_scores, confidence, `[batch, n_best,
    ...]`), `translate_prefix` (text, prefix -> translation, score), `score` (source, target
    -> log_probability, length) and
    `translate_constrained` (text, constraints `[batch, C]` padded with "" -> translation,
    score, constraints_met); with `alignments`, `translate_markup` (text, markup "html" or
    "xml" -> translation with its tags, score, alignment, markup_valid); a model whose
    vocabulary keeps the glossary tags (prepared with
    `data.terminology`) also has `translate_glossary` (text, glossary_source, glossary_target
    -> translation, score, annotated).
    `assets.extra/` holds `keras_transformer.json` (the signatures and decoding settings),
    the model card (`model_card.json`, `model_card.md`: `card_facts`, the decoding settings,
    the confidence's calibration and the decoding speed measured here on `dev_pairs`) and
    `tf_serving_warmup_requests` (every signature at every source-length bucket, replayed by
    TF Serving at load).

    The SavedModel is written to a hidden temporary directory next to the versions and renamed
    into place, so TF Serving (which polls the base path) never sees a half-written version and
    an existing version is never overwritten. If anything fails, nothing is left behind.

    Args:
        model: a `Transformer` (TensorFlow backend).
        tokenizer: `keras_transformer.data.Tokenizer` (or SentencePiece model bytes).
        plan: the `ExportPlan` it serves (`export.plan.resolve_export_plan`; its `format` is
            not read): `settings`, the `DecodingSettings` fixed into the graph (with sampling
            on, `sampling_topk > 0`, the export adds the `translate_sample` signature); `data`,
            a `DataConfig` (or dict): `max_source_length` (inputs are truncated to it) and
            `max_target_length` (the longest output, EOS included); `jit_compile`, the search
            compiled with XLA (`Translator`'s: faster on CPUs, a compile per new input shape,
            and TF Serving needs `--xla_cpu_compilation_enabled=true` to run it on a CPU);
            `shortlist`, a vocabulary shortlist's `LexicalTable` the searching signatures decode
            over (None: the whole vocabulary); `alignments`, `serving_default` also returns each
            translation's word `alignment` (one more forward pass per request) from the decoder
            layer `alignment_layer` (-2: the second-to-last); `quantization`, the precision:
            None or "float32" (the model as given) or "bfloat16" (weights held and multiplied
            in bfloat16, faster on CPUs with AVX512-BF16 or AMX, answers within its rounding).
        base_dir: directory holding the named models.
        name: the model's name (TF Serving's `--model_name`).
        card_facts: the training side of the model card (`keras_transformer.export.card.
            card_facts`: config, corpora and counts, steps, time, precision, dev/test scores).
        dev_pairs: `[(source, reference), ...]`; the first `MAX_CALIBRATION_SENTENCES` calibrate
            the confidence against sentence chrF and time the decoding. None keeps the default
            map (`Translator.set_calibration`) and leaves the speed unmeasured.

    Returns:
        The path of the new version directory, e.g. `saved_models/quickstart/3`.

    Example:
    ```python
    plan = ExportPlan(settings=decoding_settings(config, export=True), data=config.data)
    path = export_saved_model(model, tokenizer, plan, "saved_models", "quickstart")
    ```
    """
    if not name or os.sep in str(name) or str(name) in (".", ".."):
        raise ValueError(f"invalid model name {name!r}")
    translator = export_translator(model, tokenizer, plan)
    stopping.check(PHASE)
    calibration, speed = _calibrate(translator, dev_pairs)
    stopping.check(PHASE)

    def write_assets(export_dir):
        metadata = _write_metadata(export_dir, translator, name)
        decoding = {key: metadata[key] for key in DECODING_KEYS}
        facts = dict(card_facts or facts_of_workdir(vocab_size=translator.model.vocab_size))
        facts.setdefault("vocabulary", {"size": translator.model.vocab_size})
        card = build_card(facts, name, decoding, calibration, speed, metadata["signatures"])
        write_card(export_dir, card)
        _write_warmup(export_dir, translator, metadata["signatures"])

    model_dir = os.path.join(base_dir, str(name))
    if not is_local(model_dir):
        return _export_elsewhere(translator, model_dir, write_assets)
    created_model_dir = not os.path.isdir(model_dir)
    os.makedirs(model_dir, exist_ok=True)
    # Same parent as the versions, so the final rename is atomic; the dot keeps it out of
    # TF Serving's sight (only integer names are versions).
    tmp_dir = staging_directory(model_dir, ".export-")
    try:
        tf.saved_model.save(translator, tmp_dir, signatures=translator.signatures)
        write_assets(tmp_dir)
        stopping.check(PHASE)  # the last moment: the version does not appear
        version_dir = _rename_to_next_version(tmp_dir, model_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if created_model_dir and not os.listdir(model_dir):
            os.rmdir(model_dir)
        raise
    return version_dir


DECODING_KEYS = (
    "beam_size", "alpha", "n_best", "max_extra_length", "batch_size", "max_source_length",
    "max_length", "precision",
)  # fmt: skip


# `translate_constrained`'s entry of `keras_transformer.json`.
CONSTRAINED_SIGNATURE = {
    "inputs": {"text": "string [batch]", "constraints": "string [batch, C]"},
    "outputs": {
        "translation": "string [batch]",
        "score": "float32 [batch]",
        "constraints_met": "bool [batch]",
    },
}

SAMPLING_KEYS = ("sampling_topk", "sampling_temperature", "sampling_topp")


def _features_function(translator):
    """A tf.function: text -> what the calibration needs of the best hypotheses."""

    def features(text):
        out = translator._hypotheses(text, 1)
        return {key: out[key][:, 0] for key in ("text", "score", "length", "margin")}

    return tf.function(
        features, input_signature=[tf.TensorSpec([None], tf.string)], autograph=False
    )


def _calibrate(translator, dev_pairs):
    """Fits the translator's confidence on `dev_pairs` and times its decoding there.

    Returns `(calibration figures, speed)` for the model card (speed None without a dev set).
    """
    if not dev_pairs:
        return {"fitted": False, **translator.calibration}, None
    pairs = list(dev_pairs)[:MAX_CALIBRATION_SENTENCES]
    sources = [s for s, _ in pairs]
    references = [r for _, r in pairs]
    features = _features_function(translator)
    features(tf.constant(sources[:1]))  # traces; the timing below is decoding only
    started = time.perf_counter()
    out = features(tf.constant(sources))
    seconds = time.perf_counter() - started
    hypotheses = [t.decode("utf-8") for t in out["text"].numpy()]
    fitted, figures = calib.fit_on_dev(
        hypotheses, references, out["score"].numpy(), out["margin"].numpy()
    )
    translator.set_calibration(**fitted)
    request = (
        f"all {len(sources)} dev sentences in one call (graph batch "
        f"{translator.settings.batch_size})"
    )
    speed = {
        **calib.decoding_speed(len(sources), seconds, np.sum(out["length"].numpy()), request),
        "cpu": _cpu_name(),
        "threads": os.cpu_count(),
    }
    return figures, speed


def _cpu_name():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _write_warmup(export_dir, translator, signatures):
    """`assets.extra/tf_serving_warmup_requests`: every signature at every length bucket of the
    translator (those the XLA export compiles)."""
    texts = [sentence_of_length(translator._spm_proto, n) for n in translator.length_buckets]
    inputs = {key: list(spec["inputs"]) for key, spec in signatures.items()}
    return write_warmup(export_dir, warmup_requests(inputs, texts))


def _export_elsewhere(translator, model_dir, write_assets):
    """An export to a filesystem without atomic directory renames (`gs://...`): written in a
    local temporary directory, then copied into the next version with `saved_model.pb` last
    (a version without it is no SavedModel: loaders and `resolve_model_dir` skip it)."""
    with local_directory() as local:
        tf.saved_model.save(translator, local, signatures=translator.signatures)
        write_assets(local)
        stopping.check(PHASE)
        version = (list_versions(model_dir) or [0])[-1] + 1
        while tf.io.gfile.exists(os.path.join(model_dir, str(version))):
            version += 1
        target = os.path.join(model_dir, str(version))
        copy_tree(local, target, last="saved_model.pb")
    return target


# The `translate_glossary` signature, as the metadata describes it.
_GLOSSARY_SIGNATURE = {
    "inputs": {
        "text": "string [batch]",
        "glossary_source": "string [batch, terms]",
        "glossary_target": "string [batch, terms]",
    },
    "outputs": {
        "translation": "string [batch]",
        "score": "float32 [batch]",
        "annotated": "bool [batch]",
    },
}


# The `translate_markup` signature (an export with alignments), as the metadata describes it.
_MARKUP_SIGNATURE = {
    "inputs": {"text": "string [batch]", "markup": "string [batch]"},
    "outputs": {
        "translation": "string [batch]",
        "score": "float32 [batch]",
        "alignment": "int32 [batch, words]",
        "markup_valid": "bool [batch]",
    },
}


def _serving_outputs(alignments):
    """`serving_default`'s outputs in the metadata (`alignment` with `alignments`)."""
    outputs = {
        "translation": "string [batch]",
        "score": "float32 [batch]",
        "token_scores": "float32 [batch, length]",
        "confidence": "float32 [batch]",
    }
    return {**outputs, "alignment": "int32 [batch, words]"} if alignments else outputs


def _write_metadata(export_dir, translator, name):
    # assets.extra/ travels with the SavedModel and is ignored by the loaders.
    extra = os.path.join(export_dir, "assets.extra")
    tf.io.gfile.makedirs(extra)
    settings = translator.settings
    metadata = {
        "name": str(name),
        "signature": SIGNATURE_KEY,
        "inputs": {"text": "string [batch]"},
        "outputs": {"translation": "string [batch]", "score": "float32 [batch]"},
        "signatures": {
            SIGNATURE_KEY: {
                "inputs": {"text": "string [batch]"},
                "outputs": _serving_outputs(translator.alignments),
            },
            "translate_nbest": {
                "inputs": {"text": "string [batch]"},
                "outputs": {
                    "translations": f"string [batch, {settings.hypotheses}]",
                    "scores": f"float32 [batch, {settings.hypotheses}]",
                    "token_scores": f"float32 [batch, {settings.hypotheses}, length]",
                    "confidence": f"float32 [batch, {settings.hypotheses}]",
                },
            },
            "translate_prefix": {
                "inputs": {"text": "string [batch]", "prefix": "string [batch]"},
                "outputs": {"translation": "string [batch]", "score": "float32 [batch]"},
            },
            "score": {
                "inputs": {"source": "string [batch]", "target": "string [batch]"},
                "outputs": {"log_probability": "float32 [batch]", "length": "int32 [batch]"},
            },
            "translate_constrained": CONSTRAINED_SIGNATURE,
        },
        "beam_size": settings.beam_size,
        "alpha": settings.alpha,
        "n_best": settings.hypotheses,
        "max_extra_length": settings.max_extra_length,
        "batch_size": settings.batch_size,
        "max_source_length": translator.max_source_length,
        "max_length": translator.max_length,
        "vocab_size": translator.model.vocab_size,
        "jit_compile": translator.jit_compile,
        "precision": translator.precision,
        "fast_paths": translator.kernels.to_config(),
    }
    metadata["alignments"] = translator.alignments  # serving_default's alignment output
    _add_options(metadata, translator)
    write_atomically(os.path.join(extra, METADATA_FILE), json.dumps(metadata, indent=2))
    return metadata


def _add_options(metadata, translator):
    """The metadata of what only some exports have: sampling, a shortlist, glossaries."""
    settings = translator.settings
    if translator.reads_glossaries:  # a model prepared with data.terminology
        metadata["signatures"]["translate_glossary"] = _GLOSSARY_SIGNATURE
        metadata["glossary_tags"] = list(glossaries.TAGS)
    if translator.alignments:
        metadata["signatures"]["translate_markup"] = _MARKUP_SIGNATURE
    if translator.shortlist is not None:  # how its lexical table was built
        metadata["shortlist"] = translator.shortlist.settings.value
    if settings.sampling:
        metadata["signatures"]["translate_sample"] = {
            "inputs": {"text": "string [batch]", "seed": "int64 [batch]"},
            "outputs": {"translation": "string [batch]", "score": "float32 [batch]"},
        }
        metadata.update({key: getattr(settings, key) for key in SAMPLING_KEYS})


def _rename_to_next_version(tmp_dir, model_dir):
    version = (list_versions(model_dir) or [0])[-1] + 1
    while True:
        target = os.path.join(model_dir, str(version))
        if not os.path.exists(target):
            try:
                os.rename(tmp_dir, target)
                return target
            except OSError:
                if not os.path.exists(target):
                    raise
        # Another export took this number meanwhile: take the next one, never overwrite.
        version += 1
