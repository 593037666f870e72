"""Soft glossaries (Dinu et al. 2019): source terms annotated inline with their target terms.

A model prepared with `data.terminology` learned, on a fraction of its training pairs, to copy
the target term that follows an annotated source term:

    the <term> New York <trans> Nueva York </term> office

At inference a glossary (source term -> target term) annotates the source the same way: the
`translate_glossary` signature of the SavedModel does it in the graph (`annotate_graph`), and
since the annotation is only input text, any other runtime (CTranslate2, LiteRT) takes the text
that `annotate` returns.

Matching, the same in `annotate` and `annotate_graph`:
- a source term matches where it occurs whole: neither the character before it nor the one after
  it is a word character (a letter, a digit or `_`); case-sensitive, exact (spaces included);
- longest term first over the whole sentence (ties: the glossary's order), every occurrence;
  a term inside an annotation already made is not annotated again (no nested annotation);
- the characters U+0001-U+0005 of a text (which mark annotations and word boundaries while
  they are made) become spaces when the glossary is not empty; an empty glossary returns the
  text unchanged.

`TAGS` are kept whole by the tokenizer: `prepare` trains the vocabulary with them as
SentencePiece `user_defined_symbols`. A term that is empty (nothing but SentencePiece's
whitespace, `word_rules.SPACES`: it holds no word), holds a tag or a control character is
refused, by `annotate` and `annotate_graph` alike (`REFUSED`, one list of patterns both read);
in the graph an entry whose two terms are "" is padding, not an entry.
"""

import random
import re

from keras_transformer.word_rules import SPACES

START, SEPARATOR, END = "<term>", "<trans>", "</term>"
TAGS = (START, SEPARATOR, END)
# Marks an annotation while the glossary is applied (the nth term: OPEN, n + 1 x FILL, CLOSE).
_OPEN, _FILL, _CLOSE = "\x01", "\x02", "\x03"
_MARKS = re.compile("[\x01-\x05]")
# A term's boundaries in the graph's annotation (`_bounded`): no word character (Python's `\w`:
# letters, digits, `_`) on either side.
_BEFORE_WORD, _AFTER_WORD = "\x04", "\x05"


class GlossaryError(ValueError):
    """A glossary that cannot be used: unreadable, malformed, or a term that is refused."""


# The terms refused, as `(pattern a refused term matches whole, why)`: patterns that Python's `re`
# and RE2 (`annotate_graph`) read alike. Empty: nothing but whitespace as SentencePiece reads it
# (the literal characters of `word_rules.SPACES`, none special in a character class).
REFUSED = (
    ("[" + "".join(map(chr, SPACES)) + "]*", "is empty"),
    ("[\\s\\S]*(?:" + "|".join(re.escape(tag) for tag in TAGS) + ")[\\s\\S]*",
     f"holds an annotation tag {TAGS}"),
    ("[\\s\\S]*[\\x00-\\x1f\\x7f][\\s\\S]*", "holds a control character"),
)  # fmt: skip


def check_term(term, where="glossary"):
    """Raises `GlossaryError` for a term that is empty, holds a tag or a control character
    (`REFUSED`, the graph's refusals too)."""
    for pattern, why in REFUSED:
        if re.fullmatch(pattern, term):
            raise GlossaryError(f"{where}: the term {term!r} {why}")


def entries(glossary):
    """`[(source term, target term)]` of a mapping or of pairs, each checked (`check_term`)."""
    items = glossary.items() if hasattr(glossary, "items") else glossary
    out = []
    for source, target in items:
        check_term(source)
        check_term(target)
        out.append((str(source), str(target)))
    return out


def load_glossary(path):
    """The entries of a TSV glossary file: one `source term<TAB>target term` a line (blank
    lines and lines starting with `#` are skipped). Raises `GlossaryError` (one line) for an
    unreadable file, invalid UTF-8, a line without exactly one tab, or a refused term."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise GlossaryError(f"cannot read the glossary {path}: {e.strerror or e}") from None
    result = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError:
            raise GlossaryError(f"{path}:{number}: invalid UTF-8") from None
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise GlossaryError(
                f"{path}:{number}: expected 'source term<TAB>target term', got {len(fields)} "
                "tab-separated fields"
            )
        for term in fields:
            check_term(term, f"{path}:{number}")
        result.append((fields[0], fields[1]))
    return result


def _annotation(source, target):
    return f"{START} {source} {SEPARATOR} {target} {END}"


def _mark(n):
    return _OPEN + _FILL * (n + 1) + _CLOSE


def annotate(text, glossary):
    """`text` with the source terms of `glossary` it holds annotated inline: `<term> SOURCE
    <trans> TARGET </term>` (see the module docstring for the matching rules).

    Args:
        text: a sentence (str).
        glossary: a mapping `{source term: target term}` or `(source, target)` pairs.

    Returns:
        The annotated text; `text` itself when the glossary is empty.

    Raises:
        GlossaryError: a term is empty, holds a tag or a control character.

    Example:
    ```python
    annotate("the New York office", {"New York": "Nueva York"})
    # -> 'the <term> New York <trans> Nueva York </term> office'
    ```
    """
    items = entries(glossary)
    if not items:
        return text
    text = _MARKS.sub(" ", text)
    order = sorted(range(len(items)), key=lambda i: -len(items[i][0]))  # stable: ties in order
    for i in order:
        pattern = r"(?<!\w)" + re.escape(items[i][0]) + r"(?!\w)"
        text = re.sub(pattern, _mark(i), text)
    for i in order:
        text = text.replace(_mark(i), _annotation(*items[i]))
    return text


def _first_word(term):
    match = re.search(r"\w+", term)
    return match.group(0) if match else None


class TermAnnotator:
    """The training side (`data.terminology`): annotates a pair's source with the glossary
    entries whose source term occurs in its source and whose target term occurs in its target,
    for a seeded `fraction` of the pairs that have any."""

    def __init__(self, glossary, fraction):
        self.items = entries(glossary)
        self.fraction = float(fraction)
        self.by_word, self.always = {}, []
        for source, target in self.items:
            word = _first_word(source)
            (self.by_word.setdefault(word, []) if word else self.always).append((source, target))

    def found(self, source, target):
        """The entries that occur in the pair (source term in the source, target term in the
        target, both whole), in the glossary's order."""
        candidates = list(self.always)
        for word in set(re.findall(r"\w+", source)):
            candidates.extend(self.by_word.get(word, ()))
        order = {entry: i for i, entry in enumerate(self.items)}
        found = []
        for entry in sorted(set(candidates), key=order.__getitem__):
            if _occurs(entry[0], source) and _occurs(entry[1], target):
                found.append(entry)
        return found

    def __call__(self, pairs, seed):
        """`(pairs, annotated)`: the pairs with a seeded fraction of those holding terms
        annotated, and how many were."""
        rng, out, annotated = random.Random(seed), [], 0
        for source, target in pairs:
            found = self.found(source, target) if self.items else []
            if found and rng.random() < self.fraction:
                source = annotate(source, found)
                annotated += 1
            out.append((source, target))
        return out, annotated


def _occurs(term, text):
    return re.search(r"(?<!\w)" + re.escape(term) + r"(?!\w)", text) is not None


def annotate_graph(text, sources, targets):
    """`annotate` in TensorFlow ops (what the `translate_glossary` signature runs).

    Args:
        text: tf.string `[n]`, valid UTF-8.
        sources, targets: tf.string `[n, G]`: each row's glossary, padded with "" (an entry
            whose source term is "" is none).

    Returns:
        tf.string `[n]`, equal to `annotate` of each row with its entries; a term that
        `annotate` refuses (`REFUSED`: empty, holding a tag or a control character) in an entry
        that is not padding (both terms "") fails with `InvalidArgumentError`.
    """
    import tensorflow as tf

    entry = tf.logical_or(tf.not_equal(sources, ""), tf.not_equal(targets, ""))
    refused = tf.zeros_like(entry)
    for terms in (sources, targets):
        for pattern, _ in REFUSED:
            refused = tf.logical_or(refused, tf.strings.regex_full_match(terms, pattern))
    check = tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(tf.logical_and(entry, refused))),
        [f"a glossary term is empty, holds an annotation tag {TAGS} or a control character"],
    )
    with tf.control_dependencies([check]):
        text = tf.identity(text)
    return tf.map_fn(
        lambda row: _annotate_row(*row),
        (text, sources, targets),
        fn_output_signature=tf.TensorSpec([], tf.string),
    )


def _bounded(strings):
    r"""`strings` with word boundaries written in: at each position (between two characters, and
    at both ends) `_AFTER_WORD` when the character after it is not a word character (or it is
    the end), then `_BEFORE_WORD` when the character before it is not one (or it is the start).
    A term occurs whole (as `annotate`'s `(?<!\w)` and `(?!\w)` ask) exactly where
    `_term_pattern(term)` occurs in `_bounded(text)`, and two occurrences that touch share no
    character; so the per-term patterns are literals (RE2 compiles a pattern holding `\pL`
    at every call, 30x the cost of the literal). The strings hold no U+0004 or U+0005."""
    import tensorflow as tf

    after = tf.strings.regex_replace(strings, r"([^\pL\pN_])", r"\1" + _BEFORE_WORD)
    after = tf.strings.join([_BEFORE_WORD, after])
    return tf.strings.regex_replace(
        after, f"({_BEFORE_WORD})?([^\\pL\\pN_{_BEFORE_WORD}]|$)", _AFTER_WORD + r"\1\2"
    )


def _term_pattern(terms):
    """The RE2 pattern of each term in `_bounded` text: from the boundary before its first
    character to the one after its last."""
    import tensorflow as tf

    inner = tf.strings.regex_replace(_bounded(terms), f"^{_AFTER_WORD}|{_BEFORE_WORD}$", "")
    return tf.strings.regex_replace(inner, r"([.^$|?*+()\[\]{}\\])", r"\\\1")


def _annotate_row(line, row_sources, row_targets):
    """`annotate_graph` of one text: tf.string scalar, `[G]`, `[G]` -> tf.string scalar."""
    import tensorflow as tf

    def rewrite(term):  # a literal in an RE2 rewrite
        return tf.strings.regex_replace(term, r"\\", r"\\\\")

    size = tf.size(row_sources)
    lengths = tf.strings.length(row_sources, unit="UTF8_CHAR")
    order = tf.argsort(-lengths, stable=True)
    present = tf.reduce_any(tf.not_equal(row_sources, ""))
    line = tf.where(present, tf.strings.regex_replace(line, "[\x01-\x05]", " "), line)
    patterns = _term_pattern(row_sources)

    def mark(i):
        fill = tf.strings.reduce_join(tf.fill([i + 1], _FILL))
        return tf.strings.join([_OPEN, fill, _CLOSE])

    def mark_terms(k, line):
        i = order[k]
        # The match takes the boundaries around it. The mark's characters are not word
        # characters (as in `annotate`, a term may touch a mark): both boundaries on each side.
        both = _AFTER_WORD + _BEFORE_WORD
        replacement = tf.strings.join([both, mark(i), both])

        def marked():
            return tf.strings.regex_replace(line, patterns[i], replacement)

        return k + 1, tf.cond(tf.equal(row_sources[i], ""), lambda: line, marked)

    def annotate_marks(k, line):
        i = order[k]
        annotation = tf.strings.join(
            [START, " ", row_sources[i], " ", SEPARATOR, " ", row_targets[i], " ", END]
        )

        def replaced():
            return tf.strings.regex_replace(line, mark(i), rewrite(annotation))

        return k + 1, tf.cond(tf.equal(row_sources[i], ""), lambda: line, replaced)

    _, bounded = tf.while_loop(lambda k, _: k < size, mark_terms, [tf.constant(0), _bounded(line)])
    unbounded = tf.strings.regex_replace(bounded, f"[{_BEFORE_WORD}{_AFTER_WORD}]", "")
    line = tf.where(present, unbounded, line)
    _, line = tf.while_loop(lambda k, _: k < size, annotate_marks, [tf.constant(0), line])
    return line


def not_used(texts, glossaries, annotated):
    """The number of texts that hold a term of their glossary but whose annotation was not used
    (`annotated` false: it would not fit the source length limit)."""
    return sum(
        1
        for text, terms, used in zip(texts, glossaries, annotated)
        if not used and annotate(text, terms) != text
    )


def too_long_warning(count):
    """The one-line warning of `count` texts translated without their too long annotation."""
    return (
        f"{count} sentence(s) translated without their glossary annotation: annotated, they "
        "would be longer than the model's source length limit"
    )


def padded(glossaries):
    """`(sources, targets)`: per-row glossaries (mappings or pairs, one per text) as the dense
    `[n, G]` lists of str that `translate_glossary` takes, padded with ""."""
    rows = [entries(g) for g in glossaries]
    width = max((len(r) for r in rows), default=0)
    sources = [[s for s, _ in r] + [""] * (width - len(r)) for r in rows]
    targets = [[t for _, t in r] + [""] * (width - len(r)) for r in rows]
    return sources, targets
