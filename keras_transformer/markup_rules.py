"""Where the tags of a translated text go: the rules of `keras_transformer.markup` on arrays,
written once for every engine. Each function takes the array namespace `xp` it runs on first:
`constraint_rules.NUMPY` (the Python road: `markup.transfer_tags`, the LiteRT runtime) or
`keras.ops` (a graph). Imports numpy, `constraint_rules` and `word_rules` only.

One text at a time. Its elements are listed in document order (a parent before its children):
`void` bool `[E]` (self-closing tags, comments, declarations: no end tag), `parent` int32 `[E]`
(-1: top level), and the character span `[begin, finish)` of the plain text each covers (a void
one: `begin == finish`, where it stands). The plain text's words are the character spans
`[word_begin, word_end)` (`word_spans`, `keras_transformer.word_rules`' rule of what a word
is, re-exported here); the translation has `n` words, and `alignment` int32 `[n]` gives
each one's source word (-1: none).

The rules (the module docstring of `keras_transformer.markup` says them in words):
0. `structure`: a text's elements from its tokens (each engine reads the tokens by
   `markup.TAG_PATTERN`), whether they nest, and `word_spans`: its plain text's words.
1. `source_words`: the source words `[first, stop)` each element wraps.
2. `target_spans`: the target gaps `[a, b)` each element should wrap, from the alignment.
3. `nest`: the spans made proper, parent by parent in document order: siblings clipped to
   their parent, parted where they overlap by the cut that keeps the most aligned words inside
   their tags (one pair at a time, at most `k * k + 1` cuts for `k` siblings), pushed apart in
   the order they start, and a void sibling that falls inside another's words moved into it.
4. `output_order`: where each tag and word goes in the output text, as sort keys.
"""

from keras_transformer.constraint_rules import NUMPY
from keras_transformer.word_rules import word_spans

__all__ = [
    "NUMPY",
    "nest",
    "output_order",
    "source_words",
    "structure",
    "target_spans",
    "transfer",
    "word_spans",
]

# What a token of a text with markup is (`keras_transformer.markup`'s grammar): text, a start
# tag, an end tag, a void element (self-closing tag, comment, declaration), a void element that
# separates words (HTML's `<br>` and `<hr>`: a space in the plain text), or a tag that does
# nothing (an end tag of an HTML void element, such as `</br>`).
TEXT, START, END, VOID, BREAK, DROPPED = range(6)
# `structure`'s verdicts: well formed, an end tag that closes nothing, an end tag that closes
# another element than the innermost open one, an element never closed.
WELL_FORMED, CLOSES_NOTHING, CLOSES_ANOTHER, NEVER_CLOSED = range(4)


def _dim(xp, x, axis=0):
    size = x.shape[axis]
    return xp.shape(x)[axis] if size is None else size


def _int(xp, x):
    return xp.cast(x, "int32")


def _column(xp, x):
    return xp.expand_dims(x, 1)


def _row(xp, x):
    return xp.expand_dims(x, 0)


def _first_index(xp, mask, default):
    """int32 `[E]`: the first column of each row of `mask` `[E, W]` that is set (`default`
    where none)."""
    columns = _int(xp, xp.arange(_dim(xp, mask, 1)))
    return xp.min(_int(xp, xp.where(mask, _row(xp, columns), default)), axis=1, initial=default)


def _last_index(xp, mask):
    """int32 `[E]`: the last column of each row of `mask` that is set (-1 where none)."""
    columns = _int(xp, xp.arange(_dim(xp, mask, 1)))
    return xp.max(_int(xp, xp.where(mask, _row(xp, columns), -1)), axis=1, initial=-1)


def _select(xp, mask):
    """int32 `[m]`: the indices where the 1-D `mask` is set, in order."""
    count = _dim(xp, mask)
    index = _int(xp, xp.arange(count))
    order = xp.argsort(xp.where(mask, index, index + count))
    return _int(xp, order[: xp.sum(_int(xp, mask))])


def _append(xp, x, value):
    """`x` `[T]` with `value` appended: `[T + 1]` (so that index `T` is valid)."""
    return xp.concatenate([x, xp.full((1,), value, dtype=x.dtype)])


def structure(xp, kind, name, length):
    """The elements of a text's tokens, and whether they nest.

    Args:
        kind: int32 `[T]`, each token's kind (`TEXT`, `START`, ...).
        name: int32 `[T]`, the same number for the same tag name (HTML: in any case).
        length: int32 `[T]`, the characters each token adds to the plain text.

    Returns:
        `(verdict, at, partner, elements)`: `verdict` one of `WELL_FORMED`, ...; `at` the
        token it is about (the first end tag that closes nothing or another element, or the
        innermost element never closed); `partner` the start tag that an end tag closing
        another element meets. `elements`: the element tokens (start tags and void ones) in
        order, as `(token, void, parent, begin, finish)` (module docstring); meaningful only
        when well formed.
    """
    count = _dim(xp, kind)
    index = _int(xp, xp.arange(count))
    start, end = xp.equal(kind, START), xp.equal(kind, END)
    delta = _int(xp, start) - _int(xp, end)
    after = xp.cumsum(delta)  # depth after each token
    before = after - delta
    offset = _int(xp, xp.cumsum(length)) - length
    # The innermost element open at each token: the last start tag before it at its depth.
    earlier = xp.less(_row(xp, index), _column(xp, index))
    at_depth = xp.equal(_row(xp, after), _column(xp, before))
    opener = _last_index(xp, xp.logical_and(xp.logical_and(_row(xp, start), earlier), at_depth))
    opened = xp.where(opener < 0, count, opener)  # index `count`: the appended value
    opener_name = xp.take(_append(xp, name, -1), opened)
    stray = xp.logical_and(end, xp.less_equal(before, 0))
    crossed = xp.logical_and(
        xp.logical_and(end, xp.greater(before, 0)), xp.not_equal(opener_name, name)
    )
    first_bad = _first_index(xp, _row(xp, xp.logical_or(stray, crossed)), count)[0]
    depth = xp.sum(delta)
    unclosed = _last_index(xp, _row(xp, xp.logical_and(start, xp.equal(after, depth))))[0]
    verdict = xp.where(
        first_bad < count,
        xp.where(xp.take(_append(xp, stray, False), first_bad), CLOSES_NOTHING, CLOSES_ANOTHER),
        xp.where(xp.not_equal(depth, 0), NEVER_CLOSED, WELL_FORMED),
    )
    at = xp.where(xp.equal(verdict, NEVER_CLOSED), unclosed, first_bad)
    partner = xp.take(_append(xp, opener, -1), first_bad)
    # Elements: where each starts and ends in the plain text, and their parents.
    is_element = xp.logical_or(start, xp.logical_or(xp.equal(kind, VOID), xp.equal(kind, BREAK)))
    tokens = _select(xp, is_element)
    position = _int(xp, xp.cumsum(_int(xp, is_element))) - 1
    later = xp.logical_and(_row(xp, end), xp.greater(_row(xp, index), _column(xp, index)))
    closer = _first_index(
        xp, xp.logical_and(later, xp.equal(_row(xp, before), _column(xp, after))), count
    )
    finish = xp.where(start, xp.take(_append(xp, offset, xp.sum(length)), closer), offset)
    parent = xp.take(_append(xp, position, -1), opened)
    elements = tuple(xp.take(x, tokens) for x in (xp.logical_not(start), parent, offset, finish))
    return verdict, at, partner, (tokens, *elements)


def source_words(xp, void, begin, finish, word_begin, word_end):
    """int32 `([E] first, [E] stop)`: the words of the plain text each element wraps, every
    word whose characters it covers even in part; a void element, or one that covers no word,
    gets `first == stop`, the first word that ends after where it begins (the word count where
    none does)."""
    words = _dim(xp, word_begin)
    inside = xp.logical_and(
        xp.less(_row(xp, word_begin), _column(xp, finish)),
        xp.greater(_row(xp, word_end), _column(xp, begin)),
    )
    inside = xp.logical_and(inside, _column(xp, xp.logical_not(void)))
    following = _first_index(xp, xp.greater(_row(xp, word_end), _column(xp, begin)), words)
    covered = xp.any(inside, axis=1)
    first = xp.where(covered, _first_index(xp, inside, words), following)
    stop = xp.where(covered, _last_index(xp, inside) + 1, following)
    return first, stop


def target_spans(xp, first, stop, alignment):
    """`(a, b, targets)`: each element's target span `[a, b)` before nesting, from the first to
    the last target word aligned to one of its words (`targets` bool `[E, n]`, those words);
    with none, the empty span before the first target word aligned to the source word
    `stop`, or else to a later one (`n`, the end, when none)."""
    n = _dim(xp, alignment)
    aligned = _row(xp, alignment)
    targets = xp.logical_and(
        xp.greater_equal(aligned, _column(xp, first)), xp.less(aligned, _column(xp, stop))
    )
    exact = xp.equal(aligned, _column(xp, stop))
    gap = xp.where(
        xp.any(exact, axis=1),
        _first_index(xp, exact, n),
        _first_index(xp, xp.greater_equal(aligned, _column(xp, stop)), n),
    )
    has = xp.any(targets, axis=1)
    a = xp.where(has, _first_index(xp, targets, n), gap)
    b = xp.where(has, _last_index(xp, targets) + 1, gap)
    return a, b, targets


def _descendants(xp, parent):
    """float32 `[E, E]`: 1 where the second element is the first or lies inside it."""
    count = _dim(xp, parent)
    index = _int(xp, xp.arange(count))
    child = xp.cast(xp.equal(_row(xp, parent), _column(xp, index)), "float32")
    itself = xp.cast(xp.equal(_row(xp, index), _column(xp, index)), "float32")

    def body(step, reach):
        return step + 1, xp.minimum(itself + xp.matmul(reach, child), 1.0)

    return xp.while_loop(lambda step, reach: step < count, body, (0, itself))[1]


def _before(xp, member, *keys):
    """bool `[E, E]`: `[e, f]` where `f` is a member and sorts before `e` by `keys` (compared
    in turn; the last must differ between members)."""
    less = None
    for key in reversed(keys):
        row, column = _row(xp, key), _column(xp, key)
        here = xp.less(row, column)
        less = (
            here
            if less is None
            else xp.logical_or(here, xp.logical_and(xp.equal(row, column), less))
        )
    return xp.logical_and(less, _row(xp, member))


def _rank(xp, member, *keys):
    """int32 `[E]`: how many members sort before each element (`_before`)."""
    return xp.sum(_int(xp, _before(xp, member, *keys)), axis=1)


def _take(xp, x, i):
    return xp.take(x, i, axis=0)


def _kept(xp, totals, element, low, high):
    """The aligned target words of `element` and of the elements inside it (each counted once
    per element it belongs to) within `[low, high)`: `totals` `[E, n + 1]` holds their running
    counts."""
    row = _take(xp, totals, element)
    return _take(xp, row, high) - _take(xp, row, low)


def _cut(xp, a, b, x, y, totals):
    """Parts siblings `x` and `y` (`x` first): `x` ends where `y` starts, or starts where `y`
    ends, or `y` starts where `x` ends; the cut that keeps the most aligned words inside their
    tags wins (ties: in that order)."""
    xa, xb, ya, yb = _take(xp, a, x), _take(xp, b, x), _take(xp, a, y), _take(xp, b, y)
    keep_y = _kept(xp, totals, y, ya, yb)
    after = xp.maximum(xb, yb)
    first = _kept(xp, totals, x, xa, ya) + keep_y
    second = _kept(xp, totals, x, xp.maximum(yb, xa), after) + keep_y
    third = _kept(xp, totals, x, xa, xb) + _kept(xp, totals, y, xb, after)
    take_first = xp.logical_and(first >= second, first >= third)
    take_second = xp.logical_and(xp.logical_not(take_first), second >= third)
    take_third = xp.logical_not(xp.logical_or(take_first, take_second))
    index = _int(xp, xp.arange(_dim(xp, a)))
    is_x, is_y = xp.equal(index, x), xp.equal(index, y)
    new_xa = xp.where(take_second, xp.maximum(yb, xa), xa)
    new_xb = xp.where(take_first, ya, xp.where(take_second, after, xb))
    a = xp.where(is_x, new_xa, xp.where(xp.logical_and(is_y, take_third), xb, a))
    b = xp.where(is_x, new_xb, xp.where(xp.logical_and(is_y, take_third), after, b))
    return a, b


def _part_overlaps(xp, a, b, rank, paired, totals):
    """The siblings `paired` with overlapping spans parted one pair at a time (`_cut`), the
    first overlapping pair in their order first: `(a, b, rank)`, `rank` their order after."""
    count = _dim(xp, a)
    siblings = xp.sum(_int(xp, paired))
    pair_of = _row(xp, paired)

    def body(step, done, a, b, rank):
        rank = _rank(xp, paired, a, b, rank)
        open_ = xp.less(a, b)
        overlap = xp.logical_and(
            xp.logical_and(xp.less(_column(xp, rank), _row(xp, rank)), pair_of),
            xp.logical_and(
                _column(xp, paired), xp.logical_and(_column(xp, open_), _row(xp, open_))
            ),
        )
        overlap = xp.logical_and(overlap, xp.greater(_column(xp, b), _row(xp, a)))
        overlap = xp.logical_and(overlap, xp.greater(_row(xp, b), _column(xp, a)))
        order = _column(xp, rank) * count + _row(xp, rank)
        first = _int(xp, xp.argmin(xp.reshape(xp.where(overlap, order, count * count), (-1,))))
        found = xp.any(overlap)
        cut_a, cut_b = _cut(xp, a, b, first // count, first % count, totals)
        return (
            step + 1,
            xp.logical_not(found),
            xp.where(found, cut_a, a),
            xp.where(found, cut_b, b),
            rank,
        )

    def more(step, done, a, b, rank):
        return xp.logical_and(xp.logical_not(done), step < siblings * siblings + 1)

    _, _, a, b, rank = xp.while_loop(more, body, (0, xp.equal(count, 0), a, b, rank))
    return a, b, _rank(xp, paired, a, b, rank)


def _push_apart(xp, a, b, rank, paired, low, high):
    """Siblings in their order each start at or after the previous one's end and end where a
    later one starts after them, inside `[low, high]`."""
    siblings = xp.sum(_int(xp, paired))

    def body(step, cursor, a, b):
        this = xp.logical_and(paired, xp.equal(rank, step))
        start = xp.minimum(xp.maximum(xp.max(xp.where(this, a, -1)), cursor), high)
        later = xp.logical_and(xp.logical_and(paired, xp.greater(rank, step)), xp.greater(a, start))
        end = xp.minimum(xp.maximum(xp.max(xp.where(this, b, -1)), start), high)
        end = xp.minimum(end, xp.min(xp.where(later, a, high)))
        return step + 1, end, xp.where(this, start, a), xp.where(this, end, b)

    _, _, a, b = xp.while_loop(lambda step, *_: step < siblings, body, (0, low, a, b))
    return a, b


def _nest_children(xp, group, state, void, totals, n):
    """`nest`'s step for the children of element `group` (-1: the top level)."""
    a, b, parent, order, moves = state
    count = _dim(xp, a)
    inner = xp.maximum(group, 0)
    top = xp.less(group, 0)
    low = xp.where(top, 0, _take(xp, a, inner))
    high = xp.where(top, n, _take(xp, b, inner))
    children = xp.equal(parent, group)
    paired = xp.logical_and(children, xp.logical_not(void))
    rank = _rank(xp, paired, a, b, order)  # by the spans before clipping, then as listed
    a = xp.where(paired, xp.clip(a, low, high), a)
    b = xp.where(paired, xp.clip(b, low, high), b)
    a, b, rank = _part_overlaps(xp, a, b, rank, paired, totals)
    a, b = _push_apart(xp, a, b, rank, paired, low, high)
    # Void children: at their gap, inside the sibling whose words hold it (if one does).
    voids = xp.logical_and(children, void)
    gap = xp.clip(a, low, high)
    a, b = xp.where(voids, gap, a), xp.where(voids, gap, b)
    holds = xp.logical_and(
        xp.logical_and(_row(xp, paired), xp.less(_row(xp, a), _column(xp, gap))),
        xp.less(_column(xp, gap), _row(xp, b)),
    )
    moved = xp.logical_and(voids, xp.any(holds, axis=1))
    host = _int(xp, xp.argmax(_int(xp, holds), axis=1))
    # A moved element is listed after its new siblings, in the order it was listed before.
    listed = count + moves + _rank(xp, moved, order)
    order = xp.where(moved, listed, order)
    return a, b, xp.where(moved, host, parent), order, moves + xp.sum(_int(xp, moved))


def nest(xp, void, parent, a, b, targets):
    """The spans `(a, b)` of `target_spans` made proper, parent by parent (module docstring,
    rule 3): `(a, b, parent, order)` with the void elements' new parents and `order`, how
    siblings are listed (the document's order, moved void elements after).

    `targets` bool `[E, n]`: each element's aligned target words (`target_spans`)."""
    count, n = _dim(xp, a), _dim(xp, targets, 1)
    inside = _descendants(xp, parent)
    # Running counts over the target words of the aligned words of each element and those
    # inside it: `_kept`.
    per_element = xp.matmul(inside, xp.cast(targets, "float32"))
    totals = xp.concatenate(
        [xp.full((count, 1), 0, dtype="int32"), _int(xp, xp.cumsum(per_element, axis=1))], axis=1
    )
    order = _int(xp, xp.arange(count))

    def body(group, *state):
        return (group + 1, *_nest_children(xp, group, state, void, totals, n))

    state = (_int(xp, a), _int(xp, b), _int(xp, parent), order, 0)
    more = lambda group, *_: xp.logical_and(group < count, count > 0)  # noqa: E731
    _, a, b, parent, order, _ = xp.while_loop(more, body, (-1, *state))
    return a, b, parent, order


def output_order(xp, void, parent, a, b, order, n):
    """Where the tags go among the `n` words of the translation, as sort keys (int64; all
    different): `(open_key [E], close_key [E], closes [E], word_key [n], space_key [n])`.
    Each element has an opening item (its start tag) and an ending one (its end tag; nothing
    for a void element); `closes`: the ending item is a closing tag that joins the word before
    it (an element with words); otherwise it joins the word after it, as opening tags do.
    Items sorted by key give the text: siblings in the order of their spans (then as listed),
    a word after the tags in the gap before it, one space between two words, placed after the
    last closing tag of that gap. `space_key[0]`: no space before the first word (unused)."""
    count = _dim(xp, a)
    inside = _descendants(xp, parent)
    size = _int(xp, xp.sum(inside, axis=1))
    depth = _int(xp, xp.sum(inside, axis=0)) - 1
    siblings = xp.equal(_row(xp, parent), _column(xp, parent))
    earlier = xp.logical_and(_before(xp, xp.ones_like(void), a, b, order), siblings)
    before = xp.sum(xp.where(earlier, _row(xp, size), 0), axis=1)
    top = xp.less(parent, 0)
    up = xp.clip(parent, 0, xp.maximum(count - 1, 0))

    def body(step, preorder):
        return step + 1, xp.where(top, before, _take(xp, preorder, up) + 1 + before)

    preorder = xp.while_loop(lambda step, _: step < count, body, (0, before))[1]
    opens = 2 * preorder - depth
    ends = opens + 2 * size - 1
    closes = xp.logical_and(xp.logical_not(void), xp.less(a, b))
    # Per gap, the last closing tag: the space goes after it.
    events = xp.concatenate([opens, ends])
    gaps = xp.concatenate([a, b])
    closing = xp.concatenate([xp.zeros_like(closes), closes])
    same_gap = xp.logical_and(xp.equal(_row(xp, gaps), _column(xp, gaps)), _row(xp, closing))
    last_close = xp.max(xp.where(same_gap, _row(xp, events), -1), axis=1, initial=-1)
    place = xp.where(xp.less_equal(events, last_close), 0, 2)
    width = xp.cast(2 * count + 1, "int64")
    keys = (xp.cast(gaps * 4 + place, "int64")) * width + xp.cast(events, "int64")
    words = xp.cast(xp.arange(n), "int64") * 4
    return keys[:count], keys[count:], closes, (words + 3) * width, (words + 1) * width


def transfer(xp, void, parent, begin, finish, word_begin, word_end, alignment):
    """Rules 1-4 in turn: `(open_key, close_key, closes, word_key, space_key)` of
    `output_order` for one text's elements and its translation's `alignment`."""
    first, stop = source_words(xp, void, begin, finish, word_begin, word_end)
    a, b, targets = target_spans(xp, first, stop, alignment)
    a, b, parent, order = nest(xp, void, parent, a, b, targets)
    return output_order(xp, void, parent, a, b, order, _dim(xp, alignment))
