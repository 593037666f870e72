"""Word alignments from attended pieces: the rules that turn the source piece each target piece
attends to most into word alignments, written once for both engines: the SavedModel's graph
(`export.alignment_graph`, on `keras.ops`) and the LiteRT runtime (`litert.runtime`, on
numpy). Each takes the array namespace `xp` it runs on first (`keras.ops`, or
`constraint_rules.NUMPY`). Imports numpy and `constraint_rules` only: the LiteRT runtime loads
neither TensorFlow nor Keras.
"""

import numpy as np

from keras_transformer.constraint_rules import NUMPY

WORD_MARKER = "\u2581"  # SentencePiece's "▁", the start of a word


def word_indices(xp, is_text, lone, marked):
    """bool `[r, L]` flags of pieces -> `(word int32 [r, L], starts bool [r, L])`: the index of
    the whitespace-separated word of the detokenized text that each piece belongs to (-1 for a
    piece that is not text) and whether it begins that word.

    `is_text`: the pieces that are text (not EOS, not padding); `lone`: a piece that is the
    word marker "▁" alone; `marked`: a piece starting with it. A piece begins a word when it is
    marked (or follows a lone "▁", or is the first text piece); a lone "▁" belongs to the word
    before."""
    after_lone = xp.concatenate([xp.ones_like(lone[:, :1]), lone[:, :-1]], axis=1)
    text = xp.logical_and(is_text, xp.logical_not(lone))
    # The first text piece always begins a word.
    first = xp.logical_and(text, xp.equal(xp.cumsum(xp.cast(text, "int32"), axis=1), 1))
    starts = xp.logical_and(text, xp.logical_or(first, xp.logical_or(marked, after_lone)))
    word = xp.maximum(xp.cumsum(xp.cast(starts, "int32"), axis=1) - 1, 0)
    return xp.where(is_text, word, -1), starts


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


def piece_flags(pieces):
    """`(lone, marked)` bool numpy `[V]` of a vocabulary's piece strings (`word_indices`)."""
    lone = np.array([p == WORD_MARKER for p in pieces], bool)
    marked = np.array([p.startswith(WORD_MARKER) for p in pieces], bool)
    return lone, marked


def numpy_word_alignment(piece, source_ids, ids, flags, special, words_out, words_in):
    """`word_alignment` in numpy from ids (the LiteRT runtime's road): `piece` int32 `[r, T]`,
    `source_ids` `[r, S]` and `ids` `[r, T]` (padded), `flags` `piece_flags` of the
    vocabulary, `special` the ids that are not text (padding, EOS)."""
    lone, marked = flags

    def words(x):
        x = np.asarray(x)
        return word_indices(NUMPY, ~np.isin(x, special), lone[x], marked[x])

    source_word, _ = words(source_ids)
    target_word, starts = words(ids)
    return word_alignment(NUMPY, np.asarray(piece), source_word, target_word, starts,
                          words_out, words_in)  # fmt: skip


def word_pairs(row):
    """A row of `word_alignment`'s alignment (each target word's source word, -1 for none)
    -> its `(source word, target word)` pairs."""
    return [(i, j) for j, i in enumerate(row) if i >= 0]
