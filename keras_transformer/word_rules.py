"""What a word is: one rule for the words of a text and for the words of its SentencePiece
pieces, the same in the export's alignments, guided-alignment training, markup and the Python
road, on every engine. Each function on arrays takes the array namespace `xp` it runs on first
(`keras.ops` in a graph, or `constraint_rules.NUMPY`). Imports numpy and `constraint_rules`
only: the LiteRT runtime loads neither TensorFlow nor Keras.

The words are those of the text as SentencePiece's normaliser (`nmt_nfkc`, the vocabulary's)
reads it: it writes some characters as a space (`SPACES`: tab, line breaks, no-break and
zero-width spaces, U+FEFF, U+FFFD, ...), deletes others (`IGNORED`: most C0 and C1 controls,
such as U+001C and U+000B, though Python's `str.split` splits at them) and keeps the rest (U+0085
too, where `str.split` splits); a few it writes as a space and a combining mark (`BEGINS`:
U+00A8, U+00B4, ...), so that they begin a word. A word of a text is a run of characters that
are not `SPACES`, ignoring the `IGNORED` ones (they neither make a word nor part one), and
cut before each `BEGINS` character (`word_spans`). The characters that NFKC writes as several
words (U+FDFA, U+FDFB) count as one.

The pieces of that text hold the same words: a piece starting with SentencePiece's "▁" begins
a word, and a lone "▁" (a space before a piece that the vocabulary has no "▁" form of) begins
the word of the piece after it (`word_indices`). Detokenized, an unknown piece (`<unk>`) is
written " ⁇ ": in a translation it is a word of its own (`unknown`), while in a source text
the unknown characters are part of the word they are in.
"""

import numpy as np

from keras_transformer.constraint_rules import NUMPY

WORD_MARKER = "\u2581"  # SentencePiece's "▁", the start of a word
UNKNOWN_PIECE = "<unk>"  # the vocabulary's unknown piece (`data.tokenizer`)


def _code_points(*ranges):
    return tuple(c for first, last in ranges for c in range(first, last + 1))


# What `nmt_nfkc` makes of each character alone (tests/test_word_rules.py asks SentencePiece's
# normaliser about every code point): a space,
SPACES = _code_points(
    (0x9, 0xA), (0xC, 0xD), (0x20, 0x20), (0xA0, 0xA0), (0x61C, 0x61C), (0x1680, 0x1680),
    (0x2000, 0x200C), (0x200E, 0x200F), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F),
    (0x2581, 0x2581), (0x3000, 0x3000), (0xFEFF, 0xFEFF), (0xFFFD, 0xFFFD),
)  # fmt: skip
# nothing,
IGNORED = _code_points(
    (0x1, 0x8), (0xB, 0xB), (0xE, 0x1F), (0x7F, 0x7F), (0x8F, 0x8F), (0x9F, 0x9F)
)  # fmt: skip
# a space and then text (a combining mark): a word begins with it,
BEGINS = _code_points(
    (0xA8, 0xA8), (0xAF, 0xAF), (0xB4, 0xB4), (0xB8, 0xB8), (0x2D8, 0x2DD), (0x37A, 0x37A),
    (0x384, 0x385), (0x1FBD, 0x1FBD), (0x1FBF, 0x1FC1), (0x1FCD, 0x1FCF), (0x1FDD, 0x1FDF),
    (0x1FED, 0x1FEE), (0x1FFD, 0x1FFE), (0x2017, 0x2017), (0x203E, 0x203E), (0x309B, 0x309C),
    (0xFC5E, 0xFC63), (0xFE49, 0xFE4C), (0xFE70, 0xFE70), (0xFE72, 0xFE72), (0xFE74, 0xFE74),
    (0xFE76, 0xFE76), (0xFE78, 0xFE78), (0xFE7A, 0xFE7A), (0xFE7C, 0xFE7C), (0xFE7E, 0xFE7E),
    (0xFFE3, 0xFFE3),
)  # fmt: skip
# and text for every other character (`character_classes`).
TEXT, SPACE, IGNORE, BEGIN = range(4)

_TABLES = ((SPACE, SPACES), (IGNORE, IGNORED), (BEGIN, BEGINS))


def _dim(xp, x, axis=0):
    size = x.shape[axis]
    return xp.shape(x)[axis] if size is None else size


def _select(xp, mask):
    """int32 `[m]`: the indices where the 1-D `mask` is set, in order."""
    count = _dim(xp, mask)
    index = xp.cast(xp.arange(count), "int32")
    order = xp.argsort(xp.where(mask, index, index + count))
    return xp.cast(order[: xp.sum(xp.cast(mask, "int32"))], "int32")


def character_classes(xp, codes):
    """int32 `[L]` code points of a text's characters -> int32 `[L]`: each one's class,
    `TEXT`, `SPACE`, `IGNORE` or `BEGIN` (module docstring)."""
    codes = xp.expand_dims(xp.cast(codes, "int32"), 1)
    classes = xp.zeros_like(codes[:, 0])
    for value, table in _TABLES:
        found = xp.any(xp.equal(codes, np.asarray(table, "int32")), axis=1)
        classes = xp.where(found, value, classes)
    return xp.cast(classes, "int32")


def word_spans(xp, classes):
    """`(begin, end)` int32 `[W]`: the character spans `[begin, end)` of a text's words from
    its `character_classes` `[L]` (module docstring): a word is a run of characters that are
    not spaces, `IGNORE` ones skipped, cut before each `BEGIN` one; it spans its first to its
    last character that is not ignored."""
    kept = _select(xp, xp.not_equal(classes, IGNORE))  # [K] the characters that count
    kind = xp.take(classes, kept)
    count = _dim(xp, kind)
    text = xp.not_equal(kind, SPACE)
    begins = xp.equal(kind, BEGIN)
    edge = xp.zeros((1,), dtype="bool")
    previous = xp.concatenate([edge, text])[:count]
    following = xp.concatenate([text, edge])[1:]
    next_begins = xp.concatenate([begins, edge])[1:]
    starts = xp.logical_and(text, xp.logical_or(xp.logical_not(previous), begins))
    ends = xp.logical_and(text, xp.logical_or(xp.logical_not(following), next_begins))
    begin = xp.take(kept, _select(xp, starts))
    end = xp.take(kept, _select(xp, ends)) + 1
    return xp.cast(begin, "int32"), xp.cast(end, "int32")


def text_word_spans(text):
    """`[(begin, end)]`: the character spans of the words of the str `text` (`word_spans`)."""
    codes = np.fromiter(map(ord, text), dtype=np.int32, count=len(text))
    begin, end = word_spans(NUMPY, character_classes(NUMPY, codes))
    return list(zip(begin.tolist(), end.tolist()))


def text_words(text):
    """The words of `text` (module docstring), as written: `str.split` by SentencePiece's
    rule."""
    return [text[begin:end] for begin, end in text_word_spans(text)]


def join_words(text):
    """The words of `text` with one space between them: the same words, SentencePiece's
    whitespace collapsed (what the model is given of a plain text)."""
    return " ".join(text_words(text))


def word_indices(xp, is_text, lone, marked, unknown=None):
    """bool `[r, L]` flags of pieces -> `(word int32 [r, L], starts bool [r, L])`: the index of
    the word (module docstring) that each piece belongs to, -1 for a piece that is not text
    or a lone "▁" that no word follows, and whether the piece begins its word.

    `is_text`: the pieces that are text (not EOS, not padding); `lone`: a piece that is the
    word marker "▁" alone; `marked`: a piece starting with it; `unknown` (None: none): the
    pieces written " ⁇ " (`<unk>`) in the text the words are counted in, a word of their own
    (a translation's, not a source's). A piece other than a lone "▁" begins a word when it is
    marked, follows a lone "▁", is unknown or follows an unknown piece, or is the first; a
    lone "▁" belongs to the word after it."""
    content = xp.logical_and(is_text, xp.logical_not(lone))
    if unknown is None:
        unknown = xp.zeros_like(lone)
    unknown = xp.logical_and(unknown, content)
    before = xp.logical_or(lone, unknown)
    after = xp.concatenate([xp.ones_like(before[:, :1]), before[:, :-1]], axis=1)
    counted = xp.cast(xp.cumsum(xp.cast(content, "int32"), axis=1), "int32")
    first = xp.logical_and(content, xp.equal(counted, 1))
    breaks = xp.logical_or(xp.logical_or(marked, after), xp.logical_or(unknown, first))
    starts = xp.logical_and(content, breaks)
    started = xp.cast(xp.cumsum(xp.cast(starts, "int32"), axis=1), "int32")  # [r, L]
    # A lone "▁" takes the word that starts after it (one more than those started before).
    word = started - 1 + xp.cast(lone, "int32")
    total = xp.sum(xp.cast(starts, "int32"), axis=1, keepdims=True)
    return xp.where(xp.logical_and(is_text, xp.less(word, total)), word, -1), starts


def piece_flags(pieces):
    """`(lone, marked, unknown)` bool numpy `[V]` of a vocabulary's piece strings
    (`word_indices`)."""
    lone = np.array([p == WORD_MARKER for p in pieces], bool)
    marked = np.array([p.startswith(WORD_MARKER) for p in pieces], bool)
    unknown = np.array([p == UNKNOWN_PIECE for p in pieces], bool)
    return lone, marked, unknown


def piece_words(pieces, translation=False):
    """`word_indices` of one sentence's pieces (strings, all text): a word index per piece
    (-1: a lone "▁" that no word follows); `translation`: unknown pieces are words of their
    own (a detokenized translation's words, not a source text's)."""
    lone, marked, unknown = (x[None] for x in piece_flags(pieces))
    word, _ = word_indices(
        NUMPY, np.ones_like(lone), lone, marked, unknown if translation else None
    )
    return word[0].tolist()
