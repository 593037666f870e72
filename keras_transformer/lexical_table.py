"""A vocabulary shortlist's lexical table as a file, and a batch's shortlist from it, in NumPy
only: what every engine reads (the graph search, the LiteRT runtime without TensorFlow or
Keras, the CTranslate2 vocabulary map). `keras_transformer.data.shortlist` builds the table;
`keras_transformer.decoding.shortlist` is the graph's twin of `batch_shortlist`.
"""

import dataclasses
import io
import json

import numpy as np

from keras_transformer import local_files
from keras_transformer.errors import DataError
from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from keras_transformer.workdir import write_atomically

# The width of a batch's shortlist is a multiple of this (`batch_shortlist`'s `bucket`).
SHORTLIST_BUCKET = 64
# Always in a batch's shortlist: padding and BOS (their probability enters the normaliser as in
# the unrestricted search, which then bans them), UNK and EOS.
SPECIAL_IDS = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)


@dataclasses.dataclass(frozen=True)
class LexicalTable:
    """A vocabulary shortlist's lexical table (see the module docstring).

    Args:
        translations: int32 `[vocab, k]`, row `s` the target pieces of source piece `s`.
        frequent: int32 `[m]`, the most frequent target pieces, most frequent first.
        settings: how it was built (`k`, `m`, `pairs`, `estimate`, and `spm_sha256`: the
            sha256 of the SentencePiece model whose ids it holds).
    """

    translations: np.ndarray
    frequent: np.ndarray
    settings: dict = dataclasses.field(default_factory=dict)

    @property
    def vocab_size(self):
        """Source pieces the table has a row for."""
        return int(self.translations.shape[0])


def row_pieces(translations, source_ids):
    """int `[batch, s_len * k]` (`source_ids` int `[batch, s_len]`): the table's target pieces
    of each row's source pieces, a padding position's none (0, the padding id, which every
    shortlist holds): a row's shortlist is the same whatever padding its batch gives it."""
    pieces = _source_pieces(translations, source_ids)  # [batch, s_len, k]
    return _by_row(pieces, pieces.shape[0])


def _source_pieces(translations, source_ids):
    """`translations[source_ids]` (`[..., k]`), 0 at padding positions."""
    source_ids = np.asarray(source_ids, np.int64)
    pieces = np.asarray(translations)[source_ids]
    return np.where((source_ids != PAD_ID)[..., None], pieces, PAD_ID)


def glossary_pieces(xp, source_ids, separator_id, end_id):
    """int32 `[batch, s_len]`: the pieces of each row's glossary translations, the pieces between
    a `<trans>` (`separator_id`) and its `</term>` (`end_id`) of an annotated source
    (`keras_transformer.glossary`), 0 elsewhere: target pieces a soft glossary asks for, which
    each row's shortlist holds. `xp`: `keras.ops` or `constraint_rules.NUMPY`."""
    source_ids = xp.cast(source_ids, "int32")
    opened = xp.cumsum(xp.cast(xp.equal(source_ids, separator_id), "int32"), axis=1)
    closed = xp.cumsum(xp.cast(xp.equal(source_ids, end_id), "int32"), axis=1)
    inside = xp.logical_and(
        xp.greater(opened, closed), xp.not_equal(source_ids, separator_id)
    )  # [batch, s_len] after a <trans>, before its </term>
    return xp.where(inside, source_ids, xp.zeros_like(source_ids))


def batch_shortlist(translations, frequent, source_ids, extra_ids=None, bucket=SHORTLIST_BUCKET):
    """A batch's shortlist in NumPy: `(ids int32 [n], real bool [n])`, what the graph's
    `keras_transformer.decoding.shortlist.row_shortlists` gives as its columns for the runtimes
    without TensorFlow (the LiteRT runtime).

    The union of the table's `translations` of every piece of `source_ids` (0-padded; a padding
    position adds none), the `frequent` ids, `SPECIAL_IDS` and the non-zero `extra_ids` (a
    forced prefix's), in increasing order, then padding columns (`real` False, id `PAD_ID`) up
    to the smallest multiple of `bucket` holding it. Each row's own part of it:
    `row_shortlists`.
    """
    parts = [
        _source_pieces(translations, source_ids).reshape(-1),
        np.asarray(frequent).reshape(-1),
        np.asarray(SPECIAL_IDS),
    ]
    if extra_ids is not None:
        parts.append(np.asarray(extra_ids).reshape(-1))
    return _columns(np.concatenate(parts), bucket)


def _columns(wanted, bucket):
    """`(ids, real)`: the distinct ids of `wanted` in increasing order, then padding columns
    up to a multiple of `bucket`."""
    union = _sorted_union(wanted.astype(np.int32))
    n = -(-union.size // int(bucket)) * int(bucket)
    ids = np.full(n, PAD_ID, np.int32)
    ids[: union.size] = union
    return ids, np.arange(n) < union.size


def row_shortlists(translations, frequent, source_ids, extras=(), bucket=SHORTLIST_BUCKET):
    """A batch's shortlist and each row's own: `(ids int32 [n], real bool [n], member bool
    [batch, n])`, `ids`/`real` the batch's (`batch_shortlist`, the union of the rows') and
    `member[b, j]` whether column `j` is in row `b`'s own shortlist: the table's translations
    of its source pieces, the frequent and special ids and its own `extras` (a sequence of int
    arrays `[batch, ...]`, 0 ignored: its prefix, its constraints, its glossary's pieces). A
    search that masks each row to its own columns answers each row as it answers it alone
    (the graph's twin: `decoding.shortlist.row_shortlists`).
    """
    source_ids = np.asarray(source_ids, np.int64)
    batch = source_ids.shape[0]
    own = [row_pieces(translations, source_ids)]
    own += [_by_row(np.asarray(x, np.int64), batch) for x in extras if x is not None]
    own = np.concatenate(own, axis=1)  # [batch, P]
    common = np.concatenate([np.asarray(frequent).reshape(-1), SPECIAL_IDS])
    ids, real = _columns(np.concatenate([own.reshape(-1), common]), bucket)  # the union
    marks = np.zeros((batch, int(ids.max(initial=0)) + 1), bool)
    marks[np.arange(batch)[:, None], own] = True
    member = marks[:, ids] & real  # [batch, n]
    return ids, real, member | (np.isin(ids, common) & real)


def _by_row(x, batch):
    """`x` `[batch, ...]` as `[batch, rest]`."""
    return x.reshape(batch, int(np.prod(x.shape[1:])))


def _sorted_union(values):
    """`np.unique(values)` (int32), for ids by marking each in a table as long as the largest:
    linear, where `np.unique`'s sort or hash costs 2.7-4.0 ms on a served batch's 100,000 ids
    (32 sentences of 32 pieces, 100 translations each)."""
    if values.size == 0:
        return np.unique(values)
    largest = int(values.max())
    if values.min() < 0 or largest >= 2**24:  # not a vocabulary's ids
        return np.unique(values)
    present = np.zeros(largest + 1, bool)
    present[values] = True
    return np.flatnonzero(present).astype(np.int32)


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
