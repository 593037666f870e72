"""Markup that survives translation: tags are taken out of the source, the plain text is
translated, and the tags are put back around the target words aligned to the source words they
wrapped (the word alignments of `Translator`'s `alignment` output).

- `strip_markup(text, kind)`: the source's plain text (entities decoded, its words joined by
  single spaces); `MarkupError` for malformed markup.
- `transfer_tags(source_markup, translation, alignment, kind)`: the translation with the
  source's tags put back. Standalone: a TF Serving client that gets the `alignment` output
  calls it with the source markup it sent (stripped) and the answer. A SavedModel exported
  with alignments does the same in its `translate_markup` signature
  (`keras_transformer.export.markup_graph`), by the same grammar and rules.

The grammar, one for every engine (this module's Python, the SavedModel's graph): a tag is a
match of `TAG_PATTERN`: a comment `<!--...-->`, a declaration `<!...>`, a processing
instruction `<?...>`, or a start or end tag, `<` then a letter (or `/` and a letter) up to the
first `>` outside a quoted attribute value. Everything else is text: a `<` that starts no tag
(`a < b`, `<3`, an unfinished `<b`) is text. In text, character references are decoded as
`html.unescape` decodes them. A start tag is void (it has no end tag) when it ends with `/>`,
or in HTML when its name is one of `VOID_ELEMENTS` (whose end tags, such as `</br>`, are
ignored); comments, declarations and processing instructions are void too. End tags close the
innermost open element of the same name (HTML and XML: in any case); an end tag that closes
nothing or another element, or an element never closed, is malformed markup. In HTML, `<br>`
and `<hr>` separate the words around them.

Words are those of the plain text and of the translation as SentencePiece reads them
(`keras_transformer.word_rules`, the rule of the alignments' word indices): its whitespace, not
Python's (a zero-width space separates words, U+001C and U+0085 do not; characters its
normaliser deletes are skipped), and an unknown piece of the translation (" ⁇ ") a word of its
own. A pair of
tags wraps every source word whose characters it covers, even in part. In the translation it
wraps the span from the first to the last target word aligned to one of those words, so every
tag appears exactly once and elements nest properly: a child stays inside its parent, and of
two siblings that would overlap one is cut short, by the cut that keeps the most aligned words
inside their tags (`keras_transformer.markup_rules`, the rules on arrays).
An element with no aligned target word, a self-closing tag (`<br/>`, and in HTML the void
elements such as `<img>` written without the slash), a comment or a declaration goes before the
target word aligned to the source word after it (at the end when there is none). Start tags
and void ones keep their text as written; an end tag is written `</name>` with its start tag's
name. The text is escaped (`&`, `<`, `>`), so entities such as `&amp;` come
back as entities; other entities (`&eacute;`) come back as their characters.
"""

import html
import re
import warnings

import numpy as np

from keras_transformer import markup_rules as rules
from keras_transformer import word_rules

KINDS = ("html", "xml")

# HTML's void elements: no end tag, with or without "/>".
VOID_ELEMENTS = frozenset(
    "area base br col embed hr img input link meta param source track wbr".split()
)
# Void elements that separate the words around them (a line break is whitespace).
BREAKS = frozenset(("br", "hr"))

# A tag (module docstring). Python's `re` and RE2 (TensorFlow's regex ops) read it alike.
TAG_PATTERN = r"<!--[\s\S]*?-->|<![^>]*>|<\?[^>]*>|</?[a-zA-Z](?:[^>\"']|\"[^\"]*\"|'[^']*')*>"
# The name of a start or end tag: group 1.
NAME_PATTERN = r"</?([^\s/>]+)"
# What malformed markup is read as (`plain_text`): anything tag-like is a space.
TAG_LIKE_PATTERN = r"<[^>]*>?"
# Python's whitespace (`str.isspace`): what ends a tag's name (`NAME_PATTERN`'s `\s`). Words are
# separated by SentencePiece's (`word_rules`).
WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + "\u2028\u2029\u202f\u205f\u3000"
)

_TAG, _NAME = re.compile(TAG_PATTERN), re.compile(NAME_PATTERN)


class MarkupError(ValueError):
    """Malformed markup: an end tag that closes nothing or not the innermost open element, or
    an element left open."""


class MarkupWarning(UserWarning):
    """Malformed markup was translated as plain text (its tags dropped)."""


def _tag_kind(tag, kind):
    """`(markup_rules kind, lower-case name)` of a tag (module docstring)."""
    if tag.startswith(("<!", "<?")):
        return rules.VOID, ""
    name = _NAME.match(tag).group(1).lower()
    html_void = kind == "html" and name in VOID_ELEMENTS
    if tag.startswith("</"):
        return (rules.DROPPED if html_void else rules.END), name
    if html_void or tag.endswith("/>"):
        return (rules.BREAK if kind == "html" and name in BREAKS else rules.VOID), name
    return rules.START, name


def check_kind(kind):
    """`ValueError` unless `kind` is one of `KINDS`."""
    if kind not in KINDS:
        raise ValueError(f"markup kind must be one of {KINDS}, got {kind!r}")


def tokens(text, kind):
    """`[(markup_rules kind, token as written, lower-case name, plain text it adds)]` of
    `text`: its tags and its text (decoded), in order."""
    check_kind(kind)
    found, position = [], 0
    for match in _TAG.finditer(text):
        if match.start() > position:
            piece = text[position : match.start()]
            found.append((rules.TEXT, piece, "", html.unescape(piece)))
        code, name = _tag_kind(match.group(), kind)
        found.append((code, match.group(), name, " " if code == rules.BREAK else ""))
        position = match.end()
    if position < len(text):
        found.append((rules.TEXT, text[position:], "", html.unescape(text[position:])))
    return found


class _Parsed:
    """A well-formed text: `plain` (decoded, whitespace as written), its elements' `starts`
    and `ends` (the tags as written; "" for a void element), and `inputs`, the arrays
    `markup_rules.transfer` takes before the alignment."""

    def __init__(self, plain, starts, ends, inputs):
        self.plain, self.starts, self.ends, self.inputs = plain, starts, ends, inputs


def _parse(text, kind):
    """`_Parsed`; `MarkupError` when malformed."""
    found = tokens(text, kind)
    names = {}
    codes = np.asarray([t[0] for t in found], dtype=np.int32)
    ids = np.asarray([names.setdefault(t[2], len(names)) for t in found], dtype=np.int32)
    lengths = np.asarray([len(t[3]) for t in found], dtype=np.int32)
    verdict, at, partner, elements = rules.structure(rules.NUMPY, codes, ids, lengths)
    if verdict != rules.WELL_FORMED:
        problem = {
            rules.CLOSES_NOTHING: "closes nothing",
            rules.CLOSES_ANOTHER: f"closes {found[int(partner)][1] if partner >= 0 else ''}",
            rules.NEVER_CLOSED: "is never closed",
        }[int(verdict)]
        raise MarkupError(f"{found[int(at)][1]} {problem}")
    plain = "".join(t[3] for t in found)
    token, void, parent, begin, finish = elements
    starts = [found[int(i)][1] for i in token]
    ends = ["" if v else f"</{_NAME.match(tag).group(1)}>" for tag, v in zip(starts, void)]
    codes = np.fromiter(map(ord, plain), dtype=np.int32, count=len(plain))
    classes = word_rules.character_classes(rules.NUMPY, codes)
    inputs = (void, parent, begin, finish, *rules.word_spans(rules.NUMPY, classes))
    return _Parsed(plain, starts, ends, inputs)


def strip_markup(text, kind="html"):
    """The plain text of `text` (tags removed, entities decoded, its words joined by single
    spaces: `word_rules.join_words`): what the model translates. `MarkupError` if the markup
    is malformed."""
    return word_rules.join_words(_parse(text, kind).plain)


def plain_text(text, kind="html"):
    """`strip_markup`, or for malformed markup its text with anything tag-like removed (and a
    `MarkupWarning`): never an error."""
    try:
        return strip_markup(text, kind)
    except MarkupError as e:
        warnings.warn(
            f"malformed markup translated as plain text: {e}", MarkupWarning, stacklevel=2
        )
        return word_rules.join_words(html.unescape(re.sub(TAG_LIKE_PATTERN, " ", text)))


def element_words(text, kind="html"):
    """`{start tag as written: (first, stop)}`: the words `[first, stop)` of `text`'s plain
    text (`strip_markup`) that each of its paired elements wraps (a start tag written twice:
    the last one's). `MarkupError` if the markup is malformed."""
    parsed = _parse(text, kind)
    void, _, begin, finish, word_begin, word_end = parsed.inputs
    first, stop = rules.source_words(rules.NUMPY, void, begin, finish, word_begin, word_end)
    return {
        tag: (int(first[i]), int(stop[i])) for i, tag in enumerate(parsed.starts) if not void[i]
    }


def _tagged_text(parsed, words, keys):
    """The text of `markup_rules.output_order`'s keys: the tags of `parsed` among the `words`
    (escaped), one space between two words."""
    open_key, close_key, _, word_key, space_key = keys
    items = list(zip(open_key, parsed.starts)) + list(zip(close_key, parsed.ends))
    items += [(k, html.escape(w, quote=False)) for w, k in zip(words, word_key)]
    items += [(k, " ") for k in space_key[1:]]
    return "".join(text for _, text in sorted(items, key=lambda item: int(item[0])))


def _target_alignment(alignment, n):
    """A source word index per target word (-1: none) from `alignment`: such a list (as the
    `alignment` output, -1 padded) or `(source, target)` pairs (the first pair of a target
    word counts)."""
    alignment = list(alignment)
    if alignment and isinstance(alignment[0], (tuple, list)):
        per_word = [-1] * n
        for i, j in alignment:
            if 0 <= j < n and per_word[j] < 0:
                per_word[j] = int(i)
        return per_word
    per_word = [int(i) for i in alignment[:n]]
    return per_word + [-1] * (n - len(per_word))


def transfer_tags(source_markup, translation, alignment, kind="html"):
    """The translation of `source_markup`'s plain text (`strip_markup`) with the source's tags
    put back (the rules are the module's docstring's).

    Args:
        source_markup: the source with its markup, as given to be translated.
        translation: the translation of its plain text (its words: `word_rules.text_words`).
        alignment: for each word of the translation, the index of the plain source word it is
            aligned to (-1: none; the `alignment` output of `serving_default`, -1 padded), or
            `(source word, target word)` pairs.
        kind: "html" (void elements such as `<br>` need no slash, names in any case) or "xml".

    Returns:
        The translation with the tags, its text escaped. Malformed source markup: the
        translation escaped, without tags, and a `MarkupWarning`.

    Example:
    >>> transfer_tags("a <b>red</b> cat", "un chat rouge", [0, 2, 1])
    'un chat <b>rouge</b>'
    """
    words = word_rules.text_words(translation)
    try:
        parsed = _parse(source_markup, kind)
    except MarkupError as e:
        warnings.warn(f"malformed markup: tags dropped ({e})", MarkupWarning, stacklevel=2)
        return html.escape(" ".join(words), quote=False)
    alignment = np.asarray(_target_alignment(alignment, len(words)), dtype=np.int32)
    keys = rules.transfer(rules.NUMPY, *parsed.inputs, alignment)
    return _tagged_text(parsed, words, keys)


def translate_markup(translate, texts, kind="html"):
    """Translates texts with markup: the one road of `Translator.translate(markup=...)` and
    `keras-transformer translate --markup`.

    Args:
        translate: `plain texts -> (translations, alignments)`, an alignment per translation
            as `transfer_tags` takes it.
        texts: the texts with their markup.
        kind: "html" or "xml".

    Returns:
        `(translations with their tags, alignments)`, the alignments over the plain words.
        A malformed text is translated as plain text (tags dropped, text escaped) with one
        `MarkupWarning`.
    """
    plain, valid = [], []
    for text in texts:
        try:
            plain.append(strip_markup(text, kind))
            valid.append(True)
        except MarkupError:
            plain.append(plain_text(text, kind))  # warns
            valid.append(False)
    translations, alignments = translate(plain)
    marked = [
        transfer_tags(text, translation, alignment, kind)
        if ok
        else html.escape(word_rules.join_words(translation), quote=False)
        for text, translation, alignment, ok in zip(texts, translations, alignments, valid)
    ]
    return marked, alignments


def markup_answer(translate, texts, kind="html", alignments=False):
    """`Translator.translate(texts, markup=kind, alignments=...)`'s answer, the one road of the
    SavedModel's `Translator` and of the LiteRT runtime's `translate(texts, markup=...)`.

    Args:
        translate: `plain texts -> {"translation": [str], "score": [float], "alignment": per
            translation, its (source word, target word) pairs}` (one call).
        texts: the texts with their markup.
        kind: "html" or "xml".
        alignments: also the `"alignment"` pairs (over the plain words).

    Returns:
        `{"translation": [the translations with their tags], "score": [float]}` and, with
        `alignments`, `"alignment"`: `translate_markup` on `translate`'s answer.
    """
    answers = []

    def plain(part):
        answers.append(translate(part))
        return answers[-1]["translation"], answers[-1]["alignment"]

    translations, pairs = translate_markup(plain, texts, kind)
    answer = {"translation": translations, "score": [float(s) for s in answers[-1]["score"]]}
    if alignments:
        answer["alignment"] = pairs
    return answer
