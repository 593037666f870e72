"""Word alignments: their Moses text form, the alignment error rate (AER), and a set of
synthetic sentence pairs whose true alignment is known by construction. The rules that map the
attended pieces to words, shared by the SavedModel's graph and the LiteRT runtime, are
`keras_transformer.alignment_rules`.

The alignments themselves come from the model (`Translator`'s `alignment` output, see
docs/guides/alignments-markup.md). Here a word alignment is a set of `(source word, target
word)` index pairs, words being those of each side as SentencePiece reads them
(`keras_transformer.word_rules`; the synthetic sentences' words are plain ASCII ones).

Measure a SavedModel's AER and markup transfer on the synthetic set (the quickstart's export):

    python -m keras_transformer.alignment saved_models/quickstart --size 200
"""

import argparse
import re
import sys
from collections import Counter

from keras_transformer.data.synthetic import CONJUNCTION, TARGET_CONJUNCTION, generate, inflect
from keras_transformer.data.synthetic import lexicon as synthetic_lexicon

_START_TAG = re.compile(r"<[^/!?][^>]*>")
def format_pairs(pairs):
    """`[(i, j), ...]` -> Moses' / fast_align's `"i-j i-j"` (source word i, target word j)."""
    return " ".join(f"{i}-{j}" for i, j in pairs)


def alignment_error_rate(predicted, sure, possible=None):
    """Och and Ney's (2003) alignment error rate over a corpus, in [0, 1] (0: perfect).

    `AER = 1 - (|A & S| + |A & P|) / (|A| + |S|)`, summed over the sentences, with A the
    predicted links, S the sure links and P the possible ones (P includes S; None: P = S).

    Args:
        predicted, sure, possible: per sentence, an iterable of `(source word, target word)`
            pairs.

    Example:
    >>> alignment_error_rate([[(0, 0), (1, 2)]], [[(0, 0), (1, 1)]])
    0.5
    """
    possible = sure if possible is None else possible
    hits_sure = hits_possible = size_a = size_s = 0
    for a, s, p in zip(predicted, sure, possible, strict=True):
        a, s = set(map(tuple, a)), set(map(tuple, s))
        p = set(map(tuple, p)) | s
        hits_sure += len(a & s)
        hits_possible += len(a & p)
        size_a += len(a)
        size_s += len(s)
    if size_a + size_s == 0:
        return 0.0
    return 1.0 - (hits_sure + hits_possible) / (size_a + size_s)


def _target_stems():
    """Every source surface form of the synthetic language -> the stem its target word starts
    with (each source word has exactly one target word)."""
    lex = synthetic_lexicon()
    stems = {CONJUNCTION: TARGET_CONJUNCTION}
    for noun, (stem, _) in lex.nouns.items():
        stems[noun] = stems[inflect(noun)] = stem
    for verb, stem in lex.verbs.items():
        stems[verb] = stems[inflect(verb)] = stem
    stems.update(lex.adjectives)
    stems.update(lex.adverbs)
    stems.update(lex.prepositions)
    stems.update(lex.determiners)
    stems["an"] = lex.determiners["a"]
    stems.update({name: name for name in lex.names})
    return stems


def true_alignment(source, target):
    """The alignment of a synthetic pair by construction (`keras_transformer.data.synthetic`:
    every source word has one target word, its stem plus an ending), or None when it is
    ambiguous (a target word whose longest matching stem belongs to two source words, e.g. a
    word repeated)."""
    stems = _target_stems()
    source_words, target_words = source.split(), target.split()
    if not all(word in stems for word in source_words):
        return None
    pairs = []
    for j, word in enumerate(target_words):
        matches = [
            (len(stems[w]), i) for i, w in enumerate(source_words) if word.startswith(stems[w])
        ]
        if not matches:
            return None
        longest = max(length for length, _ in matches)
        best = [i for length, i in matches if length == longest]
        if len(best) != 1:
            return None
        pairs.append((best[0], j))
    if sorted(i for i, _ in pairs) != list(range(len(source_words))):
        return None  # not one target word per source word
    return pairs


def synthetic_alignment_set(size=200, seed=1, split="test", max_words=12):
    """`size` synthetic pairs with their true alignments: `[(source, target, pairs)]`, drawn
    from `split` and keeping only the unambiguous ones (`true_alignment`)."""
    chosen = []
    drawn = 4 * size
    while len(chosen) < size:
        chosen = []
        for source, target in generate(split, size=drawn, seed=seed, max_words=max_words):
            pairs = true_alignment(source, target)
            if pairs is not None:
                chosen.append((source, target, pairs))
            if len(chosen) == size:
                break
        drawn *= 2
    return chosen


def synthetic_markup_set(size=200, seed=1):
    """`size` synthetic HTML sentences with their known answers: `[(source markup, target,
    pairs, expected)]`, `expected` mapping each paired tag's start tag (`<b id=k>`, unique) to
    the target words `(first, stop)` it must wrap, or None where the words aligned to the
    source words it wraps are not contiguous in the target (no single right answer). Each
    sentence has one to three elements (one of them nested in another now and then) and a
    `<br/>` now and then."""
    import random

    rng = random.Random(seed)
    items = []
    for source, target, pairs in synthetic_alignment_set(size, seed):
        words = source.split()
        n = len(words)
        opens, closes, expected = [[] for _ in range(n)], [[] for _ in range(n)], {}
        start, tag = 0, 0
        while start < n and tag < 3:
            first = rng.randrange(start, n)
            stop = min(n, first + rng.randint(1, 3))
            spans = [(first, stop)]
            if stop - first > 1 and rng.random() < 0.5:  # a child inside
                inner = rng.randrange(first, stop)
                spans.append((inner, inner + 1))
            for a, b in spans:
                name = rng.choice(("b", "i", "span"))
                start_tag = f"<{name} id={tag}>"
                tag += 1
                opens[a].append(start_tag)
                closes[b - 1].insert(0, f"</{name}>")
                targets = sorted(j for i, j in pairs if a <= i < b)
                contiguous = targets == list(range(targets[0], targets[-1] + 1))
                expected[start_tag] = (targets[0], targets[-1] + 1) if contiguous else None
            start = stop + 1
        if rng.random() < 0.3:
            opens[rng.randrange(n)].insert(0, "<br/>")
        text = " ".join("".join(opens[i]) + w + "".join(closes[i]) for i, w in enumerate(words))
        items.append((text, target, pairs, expected))
    return items


def markup_scores(outputs, items, kind="html"):
    """How well `outputs` (a marked-up translation per item of `synthetic_markup_set`, of its
    reference target) kept the markup: `{"kept": share of sentences with every tag exactly
    once and properly nested, "right_words": share of the tags with a known answer that wrap
    exactly the right target words}`."""
    from keras_transformer.markup import MarkupError, element_words

    kept = right = known = 0
    for output, (source, _, _, expected) in zip(outputs, items, strict=True):
        try:
            spans = element_words(output, kind)
        except MarkupError:
            continue  # not properly nested
        kept += Counter(_START_TAG.findall(output)) == Counter(_START_TAG.findall(source))
        for start_tag, words in expected.items():
            if words is not None:
                known += 1
                right += spans.get(start_tag) == words
    return {"kept": kept / max(len(items), 1), "right_words": right / max(known, 1)}


def measure(model_dir, size=200, seed=1):
    """The AER of a SavedModel's attention alignments and its markup transfer on
    `synthetic_markup_set(size, seed)` (the alignment set, tags added), scored on the pairs it
    translates exactly (where its words are the reference's): `{"pairs", "exact", "aer",
    "markup_kept", "right_words"}`. Raises `ValueError` for a model exported without
    alignments."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops the graph uses)

    from keras_transformer.export.saved_model import resolve_model_dir
    from keras_transformer.markup import strip_markup, transfer_tags

    loaded = tf.saved_model.load(resolve_model_dir(model_dir))
    serve = loaded.signatures["serving_default"]
    if "alignment" not in serve.structured_outputs:
        raise ValueError(f"{model_dir} was exported without word alignments: export it with "
                         "--alignments (export.alignments: true)")  # fmt: skip
    items = synthetic_markup_set(size, seed)
    out = serve(text=tf.constant([strip_markup(text) for text, _, _, _ in items]))
    predicted, sure, outputs, exact = [], [], [], []
    for item, translation, row in zip(
        items, out["translation"].numpy(), out["alignment"].numpy().tolist()
    ):
        if translation.decode("utf-8", "replace").split() != item[1].split():
            continue  # another translation: its words are not the reference's
        exact.append(item)
        predicted.append([(i, j) for j, i in enumerate(row) if i >= 0])
        sure.append(item[2])
        outputs.append(transfer_tags(item[0], item[1], row))
    scores = markup_scores(outputs, exact)
    return {
        "pairs": len(items),
        "exact": len(exact),
        "aer": alignment_error_rate(predicted, sure),
        "markup_kept": scores["kept"],
        "right_words": scores["right_words"],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m keras_transformer.alignment",
        description="AER of a SavedModel's attention alignments and its markup transfer on the "
        "synthetic set (scored where the model's translation equals the reference, whose "
        "alignment is known)",
    )
    parser.add_argument(
        "model", help="a SavedModel directory (keras-transformer export --alignments)"
    )
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        m = measure(args.model, args.size, args.seed)
    except ValueError as e:
        parser.error(str(e))
    print(
        f"{m['exact']} of {m['pairs']} pairs translated exactly; on them: AER {m['aer']:.4f}, "
        f"markup kept {m['markup_kept']:.1%}, tags around the right words "
        f"{m['right_words']:.1%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
