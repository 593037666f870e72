"""Layer tests against the paper's formulas and numpy references.

This module uses keras.ops and numpy only: it also runs with KERAS_BACKEND=jax
(see tests/test_backends.py).
"""

import math

import keras
import numpy as np
import pytest
from keras import ops
from layer_harness import POLICIES, check_output_spec, np_, run_layer_test, softmax  # noqa: E402

from keras_transformer.layers import (
    MultiHeadAttention,
    PositionwiseFeedForward,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    TransformerDecoder,
    TransformerDecoderBlock,
    TransformerEncoder,
    TransformerEncoderBlock,
    scaled_dot_product_attention,
)
from keras_transformer.layers.normalization import LayerNormalization

# ---------------------------------------------------------------- scaled dot-product attention


def test_worked_example():
    q = k = np.array([[1.0, 0.0], [0.0, 1.0]], "float32")
    v = np.array([[2.0, 3.0], [4.0, 5.0]], "float32")
    out, w = scaled_dot_product_attention(q, k, v)
    # softmax([1/sqrt2, 0]) = [0.6698, 0.3302]
    np.testing.assert_allclose(np_(w), [[0.67, 0.33], [0.33, 0.67]], atol=5e-3)
    np.testing.assert_allclose(np_(out), [[2.66, 3.66], [3.34, 4.34]], atol=5e-3)


def test_sdpa_matches_numpy_with_mask():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(2, 3, 5, 8)).astype("float32")
    k = rng.normal(size=(2, 3, 7, 8)).astype("float32")
    v = rng.normal(size=(2, 3, 7, 4)).astype("float32")
    mask = rng.random((2, 1, 5, 7)) > 0.3
    mask[..., 0] = True  # every row keeps one key
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    logits = q @ k.swapaxes(-1, -2) / math.sqrt(8)
    ref_w = softmax(np.where(mask, logits, -np.inf))
    np.testing.assert_allclose(np_(w), ref_w, atol=1e-5)
    np.testing.assert_allclose(np_(out), ref_w @ v, atol=1e-5)
    # Rows sum to one over the unmasked keys and give no weight to masked ones.
    np.testing.assert_allclose(np_(w).sum(-1), 1.0, atol=1e-5)
    assert np.all(np_(w)[~np.broadcast_to(mask, ref_w.shape)] == 0)


def test_fully_masked_rows_give_zeros_not_nan():
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(1, 4, 6)).astype("float32") for _ in range(3))
    mask = np.ones((1, 4, 4), bool)
    mask[0, 2] = False
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    out, w = np_(out), np_(w)
    assert np.isfinite(out).all() and np.isfinite(w).all()
    np.testing.assert_array_equal(w[0, 2], 0.0)
    np.testing.assert_array_equal(out[0, 2], 0.0)
    np.testing.assert_allclose(w[0, [0, 1, 3]].sum(-1), 1.0, atol=1e-6)
    # Without the zeroing pass (for callers whose rows all have a key): the same rows that have
    # keys, and the empty row's weights spread evenly over its keys.
    out2, w2 = (np_(x) for x in scaled_dot_product_attention(q, k, v, mask, zero_empty_rows=False))
    rows = [0, 1, 3]
    np.testing.assert_array_equal(w2[0, rows], w[0, rows])
    np.testing.assert_array_equal(out2[0, rows], out[0, rows])
    np.testing.assert_allclose(w2[0, 2], 0.25, atol=1e-6)


# ---------------------------------------------------------------- positional encoding


@pytest.mark.parametrize("depth", [16, 512, 7])
def test_positional_encoding_formula(depth):
    length, start = 60, 5
    x = np.zeros((2, length, depth), "float32")
    y = np_(SinusoidalPositionalEncoding()(x, start_index=start))
    pos = np.arange(start, start + length)[:, None].astype("float64")
    i = np.arange(depth)[None, :]
    angle = pos / np.power(10000.0, (2 * (i // 2)) / depth)
    ref = np.where(i % 2 == 0, np.sin(angle), np.cos(angle))
    np.testing.assert_allclose(y[0], ref, atol=2e-4)
    np.testing.assert_allclose(y[1], ref, atol=2e-4)
    # A few entries written out from the paper's formula.
    assert y[0, 0, 0] == pytest.approx(math.sin(5.0), abs=1e-5)
    assert y[0, 0, 1] == pytest.approx(math.cos(5.0), abs=1e-5)
    if depth > 3:
        assert y[0, 3, 2] == pytest.approx(math.sin(8.0 / 10000 ** (2 / depth)), abs=1e-5)


def test_positional_encoding_adds_to_input():
    x = np.random.default_rng(2).normal(size=(1, 9, 12)).astype("float32")
    layer = SinusoidalPositionalEncoding()
    base = np_(layer(np.zeros_like(x)))
    np.testing.assert_allclose(np_(layer(x)), x + base, atol=1e-6)


# ---------------------------------------------------------------- embedding and feed-forward


def test_token_embedding_scale_and_tied_projection():
    emb = TokenEmbedding(vocab_size=11, d_model=16)
    ids = np.array([[1, 4, 0]])
    x = np_(emb(ids))
    table = np_(emb.embeddings)
    np.testing.assert_allclose(x[0], table[[1, 4, 0]] * 4.0, atol=1e-6)
    h = np.random.default_rng(3).normal(size=(1, 3, 16)).astype("float32")
    np.testing.assert_allclose(np_(emb(h, reverse=True)), h @ table.T, atol=1e-5)
    assert emb.compute_mask(ids) is None
    masked = TokenEmbedding(11, 16, mask_zero=True)
    assert np_(masked.compute_mask(ids)).tolist() == [[True, True, False]]


def test_feed_forward_formula():
    x = np.random.default_rng(4).normal(size=(2, 5, 8)).astype("float32")
    ffn = PositionwiseFeedForward(d_ff=32)
    y = np_(ffn(x))
    w1, b1 = (np_(v) for v in ffn.inner.weights)
    w2, b2 = (np_(v) for v in ffn.outer.weights)
    np.testing.assert_allclose(y, np.maximum(0, x @ w1 + b1) @ w2 + b2, atol=1e-5)


# ---------------------------------------------------------------- multi-head attention


def test_multi_head_attention_matches_reference():
    rng = np.random.default_rng(5)
    xq = rng.normal(size=(2, 4, 12)).astype("float32")
    xkv = rng.normal(size=(2, 6, 12)).astype("float32")
    mha = MultiHeadAttention(num_heads=3, key_dim=4)
    out, scores = mha(xq, xkv, return_attention_scores=True)
    wq, bq, wk, bk, wv, bv, wo, bo = (np_(w) for w in mha.weights)

    def heads(x):
        return x.reshape(2, -1, 3, 4).transpose(0, 2, 1, 3)

    q, k, v = heads(xq @ wq + bq), heads(xkv @ wk + bk), heads(xkv @ wv + bv)
    w = softmax(q @ k.swapaxes(-1, -2) / 2.0)
    ref = (w @ v).transpose(0, 2, 1, 3).reshape(2, 4, 12) @ wo + bo
    np.testing.assert_allclose(np_(scores), w, atol=1e-5)
    np.testing.assert_allclose(np_(out), ref, atol=1e-5)


def test_causal_mask_blocks_future():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(1, 6, 8)).astype("float32")
    mha = MultiHeadAttention(num_heads=2, key_dim=4)
    y1 = np_(mha(x, x, use_causal_mask=True))
    x2 = x.copy()
    x2[:, 4:] = rng.normal(size=(1, 2, 8))
    y2 = np_(mha(x2, x2, use_causal_mask=True))
    np.testing.assert_allclose(y1[:, :4], y2[:, :4], atol=1e-6)
    assert not np.allclose(y1[:, 4:], y2[:, 4:])


def test_self_attention_cache_equals_full_pass():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    mha = MultiHeadAttention(num_heads=2, key_dim=4)
    full = np_(mha(x, x, use_causal_mask=True))
    cache = (ops.zeros((2, 2, 7, 4)), ops.zeros((2, 2, 7, 4)))  # room for 7 positions, 5 used
    steps = []
    for t in range(5):
        out, cache = mha(x[:, t : t + 1], x[:, t : t + 1], cache=cache, cache_update_index=t)
        steps.append(np_(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


def test_cross_attention_cache_equals_direct():
    rng = np.random.default_rng(8)
    q = rng.normal(size=(2, 3, 8)).astype("float32")
    mem = rng.normal(size=(2, 5, 8)).astype("float32")
    mask = np.array([[True] * 5, [True, True, True, False, False]])[:, None, :]
    mha = MultiHeadAttention(num_heads=2, key_dim=4)
    direct = np_(mha(q, mem, attention_mask=mask))
    cache = mha.compute_key_value_cache(mem)
    cached, _ = mha(q, None, attention_mask=mask, cache=cache)
    np.testing.assert_allclose(np_(cached), direct, atol=1e-6)


# ---------------------------------------------------------------- blocks and stacks


def test_encoder_block_padding_invariance():
    rng = np.random.default_rng(9)
    x = rng.normal(size=(1, 4, 16)).astype("float32")
    padded = np.concatenate([x, rng.normal(size=(1, 3, 16)).astype("float32")], axis=1)
    for layer in (
        TransformerEncoderBlock(num_heads=4, d_ff=32),
        TransformerEncoder(num_layers=2, num_heads=4, d_ff=32, norm_first=True),
    ):
        y = np_(layer(x, padding_mask=np.ones((1, 4), bool)))
        mask = np.array([[True] * 4 + [False] * 3])
        y_pad = np_(layer(padded, padding_mask=mask))
        np.testing.assert_allclose(y_pad[:, :4], y, atol=1e-5)


def test_encoder_block_post_norm_structure():
    """Post-norm: every block output is LayerNorm-ed (zero mean, unit variance per position)."""
    x = np.random.default_rng(10).normal(size=(2, 5, 16)).astype("float32") * 3 + 1
    y = np_(TransformerEncoderBlock(num_heads=2, d_ff=32)(x))
    np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-4)
    np.testing.assert_allclose(y.std(-1), 1.0, atol=1e-2)


def test_decoder_cache_equals_full_pass():
    rng = np.random.default_rng(11)
    y = rng.normal(size=(2, 6, 16)).astype("float32")
    mem = rng.normal(size=(2, 4, 16)).astype("float32")
    mem_mask = np.array([[True] * 4, [True, True, False, False]])
    dec = TransformerDecoder(num_layers=2, num_heads=4, d_ff=32)
    full = np_(dec(y, mem, encoder_padding_mask=mem_mask))
    cache = [(ops.zeros((2, 4, 8, 4)), ops.zeros((2, 4, 8, 4))) for _ in range(2)]
    cross = dec.compute_cross_attention_cache(mem)
    outs = []
    for t in range(6):
        out, cache = dec(
            y[:, t : t + 1],
            None,
            encoder_padding_mask=mem_mask,
            self_attention_cache=cache,
            cache_update_index=t,
            cross_attention_cache=cross,
        )
        outs.append(np_(out))
    np.testing.assert_allclose(np.concatenate(outs, 1), full, atol=1e-5)


def test_decoder_block_returns_scores():
    rng = np.random.default_rng(12)
    y = rng.normal(size=(1, 3, 8)).astype("float32")
    mem = rng.normal(size=(1, 5, 8)).astype("float32")
    out, scores = TransformerDecoderBlock(num_heads=2, d_ff=16)(
        y, mem, return_attention_scores=True
    )
    assert np_(scores["self_attention"]).shape == (1, 2, 3, 3)
    cross = np_(scores["cross_attention"])
    assert cross.shape == (1, 2, 3, 5)
    np.testing.assert_allclose(cross.sum(-1), 1.0, atol=1e-5)
    self_w = np_(scores["self_attention"])
    assert np.all(np.triu(self_w[0, 0], k=1) == 0)  # causal


# ---------------------------------------------------------------- config round trips, dtypes


X = np.random.default_rng(13).normal(size=(2, 3, 8)).astype("float32")
IDS = np.array([[3, 7, 1, 0], [5, 2, 0, 0]], "int32")
MEMORY = np.random.default_rng(14).normal(size=(2, 4, 8)).astype("float32")

# (layer factory, input, output shape, trainable weights, input dtype)
LAYER_CASES = {
    "MultiHeadAttention": (
        lambda: MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.1),
        {"query": X, "value": X},
        (2, 3, 8),
        8,  # query, key, value, output: kernel and bias each
        "float32",
    ),
    "PositionwiseFeedForward": (
        lambda: PositionwiseFeedForward(d_ff=16, activation="relu"),
        X,
        (2, 3, 8),
        4,
        "float32",
    ),
    "SinusoidalPositionalEncoding": (
        lambda: SinusoidalPositionalEncoding(),
        X,
        (2, 3, 8),
        0,
        "float32",
    ),
    "TokenEmbedding": (lambda: TokenEmbedding(20, 8, mask_zero=True), IDS, (2, 4, 8), 1, "int32"),
    "LayerNormalization": (lambda: LayerNormalization(epsilon=1e-6), X, (2, 3, 8), 2, "float32"),
    "TransformerEncoderBlock": (
        lambda: TransformerEncoderBlock(num_heads=2, d_ff=16, norm_first=True),
        X,
        (2, 3, 8),
        8 + 4 + 4,  # attention, feed-forward, two LayerNorms
        "float32",
    ),
    "TransformerDecoderBlock": (
        lambda: TransformerDecoderBlock(num_heads=2, d_ff=16, dropout=0.2),
        {"inputs": X, "encoder_output": MEMORY},
        (2, 3, 8),
        2 * 8 + 4 + 6,  # two attentions, feed-forward, three LayerNorms
        "float32",
    ),
    "TransformerDecoderBlock decoder-only": (
        lambda: TransformerDecoderBlock(num_heads=2, d_ff=16, dropout=0.2),
        X,
        (2, 3, 8),
        8 + 4 + 4,  # self-attention, feed-forward, two LayerNorms: no cross-attention
        "float32",
    ),
    "TransformerEncoder": (
        lambda: TransformerEncoder(num_layers=2, num_heads=2, d_ff=16),
        X,
        (2, 3, 8),
        2 * 16,
        "float32",
    ),
    "TransformerDecoder": (
        lambda: TransformerDecoder(num_layers=2, num_heads=2, d_ff=16, norm_first=True),
        {"inputs": X, "encoder_output": MEMORY},
        (2, 3, 8),
        2 * 26 + 2,  # and the pre-norm stack's final LayerNorm
        "float32",
    ),
    "TransformerDecoder decoder-only": (
        lambda: TransformerDecoder(num_layers=2, num_heads=2, d_ff=16, norm_first=True),
        X,
        (2, 3, 8),
        2 * 16 + 2,
        "float32",
    ),
}


@pytest.mark.parametrize("name", sorted(LAYER_CASES))
def test_layer_by_the_book(name, tmp_path):
    make, data, shape, weights, dtype = LAYER_CASES[name]
    run_layer_test(make, data, shape, weights, tmp_path, input_dtype=dtype)


CACHE = (np.zeros((2, 2, 5, 4), "float32"),) * 2  # [batch, heads, max_len, head_dim]

# Calls beyond the default one: (layer factory, args, kwargs).
CALL_VARIANTS = {
    "attention scores": (
        lambda: MultiHeadAttention(2, 4),
        (X, MEMORY),
        dict(return_attention_scores=True),
    ),
    "self-attention cache": (
        lambda: MultiHeadAttention(2, 4),
        (X[:, :1], X[:, :1]),
        dict(cache=CACHE, cache_update_index=2, return_attention_scores=True),
    ),
    "cross-attention cache": (lambda: MultiHeadAttention(2, 4), (X, None), dict(cache=CACHE)),
    "positions from an index": (SinusoidalPositionalEncoding, (X,), dict(start_index=3)),
    "tied output projection": (lambda: TokenEmbedding(20, 8), (X,), dict(reverse=True)),
    "encoder scores": (
        lambda: TransformerEncoder(2, 2, 16),
        (X,),
        dict(padding_mask=np.ones((2, 3), bool), return_attention_scores=True),
    ),
    "decoder block scores": (
        lambda: TransformerDecoderBlock(2, 16),
        (X, MEMORY),
        dict(return_attention_scores=True),
    ),
    "decoder-only scores": (
        lambda: TransformerDecoderBlock(2, 16),
        (X,),
        dict(decoder_padding_mask=np.ones((2, 3), bool), return_attention_scores=True),
    ),
    "decoder-only cache": (
        lambda: TransformerDecoder(2, 2, 16),
        (X[:, :1],),
        dict(self_attention_cache=[CACHE] * 2, cache_update_index=1, return_attention_scores=True),
    ),
    "decoder cache": (
        lambda: TransformerDecoder(2, 2, 16, norm_first=True),
        (X[:, :1], None),
        dict(
            self_attention_cache=[CACHE] * 2,
            cache_update_index=1,
            cross_attention_cache=[CACHE] * 2,
            return_attention_scores=True,
        ),
    ),
}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("variant", sorted(CALL_VARIANTS))
def test_output_spec_agrees_with_call(variant, policy):
    make, args, kwargs = CALL_VARIANTS[variant]
    check_output_spec(make, args, kwargs, policy)


def test_every_public_layer_is_covered():
    """Every layer class of the package's layer modules (the public ones and those only
    importable from their module, such as `LayerNormalization`) has a case above."""
    import importlib
    import pkgutil

    import keras_transformer.layers as layers

    public = {
        name
        for name in layers.__all__
        if isinstance(getattr(layers, name), type)
        and issubclass(getattr(layers, name), keras.layers.Layer)
    }
    defined = set()
    for info in pkgutil.iter_modules(layers.__path__):
        if not info.name.startswith("_"):
            module = importlib.import_module(f"{layers.__name__}.{info.name}")
            defined |= {
                name
                for name, value in vars(module).items()
                if isinstance(value, type)
                and issubclass(value, keras.layers.Layer)
                and value.__module__ == module.__name__
            }
    assert public and public <= defined
    assert defined == {name.split()[0] for name in LAYER_CASES}


def test_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match="divisible"):
        TransformerEncoderBlock(num_heads=3, d_ff=8)(np.ones((1, 2, 8), "float32"))
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadAttention(num_heads=0, key_dim=4)
