"""Markup that survives translation: tags are taken out of the source, the plain text is
translated, and the tags are put back around the target words aligned to the source words they
wrapped (the word alignments of `Translator`'s `alignment` output).

- `strip_markup(text, kind)`: the source's plain text (entities decoded, whitespace collapsed)
  and its tags as a tree over the plain text's words; `MarkupError` for malformed markup.
- `transfer_tags(source_markup, translation, alignment, kind)`: the translation with the
  source's tags put back. Standalone: a TF Serving client that gets the `alignment` output
  calls it with the source markup it sent (stripped) and the answer.

Words are the whitespace-separated words of the plain text and of the translation. A pair of
tags wraps every source word whose characters it covers, even in part. In the translation it
wraps the span from the first to the last target word aligned to one of those words, so every
tag appears exactly once and elements nest properly: a child stays inside its parent, and of
two siblings that would overlap one is cut short, by the cut that keeps the most aligned words
inside their tags.
An element with no aligned target word, a self-closing tag (`<br/>`, and in HTML the void
elements such as `<img>` written without the slash), a comment or a declaration goes before the
target word aligned to the source word after it (at the end when there is none). The text is
escaped (`&`, `<`, `>`), so entities such as `&amp;` come back as entities; other entities
(`&eacute;`) come back as their characters.
"""

import html
import re
import warnings
from html.parser import HTMLParser

KINDS = ("html", "xml")

# HTML's void elements: no end tag, with or without "/>".
VOID_ELEMENTS = frozenset(
    "area base br col embed hr img input link meta param source track wbr".split()
)
# Void elements that separate the words around them (a line break is whitespace).
_BREAKS = frozenset(("br", "hr"))


class MarkupError(ValueError):
    """Malformed markup: an end tag that closes nothing or not the innermost open element, or
    an element left open."""


class MarkupWarning(UserWarning):
    """Malformed markup was translated as plain text (its tags dropped)."""


class _Element:
    """A tag in the source: `start` (as written) and `end` (None: self-closing, a comment, a
    declaration), the plain text's character span `[begin, end)` it covers, its children."""

    def __init__(self, start, name=None, begin=0):
        self.start, self.name, self.end = start, name, None
        self.begin = self.finish = begin
        self.children = []
        self.void = name is None

    def __repr__(self):
        return f"_Element({self.start!r}, {self.begin}-{self.finish}, {self.children})"


class _Parser(HTMLParser):
    def __init__(self, kind):
        super().__init__(convert_charrefs=True)
        self.kind = kind
        self.text = []  # plain text chunks
        self.length = 0
        self.root = _Element("", "")
        self.stack = [self.root]

    def _add(self, data):
        self.text.append(data)
        self.length += len(data)

    def _void(self, raw):
        self.stack[-1].children.append(_Element(raw, None, self.length))

    def handle_data(self, data):
        self._add(data)

    def handle_starttag(self, tag, attrs):
        raw = self.get_starttag_text()
        if self.kind == "html" and tag in VOID_ELEMENTS:
            return self.handle_startendtag(tag, attrs)
        element = _Element(raw, _raw_name(raw), self.length)
        self.stack[-1].children.append(element)
        self.stack.append(element)

    def handle_startendtag(self, tag, attrs):
        self._void(self.get_starttag_text())
        if self.kind == "html" and tag in _BREAKS:
            self._add(" ")

    def handle_endtag(self, tag):
        if self.kind == "html" and tag in VOID_ELEMENTS:
            return  # "</br>" and the like: nothing to close
        top = self.stack[-1]
        if len(self.stack) == 1 or top.name.lower() != tag.lower():
            raise MarkupError(f"</{tag}> closes {'nothing' if len(self.stack) == 1 else top.start}")
        top.end, top.finish = f"</{top.name}>", self.length
        self.stack.pop()

    def handle_comment(self, data):
        self._void(f"<!--{data}-->")

    def handle_decl(self, decl):
        self._void(f"<!{decl}>")

    def handle_pi(self, data):
        self._void(f"<?{data}>")

    def unknown_decl(self, data):
        self._void(f"<![{data}]>")


def _raw_name(raw):
    """The tag name as written in a start tag (XML names keep their case)."""
    return re.match(r"<\s*([^\s/>]+)", raw).group(1)


def _parse(text, kind):
    """`(plain text, root element)`; `MarkupError` when malformed."""
    if kind not in KINDS:
        raise ValueError(f"markup kind must be one of {KINDS}, got {kind!r}")
    parser = _Parser(kind)
    parser.feed(text)
    parser.close()
    if len(parser.stack) > 1:
        raise MarkupError(f"{parser.stack[-1].start} is never closed")
    if parser.rawdata:  # an unfinished tag ("a <b") left unparsed
        raise MarkupError(f"unfinished markup: {parser.rawdata[:40]!r}")
    return "".join(parser.text), parser.root


def _word_spans(text):
    """`[(begin, end)]` character spans of the whitespace-separated words of `text`."""
    return [m.span() for m in re.finditer(r"\S+", text)]


def strip_markup(text, kind="html"):
    """The plain text of `text` (tags removed, entities decoded, whitespace collapsed to single
    spaces): what the model translates. `MarkupError` if the markup is malformed."""
    plain, _ = _parse(text, kind)
    return " ".join(plain.split())


def plain_text(text, kind="html"):
    """`strip_markup`, or for malformed markup its text with anything tag-like removed (and a
    `MarkupWarning`): never an error."""
    try:
        return strip_markup(text, kind)
    except MarkupError as e:
        warnings.warn(
            f"malformed markup translated as plain text: {e}", MarkupWarning, stacklevel=2
        )
        return " ".join(html.unescape(re.sub(r"<[^>]*>?", " ", text)).split())


def element_words(text, kind="html"):
    """`{start tag as written: (first, stop)}`: the words `[first, stop)` of `text`'s plain
    text (`strip_markup`) that each of its paired elements wraps (a start tag written twice:
    the last one's). `MarkupError` if the markup is malformed."""
    plain, root = _parse(text, kind)
    _source_words(root, _word_spans(plain))
    found, stack = {}, list(root.children)
    while stack:
        element = stack.pop()
        if not element.void:
            found[element.start] = element.words
        stack.extend(element.children)
    return found


def _source_words(element, spans):
    """Sets `element.words`, the source word indices `[first, stop)` its span covers (void:
    the index of the word after it), for it and its descendants."""
    if element.void:
        element.words = (_next_word(spans, element.begin),) * 2
    else:
        inside = [i for i, (b, e) in enumerate(spans) if b < element.finish and e > element.begin]
        element.words = (
            (inside[0], inside[-1] + 1) if inside else ((_next_word(spans, element.begin),) * 2)
        )
    for child in element.children:
        _source_words(child, spans)


def _next_word(spans, position):
    """The first word that ends after `position` (len(spans): none)."""
    return next((i for i, (_, e) in enumerate(spans) if e > position), len(spans))


def _place(element, alignment, n):
    """Sets `element.span`, the target gaps `[a, b)` it should wrap (before `_nest`)."""
    first, stop = element.words
    targets = [j for j, i in enumerate(alignment) if first <= i < stop]
    element.targets = set(targets)
    if targets:
        element.span = (min(targets), max(targets) + 1)
    else:  # before the target word aligned to the source word after it (or a later one)
        after = [j for j, i in enumerate(alignment) if i == stop]
        after = after or [j for j, i in enumerate(alignment) if i >= stop]
        gap = min(after) if after else n
        element.span = (gap, gap)
    for child in element.children:
        _place(child, alignment, n)


def _nest(children, low, high):
    """Makes the spans of `children` (siblings) proper inside `[low, high)`: the elements
    ordered by where they start in the translation, clipped to the parent and cut apart from
    one another; a void child that falls inside a sibling's words moves into that sibling."""
    paired = sorted((c for c in children if not c.void), key=lambda c: c.span)
    for child in paired:
        child.span = (min(max(child.span[0], low), high), min(max(child.span[1], low), high))
    _part_overlaps(paired)
    paired.sort(key=lambda c: c.span)
    cursor = low
    for k, child in enumerate(paired):
        a = min(max(child.span[0], cursor), high)
        # A sibling that starts later inside this one's span ends this one there.
        later = [c.span[0] for c in paired[k + 1 :] if c.span[0] > a]
        child.span = (a, min(max(child.span[1], a), high, *later[:1]))
        cursor = child.span[1]
    for child in [c for c in children if c.void]:
        gap = min(max(child.span[0], low), high)
        child.span = (gap, gap)
        host = next((c for c in paired if c.span[0] < gap < c.span[1]), None)
        if host is not None:
            children.remove(child)
            host.children.append(child)
    for child in paired:
        _nest(child.children, *child.span)
    children.sort(key=lambda c: c.span)


def _kept(element, span):
    """How many of the aligned target words of `element` and its descendants (each counted
    for every element it belongs to) lie inside `span`."""
    inside = sum(span[0] <= j < span[1] for j in element.targets)
    return inside + sum(_kept(c, span) for c in element.children if not c.void)


def _part_overlaps(paired):
    """Parts siblings whose spans overlap, one pair at a time, by the cut that keeps the most
    aligned words inside their tags: the first one ends where the second starts, starts where
    the second ends, or the second starts where the first ends (ties: in that order)."""
    for _ in range(len(paired) ** 2 + 1):
        paired.sort(key=lambda c: c.span)
        pair = next(
            ((x, y) for k, x in enumerate(paired) for y in paired[k + 1 :]
             if x.span[1] > y.span[0] and y.span[1] > x.span[0] and x.span[0] < x.span[1]
             and y.span[0] < y.span[1]),
            None,
        )  # fmt: skip
        if pair is None:
            return
        x, y = pair
        (xa, xb), (ya, yb) = x.span, y.span
        options = [((xa, ya), y.span), ((max(yb, xa), max(xb, yb)), y.span)]
        options.append((x.span, (xb, max(xb, yb))))
        x.span, y.span = max(options, key=lambda o: _kept(x, o[0]) + _kept(y, o[1]))
        if x.span == options[1][0] and xb <= yb:  # nothing of x after y: empty, after it
            x.span = (yb, yb)


def _render(children, words, low, high, out):
    """Appends `(kind, text)` items for words `[low, high)` with `children`'s tags: kind
    "word", "open" (joins the next word) or "close" (joins the previous word)."""
    cursor = low
    for child in children:
        a, b = child.span
        out.extend(("word", w) for w in words[cursor:a])
        if child.void:
            out.append(("open", child.start))
            cursor = a
            continue
        out.append(("open", child.start))
        _render(child.children, words, a, b, out)
        out.append(("close" if b > a else "open", child.end))
        cursor = b
    out.extend(("word", w) for w in words[cursor:high])


def _join(items):
    """The items as text: words separated by one space, opening tags before the next word,
    closing tags after the previous one."""
    text, pending, seen_word = [], [], False
    for kind, value in items:
        if kind == "word":
            if seen_word:
                text.append(" ")
            text.extend(pending)
            pending = []
            text.append(html.escape(value, quote=False))
            seen_word = True
        elif kind == "open":
            pending.append(value)
        else:
            text.extend(pending)
            pending = []
            text.append(value)
    return "".join(text + pending)


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
        translation: the translation of its plain text.
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
    words = translation.split()
    try:
        plain, root = _parse(source_markup, kind)
    except MarkupError as e:
        warnings.warn(f"malformed markup: tags dropped ({e})", MarkupWarning, stacklevel=2)
        return html.escape(" ".join(words), quote=False)
    # Character spans over the collapsed text the model saw map to the same word indices.
    spans = _word_spans(plain)
    per_word = _target_alignment(alignment, len(words))
    _source_words(root, spans)
    for child in root.children:
        _place(child, per_word, len(words))
    _nest(root.children, 0, len(words))
    items = []
    _render(root.children, words, 0, len(words), items)
    return _join(items)


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
        else html.escape(" ".join(translation.split()), quote=False)
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
