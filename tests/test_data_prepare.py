"""`prepare`: corpora streamed into a bounded-sample vocabulary and tokenized shards, read back
by tf.data exactly as the in-memory path tokenizes them."""

import collections
import glob
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import tensorflow as tf
from training_helpers import tiny_config

from keras_transformer import cli
from keras_transformer.config import save_config
from keras_transformer.data import Tokenizer, prepare, prepared_dataset, read_pairs
from keras_transformer.data import tokenizer as tokenizer_module
from keras_transformer.data.pipeline import bucket_batch_sizes
from keras_transformer.data.prepare import check_prepared, read_manifest
from keras_transformer.data.prepared import prepared_examples
from keras_transformer.errors import DataError, DataWarning
from keras_transformer.workdir import Workdir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(workdir, **data):
    values = dict(vocab_size=120, max_source_length=40, max_target_length=40)
    values.update(data)
    return tiny_config(workdir, data=values)


def _read_back(directory, **kwargs):
    """Every (source ids, target ids) of the prepared shards, as tuples."""
    return [
        (tuple(s.tolist()), tuple(t.tolist()))
        for s, t in prepared_examples(directory, **kwargs).as_numpy_iterator()
    ]


def _expected_ids(spec, tokenizer, max_source, max_target):
    """What the in-memory path keeps of `spec`, tokenized: pairs fitting the lengths."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        pairs = read_pairs(spec, verbose=False)
    ids, too_long = [], 0
    for source, target in pairs:
        s, t = tokenizer.encode(source), tokenizer.encode(target)
        if len(s) + 1 > max_source or len(t) + 1 > max_target:
            too_long += 1
            continue
        ids.append((tuple(s), tuple(t)))
    return ids, too_long


def _check_round_trip(config, manifest):
    layout = Workdir.of(config)
    tokenizer = Tokenizer(layout.spm)
    expected, too_long = _expected_ids(
        config.data.train, tokenizer, config.data.max_source_length, config.data.max_target_length
    )
    assert manifest["counts"]["written"] == len(expected)
    assert manifest["counts"]["skipped"]["too_long"] == too_long
    assert sum(shard["pairs"] for shard in manifest["shards"]) == len(expected)
    read = _read_back(layout.prepared, training=False)
    # The same ids as the in-memory path, each pair exactly once.
    assert collections.Counter(read) == collections.Counter(expected)
    return read


def test_prepare_text_counts_skips_by_reason_and_reads_back_the_same_ids(tmp_path):
    good = [(f"the house number {i} is red", f"das haus nummer {i} ist rot") for i in range(60)]
    source_lines = [s for s, _ in good] + ["", "fine", "x " * 60]
    target_lines = [t for _, t in good] + ["leer", "", "y " * 60]
    (tmp_path / "train.src").write_bytes(
        ("\n".join(source_lines) + "\n").encode() + b"bad \xff byte\n"
    )
    (tmp_path / "train.tgt").write_bytes(("\n".join(target_lines) + "\n").encode() + b"ok\n")
    config = _config(tmp_path / "work", train=f"text:{tmp_path}/train.src,{tmp_path}/train.tgt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)  # a vocabulary smaller than asked for
        manifest = prepare(config, verbose=False)
    assert manifest["counts"]["lines"] == 64
    assert manifest["counts"]["skipped"] == {
        "empty": 2,
        "invalid_utf8": 1,
        "malformed": 0,
        "too_long": 1,
    }
    assert manifest["counts"]["written"] == 60
    assert manifest["format_version"] == 1
    assert manifest["settings"]["data.train"] == config.data.train
    _check_round_trip(config, manifest)
    layout = Workdir.of(config)
    assert os.path.exists(layout.prepared_manifest)
    # No temporary directory is left behind; a second call reuses the data.
    assert not glob.glob(os.path.join(layout.root, "prepared.*"))
    assert prepare(config, verbose=False) == manifest


def test_the_shards_read_without_tensorflow_are_tf_datas_records_on_any_filesystem(tmp_path):
    """`data.records` (the JAX engine's and the vocabulary shortlist's reader) reads each shard
    as `tf.data.TFRecordDataset` does, through `tf.io.gfile` (a `ram://` copy gives the same
    pairs), and refuses a torn shard."""
    from keras_transformer.data.records import prepared_pairs, read_tfrecords

    config = _config(tmp_path / "work", train="synthetic:size=200,max_words=8")
    prepare(config, verbose=False)
    local = Workdir.of(config).prepared
    shards = [os.path.join(local, s["file"]) for s in read_manifest(local)["shards"]]
    for path in shards:
        expected = [r.numpy() for r in tf.data.TFRecordDataset(path)]
        assert list(read_tfrecords(path)) == expected and expected, path
    remote = "ram://records_test/prepared"
    tf.io.gfile.makedirs(remote)
    for name in tf.io.gfile.listdir(local):
        tf.io.gfile.copy(os.path.join(local, name), f"{remote}/{name}", overwrite=True)
    pairs, copied = prepared_pairs(local), prepared_pairs(remote)
    assert len(pairs) == len(copied) == read_manifest(local)["counts"]["written"]
    assert all(np.array_equal(a, b) for p, q in zip(pairs, copied) for a, b in zip(p, q))
    with open(shards[0], "rb") as f:
        whole = f.read()
    for cut in (5, len(whole) - 2):  # in a header, in a record's checksum
        torn = str(tmp_path / f"torn{cut}.tfrecord")
        with open(torn, "wb") as f:
            f.write(whole[:cut])
        with pytest.raises(DataError, match="truncated TFRecord"):
            list(read_tfrecords(torn))


def test_word_cached_encoding_equals_whole_sentence_encoding(tmp_path):
    import sentencepiece as spm

    from keras_transformer.data.encoding import _WordCachedEncoder

    pairs = read_pairs("synthetic:split=train,size=300", verbose=False)
    path = str(tmp_path / "spm.model")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        tokenizer_module.train_sentencepiece(
            [side for pair in pairs for side in pair] + ["Ａｂｃ ﬁ é"], path, 150, verbose=False
        )
    processor = spm.SentencePieceProcessor(model_file=path)
    # Normalization that changes or adds spaces, runs of spaces, unknown characters.
    tricky = ["a\u3000b  c", " x\u00a0y ", "Ａｂｃ ｄ", "e\u0301 \u0301a", "tab\there", "ﬁ ﬂ 😀"]
    sentences = [s for pair in pairs[:50] for s in pair] + tricky
    encoder = _WordCachedEncoder(processor, threads=1)
    assert encoder.encode(sentences) == processor.encode(sentences)
    assert encoder.enabled and encoder.cache
    assert encoder.encode(sentences[::-1]) == processor.encode(sentences[::-1])  # from the cache


def test_prepare_tsv_counts_malformed_lines(tmp_path):
    lines = [f"a small cat {i}\tdie kleine katze {i}\tattribution" for i in range(40)]
    lines += ["no tab here", "", "\tonly target"]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = _config(tmp_path / "work", train=f"tsv:{tmp_path}/train.tsv", long_pairs="truncate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        manifest = prepare(config, verbose=False)
    assert manifest["counts"]["skipped"] == {
        "empty": 2,
        "invalid_utf8": 0,
        "malformed": 1,
        "too_long": 0,
    }
    assert manifest["counts"]["lines"] == 43
    assert manifest["counts"]["written"] == 40
    _check_round_trip(config, manifest)


def test_prepare_tfds_with_mock_data(tmp_path):
    import tensorflow_datasets as tfds

    config = _config(
        tmp_path / "work",
        train="tfds:wmt14_translate/de-en:validation",
        vocab_size=60,
        max_source_length=200,
        max_target_length=200,
        long_pairs="truncate",
    )
    with tfds.testing.mock_data(num_examples=30), warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        manifest = prepare(config, verbose=False)
        counts = manifest["counts"]
        assert counts["lines"] == 30
        skipped = counts["skipped"]
        assert counts["written"] + skipped["empty"] + skipped["invalid_utf8"] == 30
        read = _check_round_trip(config, manifest)
    assert len(read) == counts["written"] >= 20


def test_prepare_synthetic_and_one_training_epoch_holds_each_pair_once(tmp_path):
    config = _config(tmp_path / "work", train="synthetic:split=train,size=400,max_words=8")
    manifest = prepare(config, verbose=False)
    assert manifest["counts"]["lines"] == 400
    assert len(manifest["shards"]) == 16
    read = _check_round_trip(config, manifest)
    # Training order: shuffled files and examples; with a one-example buffer the first
    # `written` examples are exactly one epoch.
    dataset = prepared_examples(Workdir.of(config).prepared, training=True, shuffle_buffer=1)
    written = manifest["counts"]["written"]
    stream = [(tuple(s), tuple(t)) for s, t in dataset.take(2 * written).as_numpy_iterator()]
    first, second = stream[:written], stream[written:]
    assert collections.Counter(first) == collections.Counter(read)
    assert collections.Counter(second) == collections.Counter(read)
    assert first != read and second != first  # files are shuffled anew each epoch


def test_subword_samples_write_sampled_segmentations_that_spell_each_pair(tmp_path):
    import sentencepiece as spm

    train = "synthetic:split=train,size=200,max_words=8"
    plain = _config(tmp_path / "plain", train=train, vocab_size=200)
    best = _check_round_trip(plain, prepare(plain, verbose=False))
    samples = 3

    def prepare_sampled(name, vocabulary):
        """Prepares `samples` sampled segmentations in a new workdir with `vocabulary`."""
        config = _config(
            tmp_path / name, train=train, vocab_size=200, subword_samples=samples, subword_alpha=0.3
        )
        os.makedirs(Workdir.of(config).root)
        shutil.copy(vocabulary, Workdir.of(config).spm)
        return Workdir.of(config), prepare(config, verbose=False)

    layout, manifest = prepare_sampled("sampled", Workdir.of(plain).spm)  # the same vocabulary
    counts = manifest["counts"]
    assert counts["written"] == len(best) and counts["segmentations"] == samples
    assert counts["records"] == sum(shard["pairs"] for shard in manifest["shards"])
    assert manifest["settings"]["data.subword_samples"] == samples
    read = _read_back(layout.prepared, training=False)
    assert len(read) == counts["records"] == samples * len(best)  # none too long here
    # Every sampled segmentation spells its pair: it decodes to the text the best one decodes
    # to, so each pair appears `samples` times, as a multiset of texts.
    processor = spm.SentencePieceProcessor(model_file=layout.spm)

    def texts(pairs):
        return collections.Counter(
            (processor.decode(list(s)), processor.decode(list(t))) for s, t in pairs
        )

    assert texts(read) == collections.Counter({k: samples * v for k, v in texts(best).items()})
    # ... and they are other segmentations than the best one, with more pieces (alpha 0.3).
    assert sum(pair not in set(best) for pair in read) > len(read) // 2
    assert manifest["tokens"]["target"] > samples * sum(len(t) + 1 for _, t in best)
    # Seeded: preparing again gives the same records.
    again, _ = prepare_sampled("again", layout.spm)
    assert _read_back(again.prepared, training=False) == read


def test_both_directions_add_each_kept_pair_reversed_with_a_bos_tag(tmp_path):
    train = "synthetic:split=train,size=300,max_words=8"
    # Wide limits: every pair kept, the reference ids.
    plain = _config(tmp_path / "plain", train=train, vocab_size=200)
    best = _check_round_trip(plain, prepare(plain, verbose=False))
    bos = Tokenizer(Workdir.of(plain).spm).bos_id
    assert not any(bos in source for source, _ in best)  # the tag is free on the source side
    # Narrow limits, so that some pairs fit one way but not reversed (the tag adds a token).
    limit = sorted(len(t) for _, t in best)[len(best) // 2] + 2
    config = _config(
        tmp_path / "both",
        train=train,
        vocab_size=200,
        both_directions=True,
        max_source_length=limit,
        max_target_length=limit,
    )
    os.makedirs(Workdir.of(config).root)
    shutil.copy(Workdir.of(plain).spm, Workdir.of(config).spm)  # the same vocabulary
    manifest = prepare(config, verbose=False)

    def fits(source, target):  # with EOS, as the model sees them
        return len(source) + 1 <= limit and len(target) + 1 <= limit

    kept = [(s, t) for s, t in best if fits(s, t) and fits((bos,) + t, s)]
    assert any(fits(s, t) and not fits((bos,) + t, s) for s, t in best)  # the case is tested
    counts = manifest["counts"]
    assert counts["written"] == len(kept) and counts["directions"] == 2
    assert counts["skipped"]["too_long"] == len(best) - len(kept)
    assert counts["records"] == 2 * len(kept) == sum(s["pairs"] for s in manifest["shards"])
    assert manifest["settings"]["data.both_directions"] is True
    read = _read_back(Workdir.of(config).prepared, training=False)
    reversed_pairs = [((bos,) + t, s) for s, t in kept]
    assert collections.Counter(read) == collections.Counter(kept + reversed_pairs)
    # Off, nothing changes: the setting is not even recorded (older workdirs still match).
    assert "data.both_directions" not in read_manifest(Workdir.of(plain).prepared)["settings"]


def test_vocabulary_is_trained_on_a_bounded_seeded_sample(tmp_path, monkeypatch):
    seen = []
    real = tokenizer_module._spm_train

    def spy(sentences, *args, **kwargs):
        seen.append(list(sentences))
        return real(sentences, *args, **kwargs)

    monkeypatch.setattr(tokenizer_module, "_spm_train", spy)
    spec = "synthetic:split=train,size=300,max_words=8"  # 600 sentences
    manifests = [
        prepare(_config(tmp_path / name, train=spec, spm_max_sentences=150), verbose=False)
        for name in ("a", "b")
    ]
    assert [len(sample) for sample in seen] == [150, 150]
    assert seen[0] == seen[1]  # the same seed: the same sample, the same vocabulary
    assert manifests[0]["vocabulary"]["sha256"] == manifests[1]["vocabulary"]["sha256"]
    assert manifests[0]["vocabulary"]["sample_sentences"] == 150
    other = _config(tmp_path / "c", train=spec, spm_max_sentences=150, seed=99)
    prepare(other, verbose=False)
    assert len(seen[2]) == 150 and seen[2] != seen[0]  # another seed, another sample


@pytest.mark.scenario
def test_a_killed_prepare_is_never_taken_as_complete(tmp_path):
    workdir = tmp_path / "work"
    config = _config(workdir, train="synthetic:split=train,size=12000,max_words=20")
    config_path = str(tmp_path / "tiny.yaml")
    save_config(config, config_path)
    # Small segments: shards appear in prepared.partial/ early and keep growing (with one
    # 65,536-pair segment they appeared just before the rename, and the kill could miss them).
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2",
               KERAS_TRANSFORMER_PREPARE_SEGMENT="512")  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-m", "keras_transformer.cli", "prepare", "--config", config_path],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Kill it as soon as it writes shards into its temporary directory.
        deadline = time.time() + 120
        while not glob.glob(str(workdir / "prepared.partial" / "train-*.tfrecord")):
            assert process.poll() is None, "prepare ended before it could be killed"
            assert time.time() < deadline
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    layout = Workdir.of(config)
    assert read_manifest(layout.prepared) is None
    assert check_prepared(config) is None  # train would prepare again
    with pytest.raises(DataError, match="no prepared data"):
        prepared_examples(layout.prepared)
    manifest = prepare(config, verbose=False)
    assert manifest["counts"]["lines"] == 12000
    assert not glob.glob(str(workdir / "prepared.*"))
    assert not glob.glob(str(workdir / "prepare.*"))  # the kept vocabulary, the progress
    # A kill between the rename of prepared/ and the installation of spm.model is repaired.
    os.remove(layout.spm)
    assert check_prepared(config) == manifest
    assert (
        Tokenizer(layout.spm).model_proto
        == Tokenizer(os.path.join(layout.prepared, "spm.model")).model_proto
    )


@pytest.mark.parametrize(
    "override, key",
    [
        ("data.train=synthetic:split=train,size=250,max_words=8", "data.train"),
        ("data.vocab_size=150", "data.vocab_size"),
        ("data.subword_samples=2", "data.subword_samples"),
        ("data.both_directions=true", "data.both_directions"),
    ],
)
def test_a_prepared_workdir_that_does_not_match_the_config_is_refused(
    tmp_path, capsys, override, key
):
    config = _config(tmp_path / "work", train="synthetic:split=train,size=200,max_words=8")
    config_path = str(tmp_path / "tiny.yaml")
    save_config(config, config_path)
    assert cli.main(["prepare", "--config", config_path]) == 0
    capsys.readouterr()
    for command in ("prepare", "train"):
        assert cli.main([command, "--config", config_path, "--set", override]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert f"{key} differs" in err and "delete" in err
    assert not os.path.exists(Workdir.of(config).config)  # the refused train wrote nothing
    # A replaced vocabulary is refused too.
    with open(Workdir.of(config).spm, "ab") as f:
        f.write(b"\0")
    assert cli.main(["train", "--config", config_path]) == 2
    assert "spm.model differs" in capsys.readouterr().err


def test_two_workers_read_disjoint_shards_whose_union_is_the_corpus(tmp_path):
    config = _config(tmp_path / "work", train="synthetic:split=train,size=300,max_words=8")
    prepare(config, verbose=False)
    directory = Workdir.of(config).prepared
    everything = _read_back(directory, training=False)
    parts = [
        _read_back(
            directory,
            training=False,
            input_context=tf.distribute.InputContext(
                num_input_pipelines=2, input_pipeline_id=i, num_replicas_in_sync=2
            ),
        )
        for i in range(2)
    ]
    assert parts[0] and parts[1]
    assert not set(parts[0]) & set(parts[1])
    assert collections.Counter(parts[0] + parts[1]) == collections.Counter(everything)
    # Without an input context, tf.distribute shards the files between workers.
    dataset = prepared_examples(directory)
    policy = dataset.options().experimental_distribute.auto_shard_policy
    assert policy == tf.data.experimental.AutoShardPolicy.FILE
    # The batches as a whole can be auto-sharded (by batch: FILE cannot see through the
    # bucketing's windows), as a multi-worker strategy does with a dataset given to fit.
    from tensorflow.python.data.experimental.ops import distribute

    batches = prepared_dataset(directory, config.data, training=True, verbose=False)
    first = next(iter(distribute._AutoShardDataset(batches, 2, 0)))
    assert first[1].shape[0] > 0


@pytest.mark.scenario
def test_prepared_batches_are_deterministic_keep_bucket_shapes_and_lower_the_loss(tmp_path):
    from keras_transformer.models import build_transformer
    from keras_transformer.training import compile_model

    config = _config(
        tmp_path / "work",
        train="synthetic:split=train,size=300,max_words=8",
        bucket_boundaries=[12, 24],
        max_source_length=24,
        max_target_length=24,
        vocab_size=200,
    )
    prepare(config, verbose=False)
    directory = Workdir.of(config).prepared
    budget = config.data.tokens_per_batch
    expected = set(zip(bucket_batch_sizes([12, 24], budget), [12, 24]))

    def batches(dataset, count):
        return [
            (f["source_ids"].numpy(), f["target_ids"].numpy(), y.numpy())
            for f, y in dataset.take(count)
        ]

    first = batches(prepared_dataset(directory, config.data, verbose=False), 12)
    again = batches(prepared_dataset(directory, config.data, verbose=False), 12)
    for (s, t, y), (s2, t2, y2) in zip(first, again, strict=True):
        assert np.array_equal(s, s2) and np.array_equal(t, t2) and np.array_equal(y, y2)
        assert tuple(s.shape) in expected and s.shape == t.shape == y.shape
        assert s.shape[0] * s.shape[1] <= budget
    # skip(n) reproduces the stream position (what an exact resume needs).
    skipped = batches(prepared_dataset(directory, config.data, verbose=False).skip(5), 3)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(first[5:8], skipped, strict=True))

    tokenizer = Tokenizer(Workdir.of(config).spm)
    model = build_transformer(config.model, tokenizer.vocab_size)
    compile_model(model, config, jit_compile=False)
    dataset = prepared_dataset(directory, config.data, verbose=False)
    history = model.fit(dataset, steps_per_epoch=10, epochs=3, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert losses[-1] < losses[0] - 0.5, losses


def test_small_config_default_corpus_runs_on_a_fresh_clone(tmp_path):
    """configs/small.yaml names a corpus every user can get (a TensorFlow Datasets set, which
    downloads on first use; mocked here), not a path outside the repository."""
    import tensorflow_datasets as tfds

    from keras_transformer.config import load_config

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    config = load_config(
        os.path.join(repo, "configs", "small.yaml"),
        overrides=[f"runtime.workdir={tmp_path}", "data.vocab_size=60"],
    )
    specs = [config.data.train, config.data.dev, config.data.test]
    assert all(spec.startswith("tfds:") for spec in specs), specs
    with tfds.testing.mock_data(num_examples=40):
        manifest = prepare(config, verbose=False)
        dev, test = read_pairs(config.data.dev, verbose=False), read_pairs(config.data.test)
    assert manifest["counts"]["written"] > 20
    assert dev and test
