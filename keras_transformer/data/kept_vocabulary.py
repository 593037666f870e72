"""The vocabulary a preparation trained, kept until its shards are complete.

Training the SentencePiece vocabulary is about half of `prepare` on a large corpus. Once it is
trained, `prepare` keeps a copy in the workdir (`WORKDIR/prepare.vocabulary.model`, then
`WORKDIR/prepare.vocabulary.json` last: its settings, sha256 and the counts the manifest
needs), so that a preparation stopped by SIGTERM (or killed) during its shards goes on from
the vocabulary instead of sampling and training it again. The shards are then the same bytes
as an uninterrupted run's, and so is the manifest (but its timings). Both files are removed
once the preparation is complete; a record whose settings or sha256 do not match is ignored.
"""

import hashlib
import json
import os

from keras_transformer.workdir import read_text, write_atomically

MODEL = "prepare.vocabulary.model"
RECORD = "prepare.vocabulary.json"


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def keep(root, proto, record):
    """Keeps the trained vocabulary `proto` (bytes) and `record` (JSON-able: the vocabulary's
    settings, `pairs`, `sample_sentences`, `phase_seconds`) in the workdir `root`."""
    write_atomically(os.path.join(root, MODEL), proto)
    record = dict(record, sha256=hashlib.sha256(proto).hexdigest())
    write_atomically(os.path.join(root, RECORD), json.dumps(record, indent=1))


def kept(root, settings):
    """`(proto, record)` of the vocabulary kept in `root` when it was trained with `settings`
    (a dict) and is whole; else None."""
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
    return proto, record


def forget(root):
    """Removes the kept vocabulary (the preparation is complete)."""
    gfile = _gfile()
    for name in (RECORD, MODEL):
        path = os.path.join(root, name)
        if gfile.exists(path):
            gfile.remove(path)
