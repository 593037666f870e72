"""The manifest of prepared data: what it records, reading it, and checking a workdir against it.

`WORKDIR/prepared/manifest.json` is the last file `prepare` writes: its presence marks a complete
preparation. It records the config keys the data depends on (`data_settings`), the vocabulary the
shards were tokenized with (its sha256), and each shard's size and sha256. `check_prepared`
compares it with a config before the data is reused, `verify_shards` the shards with it.
"""

import hashlib
import json
import os

from keras_transformer import local_files
from keras_transformer.data.tokenizer import copy_model
from keras_transformer.errors import DataError
from keras_transformer.integrity import file_digest, file_problem
from keras_transformer.workdir import Workdir, read_text

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
VOCABULARY = "spm.model"
# Settings that shaped the vocabulary: changing one needs a new spm.model too.
_VOCABULARY_KEYS = (
    "data.train",
    "data.vocab_size",
    "data.spm_model_type",
    "data.spm_character_coverage",
    "data.spm_max_sentences",
    "data.seed",
    "data.terminology",  # only when set: its tags are user-defined symbols
)


def data_settings(data_config):
    """What the prepared data depends on, as the manifest records it (config key -> value)."""
    d = data_config
    settings = {
        "data.train": d.train,
        "data.vocab_size": d.vocab_size,
        "data.spm_model_type": d.spm_model_type,
        "data.spm_character_coverage": d.spm_character_coverage,
        "data.spm_max_sentences": d.spm_max_sentences,
        "data.seed": d.seed,
        "data.long_pairs": d.long_pairs,
    }
    if d.subword_samples:  # recorded only when on: workdirs prepared before it still match
        settings["data.subword_samples"] = d.subword_samples
        settings["data.subword_alpha"] = d.subword_alpha
    if d.both_directions:  # likewise
        settings["data.both_directions"] = True
    if d.terminology:  # likewise (the vocabulary holds the glossary tags then)
        settings["data.terminology"] = d.terminology
        settings["data.terminology_fraction"] = d.terminology_fraction
    if d.train_alignments:  # likewise (the records hold piece links then)
        settings["data.train_alignments"] = d.train_alignments
    if d.long_pairs == "drop":  # truncated pairs are stored whole: lengths do not matter then
        settings["data.max_source_length"] = d.max_source_length
        settings["data.max_target_length"] = d.max_target_length
    return settings


def vocabulary_settings(data_config):
    """The settings that shaped the vocabulary (a kept one is reused only when they match)."""
    settings = data_settings(data_config)
    return {key: settings[key] for key in _VOCABULARY_KEYS if key in settings}


def manifest_head(data_config, proto, trained, sampled):
    """The manifest's first keys: its format, the settings the data depends on, the vocabulary."""
    import sentencepiece as spm

    return {
        "format_version": FORMAT_VERSION,
        "settings": data_settings(data_config),
        "vocabulary": {
            "file": VOCABULARY,
            "sha256": hashlib.sha256(proto).hexdigest(),
            "pieces": spm.SentencePieceProcessor(model_proto=proto).get_piece_size(),
            "trained": trained,
            "sample_sentences": sampled,
        },
    }


def read_manifest(directory):
    """The manifest of a prepared directory, or None when it holds no complete preparation.

    Args:
        directory: `WORKDIR/prepared` (`Workdir(root).prepared`).

    Returns:
        The manifest dict, or None when `directory/manifest.json` does not exist (nothing
        prepared, or a preparation that did not finish: the manifest is its last file).
    """
    path = os.path.join(directory, MANIFEST)
    if not local_files.gfile().exists(path):
        return None
    try:
        return json.loads(read_text(path))
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {path}: {e}; delete {directory} to prepare again") from None


def check_prepared(config, manifest=None, repair=True):
    """Checks that the workdir's prepared data matches `config`; returns its manifest.

    Args:
        config: an `ExperimentConfig`.
        manifest: the manifest if already read (default: read `WORKDIR/prepared/manifest.json`).
        repair: restore a missing `WORKDIR/spm.model` from `WORKDIR/prepared/spm.model` (a
            preparation killed after its rename); False for processes that must not write.

    Returns:
        The manifest dict, or None when the workdir holds no complete preparation.

    Raises:
        DataError: the prepared data was made with other settings (another corpus, vocabulary
            size, ...) or another vocabulary; the one-line message names the difference and says
            what to delete to start over.

    Example:
    ```python
    manifest = check_prepared(config)
    manifest["counts"]["written"]
    ```
    """
    layout = Workdir.of(config)
    manifest = manifest if manifest is not None else read_manifest(layout.prepared)
    if manifest is None:
        return None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DataError(
            f"{layout.prepared} has format version {manifest.get('format_version')}, this "
            f"version reads {FORMAT_VERSION}; delete {layout.prepared} or use another --workdir"
        )
    recorded, wanted = manifest.get("settings", {}), data_settings(config.data)
    for key in list(wanted) + sorted(set(recorded) - set(wanted)):
        if recorded.get(key) != wanted.get(key):
            delete = layout.prepared
            if key in _VOCABULARY_KEYS:
                delete = f"{layout.prepared} and {layout.spm}"
            raise DataError(
                f"{key} differs from the prepared data in {layout.prepared}: prepared with "
                f"{recorded.get(key)!r}, the config says {wanted.get(key)!r}; delete {delete} "
                "to prepare again, or use another --workdir"
            )
    sha256 = manifest["vocabulary"]["sha256"]
    if not local_files.gfile().exists(layout.spm):
        if repair:
            copy_model(os.path.join(layout.prepared, VOCABULARY), layout.spm)
    elif file_digest(layout.spm)[1] != sha256:
        raise DataError(
            f"{layout.spm} differs from the vocabulary the data in {layout.prepared} was "
            f"tokenized with (sha256 {sha256[:12]}...); delete {layout.prepared} and "
            f"{layout.spm} to prepare again, or use another --workdir"
        )
    verify_shards(layout.prepared, manifest)
    return manifest


def verify_shards(directory, manifest):
    """Checks every shard of a prepared directory against the manifest: the size always, the
    sha256 where the manifest has one (preparations from before checksums have sizes only).

    Reading the shards costs about a second per GB (once, at the start of `train`); it stops a
    truncated or changed shard before training instead of a crash mid-run (TFRecord's CRC) or
    silently missing examples.

    Raises:
        DataError: one line naming the shard, what is wrong and what to run.
    """
    for shard in manifest.get("shards", []):
        path = os.path.join(directory, shard["file"])
        problem = file_problem(path, shard.get("bytes"), shard.get("sha256"))
        if problem:
            raise DataError(
                f"prepared shard {path} is corrupted ({problem}, see {MANIFEST}): delete "
                f"{directory} and run keras-transformer prepare (or train) again"
            )
