"""`run_layer_test`: the checks every public layer must pass (in the manner of KerasHub's
`TestCase.run_layer_test`). keras.ops and numpy only, so it also runs on the JAX backend."""

import keras
import numpy as np
from keras import ops


def _np(x):
    return np.asarray(ops.convert_to_numpy(x))


def run_layer_test(
    make,
    input_data,
    expected_output_shape,
    expected_num_trainable_weights,
    tmp_path,
    input_dtype="float32",
    check_training=True,
):
    """Builds `make()` on `input_data` and checks, in turn:

    1. eager call: the output shape;
    2. trainable weights: their number;
    3. config round trip: `from_config(get_config())` has the same config and, with the same
       weights, the same outputs; Keras's registered serialization gives the same class back;
    4. symbolic call on a `keras.Input`: the output shape;
    5. `.keras` save and load of a functional model around the layer: the same outputs;
    6. one SGD step of that model: every trainable weight receives a gradient (changes);
    7. `mixed_bfloat16`: bfloat16 outputs, float32 weights.
    """
    layer = make()
    output = layer(input_data)
    assert tuple(output.shape) == tuple(expected_output_shape)
    assert len(layer.trainable_weights) == expected_num_trainable_weights

    config = layer.get_config()
    clone = layer.__class__.from_config(config)
    assert clone.get_config() == config
    clone(input_data)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(_np(clone(input_data)), _np(output), atol=1e-6)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer)

    inputs = keras.Input(shape=tuple(input_data.shape[1:]), dtype=input_dtype)
    symbolic = make()(inputs)
    assert tuple(symbolic.shape[1:]) == tuple(expected_output_shape[1:])

    model = keras.Model(inputs, symbolic)
    expected = _np(model(input_data))
    path = str(tmp_path / "layer.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(_np(loaded(input_data)), expected, atol=1e-6)

    if check_training and model.trainable_weights:
        before = [_np(w) for w in model.trainable_weights]
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        target = np.random.default_rng(0).normal(size=expected.shape).astype("float32")
        model.train_on_batch(input_data, target)
        unchanged = [
            w.path for w, old in zip(model.trainable_weights, before) if np.array_equal(_np(w), old)
        ]
        assert not unchanged, f"no gradient reached {unchanged}"

    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        half = make()
        y = half(input_data)
        assert keras.backend.standardize_dtype(y.dtype) == "bfloat16"
        assert all(keras.backend.standardize_dtype(w.dtype) == "float32" for w in half.weights)
    finally:
        keras.config.set_dtype_policy(policy)
