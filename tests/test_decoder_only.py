"""Decoder-only (GPT-style) use of the layers: a decoder built or called without an encoder
sequence is causal and has no encoder-decoder attention; the calls that do not match a layer's
mode, or leave out half of a pair of arguments, raise; `DecoderOnlyTransformer` learns a
next-token task with `model.fit` and generates it back with the library's searches, cached
decoding equal to uncached.

keras.ops and numpy only: it also runs with KERAS_BACKEND=jax (tests/test_backends.py).
"""

import keras
import numpy as np
import pytest
from keras import ops
from layer_harness import np_

from keras_transformer.config import BOS_ID, EOS_ID
from keras_transformer.decoding import beam_search, greedy_search, language_model_step
from keras_transformer.decoding.beam_cache import BeamCache
from keras_transformer.layers import (
    MultiHeadAttention,
    TransformerDecoder,
    TransformerDecoderBlock,
)
from keras_transformer.models import DecoderOnlyTransformer


def rand(shape, seed):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


DECODERS = {
    "block": lambda: TransformerDecoderBlock(num_heads=2, d_ff=32),
    "stack": lambda: TransformerDecoder(num_layers=2, num_heads=2, d_ff=32),
    "pre-norm stack": lambda: TransformerDecoder(2, 2, 32, norm_first=True),
}


@pytest.mark.parametrize("kind", sorted(DECODERS))
def test_decoder_without_encoder_sequence_is_causal(kind):
    """Changing position j changes no output before j (exactly) and changes the output at j."""
    layer = DECODERS[kind]()
    x = rand((2, 6, 16), 0)
    mask = np.ones((2, 6), bool)
    base = np_(layer(x, decoder_padding_mask=mask))
    for j in range(6):
        changed = x.copy()
        changed[:, j] = rand((2, 16), j + 1)
        out = np_(layer(changed, decoder_padding_mask=mask))
        np.testing.assert_array_equal(out[:, :j], base[:, :j])
        assert np.abs(out[:, j] - base[:, j]).max() > 1e-3


def test_language_model_is_causal_in_its_tokens():
    """The model's logits at positions before j do not depend on token j (exactly)."""
    model = DecoderOnlyTransformer(30, num_layers=2, d_model=16, num_heads=2, d_ff=32)
    ids = np.random.default_rng(1).integers(4, 30, (2, 7)).astype("int32")
    base = np_(model(ids))
    for j in range(7):
        changed = ids.copy()
        changed[:, j] = 4 + (changed[:, j] - 3) % 26  # another real token
        out = np_(model(changed))
        np.testing.assert_array_equal(out[:, :j], base[:, :j])
        assert np.abs(out[:, j] - base[:, j]).max() > 1e-4


def _weight_paths(layer):
    return [w.path for w in layer.weights]


@pytest.mark.parametrize("kind", sorted(DECODERS))
def test_decoder_only_has_no_cross_attention_weights(kind):
    x, memory = rand((2, 5, 16), 2), rand((2, 4, 16), 3)
    decoder_only, encoder_decoder = DECODERS[kind](), DECODERS[kind]()
    decoder_only(x)
    encoder_decoder(x, memory)
    assert decoder_only.decoder_only is True and encoder_decoder.decoder_only is False
    assert decoder_only.get_config()["decoder_only"] is True
    assert encoder_decoder.get_config()["decoder_only"] is False
    assert not [p for p in _weight_paths(decoder_only) if "cross_attention" in p]
    cross = [p for p in _weight_paths(encoder_decoder) if "cross_attention" in p]
    # The encoder-decoder layer differs only by its cross-attention (8) and its LayerNorm (2).
    layers = 1 if kind == "block" else 2
    assert len(cross) == 10 * layers
    assert len(encoder_decoder.weights) - len(decoder_only.weights) == len(cross)


def test_decoder_only_config_round_trip_keeps_the_mode():
    layer = TransformerDecoder(2, 2, 32)
    layer(rand((1, 3, 16), 4))
    clone = TransformerDecoder.from_config(layer.get_config())
    assert clone.decoder_only is True
    clone.build((1, 3, 16), (1, 4, 16))  # an encoder shape cannot change a fixed mode
    assert not [p for p in _weight_paths(clone) if "cross_attention" in p]


def _decoder_calls():
    """(layer built in one mode, call in the other or half-given, argument the error names)."""
    x, memory = rand((2, 3, 16), 5), rand((2, 4, 16), 6)
    cache = [(ops.zeros((2, 2, 5, 8)), ops.zeros((2, 2, 5, 8)))] * 2

    def only():
        layer = TransformerDecoder(2, 2, 32)
        layer(x)
        return layer

    def paired():
        layer = TransformerDecoder(2, 2, 32)
        layer(x, memory)
        return layer

    def block_only():
        layer = TransformerDecoderBlock(2, 32)
        layer(x)
        return layer

    return [
        (only, lambda d: d(x, memory), "encoder_output"),
        (only, lambda d: d(x, encoder_padding_mask=np.ones((2, 4), bool)), "encoder_padding_mask"),
        (only, lambda d: d(x, cross_attention_cache=cache), "cross_attention_cache"),
        (block_only, lambda d: d(x, memory), "encoder_output"),
        (
            lambda: TransformerDecoder(2, 2, 32, decoder_only=True),
            lambda d: d(x, memory),
            "encoder_output",
        ),
        (paired, lambda d: d(x), "encoder_output"),
        (
            lambda: TransformerDecoderBlock(2, 32, decoder_only=False),
            lambda d: d(x),
            "encoder_output",
        ),
        (paired, lambda d: d(x, memory, cross_attention_cache=cache), "cross_attention_cache"),
        (only, lambda d: d(x[:, :1], self_attention_cache=cache), "cache_update_index"),
        (only, lambda d: d(x[:, :1], cache_update_index=0), "self_attention_cache"),
        (
            only,
            lambda d: d(x[:, :1], self_attention_cache=cache[:1], cache_update_index=0),
            "self_attention_cache",
        ),
    ]


@pytest.mark.parametrize("case", range(len(_decoder_calls())))
def test_mismatched_decoder_calls_raise_naming_the_argument(case):
    make, call, argument = _decoder_calls()[case]
    layer = make()
    with pytest.raises(ValueError, match=argument):
        call(layer)


def test_attention_refuses_calls_whose_missing_argument_would_change_it():
    x = rand((2, 3, 8), 7)
    mha = MultiHeadAttention(num_heads=2, key_dim=4)
    mha(x, x)  # built
    cache = (ops.zeros((2, 2, 5, 4)), ops.zeros((2, 2, 5, 4)))
    with pytest.raises(ValueError, match="value=query"):
        mha(x)  # no value: would be bidirectional self-attention
    with pytest.raises(ValueError, match="cache_update_index"):
        mha(x[:, :1], x[:, :1], cache=cache)  # a self-attention cache without its index
    with pytest.raises(ValueError, match="cache_update_index"):
        mha(x, x, cache_update_index=1)  # an index without a cache
    beam_cache = BeamCache(ops.zeros((1, 2, 5, 4)), ops.zeros((1, 2, 5, 4)), np.ones((1, 1, 2, 5)))
    with pytest.raises(ValueError, match="attention_mask"):  # the cache's mask replaces it
        mha(x[:2, :1], None, attention_mask=np.ones((2, 1, 5), bool), cache=beam_cache)
    # The documented uses stay: a cross-attention cache replaces value; a self-attention cache
    # with its index takes the step's keys/values from the query.
    out, _ = mha(x, None, cache=cache)
    assert tuple(out.shape) == (2, 3, 8)
    step, _ = mha(x[:, :1], None, cache=cache, cache_update_index=0)
    np.testing.assert_allclose(
        np_(step), np_(mha(x[:, :1], x[:, :1], use_causal_mask=True)), atol=1e-6
    )


def test_decoder_only_cache_equals_full_pass():
    decoder = TransformerDecoder(2, 2, 32, norm_first=True)
    x = rand((2, 6, 16), 8)
    full = np_(decoder(x))
    cache = decoder.init_self_attention_cache(2, 8)  # room for 8 positions, 6 used
    assert tuple(cache[0][0].shape) == (2, 2, 8, 8) and len(cache) == 2
    steps = []
    for t in range(6):
        out, cache = decoder(x[:, t : t + 1], self_attention_cache=cache, cache_update_index=t)
        steps.append(np_(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


def test_language_model_decode_step_equals_full_pass():
    model = DecoderOnlyTransformer(30, num_layers=2, d_model=16, num_heads=2, d_ff=32)
    ids = np.random.default_rng(9).integers(4, 30, (2, 5)).astype("int32")
    full = np_(model(ids))
    cache = model.init_cache(2, 5)
    first, cache = model.decode_step(ids[:, :2], 0, cache)  # a prompt of two tokens at once
    rest = []
    for t in range(2, 5):
        logits, cache = model.decode_step(ids[:, t : t + 1], t, cache)
        rest.append(np_(logits))
    np.testing.assert_allclose(np.concatenate([np_(first)] + rest, 1), full, atol=1e-5)


def test_language_model_round_trips_through_keras_file(tmp_path):
    model = DecoderOnlyTransformer(30, num_layers=2, d_model=16, num_heads=2, d_ff=32)
    ids = np.random.default_rng(10).integers(4, 30, (2, 5)).astype("int32")
    path = str(tmp_path / "lm.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, DecoderOnlyTransformer) and loaded.decoder.decoder_only
    assert not [p for p in _weight_paths(loaded) if "cross_attention" in p]
    np.testing.assert_allclose(np_(loaded(ids)), np_(model(ids)), atol=1e-6)


# ---------------------------------------------------------------- training and generation

VOCAB, RUN = 16, 5  # sequences: BOS, s, s + 1, ..., s + RUN - 1, EOS


def _counting_sequences():
    starts = np.arange(4, VOCAB - RUN + 1)
    runs = starts[:, None] + np.arange(RUN)[None, :]
    bos, eos = np.full((len(starts), 1), BOS_ID), np.full((len(starts), 1), EOS_ID)
    return np.concatenate([bos, runs, eos], axis=1).astype("int32")  # [starts, RUN + 2]


@pytest.fixture(scope="module")
def trained_language_model():
    keras.utils.set_random_seed(0)
    model = DecoderOnlyTransformer(
        VOCAB, num_layers=1, d_model=32, num_heads=2, d_ff=64, dropout=0.0
    )
    model.compile(
        keras.optimizers.Adam(0.01),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    sequences = np.tile(_counting_sequences(), (16, 1))
    history = model.fit(
        sequences[:, :-1], sequences[:, 1:], batch_size=16, epochs=15, shuffle=True, verbose=0
    )
    return model, history.history


def test_language_model_learns_next_token_task_with_fit(trained_language_model):
    _, history = trained_language_model
    assert history["loss"][-1] < 0.5 * history["loss"][0]
    # Every token but the first (the run's start, drawn at random) is predictable.
    assert history["accuracy"][-1] > (RUN) / (RUN + 1) - 0.02


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_language_model_generates_the_task_back(trained_language_model, search):
    """Prompted with each run's first token, greedy and beam search (cached and uncached)
    continue the run and end it with EOS; cached decoding equals uncached."""
    model, _ = trained_language_model
    sequences = _counting_sequences()
    batch, max_length = len(sequences), RUN + 1
    bos = ops.full((batch,), BOS_ID, dtype="int32")
    results = []
    for use_cache in (True, False):
        step_fn, state = language_model_step(
            model, batch, max_length, use_cache=use_cache, prompt_ids=sequences[:, 1:2]
        )
        if search == "greedy":
            ids, scores, _ = greedy_search(step_fn, bos, state, max_length)
        else:
            ids, scores, _ = beam_search(step_fn, bos, state, 3, max_length, alpha=0.6)
        results.append((np_(ids), np_(scores)))
    (cached_ids, cached_scores), (full_ids, full_scores) = results
    np.testing.assert_array_equal(cached_ids, sequences[:, 1:])
    np.testing.assert_array_equal(full_ids, cached_ids)
    np.testing.assert_allclose(cached_scores, full_scores, atol=1e-4)
