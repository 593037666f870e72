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
