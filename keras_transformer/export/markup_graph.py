"""Markup in the graph: the `translate_markup` signature's parse and tag transfer, by
`keras_transformer.markup`'s grammar (its regular expressions, read by RE2) and
`keras_transformer.markup_rules`' rules (on `keras.ops`), so that a SavedModel gives the Python
road's answers (the tests compare them).

- `plain_texts(text, is_html, tables)`: what the model translates, and whether the markup is
  well formed (malformed: `markup.plain_text`'s reading, anything tag-like a space).
- `tagged_texts(text, is_html, translation, alignment, well_formed)`: the translations with the
  source's tags put back (`markup.transfer_tags`).
- `translate_markup(translate, text, markup, tables)`: the signature's answer.
"""

import html
import html.entities

import tensorflow as tf
import tensorflow_text as tf_text
from keras import ops

from keras_transformer import markup, word_rules
from keras_transformer import markup_rules as rules
from keras_transformer.data.pipeline import valid_utf8

# `html.unescape`'s character references.
CHARREF_PATTERN = r"&(?:#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)"
_NUMERIC = r"&#[0-9]+;?|&#[xX][0-9a-fA-F]+;?"
_DIGITS = r"^&#[xX]?0*([0-9a-fA-F]*);?$"
# The named references html.unescape also reads without ";" (and as a prefix: "&ampx" is
# "&x"), longest first so that RE2 takes the longest.
_LEGACY = sorted((k for k in html.entities.html5 if not k.endswith(";")), key=len, reverse=True)
_PREFIXED = rf"^&({'|'.join(_LEGACY)})([\s\S]*)$"
_MISSING = "\x00"
_NAME = f"^</?([^{markup.WHITESPACE}/>]+)[\\s\\S]*$"
_REPLACEMENT = "\ufffd"


def _special_numbers():
    """`{number: text}` where `html.unescape` does not read `&#number;` as `chr(number)` (C0
    and C1 controls, non-characters; surrogates and numbers past U+10FFFF are `_charref`'s)."""
    candidates = [*range(0x100), *range(0xFDD0, 0xFDF0)]
    candidates += [plane * 0x10000 + low for plane in range(17) for low in (0xFFFE, 0xFFFF)]
    found = {n: html.unescape(f"&#{n};") for n in candidates}
    return {n: text for n, text in found.items() if text != chr(n)}


class Tables(tf.Module):
    """The lookup tables of character references (named, and the special numbers), held by a
    `Translator` so that the SavedModel keeps them."""

    def __init__(self):
        super().__init__(name="markup_tables")
        names = list(html.entities.html5)
        self.named = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(names), tf.constant([html.entities.html5[k] for k in names])
            ),
            _MISSING,
        )
        special = _special_numbers()
        self.numbers = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(list(special), tf.int64), tf.constant(list(special.values()))
            ),
            _MISSING,
        )


def _numbers(pieces):
    """int64 `[m]`: the number of each numeric reference in `pieces` (past U+10FFFF: 0x110000;
    others: 0)."""
    hexadecimal = tf.strings.regex_full_match(pieces, r"&#[xX][\s\S]*")
    digits = tf.strings.regex_replace(pieces, _DIGITS, r"\1")
    too_long = tf.strings.length(digits) > tf.where(hexadecimal, 6, 7)
    numeric = tf.strings.regex_full_match(pieces, _NUMERIC)
    digits = tf.where(tf.logical_and(numeric, tf.logical_not(too_long)), digits, "")
    codes = tf.cast(tf.strings.unicode_decode(digits, "UTF-8"), tf.int64)
    values = tf.ragged.map_flat_values(
        lambda c: tf.where(c <= 57, c - 48, tf.bitwise.bitwise_or(c, 32) - 87), codes
    )
    lengths = values.row_lengths()
    exponents = tf.expand_dims(lengths, 1) - 1 - tf.ragged.range(lengths)
    base = tf.where(hexadecimal, tf.constant(16, tf.int64), 10)
    powers = tf.ragged.map_flat_values(
        lambda e, b: tf.pow(b, e), exponents, tf.gather(base, exponents.value_rowids())
    )
    number = tf.reduce_sum(values * powers, axis=1)
    return tf.where(too_long, tf.constant(0x110000, tf.int64), number)


def _character(number, tables):
    """The text of numeric references: `html.unescape`'s."""
    special = tables.numbers.lookup(number)
    outside = tf.logical_or(number > 0x10FFFF, tf.logical_and(number >= 0xD800, number <= 0xDFFF))
    code = tf.cast(tf.where(outside, tf.constant(0x20, tf.int64), number), tf.int32)
    ordinary = tf.strings.unicode_encode(tf.expand_dims(code, 1), "UTF-8")
    ordinary = tf.where(outside, _REPLACEMENT, ordinary)
    return tf.where(tf.equal(special, _MISSING), ordinary, special)


def _named(pieces, tables):
    """The text of named references (`html.unescape`'s): the whole name, else its longest
    prefix that is read without ";", else the reference as written."""
    whole = tables.named.lookup(tf.strings.substr(pieces, 1, -1))
    prefixed = tf.strings.regex_full_match(pieces, _PREFIXED)
    prefix = tables.named.lookup(tf.strings.regex_replace(pieces, _PREFIXED, r"\1"))
    rest = tf.strings.regex_replace(pieces, _PREFIXED, r"\2")
    by_prefix = tf.where(prefixed, tf.strings.join([prefix, rest]), pieces)
    return tf.where(tf.equal(whole, _MISSING), by_prefix, whole)


def unescape(texts, tables):
    """tf.string `[n]`: `html.unescape` of each text."""
    pieces = tf_text.regex_split_with_offsets(texts, CHARREF_PATTERN, CHARREF_PATTERN)[0]
    flat = pieces.flat_values
    numeric = tf.strings.regex_full_match(flat, _NUMERIC)
    reference = tf.strings.regex_full_match(flat, CHARREF_PATTERN)
    value = tf.where(
        numeric,
        _character(_numbers(flat), tables),
        tf.where(reference, _named(flat, tables), flat),
    )
    return tf.strings.reduce_join(pieces.with_flat_values(value), axis=1)


def _word_spans(text):
    """`(begin, end)` int32 `[W]`: the character spans of the words of one text
    (`word_rules.word_spans`)."""
    characters = tf.strings.unicode_decode(text, "UTF-8")
    return word_rules.word_spans(ops, word_rules.character_classes(ops, characters))


def words(text):
    """tf.string `[W]`: the words of one text (`word_rules.text_words`)."""
    begin, end = _word_spans(text)
    return tf.strings.substr(tf.fill(tf.shape(begin), text), begin, end - begin, "UTF8_CHAR")


def collapse(texts):
    """tf.string `[n]`: `word_rules.join_words` of each text (SentencePiece's whitespace)."""
    joined = lambda text: tf.strings.reduce_join(words(text), separator=" ")  # noqa: E731
    return tf.map_fn(joined, texts, fn_output_signature=tf.TensorSpec([], tf.string))


def escape(texts):
    """tf.string `[n]`: `html.escape(text, quote=False)` of each text."""
    texts = tf.strings.regex_replace(texts, "&", "&amp;")
    return tf.strings.regex_replace(tf.strings.regex_replace(texts, "<", "&lt;"), ">", "&gt;")


def _one_of(strings, values):
    return tf.reduce_any(tf.equal(tf.expand_dims(strings, 1), tf.constant(sorted(values))), 1)


def _tokens(text, is_html, tables):
    """One text's tokens (`markup.tokens`): `(pieces [T], kind int32 [T], name ids [T], plain
    pieces [T])`."""
    pieces = tf_text.regex_split_with_offsets(
        tf.reshape(text, [1]), markup.TAG_PATTERN, markup.TAG_PATTERN
    )[0].flat_values
    tag = tf.strings.regex_full_match(pieces, markup.TAG_PATTERN)
    special = tf.strings.regex_full_match(pieces, r"<[!?][\s\S]*")
    closing = tf.strings.regex_full_match(pieces, r"</[\s\S]*")
    name = tf.strings.lower(tf.strings.regex_replace(pieces, _NAME, r"\1"), encoding="utf-8")
    name = tf.where(tf.logical_and(tag, tf.logical_not(special)), name, "")
    void_name = tf.logical_and(is_html, _one_of(name, markup.VOID_ELEMENTS))
    self_closing = tf.logical_or(void_name, tf.strings.regex_full_match(pieces, r"[\s\S]*/>"))
    breaks = tf.logical_and(is_html, _one_of(name, markup.BREAKS))
    opening = tf.where(self_closing, tf.where(breaks, rules.BREAK, rules.VOID), rules.START)
    kind = tf.where(
        special,
        rules.VOID,
        tf.where(closing, tf.where(void_name, rules.DROPPED, rules.END), opening),
    )
    kind = tf.where(tag, kind, rules.TEXT)
    plain = tf.where(tag, tf.where(tf.equal(kind, rules.BREAK), " ", ""), unescape(pieces, tables))
    return pieces, kind, tf.unique(name).idx, plain


def _parse(text, is_html, tables):
    """`(well formed, plain, tags, inputs)` of one text: `markup._parse`'s, `tags` the start
    and end tag of each element (`[2, E]`)."""
    pieces, kind, names, plain = _tokens(text, is_html, tables)
    lengths = tf.strings.length(plain, unit="UTF8_CHAR")
    verdict, _, _, (token, void, parent, begin, finish) = rules.structure(ops, kind, names, lengths)
    plain = tf.strings.reduce_join(plain)
    starts = tf.gather(pieces, token)
    ends = tf.where(void, "", tf.strings.regex_replace(starts, _NAME, r"</\1>"))
    inputs = (void, parent, begin, finish, *_word_spans(plain))
    return tf.equal(verdict, rules.WELL_FORMED), plain, tf.stack([starts, ends]), inputs


def _map(function, inputs, dtype):
    return tf.map_fn(lambda row: function(*row), inputs, fn_output_signature=dtype)


def plain_texts(text, is_html, tables):
    """`(plain tf.string [n], well_formed bool [n])` of texts with markup (`is_html` bool
    `[n]`, else XML): `markup.strip_markup`, or `markup.plain_text`'s reading where
    malformed."""

    def one(text, is_html):
        well_formed, plain, _, _ = _parse(text, is_html, tables)
        return plain, well_formed

    plain, well_formed = _map(one, (text, is_html), (tf.string, tf.bool))
    tag_like = tf.strings.regex_replace(text, markup.TAG_LIKE_PATTERN, " ")
    fallback = collapse(unescape(tag_like, tables))
    return tf.where(well_formed, collapse(plain), fallback), well_formed


def _with_tags(text, is_html, translation, alignment, tables):
    """One translation with its source's tags (`markup.transfer_tags`)."""
    _, _, tags, inputs = _parse(text, is_html, tables)
    target = words(translation)
    n = tf.size(target)
    alignment = tf.concat([alignment[:n], -tf.ones([n], tf.int32)], 0)[:n]
    keys = rules.transfer(ops, *inputs, alignment)
    open_key, close_key, _, word_key, space_key = keys
    items = tf.concat([tags[0], tags[1], escape(target), tf.fill([tf.maximum(n - 1, 0)], " ")], 0)
    order = tf.argsort(tf.concat([open_key, close_key, word_key, space_key[1:]], 0))
    return tf.strings.reduce_join(tf.gather(items, order))


def tagged_texts(text, is_html, translation, alignment, well_formed, tables):
    """tf.string `[n]`: each translation (of `plain_texts`' text) with the tags of its source
    put back by its `alignment` int32 `[n, words]` (-1 padded); a malformed source's
    translation escaped, without tags (`markup.transfer_tags`)."""

    def one(text, is_html, translation, alignment, well_formed):
        return tf.cond(
            well_formed,
            lambda: _with_tags(text, is_html, translation, alignment, tables),
            lambda: escape(collapse(tf.reshape(translation, [1])))[0],
        )

    inputs = (text, is_html, translation, tf.cast(alignment, tf.int32), well_formed)
    return _map(one, inputs, tf.string)


def translate_markup(translate, text, markup, tables):
    """The `translate_markup` signature's answer (`Translator`'s docstring).

    Args:
        translate: plain texts -> `(translation [n], score [n], alignment int32 [n, words])`.
        text: tf.string `[n]`, texts with markup (invalid UTF-8 becomes U+FFFD).
        markup: tf.string `[n]`, "html" or "xml" per text (else `InvalidArgumentError`).
        tables: the `Tables` of character references.
    """
    known = tf.debugging.Assert(
        tf.reduce_all(tf.logical_or(tf.equal(markup, "html"), tf.equal(markup, "xml"))),
        ['translate_markup: markup must be "html" or "xml" for every text'],
    )
    with tf.control_dependencies([known]):
        text = valid_utf8(text)
    is_html = tf.equal(markup, "html")
    plain, well_formed = plain_texts(text, is_html, tables)
    translation, score, alignment = translate(plain)
    tagged = tagged_texts(text, is_html, translation, alignment, well_formed, tables)
    return {
        "translation": tagged,
        "score": score,
        "alignment": alignment,
        "markup_valid": well_formed,
    }
