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
pairs counted, the estimate). NumPy only: no TensorFlow.

Example:
```python
table = build_workdir_shortlist(Workdir("workdirs/quickstart"), k=50, m=100)
table.translations[piece_id]  # its 50 most likely target pieces
```
"""

import dataclasses
import io
import json

import numpy as np

from keras_transformer import local_files
from keras_transformer.data.records import prepared_pairs
from keras_transformer.errors import DataError
from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from keras_transformer.workdir import write_atomically

# The defaults of `keras-transformer shortlist` (Marian's lexical shortlists use 50 / 50 to
# 100 / 100; the width of a batch's union is what the speed depends on).
DEFAULT_K = 50
DEFAULT_M = 100
ESTIMATE = "dice"
# The width of a batch's shortlist is a multiple of this (`batch_shortlist`'s `bucket`).
SHORTLIST_BUCKET = 64
# Always in a batch's shortlist: padding and BOS (their probability enters the normaliser as in
# the unrestricted search, which then bans them), UNK and EOS.
SPECIAL_IDS = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
# Co-occurring (source, target) pairs counted before the counts are merged (memory bound).
_KEYS_PER_MERGE = 4_000_000


@dataclasses.dataclass(frozen=True)
class LexicalTable:
    """A vocabulary shortlist's lexical table (see the module docstring).

    Args:
        translations: int32 `[vocab, k]`, row `s` the target pieces of source piece `s`.
        frequent: int32 `[m]`, the most frequent target pieces, most frequent first.
        settings: how it was built (`k`, `m`, `pairs`, `estimate`).
    """

    translations: np.ndarray
    frequent: np.ndarray
    settings: dict = dataclasses.field(default_factory=dict)

    @property
    def vocab_size(self):
        """Source pieces the table has a row for."""
        return int(self.translations.shape[0])


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
    for source, target in pairs:
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


def batch_shortlist(translations, frequent, source_ids, extra_ids=None, bucket=SHORTLIST_BUCKET):
    """A batch's shortlist in NumPy: `(ids int32 [n], real bool [n])`, what the graph's
    `keras_transformer.decoding.shortlist.shortlist_ids` gives (its arguments) for the runtimes
    without TensorFlow (the LiteRT runtime).

    The union of the table's `translations` of every piece of `source_ids` (0-padded), the
    `frequent` ids, `SPECIAL_IDS` and the non-zero `extra_ids` (a forced prefix's), in
    increasing order, then padding columns (`real` False, id `PAD_ID`) up to the smallest
    multiple of `bucket` holding it.
    """
    source_ids = np.asarray(source_ids, np.int64).reshape(-1)
    parts = [
        np.asarray(translations)[source_ids].reshape(-1),
        np.asarray(frequent).reshape(-1),
        np.asarray(SPECIAL_IDS),
    ]
    if extra_ids is not None:
        parts.append(np.asarray(extra_ids).reshape(-1))
    union = np.unique(np.concatenate(parts).astype(np.int32))
    n = -(-union.size // int(bucket)) * int(bucket)
    ids = np.full(n, PAD_ID, np.int32)
    ids[: union.size] = union
    return ids, np.arange(n) < union.size


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


def save_lexical_table(table, path):
    """Writes `table` to `path` (npz) atomically: it appears whole or not at all."""
    buffer = io.BytesIO()
    np.savez(
        buffer,
        translations=np.asarray(table.translations, np.int32),
        frequent=np.asarray(table.frequent, np.int32),
        settings=np.array(json.dumps(table.settings, sort_keys=True)),
    )
    return write_atomically(path, buffer.getvalue())


def read_lexical_table(path, gfile=None):
    """The `LexicalTable` saved at `path` (any TensorFlow filesystem when TensorFlow is
    installed, else local), read through `gfile` when given (`local_files.LocalGfile`: local
    files without importing TensorFlow, as the LiteRT runtime reads them)."""
    gfile = local_files.gfile() if gfile is None else gfile
    if not gfile.exists(path):
        raise DataError(f"no shortlist table at {path} (run keras-transformer shortlist)")
    with gfile.GFile(path, "rb") as f:
        data = f.read()
    with np.load(io.BytesIO(data), allow_pickle=False) as saved:
        try:
            translations = saved["translations"].astype(np.int32)
            frequent = saved["frequent"].astype(np.int32)
            settings = json.loads(str(saved["settings"]))
        except KeyError as error:
            raise DataError(f"{path} is not a shortlist table (missing {error})") from None
    if translations.ndim != 2 or frequent.ndim != 1:
        raise DataError(f"{path} is not a shortlist table (shapes {translations.shape})")
    return LexicalTable(translations, frequent, settings)


def build_workdir_shortlist(workdir, k=DEFAULT_K, m=DEFAULT_M, vocab_size=None):
    """Builds the lexical table of `workdir` (a `Workdir`) from its prepared pairs, writes it
    to `workdir.shortlist` and returns it. `vocab_size`: the pieces of its SentencePiece model
    (None: read from `workdir.spm`)."""
    if vocab_size is None:
        vocab_size = _piece_count(workdir.spm)
    table = build_lexical_table(prepared_pairs(workdir.prepared), vocab_size, k, m)
    save_lexical_table(table, workdir.shortlist)
    return table


def _piece_count(spm_path):
    """The number of pieces of the SentencePiece model at `spm_path`."""
    import sentencepiece as spm

    gfile = local_files.gfile()
    if not gfile.exists(spm_path):
        raise DataError(f"no SentencePiece model at {spm_path} (run keras-transformer prepare)")
    with gfile.GFile(spm_path, "rb") as f:
        processor = spm.SentencePieceProcessor(model_proto=f.read())
    return processor.get_piece_size()
