"""The functional Transformer: causality, padding invariance, cached decoding, sizes, saving."""

import os

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.models import Transformer, build_transformer
from keras_transformer.models.transformer import PRESETS

VOCAB = 50


def tiny(**kwargs):
    params = dict(num_layers=2, d_model=32, num_heads=4, d_ff=64, dropout=0.1)
    params.update(kwargs)
    return Transformer(vocab_size=VOCAB, **params)


def ids(shape, seed=0):
    return np.random.default_rng(seed).integers(1, VOCAB, size=shape).astype("int32")


def logits(model, src, tgt):
    return np.asarray(model({"source_ids": src, "target_ids": tgt}, training=False))


def test_output_shape_and_dtype():
    model = tiny()
    out = model({"source_ids": ids((3, 7)), "target_ids": ids((3, 5), 1)})
    assert tuple(out.shape) == (3, 5, VOCAB)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"


def test_causality():
    model = tiny()
    src, tgt = ids((2, 6)), ids((2, 8), 1)
    base = logits(model, src, tgt)
    for t in (0, 3, 6):
        changed = tgt.copy()
        changed[:, t + 1 :] = ids((2, 8 - t - 1), 2 + t)
        out = logits(model, src, changed)
        np.testing.assert_allclose(out[:, : t + 1], base[:, : t + 1], atol=1e-5)
        assert not np.allclose(out[:, t + 1 :], base[:, t + 1 :])


def test_padding_invariance():
    model = tiny()
    src, tgt = ids((2, 6)), ids((2, 5), 1)
    base = logits(model, src, tgt)
    src_pad = np.pad(src, ((0, 0), (0, 4)))
    tgt_pad = np.pad(tgt, ((0, 0), (0, 3)))
    np.testing.assert_allclose(logits(model, src_pad, tgt)[:, :5], base, atol=1e-5)
    np.testing.assert_allclose(logits(model, src, tgt_pad)[:, :5], base, atol=1e-5)
    np.testing.assert_allclose(logits(model, src_pad, tgt_pad)[:, :5], base, atol=1e-5)
    # A row padded inside a batch equals the same sentence alone.
    batch_src = np.stack([src[0], np.concatenate([src[1, :3], [0, 0, 0]])])
    alone = logits(model, src[1:, :3], tgt[1:])
    np.testing.assert_allclose(logits(model, batch_src, tgt)[1:], alone, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_decoding_equals_full_pass(norm_first):
    model = tiny(norm_first=norm_first)
    src = np.pad(ids((2, 5)), ((0, 0), (0, 2)))
    src[1, 3:] = 0
    tgt = ids((2, 7), 3)
    full = logits(model, src, tgt)
    memory, source_mask = model.encode(src)
    cache = model.init_cache(memory, max_length=9)
    steps = []
    for t in range(7):
        step_logits, cache = model.decode_step(tgt[:, t : t + 1], t, cache, source_mask)
        steps.append(np.asarray(step_logits))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)
    # Several tokens at once (prefix filling) also match.
    cache = model.init_cache(memory, max_length=9)
    prefix, cache = model.decode_step(tgt[:, :4], 0, cache, source_mask)
    rest, _ = model.decode_step(tgt[:, 4:], 4, cache, source_mask)
    np.testing.assert_allclose(np.concatenate([prefix, rest], 1), full, atol=1e-5)


def test_decode_step_without_source_mask_raises():
    """Without the source mask the cross-attention would attend the padded source positions:
    `decode_step` refuses instead (only beam search's `BeamCache`s carry their own mask)."""
    model = tiny()
    src = np.pad(ids((1, 4)), ((0, 0), (0, 2)))
    memory, _ = model.encode(src)
    cache = model.init_cache(memory, max_length=3)
    with pytest.raises(ValueError, match="source_mask"):
        model.decode_step(ids((1, 1)), 0, cache, None)


@pytest.mark.scenario
def test_paper_parameter_counts():
    base = Transformer.from_preset("transformer_base", vocab_size=37000)
    assert 62e6 <= base.count_params() <= 66e6
    big = Transformer.from_preset("transformer_big", vocab_size=37000)
    assert 210e6 <= big.count_params() <= 216e6
    assert PRESETS["transformer_base"]["d_model"] == 512


def test_shared_embedding_is_one_matrix_and_untied_option():
    model = tiny()
    assert model.source_embedding is model.target_embedding
    assert len([w for w in model.weights if "embeddings" in w.path]) == 1
    untied = tiny(share_embeddings=False, tie_output_projection=False, source_vocab_size=30)
    assert untied.source_embedding is not untied.target_embedding
    out = untied({"source_ids": ids((1, 4)) % 30, "target_ids": ids((1, 3))})
    assert tuple(out.shape) == (1, 3, VOCAB)
    with pytest.raises(ValueError, match="one vocabulary"):
        tiny(source_vocab_size=30)
    with pytest.raises(ValueError, match="unknown preset"):
        Transformer.from_preset("transformer_huge", vocab_size=10)


def test_keras_save_load_identical(tmp_path):
    model = tiny(norm_first=True)
    src, tgt = ids((2, 6)), ids((2, 4), 1)
    before = logits(model, src, tgt)
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, Transformer)
    assert loaded.get_config() == model.get_config()
    np.testing.assert_array_equal(logits(loaded, src, tgt), before)


@pytest.mark.scenario
def test_fit_step_with_xla():
    model = tiny()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    x = {"source_ids": ids((8, 6)), "target_ids": ids((8, 5), 1)}
    y = ids((8, 5), 2)
    before = [np.array(w) for w in model.trainable_weights]
    history = model.fit(x, y, batch_size=4, epochs=3, verbose=0)
    losses = history.history["loss"]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    after = model.trainable_weights
    assert all(not np.array_equal(b, np.array(a)) for b, a in zip(before, after))


def test_mixed_bfloat16():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = tiny()
    out = model({"source_ids": ids((2, 5)), "target_ids": ids((2, 4), 1)})
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    assert model.encoder.compute_dtype == "bfloat16"
    assert model.decoder.blocks[0].self_attention.compute_dtype == "bfloat16"
    assert all(keras.backend.standardize_dtype(w.dtype) == "float32" for w in model.weights)
    memory, _ = model.encode(ids((2, 5)))
    assert keras.backend.standardize_dtype(memory.dtype) == "bfloat16"
    # Also when the policy is given to the model rather than set globally.
    keras.config.set_dtype_policy("float32")
    explicit = tiny(dtype="mixed_bfloat16")
    assert explicit.encoder.compute_dtype == "bfloat16"
    restored = Transformer.from_config(explicit.get_config())
    assert restored.encoder.compute_dtype == "bfloat16"


def test_build_transformer_from_config_section():
    from keras_transformer.config import ModelConfig

    model = build_transformer(ModelConfig(num_layers=1, d_model=16, num_heads=2, d_ff=32), 40)
    assert model.d_model == 16 and model.vocab_size == 40
    assert tuple(
        ops.shape(model({"source_ids": ids((1, 3)) % 40, "target_ids": ids((1, 2)) % 40}))
    ) == (1, 2, 40)


def test_attention_scores_shapes():
    model = tiny()
    scores = model.attention_scores(ids((1, 6)), ids((1, 4), 1))
    assert len(scores["encoder_self_attention"]) == 2
    assert tuple(scores["encoder_self_attention"][0].shape) == (1, 4, 6, 6)
    assert tuple(scores["decoder_cross_attention"][1].shape) == (1, 4, 4, 6)


def test_token_dropout_zeroes_whole_token_embeddings_in_training_only():
    p = 0.3
    model = tiny(token_dropout=p, dropout=0.0)
    src, tgt = ids((8, 60)), ids((8, 50), 1)
    inputs = {"source_ids": src, "target_ids": tgt}
    probe = keras.Model(
        model.inputs,
        [model.get_layer(f"{side}_token_dropout").output for side in ("source", "target")],
    )
    embedding = np.asarray(model.target_embedding.embeddings)
    for dropped, token_ids in zip(probe(inputs, training=True), (src, tgt)):
        dropped = np.asarray(dropped)
        # Scaled by sqrt(d_model) in the embedding, then by 1 / (1 - p) where kept.
        kept_value = embedding[token_ids] * np.sqrt(model.d_model) / (1 - p)
        zero = np.all(dropped == 0, axis=-1)
        np.testing.assert_allclose(dropped[~zero], kept_value[~zero], rtol=1e-5)
        assert abs(zero.mean() - p) < 0.06, zero.mean()  # one draw per token, about p of them
    # Inference: no dropout, the same logits as the same weights without the option.
    plain = tiny(dropout=0.0)
    plain.set_weights(model.get_weights())
    np.testing.assert_allclose(logits(model, src, tgt), logits(plain, src, tgt), atol=1e-5)
    assert not np.allclose(np.asarray(model(inputs, training=True)), logits(plain, src, tgt))
    assert Transformer.from_config(model.get_config()).token_dropout == p
    assert plain.source_token_dropout is None  # 0 adds no layer: older weights load as before
    with pytest.raises(ValueError, match="token_dropout"):
        tiny(token_dropout=1.0)


def test_hyper_parameters_are_the_constructor_arguments():
    """The `model:` config section (`ModelConfig`) declares them, with the constructor's own
    three; attributes, config and the model's defaults follow."""
    import dataclasses

    from keras_transformer.config import ModelConfig
    from keras_transformer.layers import TransformerEncoderBlock

    section = [field.name for field in dataclasses.fields(ModelConfig)]
    names = ["vocab_size", *section, "tie_output_projection", "source_vocab_size"]
    given = dict(num_decoder_layers=1, activation="gelu", norm_first=True, token_dropout=0.2)
    model = tiny(**given)
    config = model.get_config()
    assert list(config) == ["name", "trainable", *names, "dtype", "kernels"]
    for name in names:
        assert getattr(model, name) == config[name] == model.hyper_parameters[name]
    assert {name: config[name] for name in given} == given
    assert len(model.decoder.blocks) == 1 and model.decoder.blocks[0].norm_first
    # The config file's `model:` section uses the same names and defaults (those not given
    # here or by `tiny`), and so do the blocks.
    passed = {*given, "num_layers", "d_model", "num_heads", "d_ff", "dropout"}
    block = TransformerEncoderBlock(num_heads=2, d_ff=4).get_config()
    for field in dataclasses.fields(ModelConfig):
        if field.name not in passed:
            assert field.default == model.hyper_parameters[field.name], field.name
        if field.name in block and field.name not in ("num_heads", "d_ff"):
            assert field.default == block[field.name], field.name
