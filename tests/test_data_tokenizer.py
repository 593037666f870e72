"""The shared SentencePiece vocabulary: special ids, in-graph round trips, reuse, fallbacks."""

import os
import warnings

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.config import DataConfig
from keras_transformer.data import Tokenizer, get_or_train_tokenizer
from keras_transformer.data import tokenizer as tokenizer_module
from keras_transformer.data.tokenizer import train_sentencepiece
from keras_transformer.errors import DataError, DataWarning

SAMPLES = [
    "Grüße aus Köln, schöne Äpfel und Öl für die Straße.",
    "Ein Bär läuft über die Brücke.",
    "東京は日本の首都です。",
    "我喜欢学习语言。",
    "Good morning 😀 have a nice day 🚀",
    "The cat sat on the mat.",
    "Ça va très bien, merci !",
]


@pytest.fixture(scope="module")
def spm_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("spm") / "spm.model")
    sentences = SAMPLES * 30 + [f"sentence number {i} with words" for i in range(200)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)  # a tiny text may give fewer pieces
        train_sentencepiece(sentences, path, vocab_size=200, seed=7, verbose=False)
    return path


def test_special_ids_and_files(spm_path):
    tokenizer = Tokenizer(spm_path)
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    assert [tokenizer.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert 100 <= tokenizer.vocab_size <= 200
    assert tokenizer.model_path == spm_path
    with open(spm_path, "rb") as f:
        assert tokenizer.model_proto == f.read()
    vocab_lines = open(spm_path[: -len(".model")] + ".vocab", encoding="utf-8").read().splitlines()
    assert len(vocab_lines) == tokenizer.vocab_size
    assert not [p for p in os.listdir(os.path.dirname(spm_path)) if ".tmp" in p]


def test_round_trip_of_non_ascii_text(spm_path):
    tokenizer = Tokenizer(spm_path)
    ids = tokenizer.tokenize(tf.constant(SAMPLES))
    assert isinstance(ids, tf.RaggedTensor)
    assert ids.dtype == tf.int32
    flat = ids.flat_values.numpy()
    assert flat.min() > 3  # no pad/unk/bos/eos: every character is covered, no markers added
    assert flat.max() < tokenizer.vocab_size
    texts = [t.decode("utf-8") for t in tokenizer.detokenize(ids).numpy()]
    assert texts == SAMPLES
    # The in-graph tokenizer agrees with the sentencepiece library.
    assert ids[2].numpy().tolist() == tokenizer.encode(SAMPLES[2])


def test_detokenize_dense_padded_and_stops_at_eos(spm_path):
    tokenizer = Tokenizer(spm_path)
    ids = tokenizer.tokenize(tf.constant(SAMPLES[:3]))
    with_eos = tf.concat([ids, tf.fill([3, 1], 3)], axis=1)
    dense = with_eos.to_tensor(default_value=0, shape=[3, 60]).numpy()
    # Garbage after EOS (what a decoder may emit) is ignored.
    dense[0, ids[0].shape[0] + 1 :] = 42
    texts = tokenizer.detokenize(tf.constant(dense)).numpy()
    assert [t.decode("utf-8") for t in texts] == SAMPLES[:3]
    # With BOS in front, from numpy, and a single sequence.
    bos = np.concatenate([[2], ids[1].numpy(), [3, 0, 0]])
    assert tokenizer.detokenize(bos).numpy().decode("utf-8") == SAMPLES[1]


def test_works_inside_tf_function(spm_path):
    tokenizer = Tokenizer(spm_path)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(texts):
        return tokenizer.detokenize(tokenizer.tokenize(texts))

    assert round_trip(tf.constant(SAMPLES[:2])).numpy().tolist() == [
        s.encode("utf-8") for s in SAMPLES[:2]
    ]


def test_unknown_characters_become_unk(spm_path):
    tokenizer = Tokenizer(spm_path)
    ids = tokenizer.tokenize(tf.constant(["Ω"])).flat_values.numpy()
    assert 1 in ids


def test_too_large_vocabulary_falls_back_with_a_warning(tmp_path):
    path = str(tmp_path / "small.model")
    with pytest.warns(DataWarning, match="instead of the 5000 asked for"):
        train_sentencepiece(["ab ba abba", "baba ab"] * 20, path, vocab_size=5000, verbose=False)
    assert 4 < Tokenizer(path).vocab_size < 5000


def test_progress_line(tmp_path, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        train_sentencepiece(["ab ba"] * 10, str(tmp_path / "p.model"), vocab_size=30)
    err = capsys.readouterr().err
    assert "training SentencePiece vocabulary of 30 (unigram) on 10 sentences" in err


def test_get_or_train_tokenizer_trains_once_then_reuses(tmp_path, monkeypatch):
    config = DataConfig(vocab_size=60, seed=3)
    pairs = [("ein kleines Haus", "a small house"), ("zwei Häuser", "two houses")] * 20
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        tokenizer = get_or_train_tokenizer(config, pairs, str(tmp_path), verbose=False)
    assert tokenizer.model_path == os.path.join(str(tmp_path), "spm.model")
    # Both sides are in the shared vocabulary.
    pieces = {tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)}
    assert any("ä" in p for p in pieces) and any("h" in p for p in pieces)

    def fail(*args, **kwargs):
        raise AssertionError("retrained although spm.model exists")

    monkeypatch.setattr(tokenizer_module, "train_sentencepiece", fail)
    again = get_or_train_tokenizer(config, pairs, str(tmp_path), verbose=False)
    assert again.model_proto == tokenizer.model_proto


def test_deterministic_training(tmp_path):
    sentences = SAMPLES * 10
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        a = train_sentencepiece(sentences, str(tmp_path / "a.model"), 80, seed=1, verbose=False)
        b = train_sentencepiece(sentences, str(tmp_path / "b.model"), 80, seed=1, verbose=False)
    assert Tokenizer(a).model_proto == Tokenizer(b).model_proto


def test_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        Tokenizer(str(tmp_path / "absent.model"))
    with pytest.raises(DataError, match="empty corpus"):
        train_sentencepiece(["", ""], str(tmp_path / "e.model"), 100, verbose=False)
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(DataError, match="not a SentencePiece model"):
        Tokenizer(str(bad))


def test_survives_clearing_the_eager_kernel_cache(spm_path):
    # tf.random.set_seed (and keras.utils.set_random_seed) clears TensorFlow's eager kernel
    # cache, which destroys kernel-owned resources such as tensorflow-text's SentencePiece model.
    tokenizer = Tokenizer(spm_path)
    expected = tokenizer.tokenize(tf.constant(SAMPLES[:2])).to_list()
    dataset = tf.data.Dataset.from_tensor_slices(SAMPLES[:2]).batch(2).map(tokenizer.tokenize)
    tf.random.set_seed(5)
    assert tokenizer.tokenize(tf.constant(SAMPLES[:2])).to_list() == expected
    assert next(iter(dataset)).to_list() == expected


def test_usable_inside_a_saved_model(spm_path, tmp_path):
    # Inside a traced function the tokenizer is an op of that graph (the model proto is part of
    # it), so a SavedModel needs neither our code nor the .model file to tokenize.
    tokenizer = Tokenizer(spm_path)

    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def round_trip(self, texts):
            return tokenizer.detokenize(tokenizer.tokenize(texts))

    module = Module()
    tf.saved_model.save(module, str(tmp_path / "saved"))
    os.rename(spm_path, spm_path + ".moved")
    try:
        loaded = tf.saved_model.load(str(tmp_path / "saved"))
        texts = loaded.round_trip(tf.constant(SAMPLES[:3] + [""])).numpy()
    finally:
        os.rename(spm_path + ".moved", spm_path)
    assert [t.decode("utf-8") for t in texts] == SAMPLES[:3] + [""]
