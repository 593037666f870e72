"""Prepared data: a training corpus streamed once into sharded, tokenized examples on disk.

`prepare(config)` is the paper-scale path (like fairseq-preprocess or tensor2tensor's datagen):
it reads the training corpus as a stream, trains the shared SentencePiece vocabulary on a bounded,
seeded random sample of its sentences (reservoir sampling: at most `data.spm_max_sentences`
sentences are ever held), then tokenizes every pair and writes the ids to TFRecord shards with a
manifest. Memory does not grow with the corpus; training then streams the shards with tf.data
(`data.prepared.prepared_dataset`, the reader), each worker of a multi-worker job reading its
own files.

```
WORKDIR/
  spm.model                   the vocabulary (a copy of prepared/spm.model, where export reads it)
  prepared/
    manifest.json             written last: the completion marker (see below)
    spm.model                 the vocabulary the shards were tokenized with
    train-00000-of-00016.tfrecord ...
```

Atomicity: on the local disk everything of one preparation is written into a sibling
directory (`WORKDIR/prepared.partial`) that is renamed to `WORKDIR/prepared` in one step once
complete; on other filesystems (`gs://...`: no atomic directory rename) the files are written
into `WORKDIR/prepared` itself, `manifest.json` last. Either way a preparation killed midway
leaves no `prepared/manifest.json` and is never taken as done. Stopped (SIGTERM) or killed, it
goes on where it was: a trained vocabulary is kept (`kept_vocabulary`), and on the local disk
so are the segments of the shards that were complete (`prepare_progress`: the next run cuts the
shards back to them, encodes only the rest, and writes the same bytes as an uninterrupted run);
elsewhere the shards are written again. Every path goes through `tf.io.gfile` (any TensorFlow
filesystem).
`WORKDIR/spm.model` is installed after the rename; a
kill between the two is repaired by `check_prepared`, which restores it from `prepared/spm.model`
and refuses a `spm.model` whose sha256 differs from the manifest's.

Records: one per pair (two with `data.both_directions`), its SentencePiece ids packed as raw
integers, and what `data.long_pairs` does with overlong pairs: see `encoding`.

Parallel: `data.prepare_workers` N (default: the machine's cores) is the CPUs `prepare` uses. The
vocabulary trains on N CPUs (with SentencePiece threads as many as the machine's cores whatever N:
their number changes the vocabulary, the CPUs they run on do not), then N processes each read the
corpus, encode their share of it (segments of 65,536 pairs, every Nth) into local files, and this
process appends those to the shards in the corpus's order as they come, with their sha256: the
shards are byte-identical whatever N (see `workers.ShardJob`). (Except the sampled segmentations of
`data.subword_samples`: SentencePiece seeds them, per chunk here, but its samples still differ
from one process to the next, so those vary between preparations whatever the number of
workers.)

The jobs live in their own modules: `manifest` (what the manifest records, reading it,
`check_prepared`), `vocabulary` (the sample and the training), `encoding` (pairs into records),
`workers` (the processes of pass 2 and its segments), `shards` (pass 2: the shards and their
counts), `statistics` (progress lines, length statistics, the summary); `prepare_progress` and
`kept_vocabulary` are what a stopped preparation continues from. This module runs them in order.
"""

import json
import os
import time

from keras_transformer import local_files, stopping
from keras_transformer.data import corpora, kept_vocabulary, prepare_progress, vocabulary
from keras_transformer.data.manifest import (  # also importable from here, as before the split
    MANIFEST,
    VOCABULARY,
    check_prepared,
    manifest_head,
    read_manifest,  # noqa: F401 (the trainer and the commands import it from here)
    verify_shards,  # noqa: F401 (benchmarks/integrity_cost.py imports it from here)
)
from keras_transformer.data.shards import write_shards
from keras_transformer.data.statistics import log, summary
from keras_transformer.data.tokenizer import copy_model
from keras_transformer.data.workers import PHASE, WorkerPool
from keras_transformer.errors import Preempted
from keras_transformer.lock import fence
from keras_transformer.workdir import Workdir, is_local, remove_tree, write_atomically

# What a preparation stopped before its shards keeps.
_KEPT = "the trained vocabulary is kept"


def _remove_leftovers(layout):
    """Removes what preparations killed midway left and cannot be continued: `prepared/`
    without its manifest, the temporary directories of older versions (`prepared.tmp-*`), a
    `prepared.partial/` without its progress (see `prepare_progress`)."""
    gfile = local_files.gfile()
    for path in gfile.glob(os.path.join(layout.root, "prepared.tmp-*")):
        remove_tree(path)
    prepared = layout.prepared
    if gfile.isdir(prepared) and not gfile.exists(os.path.join(prepared, MANIFEST)):
        remove_tree(prepared)
    if not prepare_progress.has_progress(layout.root):
        remove_tree(os.path.join(layout.root, prepare_progress.PARTIAL))


def _temporary_directory(layout):
    """Where a preparation is written: on the local disk `prepared.partial/`, a sibling of
    `prepared/` renamed once complete (kept when stopped, to be continued); `prepared/` itself
    elsewhere (no atomic directory rename: the manifest, written last, marks it complete)."""
    if is_local(layout.root):
        directory = os.path.join(layout.root, prepare_progress.PARTIAL)
        os.makedirs(directory, exist_ok=True)
        return directory
    local_files.gfile().makedirs(layout.prepared)
    return layout.prepared


def _workers(data_config):
    """`data.prepare_workers`, or the machine's cores when it is null."""
    return int(data_config.prepare_workers or max(1, os.cpu_count() or 1))


def prepare(config, verbose=True):
    """Streams the training corpus once into a vocabulary and sharded, tokenized examples.

    Reads `config.data.train` as a stream, trains the SentencePiece vocabulary on a seeded
    reservoir sample of at most `data.spm_max_sentences` sentences (both sides; skipped when
    `WORKDIR/spm.model` already exists, which is then used as is), tokenizes every pair and writes
    them round robin to TFRecord shards in `WORKDIR/prepared` with `manifest.json`. Memory stays
    bounded by the sample and a chunk of a few thousand pairs, whatever the corpus size. Prints
    progress (lines/s, pairs written, ETA when the size is known) and a summary to stderr.

    A workdir that is already prepared is checked against `config` and reused (nothing is
    read); see `check_prepared`. Only one process should prepare a workdir (the chief of a
    multi-worker job); others wait until `WORKDIR/prepared/manifest.json` exists. A
    preparation that was stopped (SIGTERM: `errors.Preempted`) continues from its trained
    vocabulary and, on the local disk, from the last complete segment of its shards.

    Args:
        config: an `ExperimentConfig` (`data.*` and `runtime.workdir`).
        verbose: print progress and the summary.

    Returns:
        The manifest dict: `format_version`, `settings` (the config keys the data depends on),
        `vocabulary` (`sha256`, `pieces`, `trained`, `sample_sentences`), `counts` (`lines`
        read, pairs `written`, `skipped` by reason: `empty`, `invalid_utf8`, `malformed`,
        `too_long`; `truncated`; `segmentations` of each pair and its `directions`, and the
        `records` they make, see `data.subword_samples` and `data.both_directions`), `shards`
        (`file`, `pairs` (records), `bytes`, `sha256` each),
        `record_dtype`, `tokens` (totals and length statistics), `seconds`, `phase_seconds`
        (`vocabulary_sample`, `vocabulary_training` when it trained one, `shards`).

    Raises:
        DataError: unreadable corpus, empty result, or a prepared workdir that does not match.

    Example:
    ```python
    manifest = prepare(load_config("configs/quickstart.yaml"))
    manifest["counts"]["written"], len(manifest["shards"])
    # -> (20000, 16)
    ```
    """
    layout = Workdir.of(config)
    existing = check_prepared(config)
    if existing is not None:
        log(
            f"using the prepared data in {layout.prepared} "
            f"({existing['counts']['written']:,} pairs)",
            verbose,
        )
        return existing
    local_files.gfile().makedirs(layout.root)
    root = layout.root
    _remove_leftovers(layout)
    d = config.data
    started = time.time()
    temporary = _temporary_directory(layout)
    pool, phases = WorkerPool(_workers(d)), {}
    try:
        path = os.path.join(temporary, VOCABULARY)
        total, trained, sampled = vocabulary.install_or_train(
            config, layout, path, verbose, pool, phases
        )
        if total is None:  # a file corpus with an existing vocabulary: count it for the shards
            counter = corpora.Counter(d.train)
            total = sum(1 for _ in corpora.iter_training_pairs(d.train, counter, verbose=False))
        log(f"tokenizing {total:,} pairs into shards ({_workers(d)} workers) ...", verbose)
        with local_files.gfile().GFile(path, "rb") as f:
            proto = f.read()
        stopping.check(PHASE, _KEPT if trained else "nothing half-written")
        manifest = manifest_head(d, proto, trained, sampled)
        shards_started = time.time()
        manifest.update(write_shards(config, proto, temporary, total, verbose, pool, root))
        pool.close()
        phases["shards"] = time.time() - shards_started
        manifest["seconds"] = round(time.time() - started, 1)
        manifest["phase_seconds"] = {k: round(v, 1) for k, v in phases.items()}
        manifest["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # The manifest is the last file written: its presence means complete.
        write_atomically(os.path.join(temporary, MANIFEST), json.dumps(manifest, indent=1))
        if temporary != layout.prepared:
            fence(layout.prepared, "the prepared data")
            os.rename(temporary, layout.prepared)
    except (Preempted, KeyboardInterrupt):
        raise  # stopped: what is complete is kept (the vocabulary, segments of the shards)
    except BaseException:
        if temporary != layout.prepared:
            remove_tree(temporary)
            prepare_progress.forget(root)
        raise
    finally:
        pool.close()
    prepare_progress.forget(root)
    if not local_files.gfile().exists(layout.spm):
        copy_model(os.path.join(layout.prepared, VOCABULARY), layout.spm)
    kept_vocabulary.forget(layout.root)
    summary(manifest, layout, verbose)
    return manifest
