"""`Translator(precision="bfloat16")` and `export.precision`: the model decoded in bfloat16.

The copy is the float32 model's weights rounded once to bfloat16; its answers are the float32
model's within bfloat16's rounding (8 bits of mantissa: a relative error of 2**-8 per value),
and the default export is unchanged (its own tests compare it with the Python reference)."""

import json
import os

import _inference_fixtures as fx
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.export import Translator, export_saved_model
from keras_transformer.export.saved_model import METADATA_FILE

DECODE, DATA = fx.EXPORT_DECODE, fx.EXPORT_DATA


def _translator(model, spm_bytes, **kwargs):
    return Translator(
        model, spm_bytes, **DECODE, max_source_length=DATA["max_source_length"], **kwargs
    )


def _inputs(n=6, length=7, seed=3):
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, fx.spm_processor().get_piece_size(), (2, n, length)).astype("int32")
    return {"source_ids": ids[0], "target_ids": ids[1]}


def test_with_dtype_is_a_rounded_copy_and_leaves_the_model_alone(copy_model):
    before = [w.numpy().copy() for w in copy_model.weights]
    copy = copy_model.with_dtype("bfloat16")
    assert copy is not copy_model and copy.get_config()["dtype"]["config"]["name"] == "bfloat16"
    assert len(copy.weights) == len(copy_model.weights)
    for original, rounded, value in zip(copy_model.weights, copy.weights, before):
        assert original.dtype == "float32" and rounded.dtype == "bfloat16"
        np.testing.assert_array_equal(original.numpy(), value)  # the model is not changed
        expected = tf.cast(tf.constant(value), tf.bfloat16)
        np.testing.assert_array_equal(
            tf.cast(rounded.value, tf.float32), tf.cast(expected, tf.float32)
        )
    inputs = _inputs()
    full, half = copy_model(inputs), copy(inputs)
    assert half.dtype == "float32"  # logits stay float32
    # Rounded weights and bfloat16 products: the logits move by a few percent of their range,
    # not by the range itself (what a wrong weight would do).
    scale = float(np.max(np.abs(full)))
    error = float(np.max(np.abs(np.asarray(full) - np.asarray(half))))
    assert 0.0 < error < 0.1 * scale, (error, scale)


def test_the_bfloat16_translator_gives_the_float32_answers(copy_model, toy_spm_bytes):
    full = _translator(copy_model, toy_spm_bytes)
    half = _translator(copy_model, toy_spm_bytes, precision="bfloat16")
    assert half.precision == "bfloat16" and full.precision == "float32"
    floats = [tf.dtypes.as_dtype(v.dtype) for v in half.model_variables]
    assert {dtype for dtype in floats if dtype.is_floating} == {tf.bfloat16}
    assert full.model is copy_model and half.model is not copy_model
    texts = tf.constant(fx.NORMAL)
    a, b = full(texts), half(texts)
    # The copy model copies with a wide margin: the rounding moves scores, not the choice.
    np.testing.assert_array_equal(a["translation"].numpy(), b["translation"].numpy())
    assert b["score"].dtype == tf.float32 and b["token_scores"].dtype == tf.float32
    np.testing.assert_allclose(b["score"], a["score"], atol=0.05)
    pairs = [tf.constant(fx.NORMAL), tf.constant(fx.NORMAL[::-1])]
    np.testing.assert_allclose(
        half.score(*pairs)["log_probability"], full.score(*pairs)["log_probability"],
        rtol=0.05, atol=0.05,
    )  # fmt: skip
    with pytest.raises(ValueError, match="precision must be one of float32, bfloat16"):
        _translator(copy_model, toy_spm_bytes, precision="float16")


@pytest.mark.scenario
def test_a_bfloat16_export_holds_bfloat16_weights_and_serves_its_answers(
    tmp_path, copy_model, toy_spm_bytes
):
    paths = {
        precision: export_saved_model(
            copy_model,
            toy_spm_bytes,
            fx.export_plan(quantization=precision),
            str(tmp_path),
            precision,
        )
        for precision in ("float32", "bfloat16")
    }
    sizes = {}
    for precision, path in paths.items():
        with open(os.path.join(path, "assets.extra", METADATA_FILE)) as f:
            metadata = json.load(f)
        assert metadata["precision"] == precision
        reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
        dtypes = {
            dtype for dtype in reader.get_variable_to_dtype_map().values() if dtype.is_floating
        }
        assert dtypes == {tf.dtypes.as_dtype(precision)}
        sizes[precision] = sum(
            os.path.getsize(os.path.join(path, "variables", name))
            for name in os.listdir(os.path.join(path, "variables"))
        )
    # Half the bytes per weight: the variables take little more than half the space.
    assert sizes["bfloat16"] < 0.6 * sizes["float32"], sizes
    served = tf.saved_model.load(paths["bfloat16"]).signatures["serving_default"]
    answers = served(text=tf.constant(fx.NORMAL))
    expected = _translator(copy_model, toy_spm_bytes, precision="bfloat16")(tf.constant(fx.NORMAL))
    np.testing.assert_array_equal(answers["translation"].numpy(), expected["translation"].numpy())
    np.testing.assert_allclose(answers["score"], expected["score"], atol=1e-4)
