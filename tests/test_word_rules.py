"""`keras_transformer.word_rules`: one rule of what a word is, for a text (markup, the Python
road, guided-alignment files) and for its SentencePiece pieces (the export's alignments, the
LiteRT runtime, guided-alignment training), checked against SentencePiece's own normaliser and
tokenizer."""

import random

import _inference_fixtures as fx
import numpy as np
import pytest
import sentencepiece

from keras_transformer import markup, word_rules
from keras_transformer.constraint_rules import NUMPY


def _normaliser(**options):
    return sentencepiece.SentencePieceNormalizer(rule_name="nmt_nfkc", **options)


def test_the_character_classes_are_what_nmt_nfkc_makes_of_each_character():
    """Every code point alone between two letters: written as a space (`SPACES`), deleted
    (`IGNORED`), written as a space then text (`BEGINS`), or kept as text (the rest; U+FDFA
    and U+FDFB, which NFKC writes as several words, are the module docstring's exception)."""
    bare = _normaliser(add_dummy_prefix=False, escape_whitespaces=False,
                       remove_extra_whitespaces=False)  # fmt: skip
    found = {word_rules.SPACE: [], word_rules.IGNORE: [], word_rules.BEGIN: [], "words": []}
    for code in range(1, 0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        out = bare.normalize(f"a{chr(code)}b")
        if out == "a b":
            found[word_rules.SPACE].append(code)
        elif out == "ab":
            found[word_rules.IGNORE].append(code)
        elif out.startswith("a ") and " " not in out[2:]:
            found[word_rules.BEGIN].append(code)
        elif " " in out:
            found["words"].append(code)
    assert tuple(found[word_rules.SPACE]) == word_rules.SPACES
    assert tuple(found[word_rules.IGNORE]) == word_rules.IGNORED
    assert tuple(found[word_rules.BEGIN]) == word_rules.BEGINS
    assert found["words"] == [0xFDFA, 0xFDFB]
    codes = np.arange(0x3000, dtype=np.int32)
    classes = word_rules.character_classes(NUMPY, codes)
    assert {int(c) for c in codes[classes == word_rules.SPACE]} == {
        c for c in word_rules.SPACES if c < 0x3000
    }


@pytest.mark.parametrize(
    "pieces, translation, expected",
    [
        (["▁red", "▁app", "le", "▁cat"], False, [0, 1, 1, 2]),
        (["▁", "(", "x", "▁y"], False, [0, 0, 0, 1]),  # a lone "▁" begins the word after it
        (["a", "b", "▁c"], False, [0, 0, 1]),  # the first piece begins a word
        (["▁a", "▁", "▁b"], False, [0, 1, 1]),  # a lone "▁" belongs to the word after it
        (["▁a", "▁"], False, [0, -1]),  # ... and to none when no word follows
        (["▁", "▁"], False, [-1, -1]),
        (["▁a", "<unk>", "b"], False, [0, 0, 0]),  # a source's unknown characters: in a word
        (["▁a", "<unk>", "b"], True, [0, 1, 2]),  # a translation's " ⁇ ": a word
        (["<unk>", "<unk>", "▁b"], True, [0, 1, 2]),
        ([], True, []),
    ],
)
def test_pieces_map_to_words(pieces, translation, expected):
    assert word_rules.piece_words(pieces, translation) == expected


@pytest.mark.parametrize(
    "text, words",
    [
        ("a\u200bb c", ["a", "b", "c"]),  # a zero-width space separates words
        ("a\x1cb\x0bc d", ["a\x1cb\x0bc", "d"]),  # deleted characters do not
        ("a\x85b", ["a\x85b"]),  # nor does U+0085, kept as text
        ("a \x01 b\x02", ["a", "b"]),  # nor make a word
        ("a\u00a8\u00a8b", ["a", "\u00a8", "\u00a8b"]),  # a space and a mark: a word begins
        ("\ufeff\u3000x\u00a0y\u2581z\ufffd", ["x", "y", "z"]),
        ("", []),
    ],
)
def test_the_words_of_a_text(text, words):
    assert word_rules.text_words(text) == words
    assert word_rules.join_words(text) == " ".join(words)


# What random texts are drawn from: the toy vocabulary's letters, letters it does not know,
# every kind of separator (SentencePiece's, Python's, format and control characters, marks).
_LETTERS = "abcdefghiklmnoprstuw"
_UNKNOWN = "€жZ\u00e9\u0301\u00ad\u200d\u2060\U0001f600?"
_SEPARATORS = (
    " \t\n\r\x0c\x0b\x1c\x1d\x1e\x1f\x85\x01\x08\x7f\x8f\x9f\xa0\u061c\u1680\u2002\u200b"
    "\u200c\u200e\u2028\u2029\u202f\u205f\u2581\u3000\ufeff\ufffd\u00a8\u00b4\u2017\u309b"
    "\ufe70\u180e\u2066"
)


def _random_text(rng):
    parts = []
    for _ in range(rng.randint(0, 8)):
        draw = rng.random()
        pool = _LETTERS if draw < 0.55 else _UNKNOWN if draw < 0.7 else _SEPARATORS
        parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 3))))
    return "".join(parts)


def _char_offsets(text):
    """UTF-8 byte offset -> character index of `text` (its end included)."""
    offsets, byte = {}, 0
    for index, character in enumerate(text):
        offsets[byte] = index
        byte += len(character.encode("utf-8"))
    offsets[byte] = len(text)
    return offsets


def test_the_words_are_sentencepieces_on_random_unicode():
    """On random texts of letters, unknown characters and every kind of separator: the words
    of the text (`text_words`, what markup places tags by) are those of SentencePiece's
    normalised text, and the word each of its pieces gets (`piece_words`, what the alignments
    count) is the word of the text those pieces' characters are in; a random translation's
    pieces map to the words of its detokenized text, an unknown piece (" ⁇ ") one of them."""
    normaliser = _normaliser()
    processor = fx.spm_processor()
    rng = random.Random(86)
    for _ in range(400):
        text = _random_text(rng)
        words = word_rules.text_words(text)
        normalised = [w for w in normaliser.normalize(text).split("\u2581") if w]
        assert ["".join(normaliser.normalize(w).split("\u2581")) for w in words] == normalised
        # The pieces of the text.
        spans = word_rules.text_word_spans(text)
        encoded = processor.encode(text, return_type="proto").pieces
        piece_word = word_rules.piece_words([p.piece for p in encoded])
        assert max(piece_word, default=-1) + 1 == len(words), (text, piece_word)
        offsets = _char_offsets(text)
        codes = np.array([ord(c) for c in text], np.int32)
        in_words = np.isin(
            word_rules.character_classes(NUMPY, codes), [word_rules.TEXT, word_rules.BEGIN]
        )
        for piece, word in zip(encoded, piece_word):
            begin, end = offsets[piece.begin], offsets[piece.end]
            for i in np.flatnonzero(in_words[begin:end]) + begin:
                assert spans[word][0] <= i < spans[word][1], (text, piece.piece, word)
        # What markup reads of the same text (tags around it, entities kept as they are).
        marked = f"<b>{text}</b> <i>x</i>"
        assert markup.strip_markup(marked) == " ".join([*words, "x"])
        # A translation: random pieces, unknown ones too.
        ids = [rng.choice([1, *range(4, processor.get_piece_size())]) for _ in range(6)]
        pieces = [processor.id_to_piece(i) for i in ids]
        decoded = processor.decode(ids)
        target = word_rules.piece_words(pieces, translation=True)
        surface = {}
        for piece, word in zip(pieces, target):
            if word < 0:
                continue  # a lone "▁" last: a space, no word
            text_of = "\u2047" if piece == "<unk>" else piece.replace("\u2581", "")
            surface[word] = surface.get(word, "") + text_of
        assert [surface[k] for k in range(len(surface))] == word_rules.text_words(decoded)


def test_the_graph_reads_the_words_as_numpy():
    """`markup_graph.words` and `collapse` (keras.ops in a graph) give `text_words` and
    `join_words` on random texts."""
    import tensorflow as tf

    from keras_transformer.export import markup_graph

    rng = random.Random(7)
    texts = [_random_text(rng) for _ in range(60)] + ["", " ", "\u00a8", "a\u00a8\u00a8b"]
    got = markup_graph.collapse(tf.constant(texts)).numpy()
    assert [g.decode() for g in got] == [word_rules.join_words(t) for t in texts]
    for text in texts[:10]:
        words = markup_graph.words(tf.constant(text)).numpy()
        assert [w.decode() for w in words] == word_rules.text_words(text)
