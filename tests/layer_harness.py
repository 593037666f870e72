"""`run_layer_test`: the checks every public layer must pass (in the manner of KerasHub's
`TestCase.run_layer_test`). keras.ops and numpy only, so it also runs on the JAX backend."""

import keras
import numpy as np
from keras import ops, tree

# Every dtype policy a layer may run under: its output spec must agree with its call in each.
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "bfloat16")


def np_(x):
    """A backend tensor (or array) as a numpy array."""
    return np.asarray(ops.convert_to_numpy(x))


def softmax(x):
    """The reference softmax over the last axis, in numpy."""
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _call(layer, data):
    """`layer` on `data`: one input, or a dict of named call arguments (`{"query": ...}`)."""
    return layer(**data) if isinstance(data, dict) else layer(data)


def _inputs(data, dtype, name=None):
    """`keras.Input`s shaped like `data` (one array or a dict of them, named by their keys)."""
    if isinstance(data, dict):
        return {key: _inputs(x, dtype, key) for key, x in data.items()}
    return keras.Input(shape=tuple(data.shape[1:]), dtype=dtype, name=name)


def run_layer_test(
    make,
    input_data,
    expected_output_shape,
    expected_num_trainable_weights,
    tmp_path,
    input_dtype="float32",
    check_training=True,
):
    """Builds `make()` on `input_data` (an array, or a dict of named call arguments) and
    checks, in turn:

    1. eager call: the output shape;
    2. trainable weights: their number;
    3. config round trip: `from_config(get_config())` has the same config and, with the same
       weights, the same outputs; Keras's registered serialization gives the same class back;
    4. symbolic call on a `keras.Input`: the output shape;
    5. `.keras` save and load of a functional model around the layer: the same outputs;
    6. one SGD step of that model: every trainable weight receives a gradient (changes);
    7. `mixed_bfloat16`: bfloat16 outputs, float32 weights;
    8. under every dtype policy, `compute_output_spec` on arrays, tensors and `KerasTensor`s, and
       `compute_output_shape`, agree with the call's output (`check_output_spec`).
    """
    layer = make()
    output = _call(layer, input_data)
    assert tuple(output.shape) == tuple(expected_output_shape)
    assert len(layer.trainable_weights) == expected_num_trainable_weights

    config = layer.get_config()
    clone = layer.__class__.from_config(config)
    assert clone.get_config() == config
    _call(clone, input_data)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(np_(_call(clone, input_data)), np_(output), atol=1e-6)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer)

    inputs = _inputs(input_data, input_dtype)
    symbolic = _call(make(), inputs)
    assert tuple(symbolic.shape[1:]) == tuple(expected_output_shape[1:])

    model = keras.Model(inputs, symbolic)
    expected = np_(model(input_data))
    path = str(tmp_path / "layer.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(np_(loaded(input_data)), expected, atol=1e-6)

    if check_training and model.trainable_weights:
        before = [np_(w) for w in model.trainable_weights]
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        target = np.random.default_rng(0).normal(size=expected.shape).astype("float32")
        model.train_on_batch(input_data, target)
        unchanged = [
            w.path for w, old in zip(model.trainable_weights, before) if np.array_equal(np_(w), old)
        ]
        assert not unchanged, f"no gradient reached {unchanged}"

    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        half = make()
        y = _call(half, input_data)
        assert keras.backend.standardize_dtype(y.dtype) == "bfloat16"
        assert all(keras.backend.standardize_dtype(w.dtype) == "float32" for w in half.weights)
    finally:
        keras.config.set_dtype_policy(policy)

    args, kwargs = ((), input_data) if isinstance(input_data, dict) else ((input_data,), {})
    for dtype in POLICIES:
        check_output_spec(make, args, kwargs, dtype, shape_check=True)


def _spec(x):
    return tuple(x.shape), keras.backend.standardize_dtype(x.dtype)


def check_output_spec(make, args, kwargs, dtype_policy, shape_check=False):
    """Under `dtype_policy`, `make()`'s `compute_output_spec(*args, **kwargs)` has the structure,
    shapes and dtypes of its eager call, whether the tensor arguments are numpy arrays, backend
    tensors or `KerasTensor`s; calling it on `KerasTensor`s gives the same; with `shape_check`,
    `compute_output_shape` of the first argument's shape (or keyword argument's, when there are
    no positional ones) gives the output's shape too."""
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(dtype_policy)
    try:
        _check_output_spec(make, args, kwargs, shape_check)
    finally:
        keras.config.set_dtype_policy(policy)


def _check_output_spec(make, args, kwargs, shape_check):
    layer = make()
    output = layer(*args, **kwargs)
    expected = tree.map_structure(_spec, output)
    is_array = lambda x: isinstance(x, np.ndarray)  # noqa: E731
    as_tensor = lambda x: ops.convert_to_tensor(x) if is_array(x) else x  # noqa: E731
    as_symbolic = lambda x: keras.KerasTensor(x.shape, x.dtype) if is_array(x) else x  # noqa: E731
    for convert in (lambda x: x, as_tensor, as_symbolic):
        spec_args, spec_kwargs = tree.map_structure(convert, (args, kwargs))
        spec = layer.compute_output_spec(*spec_args, **spec_kwargs)
        assert tree.map_structure(_spec, spec) == expected, (convert, spec, expected)
    symbolic_args, symbolic_kwargs = tree.map_structure(as_symbolic, (args, kwargs))
    symbolic = make()(*symbolic_args, **symbolic_kwargs)
    assert tree.map_structure(_spec, symbolic) == expected
    if shape_check:
        first = args[0] if args else next(iter(kwargs.values()))
        assert tuple(layer.compute_output_shape(first.shape)) == expected[0]
