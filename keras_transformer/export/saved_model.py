"""SavedModel export in TF Serving's layout: `BASE_DIR/NAME/VERSION/` with integer versions."""

import json
import os
import shutil
import tempfile

import tensorflow as tf

from keras_transformer.export.translator import Translator
from keras_transformer.workdir import copy_tree, is_local, local_directory, write_atomically

SIGNATURE_KEY = "serving_default"
METADATA_FILE = "keras_transformer.json"


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


def _field(config, key, default):
    if config is None:
        return default
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def export_translator(model, tokenizer, decode_config=None, data_config=None):
    """The `Translator` that `export_saved_model` saves, with the same decoding settings.

    `decode_config` and `data_config` are as in `export_saved_model`; use it to decode with
    exactly the graph an export would serve (e.g. `benchmarks/decode_sweep.py`).
    """
    return Translator(
        model,
        tokenizer,
        beam_size=_field(decode_config, "beam_size", 4),
        alpha=_field(decode_config, "alpha", 0.6),
        max_extra_length=_field(decode_config, "max_extra_length", 50),
        batch_size=_field(decode_config, "batch_size", 32),
        max_source_length=_field(data_config, "max_source_length", 128),
        # As in the dev-set decoding during training: no output longer than the training targets.
        max_length=_field(data_config, "max_target_length", None),
        bos_id=getattr(tokenizer, "bos_id", 2),
        eos_id=getattr(tokenizer, "eos_id", 3),
        pad_id=getattr(tokenizer, "pad_id", 0),
        n_best=_field(decode_config, "n_best", None),
    )


def export_saved_model(
    model, tokenizer, decode_config=None, data_config=None, base_dir="saved_models", name="model"
):
    """Exports `Translator(model, tokenizer)` as the next version of `base_dir/name`.

    The SavedModel has three signatures (see `Translator`): `serving_default` (text ->
    translation, score), `translate_nbest` (text -> translations, scores `[batch, n_best]`) and
    `score` (source, target -> log_probability, length). `assets.extra/keras_transformer.json`
    records them and the decoding settings used.

    The SavedModel is written to a hidden temporary directory next to the versions and renamed
    into place, so TF Serving (which polls the base path) never sees a half-written version and
    an existing version is never overwritten. If anything fails, nothing is left behind.

    Args:
        model: a `Transformer` (TensorFlow backend).
        tokenizer: `keras_transformer.data.Tokenizer` (or SentencePiece model bytes).
        decode_config: `DecodeConfig` (or dict, e.g. `config.export_decoding(config)`):
            `beam_size`, `alpha`, `max_extra_length`, `batch_size` and `n_best` (hypotheses of
            the `translate_nbest` signature; default the beam size), fixed into the graph.
        data_config: `DataConfig` (or dict): `max_source_length` (inputs are truncated to it)
            and `max_target_length` (the longest output, EOS included).
        base_dir: directory holding the named models.
        name: the model's name (TF Serving's `--model_name`).

    Returns:
        The path of the new version directory, e.g. `saved_models/quickstart/3`.

    Example:
    ```python
    path = export_saved_model(model, tokenizer, config.decode, config.data, "saved_models",
                              "quickstart")
    ```
    """
    if not name or os.sep in str(name) or str(name) in (".", ".."):
        raise ValueError(f"invalid model name {name!r}")
    translator = export_translator(model, tokenizer, decode_config, data_config)
    model_dir = os.path.join(base_dir, str(name))
    if not is_local(model_dir):
        return _export_elsewhere(translator, model_dir, name)
    created_model_dir = not os.path.isdir(model_dir)
    os.makedirs(model_dir, exist_ok=True)
    # Same parent as the versions, so the final rename is atomic; the dot keeps it out of
    # TF Serving's sight (only integer names are versions).
    tmp_dir = tempfile.mkdtemp(prefix=".export-", dir=model_dir)
    try:
        tf.saved_model.save(translator, tmp_dir, signatures=translator.signatures)
        _write_metadata(tmp_dir, translator, name)
        version_dir = _rename_to_next_version(tmp_dir, model_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if created_model_dir and not os.listdir(model_dir):
            os.rmdir(model_dir)
        raise
    return version_dir


def _export_elsewhere(translator, model_dir, name):
    """An export to a filesystem without atomic directory renames (`gs://...`): written in a
    local temporary directory, then copied into the next version with `saved_model.pb` last
    (a version without it is no SavedModel: loaders and `resolve_model_dir` skip it)."""
    with local_directory() as local:
        tf.saved_model.save(translator, local, signatures=translator.signatures)
        _write_metadata(local, translator, name)
        version = (list_versions(model_dir) or [0])[-1] + 1
        while tf.io.gfile.exists(os.path.join(model_dir, str(version))):
            version += 1
        target = os.path.join(model_dir, str(version))
        copy_tree(local, target, last="saved_model.pb")
    return target


def _write_metadata(export_dir, translator, name):
    # assets.extra/ travels with the SavedModel and is ignored by the loaders.
    extra = os.path.join(export_dir, "assets.extra")
    tf.io.gfile.makedirs(extra)
    k = translator.n_best
    metadata = {
        "name": str(name),
        "signature": SIGNATURE_KEY,
        "inputs": {"text": "string [batch]"},
        "outputs": {"translation": "string [batch]", "score": "float32 [batch]"},
        "signatures": {
            SIGNATURE_KEY: {
                "inputs": {"text": "string [batch]"},
                "outputs": {"translation": "string [batch]", "score": "float32 [batch]"},
            },
            "translate_nbest": {
                "inputs": {"text": "string [batch]"},
                "outputs": {
                    "translations": f"string [batch, {k}]",
                    "scores": f"float32 [batch, {k}]",
                },
            },
            "score": {
                "inputs": {"source": "string [batch]", "target": "string [batch]"},
                "outputs": {"log_probability": "float32 [batch]", "length": "int32 [batch]"},
            },
        },
        "beam_size": translator.beam_size,
        "alpha": translator.alpha,
        "n_best": k,
        "max_extra_length": translator.max_extra_length,
        "batch_size": translator.batch_size,
        "max_source_length": translator.max_source_length,
        "max_length": translator.max_length,
        "vocab_size": translator.model.vocab_size,
    }
    write_atomically(os.path.join(extra, METADATA_FILE), json.dumps(metadata, indent=2))


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
