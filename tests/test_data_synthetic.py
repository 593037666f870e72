"""The synthetic corpus: deterministic, disjoint splits, a real translation task."""

import collections

import pytest

from keras_transformer.data import read_pairs, synthetic
from keras_transformer.data.synthetic import generate
from keras_transformer.errors import DataError


@pytest.fixture(scope="module")
def train():
    return generate("train", size=4000, seed=3)


def test_deterministic_for_a_seed(train):
    assert generate("train", size=4000, seed=3) == train
    assert read_pairs("synthetic:split=train,size=4000,seed=3", verbose=False) == train
    other = generate("train", size=4000, seed=4)
    assert len(set(other) & set(train)) < 100  # a different draw (short sentences may repeat)


def test_splits_are_disjoint_and_translate_consistently(train):
    dev = read_pairs("synthetic:split=dev,size=400,seed=3", verbose=False)
    test = read_pairs("synthetic:split=test,size=400", verbose=False)
    sources = [{s for s, _ in pairs} for pairs in (train, dev, test)]
    assert [len(s) for s in sources] == [4000, 400, 400]  # distinct sentences within a split
    assert not sources[0] & sources[1]
    assert not sources[0] & sources[2]
    assert not sources[1] & sources[2]
    # Even with another seed, a dev sentence never shows up in train.
    assert not {s for s, _ in generate("dev", size=400, seed=99)} & sources[0]
    # Default sizes.
    assert len(read_pairs("synthetic:split=dev", verbose=False)) == 500


def test_hundreds_of_distinct_words_and_variable_lengths(train):
    source_words = {w for s, _ in train for w in s.split()}
    target_words = {w for _, t in train for w in t.split()}
    assert len(source_words) >= 400
    assert len(target_words) >= 400
    lengths = collections.Counter(len(s.split()) for s, _ in train)
    assert min(lengths) == 3 and max(lengths) >= 18
    assert len(lengths) >= 15
    short = generate("train", size=300, seed=3, min_words=4, max_words=6)
    assert {len(s.split()) for s, _ in short} == {4, 5, 6}


def test_not_a_copy_or_a_reversal(train):
    same_position = reversed_position = total = 0
    for source, target in train:
        s, t = source.split(), target.split()
        total += len(t)
        same_position += sum(a == b for a, b in zip(s, t))
        reversed_position += sum(a == b for a, b in zip(s[::-1], t))
    # Only names are carried over unchanged.
    assert same_position / total < 0.03
    assert reversed_position / total < 0.03


def _alignment(source, target):
    """Positions in `target` of the translations of the source content words, in source order."""
    lex = synthetic.lexicon()
    stems = {}
    for noun, (stem, _) in lex.nouns.items():
        stems[noun] = stems[synthetic.inflect(noun)] = stem
    for verb, stem in lex.verbs.items():
        stems[verb] = stems[synthetic.inflect(verb)] = stem
    for adjective, stem in lex.adjectives.items():
        stems[adjective] = stem
    target_words = target.split()
    positions = []
    for word in source.split():
        if word in stems:
            matches = [i for i, w in enumerate(target_words) if w.startswith(stems[word])]
            if len(matches) != 1:
                return None  # the same word twice: ambiguous, skip the sentence
            positions.append(matches[0])
    return positions


def test_words_are_reordered(train):
    monotone = reordered = 0
    for source, target in train:
        positions = _alignment(source, target)
        if positions is None or len(positions) < 3:
            continue
        if positions == sorted(positions) or positions == sorted(positions, reverse=True):
            monotone += 1
        else:
            reordered += 1
    assert reordered > 0.8 * (reordered + monotone)


def test_verb_goes_last_and_agrees_with_the_subject(train):
    lex = synthetic.lexicon()
    endings_by_number = collections.defaultdict(set)
    checked = 0
    for source, target in train:
        s, t = source.split(), target.split()
        # "NAME VERB OBJECT-NOUN(S)" sentences: subject-object-verb in the target.
        if len(s) == 3 and s[0] in lex.names:
            verb = s[1]
            lemma = verb if verb in lex.verbs else verb[:-1]
            lemma = lemma if lemma in lex.verbs else None
            if lemma is None:
                continue  # irregular spellings (-es, -ies) are covered by the other tests
            assert t[0] == s[0]
            assert t[-1].startswith(lex.verbs[lemma])
            endings_by_number["sg"].add(t[-1][len(lex.verbs[lemma]) :])
            checked += 1
    assert checked >= 5
    assert endings_by_number["sg"] == {synthetic.VERB_ENDINGS["sg"]}


def test_determiner_and_adjective_agree_with_the_noun(train):
    lex = synthetic.lexicon()
    forms = collections.defaultdict(set)  # (determiner, gender) -> target forms
    for source, target in train:
        s, t = source.split(), target.split()
        # "the/a ADJ NOUN VERB ..." with a singular noun subject and no leading adverb.
        if s[0] in ("the", "a", "an") and s[1] in lex.adjectives and s[2] in lex.nouns:
            if t[0] in lex.adverbs.values():
                continue
            stem, gender = lex.nouns[s[2]]
            assert t[1] == stem  # noun first, then the adjective
            assert t[2].startswith(lex.adjectives[s[1]])
            forms[("det", s[0] if s[0] != "an" else "a", gender)].add(t[0])
            forms[("adj", s[1], gender)].add(t[2])
    assert forms, "no matching sentences drawn"
    # Each (word, gender) has exactly one target form: a function of the noun's gender ...
    assert all(len(v) == 1 for v in forms.values())
    # ... and the form differs between genders.
    the_forms = {next(iter(v)) for k, v in forms.items() if k[:2] == ("det", "the")}
    assert len(the_forms) == 3


def test_target_is_a_function_of_the_source():
    pairs = generate("train", size=3000, seed=1) + generate("train", size=3000, seed=2)
    translation = {}
    for source, target in pairs:
        assert translation.setdefault(source, target) == target


def test_request_it_cannot_satisfy_is_a_data_error():
    with pytest.raises(DataError, match="could not draw"):
        generate("dev", size=50, min_words=3, max_words=3)
