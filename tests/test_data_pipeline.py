"""The tf.data pipeline: fixed bucket shapes, token budget, BOS/EOS placement, padding."""

import collections
import warnings

import numpy as np
import pytest

from keras_transformer.config import DataConfig
from keras_transformer.data import Tokenizer, encode_sources, make_dataset, read_pairs
from keras_transformer.data.pipeline import bucket_batch_sizes, bucket_boundaries
from keras_transformer.data.tokenizer import train_sentencepiece
from keras_transformer.errors import DataWarning

BOS, EOS, PAD = 2, 3, 0


@pytest.fixture(scope="module")
def pairs():
    return read_pairs("synthetic:split=train,size=600,seed=5", verbose=False)


@pytest.fixture(scope="module")
def tokenizer(pairs, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("pipeline") / "spm.model")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        train_sentencepiece(
            [side for pair in pairs for side in pair], path, vocab_size=300, verbose=False
        )
    return Tokenizer(path)


def _config(**kwargs):
    values = dict(max_source_length=40, max_target_length=40, tokens_per_batch=512, seed=1)
    values.update(kwargs)
    return DataConfig(**values)


def _text(tokenizer, row):
    return tokenizer.detokenize(np.asarray(row)).numpy().decode("utf-8")


def test_bucket_boundaries():
    assert bucket_boundaries(128) == [8, 16, 24, 40, 64, 96, 128]
    assert bucket_boundaries(5) == [5]
    for max_length in (7, 50, 100, 256, 1000):
        boundaries = bucket_boundaries(max_length)
        assert boundaries == sorted(set(boundaries))
        assert boundaries[-1] == max_length
        assert all(b % 8 == 0 for b in boundaries[:-1])
        assert len(boundaries) <= 12  # a few shapes, not one per length
    assert bucket_batch_sizes([8, 16, 40], 512) == [64, 32, 12]
    assert bucket_batch_sizes([8, 16, 40], 512, batch_multiple=8) == [64, 32, 8]
    assert bucket_batch_sizes([600], 512) == [1]  # always at least one sentence


def test_training_batches_have_fixed_bucket_shapes_within_the_token_budget(pairs, tokenizer):
    config = _config()
    boundaries = bucket_boundaries(40)
    expected = {
        (size, length) for size, length in zip(bucket_batch_sizes(boundaries, 512), boundaries)
    }
    shapes = collections.Counter()
    for features, labels in make_dataset(pairs, tokenizer, config, verbose=False).take(60):
        source, target = features["source_ids"], features["target_ids"]
        assert source.dtype == target.dtype == labels.dtype == "int32"
        assert target.shape == labels.shape
        assert source.shape[0] == target.shape[0]
        assert (tuple(source.shape)) in expected and tuple(target.shape) in expected
        assert source.shape == target.shape  # equal max lengths: one length per bucket
        assert source.shape[0] * source.shape[1] <= config.tokens_per_batch
        assert target.shape[0] * target.shape[1] <= config.tokens_per_batch
        shapes[tuple(source.shape)] += 1
    assert len(shapes) >= 3  # several buckets in use, each with its single shape


def test_bos_eos_placement_and_padding(pairs, tokenizer):
    translation = dict(pairs)
    features, labels = next(iter(make_dataset(pairs, tokenizer, _config(), verbose=False)))
    source = features["source_ids"].numpy()
    target = features["target_ids"].numpy()
    labels = labels.numpy()
    for s, t, y in zip(source, target, labels):
        n_source = int((s != PAD).sum())
        n_target = int((y != PAD).sum())
        # Padding only at the end.
        assert (s[:n_source] != PAD).all() and (s[n_source:] == PAD).all()
        assert (y[:n_target] != PAD).all() and (y[n_target:] == PAD).all()
        assert (t[n_target:] == PAD).all()
        # source = pieces + [EOS]; target_ids = [BOS] + pieces; labels = pieces + [EOS].
        assert s[n_source - 1] == EOS and BOS not in s and (s[: n_source - 1] != EOS).all()
        assert t[0] == BOS and EOS not in t
        assert y[n_target - 1] == EOS and BOS not in y
        np.testing.assert_array_equal(t[1:n_target], y[: n_target - 1])
        # The rows are a real pair, tokenized as the tokenizer does.
        source_text = _text(tokenizer, s)
        assert source_text in translation
        assert _text(tokenizer, y) == translation[source_text]
        assert s[: n_source - 1].tolist() == tokenizer.encode(source_text)
        assert y[: n_target - 1].tolist() == tokenizer.encode(translation[source_text])


def test_truncation_keeps_eos_and_bos(pairs, tokenizer):
    config = _config(
        max_source_length=6, max_target_length=5, bucket_boundaries=[4], long_pairs="truncate"
    )
    for features, labels in make_dataset(pairs, tokenizer, config, verbose=False).take(10):
        source, target = features["source_ids"].numpy(), features["target_ids"].numpy()
        labels = labels.numpy()
        # Buckets [4, 6]: the source pads to min(L, 6), the target to min(L, 5).
        assert (source.shape[1], target.shape[1]) in {(4, 4), (6, 5)}
        for s, t, y in zip(source, target, labels):
            n = int((s != PAD).sum())
            assert s[n - 1] == EOS
            assert t[0] == BOS
            assert y[int((y != PAD).sum()) - 1] == EOS
    long_source = max(pairs, key=lambda p: len(tokenizer.encode(p[0])))
    assert len(tokenizer.encode(long_source[0])) > 6  # truncation did happen


def test_evaluation_keeps_every_example_once_in_a_fixed_order(pairs, tokenizer):
    subset = pairs[:150]
    config = _config(max_source_length=80, max_target_length=80)  # long enough: no truncation
    dataset = make_dataset(subset, tokenizer, config, training=False, verbose=False)
    seen, first_pass = [], []
    for features, labels in dataset:
        for s, y in zip(features["source_ids"].numpy(), labels.numpy()):
            seen.append((_text(tokenizer, s), _text(tokenizer, y)))
        first_pass.append(features["source_ids"].numpy())
        assert features["source_ids"].shape[1] in bucket_boundaries(80)
    assert sorted(seen) == sorted(subset)  # nothing lost, nothing repeated
    second_pass = [f["source_ids"].numpy() for f, _ in dataset]
    assert len(first_pass) == len(second_pass)
    assert all(np.array_equal(a, b) for a, b in zip(first_pass, second_pass))


def test_training_shuffles_and_repeats(pairs, tokenizer):
    small = pairs[:40]
    config = _config(max_source_length=80, max_target_length=80, tokens_per_batch=160)
    dataset = make_dataset(small, tokenizer, config, verbose=False)
    rows = []
    for features, _ in dataset.take(40):  # more rows than examples: it repeats
        rows += [_text(tokenizer, s) for s in features["source_ids"].numpy()]
    assert len(rows) > len(small)
    assert set(rows) <= {s for s, _ in small}
    assert rows[: len(small)] != [s for s, _ in small]


def test_token_budget_override_and_batch_multiple(pairs, tokenizer):
    config = _config()
    dataset = make_dataset(
        pairs, tokenizer, config, tokens_per_batch=1024, batch_multiple=4, verbose=False
    )
    for features, _ in dataset.take(20):
        batch, length = features["target_ids"].shape
        assert batch % 4 == 0
        assert batch * length <= 1024
        assert batch == (1024 // length) // 4 * 4


def test_progress_line(pairs, tokenizer, capsys):
    make_dataset(pairs[:10], tokenizer, _config(), training=False)
    assert "evaluation data: 10 pairs in" in capsys.readouterr().err


def test_encode_sources_matches_the_training_convention(pairs, tokenizer):
    sources = [s for s, _ in pairs[:5]]
    ids = encode_sources(tokenizer, sources, max_source_length=80).numpy()
    assert ids.dtype == np.int32
    for row, text in zip(ids, sources):
        n = int((row != PAD).sum())
        assert row[: n - 1].tolist() == tokenizer.encode(text)
        assert row[n - 1] == EOS and (row[n:] == PAD).all()
    assert ids.shape[1] == max(len(tokenizer.encode(s)) + 1 for s in sources)
    short = encode_sources(tokenizer, sources, max_source_length=4, length=6).numpy()
    assert short.shape == (5, 6)
    np.testing.assert_array_equal(short[:, 3], EOS)
    np.testing.assert_array_equal(short[:, 4:], PAD)


def test_a_single_bucket_has_a_static_element_spec(pairs, tokenizer):
    config = _config(max_source_length=48, max_target_length=40, bucket_boundaries=[48])
    dataset = make_dataset(pairs, tokenizer, config, verbose=False)
    features, labels = dataset.element_spec
    assert features["source_ids"].shape.as_list() == [10, 48]  # 512 // 48
    assert features["target_ids"].shape.as_list() == [10, 40]
    assert labels.shape.as_list() == [10, 40]
    features, labels = next(iter(dataset))
    assert features["source_ids"].shape == (10, 48) and labels.shape == (10, 40)
