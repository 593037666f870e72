"""The lexical table of a vocabulary shortlist: for each source piece, the `k` target pieces it
most often translates into, and the `m` most frequent target pieces (what the searches'
shortlist, `keras_transformer.decoding.shortlist`, is made of).

The table is estimated from the prepared training pairs by sentence co-occurrence: `c(s)` the
pairs whose source holds piece `s`, `c(t)` those whose target holds `t`, `c(s, t)` those holding
both; source piece `s` keeps the `k` target pieces of the highest Dice coefficient
`2 c(s, t) / (c(s) + c(t))` (ties: the more frequent pair, then the lower id). Dice, unlike the
plain conditional frequency `c(s, t) / c(s)`, does not rank the pieces that occur everywhere
(punctuation, articles) first for every source piece: those come in through the `m` most
frequent target pieces (counted in tokens), which every shortlist holds.

The table is written in the workdir as `shortlist.npz` (`Workdir.shortlist`), atomically:
`translations` int32 `[vocab, k]` (row `s` the target pieces of source piece `s`, best first,
0-padded when it co-occurs with fewer), `frequent` int32 `[m]` and `settings` (JSON: k, m, the
pairs counted, the estimate and `spm_sha256`, the sha256 of the SentencePiece model whose ids it
holds); the file and a batch's union are `keras_transformer.lexical_table`'s (NumPy only,
re-exported here). No TensorFlow.

The table's ids are those of one SentencePiece model: after the vocabulary changes (another
`data.train`, `data.seed`, `data.terminology`, even at the same size) they point at other pieces.
An export reads it through `read_or_build_workdir_shortlist`, which rebuilds a table whose
`spm_sha256` is not that of the workdir's `spm.model` (or that has none: a table of an older
version) instead of using it.

Example:
```python
table = build_workdir_shortlist(Workdir("workdirs/quickstart"), k=100, m=100)
table.translations[piece_id]  # its 100 most likely target pieces
```
"""

import hashlib

import numpy as np

from keras_transformer import local_files
from keras_transformer.data.records import prepared_pairs
from keras_transformer.errors import DataError, first_line
from keras_transformer.lexical_table import (  # the table's file and a batch's union
    SHORTLIST_BUCKET,
    SPECIAL_IDS,
    LexicalTable,
    batch_shortlist,
    read_lexical_table,
    save_lexical_table,
)

__all__ = [
    "DEFAULT_K",
    "DEFAULT_M",
    "ESTIMATE",
    "SHORTLIST_BUCKET",
    "SPECIAL_IDS",
    "LexicalTable",
    "batch_shortlist",
    "build_lexical_table",
    "build_workdir_shortlist",
    "export_shortlist",
    "read_lexical_table",
    "read_or_build_workdir_shortlist",
    "save_lexical_table",
    "stale_reason",
]

# The defaults of `keras-transformer shortlist` (Marian's lexical shortlists use 50 / 50 to
# 100 / 100; the width of a batch's union is what the speed depends on). On Tatoeba en-de
# (`configs/small.yaml`, test BLEU 26.4) k 50 cost 0.47 BLEU and k 100 0.16; m 500 changed
# nothing over m 100 (`benchmarks/shortlist_quality.py`, ledger `shortlist_quality` 6-25).
DEFAULT_K = 100
DEFAULT_M = 100
ESTIMATE = "dice"
# The `settings` key of the sha256 of the SentencePiece model a table was built for.
SPM_KEY = "spm_sha256"
# Co-occurring (source, target) pairs counted before the counts are merged (memory bound).
_KEYS_PER_MERGE = 4_000_000


def build_lexical_table(pairs, vocab_size, k=DEFAULT_K, m=DEFAULT_M):
    """The `LexicalTable` of `pairs`, an iterable of `(source_pieces, target_pieces)` int
    arrays (no BOS/EOS; `records.prepared_pairs`), every id below `vocab_size`.

    Source piece `s` keeps its `k` target pieces of highest Dice coefficient (see the module
    docstring); `frequent` holds the `m` target pieces of most tokens (ties: the lower id).
    """
    k, m, vocab_size = int(k), int(m), int(vocab_size)
    if k < 1 or m < 0 or vocab_size < 1:
        raise ValueError(f"need k >= 1, m >= 0 and vocab_size >= 1, got {k}, {m}, {vocab_size}")
    source_counts = np.zeros(vocab_size, np.int64)  # c(s): pairs holding s
    target_counts = np.zeros(vocab_size, np.int64)  # c(t): pairs holding t
    target_tokens = np.zeros(vocab_size, np.int64)  # tokens of t
    keys, counts = np.zeros(0, np.int64), np.zeros(0, np.int64)  # s * vocab + t, c(s, t)
    pending, pending_size, total = [], 0, 0
    for source, target, *_ in pairs:  # (prepared with data.train_alignments: and links)
        source = np.unique(np.asarray(source, np.int64))
        target_all = np.asarray(target, np.int64)
        target = np.unique(target_all)
        if source.size and (source.max() >= vocab_size or source.min() < 0):
            raise DataError(f"a source piece id is out of the vocabulary of {vocab_size}")
        if target.size and (target.max() >= vocab_size or target.min() < 0):
            raise DataError(f"a target piece id is out of the vocabulary of {vocab_size}")
        total += 1
        source_counts[source] += 1
        target_counts[target] += 1
        np.add.at(target_tokens, target_all, 1)
        pending.append((source[:, None] * vocab_size + target[None, :]).ravel())
        pending_size += pending[-1].size
        if pending_size >= _KEYS_PER_MERGE:
            keys, counts = _merge(keys, counts, pending)
            pending, pending_size = [], 0
    keys, counts = _merge(keys, counts, pending)
    sources, targets = keys // vocab_size, keys % vocab_size
    dice = 2.0 * counts / (source_counts[sources] + target_counts[targets])
    # Per source, best first: the highest Dice, then the most pairs, then the lower id.
    order = np.lexsort((targets, -counts, -dice, sources))
    sources, targets = sources[order], targets[order]
    first = np.searchsorted(sources, sources, side="left")  # each entry's group start
    rank = np.arange(sources.size) - first  # its place in its source's list
    keep = rank < k
    translations = np.zeros((vocab_size, k), np.int32)
    translations[sources[keep], rank[keep]] = targets[keep]
    frequent = np.lexsort((np.arange(vocab_size), -target_tokens))[:m]
    frequent = frequent[target_tokens[frequent] > 0].astype(np.int32)
    settings = {"k": k, "m": m, "pairs": total, "estimate": ESTIMATE}
    return LexicalTable(translations, frequent, settings)


def _merge(keys, counts, pending):
    """`(keys, counts)` with the keys of `pending` (arrays of keys, one count each) added."""
    if not pending:
        return keys, counts
    new_keys, new_counts = np.unique(np.concatenate(pending), return_counts=True)
    all_keys = np.concatenate([keys, new_keys])
    merged, where = np.unique(all_keys, return_inverse=True)
    total = np.zeros(merged.size, np.int64)
    np.add.at(total, where, np.concatenate([counts, new_counts]))
    return merged, total


def build_workdir_shortlist(workdir, k=DEFAULT_K, m=DEFAULT_M, vocab_size=None):
    """Builds the lexical table of `workdir` (a `Workdir`) from its prepared pairs, writes it
    to `workdir.shortlist` and returns it, its `settings` holding the fingerprint of the
    workdir's SentencePiece model (`spm_sha256`: the sha256 of the file's bytes). `vocab_size`:
    the pieces of that model (None: read from `workdir.spm`). `DataError` without a
    SentencePiece model or prepared pairs."""
    spm_bytes = _spm_bytes(workdir.spm)
    if vocab_size is None:
        vocab_size = _piece_count(spm_bytes)
    table = build_lexical_table(prepared_pairs(workdir.prepared), vocab_size, k, m)
    table = LexicalTable(
        table.translations, table.frequent, {**table.settings, SPM_KEY: _sha256(spm_bytes)}
    )
    save_lexical_table(table, workdir.shortlist)
    return table


def stale_reason(table, spm_path):
    """Why `table` (a `LexicalTable`) is not the table of the SentencePiece model at
    `spm_path`, or None when it is: its recorded fingerprint is another model's, or missing
    (a table of an older version, whose ids may be another vocabulary's), or its rows are not
    the model's pieces. `DataError` without a SentencePiece model."""
    spm_bytes = _spm_bytes(spm_path)
    recorded = (table.settings or {}).get(SPM_KEY)
    if recorded is None:
        return "it records no SentencePiece model (a table of an older version)"
    if recorded != _sha256(spm_bytes):
        return "it was built for another SentencePiece model"
    pieces = _piece_count(spm_bytes)
    if table.vocab_size != pieces:
        return f"it has {table.vocab_size} source rows, the SentencePiece model {pieces} pieces"
    return None


def read_or_build_workdir_shortlist(workdir):
    """`(table, built)`: the lexical table of `workdir` (a `Workdir`) that an export with
    `export.shortlist` uses: `workdir.shortlist` when it exists and was built for the
    workdir's SentencePiece model (`stale_reason`), else built from the prepared pairs and
    written there (over a stale table, with its `k` and `m`). `built`: False when read, else
    why it was built (a phrase: "missing", or the stale table's reason). `DataError` when it
    cannot be built (no SentencePiece model, no prepared pairs, a shard missing or
    unreadable), naming the stale table where there is one."""
    if not local_files.gfile().exists(workdir.shortlist):
        return build_workdir_shortlist(workdir), "missing"
    try:
        table = read_lexical_table(workdir.shortlist)
        reason = stale_reason(table, workdir.spm)
        sizes = {key: table.settings.get(key, default) for key, default in
                 (("k", table.translations.shape[1]), ("m", table.frequent.size))}  # fmt: skip
    except (DataError, ValueError) as e:  # no SentencePiece model, or not a table
        if not local_files.gfile().exists(workdir.spm):
            raise
        reason, sizes = f"it cannot be read ({first_line(e)})", {}
    if reason is None:
        return table, False
    try:
        return build_workdir_shortlist(workdir, **sizes), reason
    except (DataError, OSError, *local_files.not_found_errors()) as e:
        raise DataError(
            f"{workdir.shortlist} is stale ({reason}) and cannot be rebuilt: {first_line(e)}"
        ) from None


def export_shortlist(workdir, required=True):
    """The lexical table an export of `workdir` (a `Workdir`) decodes over
    (`read_or_build_workdir_shortlist`: read, or built when missing or stale), saying in one
    line on stdout when it was built. Where it cannot be built (no prepared pairs, a shard
    missing or unreadable, no SentencePiece model): `DataError` (one line) when `required`
    (`export.shortlist: true`, `--shortlist`), else None, said in one line on stderr
    (`export.shortlist` null: the export decodes over the whole vocabulary, and the end of a
    training run is not lost to it). A stale table is never used as it is."""
    import sys

    try:
        table, built = read_or_build_workdir_shortlist(workdir)
    except (DataError, OSError, *local_files.not_found_errors()) as e:
        if required:
            raise DataError(first_line(e)) from None
        print(
            f"no vocabulary shortlist ({first_line(e)}): decoding over the whole vocabulary",
            file=sys.stderr,
        )
        return None
    if built == "missing":
        print(f"built the vocabulary shortlist {workdir.shortlist}")
    elif built:
        print(f"rebuilt the vocabulary shortlist {workdir.shortlist}: {built}")
    return table


def _spm_bytes(spm_path):
    """The bytes of the SentencePiece model at `spm_path`; `DataError` when there is none."""
    gfile = local_files.gfile()
    if not gfile.exists(spm_path):
        raise DataError(f"no SentencePiece model at {spm_path} (run keras-transformer prepare)")
    with gfile.GFile(spm_path, "rb") as f:
        return f.read()


def _sha256(data):
    return hashlib.sha256(data).hexdigest()


def _piece_count(spm_bytes):
    """The number of pieces of the SentencePiece model serialized in `spm_bytes`."""
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_proto=spm_bytes).get_piece_size()
