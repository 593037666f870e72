"""Every fast path equals the straightforward computation it replaces (to 1e-5).

The fast paths (docs/guides/performance.md explains why each is the default): fused query/key/value
projections, einsum attention logits, per-layer (keys, values) decoding caches written by
scatter, the fused softmax-cross-entropy loss (gradient formed in the forward pass, per-token
statistics handed to the metrics), the argmax-free accuracy, the one-kernel Adam update, the
LayerNorm with a hand-written gradient, the Dense layers' einsum input gradients in training, the
in-place decoding-cache writes of translate_ids and the exported per-token scores tracked during
the search.
"""

import pathlib
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops
from layer_harness import softmax

from keras_transformer import fast_paths
from keras_transformer.decoding import translate_ids
from keras_transformer.fast_paths import Kernels
from keras_transformer.layers import MultiHeadAttention, scaled_dot_product_attention
from keras_transformer.layers.attention import write_cache
from keras_transformer.layers.normalization import LayerNormalization
from keras_transformer.models import Transformer
from keras_transformer.training.recipe import losses as losses_module
from keras_transformer.training.recipe import metrics as metrics_module
from keras_transformer.training.recipe.losses import (
    MaskedSparseCrossEntropy,
    masked_token_cross_entropy,
)
from keras_transformer.training.recipe.metrics import MaskedAccuracy, Perplexity
from keras_transformer.training.recipe.optimizers import FusedAdam

ATOL = 1e-5


def rand(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def tiny_model(**kwargs):
    params = dict(vocab_size=40, num_layers=2, d_model=32, num_heads=4, d_ff=64, dropout=0.1)
    params.update(kwargs)
    return Transformer(**params)


@pytest.fixture
def unfused():
    """`switch(flag)`: fused query/key/value projections on (True) or off (False) from now on
    (conftest.py restores the setting after the test)."""
    everything = fast_paths.enabled_names()

    def switch(flag):
        others = [name for name in everything if name != "fused_projections"]
        fast_paths.set_fast_paths(others + ["fused_projections"] if flag else others)

    return switch


def test_fast_path_setting():
    """One setting: all, none, or names; unknown names are refused; `fast_paths()` restores."""
    assert fast_paths.enabled_names() == list(fast_paths.NAMES)  # the default: all
    with fast_paths.fast_paths("none"):
        assert not any(fast_paths.enabled(name) for name in fast_paths.NAMES)
        with fast_paths.fast_paths("fused_loss, fused_adam"):
            assert fast_paths.enabled_names() == ["fused_loss", "fused_adam"]
    with fast_paths.without("fused_loss"):
        assert not fast_paths.enabled("fused_loss") and fast_paths.enabled("fused_adam")
    assert fast_paths.enabled_names() == list(fast_paths.NAMES)
    with pytest.raises(ValueError, match="unknown fast path 'fused_los'"):
        fast_paths.set_fast_paths("fused_los")


# ----------------------------------------------------------------------- attention


def test_einsum_logits_match_numpy_attention():
    q, k, v = rand((2, 3, 5, 8), 1), rand((2, 3, 7, 8), 2), rand((2, 3, 7, 4), 3)
    mask = np.random.default_rng(4).random((2, 1, 5, 7)) > 0.3
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    logits = q @ np.swapaxes(k, -1, -2) / np.sqrt(8.0)
    expected = np.where(mask, softmax(np.where(mask, logits, -1e9)), 0.0)
    np.testing.assert_allclose(np.asarray(weights), expected, atol=ATOL)
    np.testing.assert_allclose(np.asarray(out), expected @ v, atol=ATOL)


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_fused_projections_equal_separate(kind):
    layer = MultiHeadAttention(num_heads=4, key_dim=8)
    x, memory = rand((2, 5, 32), 1), rand((2, 7, 32), 2)
    mask = np.random.default_rng(3).random((2, 5, 5 if kind == "self" else 7)) > 0.2
    other = x if kind == "self" else memory

    def run():
        with tf.GradientTape() as tape:
            xt, ot = tf.constant(x), tf.constant(other) if kind == "cross" else None
            tape.watch(xt)
            if ot is not None:
                tape.watch(ot)
            value = xt if kind == "self" else ot
            out = layer(xt, value, attention_mask=mask, use_causal_mask=kind == "self")
            loss = tf.reduce_sum(out * rand(out.shape, 9))
        grads = tape.gradient(loss, [xt] + [w.value for w in layer.trainable_weights])
        return np.asarray(out), [np.asarray(g) for g in grads]

    fused_out, fused_grads = run()
    layer.kernels = Kernels.get("all").without("fused_projections")  # swapped: the plain form
    plain_out, plain_grads = run()
    np.testing.assert_allclose(fused_out, plain_out, atol=ATOL)
    for a, b in zip(fused_grads, plain_grads):
        np.testing.assert_allclose(a, b, atol=ATOL)


@pytest.mark.scenario
def test_fused_training_step_equals_separate(unfused):
    """One optimizer step of the whole model (dropout on) gives the same weights either way."""
    src = np.random.default_rng(0).integers(1, 40, (3, 6)).astype("int32")
    tgt = np.random.default_rng(1).integers(1, 40, (3, 5)).astype("int32")

    def train_once(fused):
        unfused(fused)
        keras.utils.set_random_seed(7)
        model = tiny_model()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=_sparse_loss, jit_compile=False)
        model.train_on_batch({"source_ids": src, "target_ids": tgt}, tgt)
        return [np.asarray(w) for w in model.weights]

    for a, b in zip(train_once(True), train_once(False)):
        np.testing.assert_allclose(a, b, atol=ATOL)


@pytest.mark.scenario
def test_kernels_are_chosen_when_the_model_is_built():
    """A model keeps the fast paths of its build: the setting later, at trace time, changes
    nothing (no in-place writes in a `none` model's search traced under `all`); every layer,
    the loss and the optimizer `compile_model` gives it use the model's; its config (and a
    `.keras` file) records them."""
    from keras_transformer.config import from_dict
    from keras_transformer.training import compile_model

    with fast_paths.fast_paths("none"):
        plain = tiny_model()
    layers = [layer for layer in plain._flatten_layers() if hasattr(layer, "kernels")]
    assert len(layers) > 10 and all(layer.kernels == Kernels(()) for layer in layers)
    src = tf.constant(np.random.default_rng(6).integers(4, 40, (2, 5)).astype("int32"))
    search = tf.function(lambda s: translate_ids(plain, s, beam_size=1, max_extra_length=3))
    assert "InplaceUpdate" not in _graph_op_types(search.get_concrete_function(src))
    assert Transformer.from_config(plain.get_config()).kernels == plain.kernels
    assert tiny_model(kernels=["fused_loss"]).get_config()["kernels"] == ["fused_loss"]
    compile_model(plain, from_dict({}))
    assert plain.loss.kernels == plain.optimizer.kernels == plain.kernels
    assert not Kernels.get("none").uses("fused_adam") and Kernels.get().uses("fused_adam")
    with pytest.raises(ValueError, match="unknown fast path"):
        Kernels.get(["fused_los"])


# ----------------------------------------------------------------------- projection gradients


@pytest.mark.parametrize("activation", ["relu", None])
@pytest.mark.parametrize("use_bias", [True, False])
def test_projection_gradients_equal_keras_dense(activation, use_bias):
    """In training, `call_dense`'s fast path gives the Dense layer's output and the gradients of
    the input, kernel and bias (to 1e-5), and its input gradient is an einsum."""
    from keras_transformer.layers import _fast_paths as layer_paths

    layer = keras.layers.Dense(24, activation=activation, use_bias=use_bias)
    layer.build((2, 5, 16))
    x, upstream = tf.constant(rand((2, 5, 16), 1)), tf.constant(rand((2, 5, 24), 2))

    @tf.function
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer_paths.call_dense(kernels, layer, x, training=True)
        grads = tape.gradient(y, [x] + [w.value for w in layer.trainable_weights], upstream)
        return y, grads

    kernels = Kernels.get("all")
    fast_out, fast_grads = run(x)
    assert "Einsum" in _graph_op_types(run.get_concrete_function(x))
    kernels = kernels.without("projection_gradients")
    plain = tf.function(run.python_function)
    plain_out, plain_grads = plain(x)
    assert "Einsum" not in _graph_op_types(plain.get_concrete_function(x))
    np.testing.assert_allclose(np.asarray(fast_out), np.asarray(plain_out), atol=ATOL)
    for a, b in zip(fast_grads, plain_grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=ATOL)


def test_projection_gradients_apply_only_in_training():
    """Outside training (decoding steps, evaluation) the Dense layers' gradient path is off:
    without `flat_dense` they run as Keras runs them."""
    from keras_transformer.layers import _fast_paths as layer_paths

    layer = keras.layers.Dense(8, activation="relu")
    layer.build((3, 2, 4))
    x = rand((3, 2, 4))
    kernels = Kernels.get("all").without("flat_dense")
    for training in (None, False):
        assert layer_paths.dense(kernels, layer, x, training) is None
    assert layer_paths.dense(kernels, layer, x, True) is not None
    assert layer_paths.dense(kernels, keras.layers.Dense(8, activation="gelu"), x, True) is None


# ----------------------------------------------------------------------- flat Dense products


def _dense_graph(kernels, layer, x, training=False):
    from keras_transformer.layers import _fast_paths as layer_paths

    run = tf.function(lambda x: layer_paths.call_dense(kernels, layer, x, training=training))
    spec = tf.TensorSpec([None, *x.shape[1:]], tf.float32)  # a batch known at run time only
    concrete = run.get_concrete_function(spec)
    return np.asarray(concrete(tf.constant(x))), concrete.graph.as_graph_def().node


@pytest.mark.parametrize("activation", ["relu", None])
@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("shape", [(2, 5, 16), (6, 1, 16)])
def test_flat_dense_equals_keras_dense_in_fewer_ops(activation, use_bias, shape):
    """Outside training, `flat_dense` gives the Dense layer's output (to 1e-5) as one 2-D MatMul
    followed directly by its BiasAdd and Relu (the chain TensorFlow's remapper fuses into one
    kernel), in fewer ops than Keras's tensordot, whose BiasAdd follows a Reshape."""
    layer = keras.layers.Dense(24, activation=activation, use_bias=use_bias)
    layer.build(shape)
    x = rand(shape, 1)
    fast, fast_nodes = _dense_graph(Kernels.get("all"), layer, x)
    plain, plain_nodes = _dense_graph(Kernels.get("all").without("flat_dense"), layer, x)
    np.testing.assert_allclose(fast, plain, atol=ATOL)
    np.testing.assert_allclose(fast, np.asarray(layer(x)), atol=ATOL)
    assert fast.shape == (*shape[:-1], 24)

    def work(nodes):  # what runs: not the constants, placeholders and the result's identity
        return [n for n in nodes if n.op not in ("Const", "Placeholder", "Identity", "NoOp")]

    assert len(work(fast_nodes)) < len(work(plain_nodes)), (
        [n.op for n in work(fast_nodes)], [n.op for n in work(plain_nodes)])  # fmt: skip
    by_name = {n.name: n for n in fast_nodes}
    (matmul,) = [n for n in fast_nodes if n.op == "MatMul"]
    chain = [n.op for n in fast_nodes if n.input and n.input[0].split(":")[0] == matmul.name]
    if use_bias:
        assert chain == ["BiasAdd"], chain
        plain_bias = [n for n in plain_nodes if n.op == "BiasAdd"]
        plain_by_name = {n.name: n for n in plain_nodes}
        assert [plain_by_name[n.input[0]].op for n in plain_bias] == ["Reshape"]
    elif activation:
        assert chain == ["Relu"], chain
    assert by_name[matmul.input[0].split(":")[0]].op == "Reshape"


def test_flat_dense_stays_out_of_training():
    """In training the Dense layers take `projection_gradients` or Keras's own product, never the
    inference-only flat product (whose gradient is TensorFlow's own)."""
    from keras_transformer.layers import _fast_paths as layer_paths

    layer = keras.layers.Dense(8)
    layer.build((3, 2, 4))
    x = rand((3, 2, 4))
    only_flat = Kernels.get("flat_dense")
    assert layer_paths.dense(only_flat, layer, x, training=True) is None
    assert layer_paths.dense(only_flat, layer, x, training=False) is not None
    assert layer_paths.dense(only_flat, layer, x[:, 0], training=False) is None  # rank 2


def test_projection_onto_a_width_known_at_run_time_is_flat():
    """The pre-softmax product over a shortlist's columns (a width known only at run time)
    equals numpy's and keeps the known dimensions of its shape."""
    from keras_transformer.layers.embedding import project_with

    y, kernel = rand((6, 1, 16), 1), rand((16, 11), 2)
    for kernels in (Kernels.get("all"), Kernels.get("none")):
        run = tf.function(
            lambda y, k, kernels=kernels: project_with(y, k, kernels),
            input_signature=[tf.TensorSpec([None, 1, 16]), tf.TensorSpec([16, None])],
        )
        concrete = run.get_concrete_function()
        assert concrete.output_shapes.as_list() == [None, 1, None]
        np.testing.assert_allclose(np.asarray(run(y, kernel)), y @ kernel, atol=ATOL)
        ops_run = _graph_op_types(concrete)
        assert ("GatherV2" in ops_run) != kernels.uses("flat_dense"), ops_run  # tensordot's


def test_flat_products_promote_mixed_dtypes_as_keras_does():
    """A bfloat16 step by a float32 kernel (or the reverse) gives Keras's matmul's dtype and
    numbers."""
    from keras_transformer.layers.embedding import project_with

    y, kernel = rand((6, 1, 16), 1), rand((16, 11), 2)
    for a, b in (("bfloat16", "float32"), ("float32", "bfloat16"), ("bfloat16", "bfloat16")):
        args = ops.cast(y, a), ops.cast(kernel, b)
        fast = project_with(*args, Kernels.get("all"))
        plain = ops.matmul(*args)
        assert fast.dtype == plain.dtype
        np.testing.assert_allclose(
            np.asarray(ops.cast(fast, "float32")), np.asarray(ops.cast(plain, "float32")),
            rtol=2e-2, atol=5e-2)  # fmt: skip


def test_one_position_attention_moves_no_data_between_layouts():
    """A decoding step's attention (one query position on a cache) splits and merges its heads
    with reshapes: its graph has no Transpose, and it equals the full causal pass's row."""
    layer = MultiHeadAttention(num_heads=4, key_dim=8)
    x = rand((2, 5, 32), 1)
    full = np.asarray(layer(x, x, use_causal_mask=True))
    keys = tf.Variable(np.zeros((2, 4, 5, 8), "float32"))
    values = tf.Variable(np.zeros((2, 4, 5, 8), "float32"))

    @tf.function
    def step(x, index):
        out, cache = layer(x, x, cache=(keys, values), cache_update_index=index)
        keys.assign(cache[0])
        values.assign(cache[1])
        return out

    for index in range(5):
        out = step(tf.constant(x[:, index : index + 1]), tf.constant(index))
        np.testing.assert_allclose(np.asarray(out)[:, 0], full[:, index], atol=ATOL)
    concrete = step.get_concrete_function(tf.TensorSpec([2, 1, 32]), tf.TensorSpec([], tf.int32))
    assert "Transpose" not in _graph_op_types(concrete)
    assert "Transpose" in _graph_op_types(
        tf.function(lambda x: layer(x, x, use_causal_mask=True)).get_concrete_function(x)
    )


@pytest.mark.scenario
def test_training_step_with_projection_gradients_equals_plain():
    """One optimizer step of the whole model (dropout on) gives the same weights with and
    without the projection-gradient fast path."""
    src = np.random.default_rng(0).integers(1, 40, (3, 6)).astype("int32")
    tgt = np.random.default_rng(1).integers(1, 40, (3, 5)).astype("int32")

    def train_once():
        keras.utils.set_random_seed(7)
        model = tiny_model()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=_sparse_loss, jit_compile=False)
        model.train_on_batch({"source_ids": src, "target_ids": tgt}, tgt)
        return [np.asarray(w) for w in model.weights]

    fast = train_once()
    with fast_paths.without("projection_gradients"):
        plain = train_once()
    moved = [not np.allclose(a, b0) for a, b0 in zip(fast, _initial_weights())]
    assert any(moved)
    for a, b in zip(fast, plain):
        np.testing.assert_allclose(a, b, atol=ATOL)


def _initial_weights():
    keras.utils.set_random_seed(7)
    model = tiny_model()
    model({"source_ids": np.ones((1, 2), "int32"), "target_ids": np.ones((1, 2), "int32")})
    return [np.asarray(w) for w in model.weights]


def _sparse_loss(y_true, y_pred):
    return ops.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)


@pytest.mark.parametrize("fused", [True, False])
def test_key_value_cache_equals_the_projections(unfused, fused):
    """compute_key_value_cache (fused or not) equals the key and value Dense layers' outputs
    split into heads."""
    unfused(fused)
    layer = MultiHeadAttention(num_heads=4, key_dim=8)
    memory = rand((2, 7, 32), 1)
    layer(rand((2, 3, 32)), memory)
    keys, values = layer.compute_key_value_cache(memory)

    def heads(x):  # [2, 7, 32] -> [2, 4, 7, 8]
        return np.asarray(x).reshape(2, 7, 4, 8).transpose(0, 2, 1, 3)

    np.testing.assert_allclose(np.asarray(keys), heads(layer.key_dense(memory)), atol=ATOL)
    np.testing.assert_allclose(np.asarray(values), heads(layer.value_dense(memory)), atol=ATOL)


@pytest.mark.parametrize("paths", ["all", "none"])
def test_cache_writes_equal_slice_update(paths):
    """One decoding step's keys/values land at the index (scatter fast path or slice_update);
    several positions at once always take slice_update."""
    cache, update = rand((3, 2, 6, 4), 1), rand((3, 2, 1, 4), 2)
    kernels = Kernels.get(paths)
    for index in (0, 4, 5):
        got = np.asarray(write_cache(cache, update, index, kernels))
        expected = cache.copy()
        expected[:, :, index : index + 1] = update
        np.testing.assert_array_equal(got, expected)
    prefix = rand((3, 2, 3, 4), 3)
    expected = cache.copy()
    expected[:, :, 2:5] = prefix
    np.testing.assert_array_equal(np.asarray(write_cache(cache, prefix, 2, kernels)), expected)


# ----------------------------------------------------------------------- decoding caches


def test_cached_decoding_equals_full_pass_with_and_without_fast_paths():
    model = tiny_model()
    rng = np.random.default_rng(0)
    src = rng.integers(1, 40, (2, 6)).astype("int32")
    src[1, 4:] = 0
    tgt = rng.integers(1, 40, (2, 5)).astype("int32")
    full = np.asarray(model({"source_ids": src, "target_ids": tgt}, training=False))
    plain_model = tiny_model(kernels="none")  # the same weights, the plain formulas
    plain_model.set_weights(model.get_weights())
    memory, source_mask = model.encode(src)
    fast = model.init_cache(memory, max_length=5)
    plain = plain_model.init_cache(memory, max_length=5)
    for t in range(5):
        a, fast = model.decode_step(tgt[:, t : t + 1], t, fast, source_mask)
        b, plain = plain_model.decode_step(tgt[:, t : t + 1], t, plain, source_mask)
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=ATOL)
        np.testing.assert_allclose(np.asarray(a)[:, 0], full[:, t], atol=1e-4)
    # The final caches hold the same numbers.
    for (keys, values), (plain_keys, plain_values) in zip(
        fast["self_attention"], plain["self_attention"]
    ):
        np.testing.assert_allclose(np.asarray(keys), np.asarray(plain_keys), atol=ATOL)
        np.testing.assert_allclose(np.asarray(values), np.asarray(plain_values), atol=ATOL)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_cached_translation_equals_uncached(beam_size):
    model = tiny_model()
    src = np.random.default_rng(5).integers(4, 40, (3, 5)).astype("int32")
    src[2, 3:] = 0
    ids, scores, _ = translate_ids(model, src, beam_size=beam_size, max_extra_length=4)
    ref_ids, ref_scores, _ = translate_ids(
        model, src, beam_size=beam_size, max_extra_length=4, use_cache=False
    )
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(ref_ids))
    np.testing.assert_allclose(np.asarray(scores), np.asarray(ref_scores), atol=1e-4)


# ----------------------------------------------------------------------- loss and metrics


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_fused_loss_equals_log_softmax_formula(smoothing):
    logits = rand((3, 4, 11), 1) * 3
    labels = np.random.default_rng(2).integers(0, 11, (3, 4)).astype("int32")
    labels[0, 2:] = 0  # padding
    losses, mask = masked_token_cross_entropy(labels, logits, smoothing, kernels="fused_loss")
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    expected = (1 - smoothing) * nll + smoothing * -log_probs.mean(-1)
    real = labels != 0
    np.testing.assert_allclose(np.asarray(mask), real.astype("float32"))
    np.testing.assert_allclose(np.asarray(losses), np.where(real, expected, 0.0), atol=ATOL)


def test_fused_loss_gradient_equals_formula():
    logits = tf.constant(rand((2, 3, 7), 1))
    labels = np.random.default_rng(3).integers(1, 7, (2, 3)).astype("int32")
    eps = 0.1
    with tf.GradientTape() as tape:
        tape.watch(logits)
        losses, _ = masked_token_cross_entropy(labels, logits, eps, kernels="fused_loss")
        total = tf.reduce_sum(losses)
    grad = np.asarray(tape.gradient(total, logits))
    target = np.eye(7, dtype="float32")[labels] * (1 - eps) + eps / 7
    np.testing.assert_allclose(grad, softmax(np.asarray(logits)) - target, atol=ATOL)


def test_accuracy_equals_argmax_accuracy():
    logits = rand((4, 6, 9), 1)
    labels = np.argmax(logits, -1).astype("int32")
    flip = np.random.default_rng(2).random(labels.shape) > 0.5
    labels = np.where(flip, (labels + 1) % 9, labels)
    labels[1, 4:] = 0  # padding, not counted
    metric = MaskedAccuracy()
    metric.update_state(labels, logits)
    real = labels != 0
    expected = ((np.argmax(logits, -1) == labels) & real).sum() / real.sum()
    np.testing.assert_allclose(float(metric.result()), expected, atol=ATOL)


def test_perplexity_equals_exp_of_mean_nll():
    from keras_transformer.training.recipe.metrics import Perplexity

    logits = rand((3, 5, 13), 4) * 2
    labels = np.random.default_rng(5).integers(1, 13, (3, 5)).astype("int32")
    labels[2, 3:] = 0
    metric = Perplexity()
    metric.update_state(labels, logits)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    real = labels != 0
    expected = np.exp((nll * real).sum() / real.sum())
    np.testing.assert_allclose(float(metric.result()), expected, rtol=1e-5)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_fused_loss_equals_straightforward_form(smoothing, mode):
    """Value and gradient of the fused TF loss equal the keras.ops one-hot form's, eagerly, in a
    tf.function (the in-place label subtraction) and under XLA (the scatter)."""
    logits_np = rand((3, 5, 18), 6) * 4  # vocab 18: viewed as [tokens * 9, 2] in place
    labels = np.random.default_rng(7).integers(0, 18, (3, 5)).astype("int32")
    labels[1, 3:] = 0

    def value_and_grad(logits):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            value = MaskedSparseCrossEntropy(label_smoothing=smoothing)(labels, logits)
        return value, tape.gradient(value, logits)

    def run(fused):
        with fast_paths.fast_paths("all" if fused else "none"):
            fn = value_and_grad
            if mode != "eager":
                fn = tf.function(value_and_grad, jit_compile=mode == "xla")
            value, grad = fn(tf.constant(logits_np))
        return float(value), np.asarray(grad)

    fused_value, fused_grad = run(True)
    plain_value, plain_grad = run(False)
    np.testing.assert_allclose(fused_value, plain_value, rtol=1e-6)
    np.testing.assert_allclose(fused_grad, plain_grad, atol=1e-7)


def test_loss_statistics_equal_formula():
    """The statistics the loss hands to the metrics: label logit, row maximum, logsumexp."""
    logits = rand((2, 4, 23), 8) * 5
    labels = np.random.default_rng(9).integers(1, 23, (2, 4)).astype("int32")
    loss = MaskedSparseCrossEntropy(label_smoothing=0.1)
    labels_t, logits_t = tf.constant(labels), tf.constant(logits)
    losses, weights, stats = loss.call_with_statistics(labels_t, logits_t)
    assert stats is not None
    np.testing.assert_allclose(
        np.asarray(stats["label_logit"]), np.take_along_axis(logits, labels[..., None], -1)[..., 0]
    )
    np.testing.assert_allclose(np.asarray(stats["max_logit"]), logits.max(-1))
    lse = np.log(np.exp(logits.astype("float64")).sum(-1))
    np.testing.assert_allclose(np.asarray(stats["logsumexp"]), lse, rtol=1e-6)
    # The per-token losses and weights give what calling the loss gives.
    mean = float(np.sum(np.asarray(losses) * np.asarray(weights)) / np.sum(np.asarray(weights)))
    np.testing.assert_allclose(mean, float(loss(labels_t, logits_t)), rtol=1e-6)
    # Handed over explicitly: the module keeps no state between a loss call and the metrics.
    assert not hasattr(losses_module, "token_statistics")
    assert not hasattr(losses_module, "_LAST")


def test_metrics_leave_the_logits_to_the_loss():
    """In a traced step, loss + accuracy + perplexity read the logits only in the loss (so the
    softmax may take the logits' buffer), and the metric values equal those from the logits."""
    logits = rand((4, 6, 31), 10) * 3
    labels = np.random.default_rng(11).integers(0, 31, (4, 6)).astype("int32")
    loss, accuracy, perplexity = MaskedSparseCrossEntropy(0.1), MaskedAccuracy(), Perplexity()

    @tf.function
    def step(y_true, y_pred):
        losses, weights, statistics = loss.call_with_statistics(y_true, y_pred)
        accuracy.update_state_from_statistics(statistics, weights)
        perplexity.update_state_from_statistics(statistics, weights)
        return ops.sum(losses * weights) / ops.sum(weights)

    step(labels, logits)
    graph = step.get_concrete_function(tf.constant(labels), tf.constant(logits)).graph
    readers = [op.name for op in graph.inputs[1].consumers()]
    assert readers and all(name.startswith("masked_sparse_cross_entropy/") for name in readers), (
        readers
    )
    reference_accuracy, reference_perplexity = MaskedAccuracy(), Perplexity()
    reference_accuracy.update_state(labels, logits)  # no loss ran: computed from the logits
    reference_perplexity.update_state(labels, logits)
    np.testing.assert_allclose(float(accuracy.result()), float(reference_accuracy.result()))
    np.testing.assert_allclose(
        float(perplexity.result()), float(reference_perplexity.result()), rtol=1e-6
    )


def test_fit_metrics_use_the_loss_statistics(monkeypatch):
    """model.evaluate with the library's loss and metrics: the metrics take the loss's statistics
    and report what the logits give."""
    hits = []
    original = metrics_module._MaskedMean.update_state_from_statistics

    def counting(self, statistics, weights):
        hits.append(statistics is not None)
        return original(self, statistics, weights)

    monkeypatch.setattr(metrics_module._MaskedMean, "update_state_from_statistics", counting)
    keras.utils.set_random_seed(3)
    model = tiny_model(dropout=0.0)
    model.compile(
        optimizer="sgd",
        loss=MaskedSparseCrossEntropy(0.1),
        metrics=[MaskedAccuracy(), Perplexity()],
        jit_compile=False,
    )
    src = np.random.default_rng(0).integers(1, 40, (8, 6)).astype("int32")
    tgt = np.random.default_rng(1).integers(1, 40, (8, 5)).astype("int32")
    tgt[:, 4:] = 0
    inputs = {"source_ids": src, "target_ids": tgt}
    result = model.evaluate(inputs, tgt, batch_size=8, verbose=0, return_dict=True)
    assert hits and all(hits)
    logits = model.predict(inputs, batch_size=8, verbose=0)
    expected = MaskedAccuracy(), Perplexity()
    for metric in expected:
        metric.update_state(tgt, logits)
    np.testing.assert_allclose(result["accuracy"], float(expected[0].result()), atol=1e-6)
    np.testing.assert_allclose(result["perplexity"], float(expected[1].result()), rtol=1e-5)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_fused_adam_equals_keras_adam(jit_compile):
    """Three steps of the one-kernel Adam equal keras.optimizers.Adam's (paper settings,
    a learning-rate schedule, global-norm clipping)."""
    shapes = [(7, 5), (5,), (3, 2, 4)]
    grads = [[rand(s, 20 + 3 * i + j) for j, s in enumerate(shapes)] for i in range(3)]

    def run(cls):
        variables = [keras.Variable(rand(s, 40 + j)) for j, s in enumerate(shapes)]
        schedule = keras.optimizers.schedules.ExponentialDecay(1e-2, 1, 0.5)
        optimizer = cls(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9, global_clipnorm=2.0)
        optimizer.build(variables)

        @tf.function(jit_compile=jit_compile)
        def apply(step_grads):
            optimizer.apply(step_grads, variables)

        for step_grads in grads:
            apply([tf.constant(g) for g in step_grads])
        return [np.asarray(v) for v in variables], optimizer

    fused, fused_optimizer = run(FusedAdam)
    plain, _ = run(keras.optimizers.Adam)
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert int(fused_optimizer.iterations) == 3
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(fused_optimizer))
    assert isinstance(restored, FusedAdam) and restored.beta_2 == 0.98


def test_adam_slots_are_kerass_own():
    """The fused Adam writes the moments through `_fast_paths.adam_slots`, the one reader of
    Keras's private `_momentums` / `_velocities` (Keras has no public accessor): they must be
    the slots Keras's own update writes and the optimizer's variables hold (what checkpoints
    save and a resume restores). A Keras that renames or re-keys them fails here, loudly."""
    from keras_transformer.training.recipe._fast_paths import adam_slots

    variables = [keras.Variable(rand((2, 3), 50)), keras.Variable(rand((3,), 51))]
    optimizer = keras.optimizers.Adam(0.1, beta_1=0.9, beta_2=0.98)  # Keras's update
    optimizer.build(variables)
    gradients = [np.full((2, 3), 0.5, "float32"), np.full((3,), 2.0, "float32")]
    optimizer.apply(gradients, variables)
    for variable, gradient in zip(variables, gradients):
        m, v = adam_slots(optimizer, variable)
        assert tuple(m.shape) == tuple(v.shape) == tuple(variable.shape)
        np.testing.assert_allclose(np.asarray(m), 0.1 * gradient, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(v), 0.02 * gradient**2, rtol=1e-5)
        assert sum(x is m or x is v for x in optimizer.variables) == 2
    package = pathlib.Path(__file__).resolve().parents[1] / "keras_transformer"
    readers = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if re.search(r"\._(momentums|velocities)\b", path.read_text())
    ]
    assert readers == ["training/recipe/_fast_paths.py"], readers


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_layer_norm_equals_keras_layer_norm(dtype):
    """Output and gradients (input, gamma, beta) of the hand-written LayerNorm equal Keras's."""
    x = rand((3, 5, 16), 12) * 3 + 1
    upstream = rand((3, 5, 16), 13)

    def run(fused):
        layer = LayerNormalization(epsilon=1e-6, dtype=dtype, kernels="all" if fused else "none")
        layer.build(x.shape)
        layer.gamma.assign(rand((16,), 14) + 1)
        layer.beta.assign(rand((16,), 15))
        xt = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            out = tf.cast(layer(xt), "float32")
            total = tf.reduce_sum(out * upstream)
        grads = tape.gradient(total, [xt, layer.gamma.value, layer.beta.value])
        return np.asarray(out), [np.asarray(g) for g in grads]

    fused_out, fused_grads = run(True)
    plain_out, plain_grads = run(False)
    tol = ATOL if dtype == "float32" else 2e-2
    np.testing.assert_allclose(fused_out, plain_out, atol=tol)
    for a, b in zip(fused_grads, plain_grads):
        np.testing.assert_allclose(a, b, atol=tol * 10, rtol=tol)
    assert isinstance(
        keras.layers.deserialize(keras.layers.serialize(LayerNormalization())), LayerNormalization
    )


def _graph_op_types(concrete):
    graph_def = concrete.graph.as_graph_def()
    types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        types |= {node.op for node in function.node_def}
    return types


@pytest.mark.scenario
@pytest.mark.parametrize("beam_size", [1, 4])
def test_inplace_cache_writes_equal_scatter_writes(beam_size):
    """translate_ids writes its caches in place (InplaceUpdate in the traced loop): the same ids
    and scores as the copying scatter, also on a second call of the same function (no constant
    or reused input was overwritten)."""
    keras.utils.set_random_seed(5)
    model = tiny_model()
    src = np.random.default_rng(6).integers(4, 40, (3, 7)).astype("int32")
    src[1, 5:] = 0

    def decoder(kernels):
        return tf.function(
            lambda s: translate_ids(
                model, s, beam_size=beam_size, max_extra_length=6, kernels=kernels
            )
        )

    fast = decoder(model.kernels)
    first, second = fast(src), fast(src)
    assert "InplaceUpdate" in _graph_op_types(fast.get_concrete_function(tf.constant(src)))
    plain = decoder(model.kernels.without("inplace_cache_writes"))
    assert "InplaceUpdate" not in _graph_op_types(plain.get_concrete_function(tf.constant(src)))
    ref_ids, ref_scores, _ = plain(src)
    for ids, scores, _ in (first, second):
        np.testing.assert_array_equal(np.asarray(ids), np.asarray(ref_ids))
        np.testing.assert_allclose(np.asarray(scores), np.asarray(ref_scores), atol=1e-5)


def test_decode_step_leaves_the_callers_cache_alone():
    """Outside translate_ids, decode_step is functional: the cache passed in is unchanged."""
    keras.utils.set_random_seed(5)
    model = tiny_model()
    src = tf.constant(np.random.default_rng(6).integers(4, 40, (2, 5)).astype("int32"))

    @tf.function
    def step(source_ids):
        memory, mask = model.encode(source_ids)
        cache = model.init_cache(memory, 6)
        before = cache["self_attention"][0][0]
        _, new_cache = model.decode_step(tf.fill([2, 1], 1), 0, cache, mask)
        return before, new_cache["self_attention"][0][0]

    before, after = step(src)
    assert not np.asarray(before).any()  # still zeros
    assert np.asarray(after)[:, :, 0].any()  # position 0 written in the new cache


# ----------------------------------------------------------------------- output projection


@pytest.mark.parametrize("tied", [True, False])
def test_decoding_output_kernel_equals_the_models_projection(tied):
    """With tied embeddings init_cache carries the embedding transposed to [d_model, vocab]; an
    untied Dense projection (with a bias) is called as it is. decode_step's logits equal the full
    forward pass either way."""
    keras.utils.set_random_seed(7)
    model = tiny_model(tie_output_projection=tied)
    src = np.random.default_rng(8).integers(4, 40, (2, 6)).astype("int32")
    tgt = np.random.default_rng(9).integers(4, 40, (2, 4)).astype("int32")
    full = np.asarray(model({"source_ids": src, "target_ids": tgt}, training=False))
    if not tied:
        model.output_projection.bias.assign(np.linspace(-1, 1, 40).astype("float32"))
        full = np.asarray(model({"source_ids": src, "target_ids": tgt}, training=False))
    memory, mask = model.encode(src)
    cache = model.init_cache(memory, 4)
    if tied:
        expected = np.asarray(model.target_embedding.embeddings).T
        np.testing.assert_array_equal(np.asarray(cache["output_kernel"]), expected)
    else:
        assert "output_kernel" not in cache
    for t in range(4):
        logits, cache = model.decode_step(tgt[:, t : t + 1], t, cache, mask)
        np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, t], atol=1e-4)


def _loop_body_2d_transposes(concrete):
    """Transposes with a 2-D permutation inside the functions of a traced graph (the while
    loop's body among them), by function name."""
    graph_def = concrete.graph.as_graph_def()
    found = {}
    for function in graph_def.library.function:
        nodes = {node.name: node for node in function.node_def}
        for node in function.node_def:
            if node.op != "Transpose":
                continue
            perm = nodes.get(node.input[1].split(":")[0])
            if perm is not None and perm.op == "Const":
                if len(tf.make_ndarray(perm.attr["value"].tensor)) == 2:
                    found.setdefault(function.signature.name, []).append(node.name)
    return found


def test_translate_loop_does_not_transpose_the_embedding_per_step():
    """The tied embedding is transposed once per translate_ids call, outside the decoding loop:
    no 2-D transpose is left in the traced loop body (before, one ran at every step)."""
    model = tiny_model()
    src = tf.constant(np.random.default_rng(6).integers(4, 40, (2, 5)).astype("int32"))
    fn = tf.function(lambda s: translate_ids(model, s, beam_size=2, max_extra_length=3))
    concrete = fn.get_concrete_function(src)
    bodies = [f.signature.name for f in concrete.graph.as_graph_def().library.function]
    assert any("body" in name for name in bodies)
    assert not {k: v for k, v in _loop_body_2d_transposes(concrete).items() if "body" in k}


# ----------------------------------------------------------------------- exported token scores


@pytest.mark.scenario
@pytest.mark.parametrize("beam_size", [1, 3])
def test_tracked_token_scores_equal_forced_decoding(
    copy_model, toy_spm_bytes, monkeypatch, beam_size
):
    """The SavedModel's per-token scores (and the confidence made from them), tracked with the
    hypotheses during the search, equal the plain form's forced-decoding pass over the outputs
    (trained model: same translations, scores to 1e-4), for the best hypothesis and the n-best;
    with the fast path the forced pass is not even traced."""
    import _inference_fixtures as fx

    from keras_transformer.export import Translator

    texts = tf.constant([*fx.NORMAL, *fx.HOSTILE])

    def translate(kernels):
        translator = Translator(
            copy_model, toy_spm_bytes, beam_size=beam_size, alpha=0.6, max_extra_length=8,
            max_source_length=fx.MAX_SOURCE_LENGTH, batch_size=4, kernels=kernels,
        )  # fmt: skip
        return translator(texts), translator.translate_nbest(texts)

    expected = translate(Kernels.get("all").without("tracked_token_scores"))
    monkeypatch.setattr(Translator, "_token_log_probs", lambda *args: pytest.fail("forced pass"))
    tracked = translate(None)  # the model's kernels: all
    for out, reference in zip(tracked, expected):
        fx.assert_same_answers(out, reference)
    assert np.any(tracked[0]["token_scores"].numpy() < -1e-3)  # not all zeros


# ----------------------------------------------------------------------- shared beam caches


def _loop_gathers(concrete, op="GatherV2"):
    """`op` ops (GatherV2) inside the while loop's body functions of a traced graph."""
    graph_def = concrete.graph.as_graph_def()
    return sum(
        node.op == op
        for function in graph_def.library.function
        if "body" in function.signature.name
        for node in function.node_def
    )


def test_beam_search_concatenates_the_fused_projections_once_not_at_every_step():
    """With shared beam caches the self-attentions' query/key/value kernels are concatenated
    once per call, outside the search's loop: its body has no more concatenations with fused
    projections than without them, and the answers are the same."""
    keras.utils.set_random_seed(5)
    model = tiny_model()
    src = np.array([[5, 6, 7, 3, 0], [8, 9, 3, 0, 0]], "int32")

    built = model.decoder.blocks[0].self_attention.kernels

    def run(fused):
        for block in model.decoder.blocks:  # the layers' own choice (made when built)
            kernels = built if fused else built.without("fused_projections")
            block.self_attention.kernels = kernels
        fn = tf.function(lambda s: translate_ids(model, s, beam_size=4, max_extra_length=4))
        ids, scores = (np.asarray(x) for x in fn(src)[:2])
        return ids, scores, _loop_gathers(fn.get_concrete_function(tf.constant(src)), "ConcatV2")

    assert model.kernels.uses("fused_projections") and model.kernels.uses("shared_beam_caches")
    ref_ids, ref_scores, ref_concats = run(fused=False)
    ids, scores, concats = run(fused=True)
    assert concats == ref_concats
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-5)


def test_beam_caches_attend_without_zeroing_empty_rows(monkeypatch):
    """On shared beam caches every attention row has a key (a hypothesis sees its own position,
    an input its own EOS), so each of the search's attentions skips the pass that zeroes rows
    without one: every call asks for none; the answers equal those of per-beam caches, whose
    plain attention keeps the pass (to 1e-5)."""
    from keras_transformer.decoding import beam_cache

    keras.utils.set_random_seed(5)
    model = tiny_model()
    src = np.array([[5, 6, 7, 3, 0], [8, 9, 3, 0, 0]], "int32")
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs.get("zero_empty_rows", True))
        return scaled_dot_product_attention(*args, **kwargs)

    monkeypatch.setattr(beam_cache, "scaled_dot_product_attention", spy)

    def run(kernels):
        fn = tf.function(
            lambda s: translate_ids(model, s, beam_size=4, max_extra_length=4, kernels=kernels)
        )
        return [np.asarray(x) for x in fn(src)[:2]]

    ids, scores = run(model.kernels)
    assert model.kernels.uses("shared_beam_caches")
    assert calls == [False] * (2 * len(model.decoder.blocks))  # traced once: one per attention
    ref_ids, ref_scores = run(model.kernels.without("shared_beam_caches"))
    assert len(calls) == 2 * len(model.decoder.blocks)  # the per-beam caches' own attention
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-5)


def test_growing_caches_double_when_full_and_keep_what_was_written():
    """In a TF graph a growing cache starts `min(16, buffer)` long (a length unknown when
    traced); at a position past its end it doubles, at most to the buffer, the old positions
    kept and zeros after them; inside it, it is the same buffer."""
    from keras_transformer.layers import _fast_paths as kernels_module

    start = kernels_module.GROWING_CACHE_START
    assert kernels_module.growing_cache_length(40) is None  # eager: fixed shapes

    @tf.function
    def lengths(buffer):
        first = kernels_module.growing_cache_length(buffer)
        assert first.shape == [] and tf.get_static_value(first) is None
        keys = tf.reshape(tf.range(2 * 3 * first * 2, dtype=tf.float32), [2, 3, first, 2])
        caches, seen = [(keys, keys + 1.0)], []
        for index in range(buffer):  # the search's positions
            caches = kernels_module.grown_caches(caches, index, buffer)
            seen.append(tf.shape(caches[0][0])[2])
        return first, tf.stack(seen), keys, caches

    first, seen, keys, caches = lengths(40)
    assert int(first) == start
    assert list(np.asarray(seen)) == [16] * 16 + [32] * 16 + [40] * 8
    grown = np.asarray(caches[0][1])
    np.testing.assert_array_equal(grown[:, :, :start], np.asarray(keys) + 1.0)
    assert not grown[:, :, start:].any()
    assert int(lengths(5)[0]) == 5  # a buffer shorter than the start


def test_beam_search_on_growing_caches_equals_full_length_caches(monkeypatch):
    """Beam search over outputs longer than the caches' start (they grow 16 -> 32 -> 40, their
    buffer) finds what it finds with caches of the whole buffer from the first step: the same
    ids, scores to 1e-5; over a shortlist too."""
    from keras_transformer.layers import _fast_paths as kernels_module

    keras.utils.set_random_seed(5)
    model = tiny_model(dropout=0.0)
    model({"source_ids": np.ones((1, 2), "int32"), "target_ids": np.ones((1, 2), "int32")})
    embeddings = model.target_embedding.embeddings
    embeddings.assign(tf.tensor_scatter_nd_update(embeddings, [[3]], tf.zeros([1, 32])))
    src = np.array([[5, 6, 7, 8, 9, 3], [8, 9, 3, 0, 0, 0]], "int32")  # buffer 6 + 34 = 40

    class Table:  # a shortlist of half the vocabulary
        translations = np.tile(np.arange(4, 24, dtype="int32"), (40, 1))
        frequent = np.arange(4, 8, dtype="int32")

    def run(shortlist):
        fn = tf.function(
            lambda s: translate_ids(model, s, beam_size=4, max_extra_length=34, shortlist=shortlist)
        )
        return [np.asarray(x) for x in fn(src)[:2]]

    results = {shortlist: run(shortlist) for shortlist in (None, Table)}
    monkeypatch.setattr(kernels_module, "growing_cache_length", lambda max_length: None)
    for shortlist, (ids, scores) in results.items():
        ref_ids, ref_scores = run(shortlist)
        assert (ref_ids > 0).sum(axis=1).max() > 2 * kernels_module.GROWING_CACHE_START
        np.testing.assert_array_equal(ids, ref_ids)
        np.testing.assert_allclose(scores, ref_scores, atol=1e-5)


@pytest.mark.scenario
@pytest.mark.parametrize("trained", [True, False])
def test_shared_beam_caches_equal_reordered_caches(copy_model, trained):
    """Beam search with each input's caches held once for all its beams (no reorder) finds what
    it finds with per-beam caches reordered at every step: the same n-best ids, scores and token
    scores (to 1e-5), a forced prefix included, in a graph; and its loop gathers no cache."""
    import _inference_fixtures as fx

    keras.utils.set_random_seed(3)
    model = copy_model if trained else tiny_model()
    src = fx.encode_sources(fx.NORMAL + [""])  # [5, s_len]
    prefix = np.zeros((len(src), 2), "int32")
    prefix[1], prefix[3, 0] = src[0, :2], src[3, 1]  # other rows: no prefix

    def run(kernels):
        fn = tf.function(
            lambda s, p: translate_ids(
                model,
                s,
                beam_size=4,
                alpha=0.6,
                max_extra_length=5,
                return_all=True,
                prefix_ids=p,
                kernels=kernels,
            )  # fmt: skip
        )
        outputs = [np.asarray(x) for x in fn(src, prefix)]
        return outputs, _loop_gathers(fn.get_concrete_function(tf.constant(src), prefix))

    (ids, scores, token_scores), gathers = run(model.kernels)
    (ref_ids, ref_scores, ref_token_scores), ref_gathers = run(
        model.kernels.without("shared_beam_caches")
    )
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-5)
    np.testing.assert_allclose(token_scores, ref_token_scores, atol=1e-5)
    assert ids[1, 0, 0] == src[0, 0] and ids[1, 0, 1] == src[0, 1]  # the prefix was forced
    # One gather of the slot history in place of two per layer (keys, values).
    assert gathers == ref_gathers - 2 * len(model.decoder.blocks) + 1
