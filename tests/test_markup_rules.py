"""`keras_transformer.markup_rules`: the tag-placement rules on arrays, one road for numpy (the
Python API, the LiteRT runtime) and for a graph (`keras.ops` under `tf.function`)."""

import random
import re
import warnings

import numpy as np
import pytest

from keras_transformer import markup, markup_rules


def _random_markup(rng, depth=0):
    """Text with nested elements, void tags, comments, entities and words split by tags."""
    parts = []
    for _ in range(rng.randint(1, 4)):
        draw = rng.random()
        if draw < 0.45:
            words = ["a", "bb", "c&amp;d", "\u00e9", "x"]
            parts.append(" ".join(rng.choice(words) for _ in range(rng.randint(0, 3))))
        elif draw < 0.75 and depth < 4:
            name = rng.choice(["b", "i", "u", "span", "a"])
            parts.append(f"<{name}>{_random_markup(rng, depth + 1)}</{name}>")
        elif draw < 0.88:
            parts.append(rng.choice(["<br/>", "<img src=x>", "<br>", "<!-- c -->", "<hr/>"]))
        else:
            parts.append(" ")
    return rng.choice(["", " "]).join(parts)


def _random_case(rng):
    """`(text, translation, per-word alignment)`: a random text, a translation of up to three
    more words than it has, aligned at random (repeats, gaps, -1) or by a permutation."""
    text = _random_markup(rng)
    count = len(markup.strip_markup(text).split())
    words = rng.randint(0, count + 3)
    if rng.random() < 0.6:
        alignment = [rng.randint(-1, count - 1) for _ in range(words)]
    else:
        alignment = rng.sample(range(count), count)[:words]
        alignment += [-1] * (words - len(alignment))
    return text, " ".join(f"w{j}" for j in range(words)), alignment


def _inputs(text, alignment):
    return (*markup._parse(text, "html").inputs, np.asarray(alignment, dtype=np.int32))


def _tags(text):
    return sorted(re.findall(r"<[^>]*>", text))


def test_every_tag_comes_back_once_properly_nested():
    """For random markup and alignments, the output holds the source's tags exactly once and
    parses as well-formed markup (a crossed or unclosed element would raise)."""
    rng = random.Random(3)
    for _ in range(300):
        text, translation, alignment = _random_case(rng)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = markup.transfer_tags(text, translation, alignment)
            assert _tags(out) == _tags(text), (text, alignment)
            assert markup.strip_markup(out) == translation


def test_the_graph_runs_the_same_rules_as_numpy():
    """`markup_rules.transfer` on `keras.ops` in a `tf.function` with unknown sizes gives
    numpy's keys exactly, on random cases that cut overlapping siblings and move void tags."""
    import tensorflow as tf
    from keras import ops

    ints = [tf.TensorSpec([None], tf.int32)] * 6
    graph = tf.function(
        lambda void, *rest: markup_rules.transfer(ops, void, *rest),
        input_signature=[tf.TensorSpec([None], tf.bool), *ints],
    )
    rng = random.Random(5)
    cases = [_random_case(rng) for _ in range(60)]
    cases.append(("plain words only", "x y", [1, 0]))  # no element
    cases.append(("<b></b>", "", []))  # no word on either side
    for text, _, alignment in cases:
        inputs = _inputs(text, alignment)
        expected = markup_rules.transfer(markup_rules.NUMPY, *inputs)
        got = graph(*inputs)
        for want, have in zip(expected, got):
            np.testing.assert_array_equal(np.asarray(have), want, err_msg=text)


@pytest.mark.parametrize(
    "text, translation, alignment, expected",
    [
        # Overlapping siblings: the cut that keeps the most aligned words inside its tags.
        ("<b>a b</b> <i>c</i>", "X Y Z", [0, 2, 1], "<b>X</b> <i>Y</i> Z"),
        # <b> (targets 0, 2, 3) and <i> (target 1): ending <b> at <i> keeps 1 + 1 aligned
        # words, starting it after <i> keeps 2 + 1, emptying <i> after <b> keeps 3 + 0.
        ("<b>a b c</b> <i>d</i>", "A D B C", [0, 3, 1, 2], "A <i>D</i> <b>B C</b>"),
        # A void tag that falls inside a sibling's words (before "D", aligned to "d") moves
        # into it.
        ("<b>a b</b> c<br/>d", "A D B", [0, 3, 1], "<b>A <br/>D B</b>"),
    ],
)
def test_cuts_and_moves(text, translation, alignment, expected):
    assert markup.transfer_tags(text, translation, alignment) == expected


# ------------------------------------------------------------------ the graph's parse


HOSTILE = [
    "",
    "   ",
    "a <b",  # an unfinished tag is text
    "a < b <3 x </> y",
    "<b><i>x</b></i> y",  # crossed
    "a </b> c",  # closes nothing
    "a <b>c",  # never closed
    "<B>x</b> <br>y</br> <img src='a>b'>z",
    "<!DOCTYPE html><![CDATA[x]]><?pi x?><!-- c --> text",
    "fish &amp; chips &eacute;t&eacute; &lt;3 &ampx &notit; &#x41;&#65 &#0;&#128;&#xD800;",
    "tab\tand\u00a0nbsp\u2003em\u3000ideographic  spaces",
    "<p>caf\u00e9 <b>na\u00efve</b></p>\u00a0",
    # SentencePiece's separators, and Python's that are not its own (`word_rules`).
    "<b>a</b>\u200bb \ufeff<i>c\x1cd</i>\x0be\x85f \x01 g\u00a8h\u00a8 &#8203;i",
    "<u>x\u2581y</u>\ufffd\u061c<b>\x1c</b> z",
]


@pytest.fixture(scope="module")
def tables():
    from keras_transformer.export import markup_graph

    return markup_graph.Tables()


@pytest.fixture(scope="module")
def markup_graph_function(tables):
    """`(text, is_html, translation, alignment) -> (plain, valid, tagged)` of
    `markup_graph`, traced once."""
    import tensorflow as tf

    from keras_transformer.export import markup_graph

    def run(text, is_html, translation, alignment):
        plain, valid = markup_graph.plain_texts(text, is_html, tables)
        tagged = markup_graph.tagged_texts(text, is_html, translation, alignment, valid, tables)
        return plain, valid, tagged

    strings = tf.TensorSpec([None], tf.string)
    specs = [
        strings,
        tf.TensorSpec([None], tf.bool),
        strings,
        tf.TensorSpec([None, None], tf.int32),
    ]
    return tf.function(run, input_signature=specs)


def test_whitespace_is_pythons():
    assert set(markup.WHITESPACE) == {chr(c) for c in range(0x110000) if chr(c).isspace()}


def test_the_graph_reads_character_references_as_html_unescape(tables):
    import html
    import html.entities

    from keras_transformer.export import markup_graph

    names = [f"&{name}" for name in html.entities.html5]
    names += [f"&{name}x;" for name in list(html.entities.html5)[::37]]  # legacy prefixes
    numbers = [*range(0x100), *range(0xFDD0, 0xFDF0), 0xD800, 0xDFFF, 0xFFFE, 0x10FFFF, 0x110000]
    numbers += random.Random(0).sample(range(0x10FFFF), 300)
    references = [f"&#{n};" for n in numbers] + [f"&#x{n:X}" for n in numbers[::3]]
    references += ["&#0000065;", "&#x0000041;", "&#99999999999;", "&#xFFFFFFFFF;", "&", "&#;"]
    texts = [f"a{ref}b" for ref in names + references]
    got = markup_graph.unescape(tf_constant(texts), tables).numpy()
    assert [g.decode("utf-8", "surrogatepass") for g in got] == [html.unescape(t) for t in texts]


def tf_constant(texts):
    import tensorflow as tf

    return tf.constant([t.encode("utf-8", "surrogatepass") for t in texts])


@pytest.mark.parametrize("kind", markup.KINDS)
def test_the_graph_parses_and_puts_tags_back_as_python(markup_graph_function, kind):
    """`markup_graph.plain_texts` and `tagged_texts` give `markup.plain_text` (and its
    verdict) and `markup.transfer_tags` on random and hostile texts."""
    import tensorflow as tf

    rng = random.Random(7)
    cases = [_random_case(rng) for _ in range(80)]
    for text in HOSTILE:
        words = len(_plain(text, kind).split())
        cases.append((text, " ".join(f"w{j}" for j in range(words)), list(range(words))[::-1]))
    texts = [c[0] for c in cases]
    width = max(len(c[2]) for c in cases) + 1
    alignment = np.full((len(cases), width), -1, np.int32)
    for row, (_, _, aligned) in zip(alignment, cases):
        row[: len(aligned)] = aligned
    is_html = tf.constant([kind == "html"] * len(cases))
    translations = tf_constant([c[1] for c in cases])
    plain, valid, tagged = markup_graph_function(
        tf_constant(texts), is_html, translations, tf.constant(alignment)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for (text, translation, aligned), p, v, t in zip(cases, plain, valid, tagged):
            assert p.numpy().decode() == _plain(text, kind), text
            assert bool(v) == _well_formed(text, kind), text
            assert t.numpy().decode() == markup.transfer_tags(text, translation, aligned, kind)


def _plain(text, kind):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return markup.plain_text(text, kind)


def _well_formed(text, kind):
    try:
        markup.strip_markup(text, kind)
    except markup.MarkupError:
        return False
    return True
