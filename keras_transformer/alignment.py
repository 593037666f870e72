"""Word alignments: their Moses text form, the alignment error rate (AER), and a set of
synthetic sentence pairs whose true alignment is known by construction.

The alignments themselves come from the model (`Translator`'s `alignment` output, see
docs/guides/alignments-markup.md). Here a word alignment is a set of `(source word, target
word)` index pairs, words being the whitespace-separated words of each side.

Measure a SavedModel's AER on the synthetic set (`keras-transformer quickstart` trains one):

    python -m keras_transformer.alignment saved_models/quickstart --size 200
"""

import argparse
import sys

from keras_transformer.data.synthetic import CONJUNCTION, TARGET_CONJUNCTION, _inflect, generate
from keras_transformer.data.synthetic import lexicon as synthetic_lexicon


def format_pairs(pairs):
    """`[(i, j), ...]` -> Moses' / fast_align's `"i-j i-j"` (source word i, target word j)."""
    return " ".join(f"{i}-{j}" for i, j in pairs)


def parse_pairs(text):
    """`"i-j i-j"` -> `[(i, j), ...]` (`format_pairs`' inverse; `i?j` possible links read as
    `i-j`)."""
    pairs = []
    for link in text.split():
        i, j = link.replace("?", "-").split("-")
        pairs.append((int(i), int(j)))
    return pairs


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
        stems[noun] = stems[_inflect(noun)] = stem
    for verb, stem in lex.verbs.items():
        stems[verb] = stems[_inflect(verb)] = stem
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


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m keras_transformer.alignment",
        description="AER of a SavedModel's attention alignments on the synthetic set "
        "(against the reference alignment, scored on the reference target words; a pair is "
        "counted only where the model's translation equals the reference)",
    )
    parser.add_argument("model", help="a SavedModel directory (keras-transformer export)")
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    import tensorflow as tf

    from keras_transformer.commands.signatures import load_signature

    loaded, _, serve = load_signature(args.model)
    data = synthetic_alignment_set(args.size, args.seed)
    out = serve(text=tf.constant([source for source, _, _ in data]))
    predicted, sure, exact = [], [], 0
    for (_, target, pairs), translation, row in zip(
        data, out["translation"].numpy(), out["alignment"].numpy().tolist()
    ):
        if translation.decode("utf-8", "replace").split() != target.split():
            continue  # another translation: its words are not the reference's
        exact += 1
        predicted.append([(i, j) for j, i in enumerate(row) if i >= 0])
        sure.append(pairs)
    aer = alignment_error_rate(predicted, sure)
    print(f"AER {aer:.4f} on {exact} of {len(data)} pairs translated exactly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
