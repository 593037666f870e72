"""The vocabulary a preparation trained, kept until its shards are complete.

Training the SentencePiece vocabulary is about half of `prepare` on a large corpus. Once it is
trained, `prepare` keeps a copy in the workdir (`WORKDIR/prepare.vocabulary.model`, `.vocab`, then
`WORKDIR/prepare.vocabulary.json` last: its settings, sha256 and the counts the manifest
needs), so that a preparation stopped by SIGTERM (or killed) during its shards goes on from
the vocabulary instead of sampling and training it again. The shards are then the same bytes
as an uninterrupted run's, and so is the manifest (but its timings). Both files are removed
once the preparation is complete; a record whose settings or sha256 do not match is ignored.
"""

import hashlib
import json
import os

from keras_transformer.data.tokenizer import copy_model, vocab_path
from keras_transformer.workdir import read_text, write_atomically

MODEL = "prepare.vocabulary.model"
RECORD = "prepare.vocabulary.json"


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def keep(root, model_path, record):
    """Keeps the trained vocabulary `model_path` (`spm.model`, and SentencePiece's `spm.vocab`
    beside it) and `record` (JSON-able: the vocabulary's settings, `pairs`,
    `sample_sentences`, `phase_seconds`) in the workdir `root`."""
    proto = copy_model(model_path, os.path.join(root, MODEL))
    record = dict(record, sha256=hashlib.sha256(proto).hexdigest())
    write_atomically(os.path.join(root, RECORD), json.dumps(record, indent=1))


def restore(root, settings, model_path):
    """Writes the vocabulary kept in `root` to `model_path` (and its `.vocab`) when it was
    trained with `settings` (a dict) and is whole; returns its record, else None."""
    gfile = _gfile()
    try:
        record = json.loads(read_text(os.path.join(root, RECORD)))
        with gfile.GFile(os.path.join(root, MODEL), "rb") as f:
            proto = f.read()
    except Exception:  # absent, torn or unreadable: train it again
        return None
    if record.get("settings") != settings:
        return None
    if hashlib.sha256(proto).hexdigest() != record.get("sha256"):
        return None
    copy_model(os.path.join(root, MODEL), model_path, proto)
    return record


def forget(root):
    """Removes the kept vocabulary (the preparation is complete)."""
    gfile = _gfile()
    for name in (RECORD, MODEL, vocab_path(MODEL)):
        path = os.path.join(root, name)
        if gfile.exists(path):
            gfile.remove(path)
