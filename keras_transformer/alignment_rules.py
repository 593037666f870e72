"""Word alignments from attended pieces: the rules that turn the source piece each target piece
attends to most into word alignments, written once for both engines: the SavedModel's graph
(`export.alignment_graph`, on `keras.ops`) and the LiteRT runtime (`litert.runtime`, on
numpy). Each takes the array namespace `xp` it runs on first (`keras.ops`, or
`constraint_rules.NUMPY`). Pieces map to words by `keras_transformer.word_rules` (`word_indices`
and `piece_flags` are its own, re-exported here). Imports numpy, `constraint_rules` and
`word_rules` only: the LiteRT runtime loads neither TensorFlow nor Keras.
"""

import numpy as np

from keras_transformer.constraint_rules import NUMPY
from keras_transformer.word_rules import WORD_MARKER, piece_flags, word_indices

__all__ = [
    "WORD_MARKER",
    "numpy_word_alignment",
    "piece_flags",
    "word_alignment",
    "word_indices",
    "word_pairs",
]


def word_alignment(xp, piece, source_word, target_word, starts, words_out, words_in):
    """Target pieces' chosen source pieces -> `(alignment int32 [r, words_out], words int32
    [r])`: each target word's source word, -1 past the translation's `words` words.

    Args:
        piece: int32 `[r, T]`, the source piece each target piece attends to most
            (`export.alignment_graph.attended_pieces`).
        source_word: int32 `[r, S]`, `word_indices`' words of the source pieces.
        target_word, starts: `word_indices` of the target pieces.
        words_out, words_in: the most target and source words (the longest output and input).

    Each target word gets the source word that most of its pieces are aligned to (a tie: its
    first piece's); a word with no piece aligned to source text gets -1."""
    aligned = xp.take_along_axis(source_word, piece, axis=1)  # [r, T]: -1 without source text
    target_hot = xp.cast(xp.equal(xp.expand_dims(target_word, -1), xp.arange(words_out)), "float32")
    source_hot = xp.cast(xp.equal(xp.expand_dims(aligned, -1), xp.arange(words_in)), "float32")
    votes = xp.einsum("rtw,rts->rws", target_hot, source_hot)  # [r, W, S']
    # Half a vote more for the first piece's source word: a tie goes to it.
    first = source_hot * xp.expand_dims(xp.cast(starts, "float32"), -1)
    votes = votes + 0.5 * xp.einsum("rtw,rts->rws", target_hot, first)
    best = xp.cast(xp.argmax(votes, axis=-1), "int32")
    alignment = xp.where(xp.greater(xp.max(votes, axis=-1), 0), best, -1)
    return alignment, xp.sum(xp.cast(starts, "int32"), axis=1)


def numpy_word_alignment(piece, source_ids, ids, flags, special, words_out, words_in):
    """`word_alignment` in numpy from ids (the LiteRT runtime's road): `piece` int32 `[r, T]`,
    `source_ids` `[r, S]` and `ids` `[r, T]` (padded), `flags` `piece_flags` of the
    vocabulary (`piece_flags`), `special` the ids that are not text (padding, EOS)."""
    lone, marked, unknown = flags

    def words(x, translation):
        x = np.asarray(x)
        found = unknown[x] if translation else None  # " ⁇ " is a word of a translation only
        return word_indices(NUMPY, ~np.isin(x, special), lone[x], marked[x], found)

    source_word, _ = words(source_ids, False)
    target_word, starts = words(ids, True)
    return word_alignment(NUMPY, np.asarray(piece), source_word, target_word, starts,
                          words_out, words_in)  # fmt: skip


def word_pairs(row):
    """A row of `word_alignment`'s alignment (each target word's source word, -1 for none)
    -> its `(source word, target word)` pairs."""
    return [(i, j) for j, i in enumerate(row) if i >= 0]
