"""Fast paths of the layers: the same numbers as the formulas in `attention.py` and
`normalization.py`, computed faster (measurements in docs/guides/performance.md).

Each function takes the caller's `kernels` (a `keras_transformer.fast_paths.Kernels`, chosen
when the layer was built) and returns None where it does not apply (not chosen, another backend,
XLA, an unusual configuration); the caller then runs the plain formula. The
TensorFlow-only kernels import TensorFlow lazily, so the layers still import and run without it
(on the JAX backend). `tests/test_fast_paths.py` checks every path against the plain form.
"""

import keras
from keras import ops

from keras_transformer.tf_utils import in_xla_context

# ------------------------------------------------------------------------ attention projections


def fused_weights(kernels, denses, compute_dtype):
    """`(kernel, bias)`: the Dense layers `denses`' kernels (and biases, else None)
    concatenated on their output axis, what `fused_projection` multiplies by; None where that
    path does not apply (fewer than two layers, not chosen, unequal widths or bias settings,
    LoRA or quantized weights). A decoding loop computes them once, outside its steps."""
    if len(denses) < 2 or not kernels.uses("fused_projections"):
        return None
    units = {d.units for d in denses}
    biases = {d.use_bias for d in denses}
    if len(units) != 1 or len(biases) != 1:
        return None
    if any(d.lora_enabled or d.quantization_mode for d in denses):
        return None
    kernel = ops.concatenate([ops.cast(d.kernel, compute_dtype) for d in denses], axis=-1)
    bias = None
    if denses[0].use_bias:
        bias = ops.concatenate([ops.cast(d.bias, compute_dtype) for d in denses], axis=-1)
    return kernel, bias


def fused_projection(
    kernels, x, denses, compute_dtype, split_heads, training=None, weights=None
):  # fmt: skip
    """`x` through the Dense layers `denses` with one (wider) matmul over their concatenated
    kernels; returns one `split_heads(...)` result per layer, or None where it does not apply.
    `weights`: their `fused_weights`, computed once by the caller (None: here).

    The weights stay separate Dense layers, so checkpoints and configs are unchanged. The product
    is split on its last axis, whose gradient is a cheap concatenation.
    """
    weights = weights or fused_weights(kernels, denses, compute_dtype)
    if weights is None:
        return None
    kernel, bias = weights
    if _projection_gradients_apply(kernels, training):
        y = _tf_dense(x, kernel, bias, relu=False)
    elif _flat_dense_applies(kernels, training, x, kernel):
        y = _tf_flat_dense(x, kernel, bias, relu=False)
    else:
        y = ops.matmul(x, kernel)  # [batch, len, n * units]
        if bias is not None:
            y = ops.add(y, bias)
    return [split_heads(part) for part in ops.split(y, len(denses), -1)]


# ------------------------------------------------------------------------ Dense layers


def dense(kernels, layer, x, training=None):
    """`layer(x)` for a Keras `Dense` layer (linear or ReLU): in training with its input
    gradient computed as an einsum over the kernel (`projection_gradients`), outside training
    as one 2-D matmul fused with its bias and ReLU (`flat_dense`); None where neither applies
    (switched off, another backend, XLA, another activation, LoRA or quantized weights)."""
    if layer.lora_enabled or layer.quantization_mode:
        return None
    relu = layer.activation is keras.activations.relu
    if not relu and layer.activation is not keras.activations.linear:
        return None
    if _projection_gradients_apply(kernels, training):
        project = _tf_dense
    elif _flat_dense_applies(kernels, training, x, layer.kernel):
        project = _tf_flat_dense
    else:
        return None
    kernel = ops.cast(layer.kernel, layer.compute_dtype)
    bias = ops.cast(layer.bias, layer.compute_dtype) if layer.use_bias else None
    return project(ops.cast(x, layer.compute_dtype), kernel, bias, relu)


def matmul(kernels, x, kernel):
    """`x @ kernel` for `x` `[..., d]` and `kernel` `[d, n]` (outside training) as one 2-D
    matmul (`flat_dense`), or None where that does not apply."""
    if not _flat_dense_applies(kernels, None, x, kernel):
        return None
    return _tf_flat_dense(x, kernel, None, relu=False)


def call_dense(kernels, layer, x, training=None):
    """`layer(x)`, through `dense`'s fast path where it applies."""
    fast = dense(kernels, layer, x, training)
    return fast if fast is not None else layer(x)


def _projection_gradients_apply(kernels, training):
    # Only where a gradient is wanted: decoding steps keep their plain (fewer) ops.
    return (
        training is True
        and kernels.uses("projection_gradients")
        and keras.backend.backend() == "tensorflow"
        and not in_xla_context()
    )


def _flat_dense_applies(kernels, training, x, kernel):
    # Outside training, in TF graphs outside XLA (which folds the shape arithmetic itself), for
    # inputs of rank 3 or more whose last axis is known (rank 2 is a plain MatMul already).
    return (
        training is not True
        and kernels.uses("flat_dense")
        and keras.backend.backend() == "tensorflow"
        and not in_xla_context()
        and len(x.shape) >= 3
        and len(kernel.shape) == 2
        and x.shape[-1] is not None
        and x.shape[-1] == kernel.shape[0]
    )


def _fused_product(flat, kernel, bias, relu):
    """`relu?(flat @ kernel + bias)` of a 2-D `flat`: the MatMul -> BiasAdd -> Relu chain that
    TensorFlow's remapper fuses into one oneDNN kernel."""
    import tensorflow as tf

    y = tf.matmul(flat, kernel)
    if bias is not None:
        y = tf.nn.bias_add(y, bias)
    return tf.nn.relu(y) if relu else y


def _tf_flat_dense(x, kernel, bias, relu):
    """`relu?(x @ kernel + bias)` over the last axis of `x` as `x` reshaped to 2-D, one MatMul
    (which TensorFlow's remapper fuses with the BiasAdd and the Relu into one oneDNN kernel)
    and a reshape back. Keras's matmul of a rank-3 `x` is a `tensordot`: a dozen shape ops
    around the same MatMul (Shape, GatherV2, Prod, Pack, ConcatV2...) and the BiasAdd after
    its reshape, unfused; a base decoder step has 38 such products."""
    import tensorflow as tf

    x, kernel = tf.convert_to_tensor(x), tf.convert_to_tensor(kernel)
    dtype = keras.backend.result_type(x.dtype.name, kernel.dtype.name)  # as Keras's matmul
    x, kernel = tf.cast(x, dtype), tf.cast(kernel, dtype)
    units_in, units_out = kernel.shape
    bias = None if bias is None else tf.cast(bias, dtype)
    y = _fused_product(tf.reshape(x, [-1, units_in]), kernel, bias, relu)
    inner = x.shape[1:-1]
    width = tf.shape(kernel)[1] if units_out is None else units_out  # a shortlist's: at run time
    if inner.is_fully_defined():  # a constant shape where the width is known: no shape ops
        shape = [-1, *inner.as_list(), width]
    else:
        shape = tf.concat([tf.shape(x)[:-1], [width]], 0)
    out = tf.reshape(y, shape)
    out.set_shape(x.shape[:-1].concatenate([units_out]))
    return out


def _tf_dense(x, kernel, bias, relu):
    """`relu?(x @ kernel + bias)` over the last axis of `x`, as a 2-D matmul TensorFlow's
    remapper fuses with the bias and ReLU; the gradient with respect to `x` is
    `einsum("no,io->ni", g, kernel)`, which oneDNN runs faster than the `matmul(g, kernel,
    transpose_b=True)` of TensorFlow's own MatMul gradient (25% at `[2048, 2048] x [2048, 512]`
    on a 2-core Zen 5; docs/guides/performance.md). Same numbers as the plain Dense to float
    rounding (tests/test_fast_paths.py)."""
    import tensorflow as tf

    units_in, units_out = kernel.shape
    out_shape = x.shape[:-1].concatenate([units_out])

    @tf.custom_gradient
    def project(x, kernel, *bias):
        flat = tf.reshape(x, [-1, units_in])
        y = _fused_product(flat, kernel, bias[0] if bias else None, relu)

        def grad(upstream):
            g = tf.reshape(upstream, [-1, units_out])
            if relu:
                g = tf.raw_ops.ReluGrad(gradients=g, features=y)
            d_x = tf.reshape(tf.einsum("no,io->ni", g, kernel), tf.shape(x))
            d_kernel = tf.matmul(flat, g, transpose_a=True)
            if bias:
                return d_x, d_kernel, tf.raw_ops.BiasAddGrad(out_backprop=g)
            return d_x, d_kernel

        out = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [units_out]], 0))
        out.set_shape(out_shape)
        return out, grad

    return project(x, kernel, *([] if bias is None else [bias]))


# ------------------------------------------------------------------------ decoding-cache writes


def write_cache(kernels, cache, update, index, owned=False):
    """`cache` `[b, h, max_len, d]` with one position `update` `[b, h, 1, d]` written at `index`,
    or None where no fast path applies (longer updates, not chosen).

    A cache its caller gave up (`owned`: the search's own buffers, never read again) is written
    in place in TF graphs outside XLA; otherwise the row is scattered: in a TF graph
    `slice_update` runs as a separately compiled XLA kernel per call and costs several times
    more.
    """
    if update.shape[2] != 1:
        return None
    update = ops.cast(update, cache.dtype)
    if owned and _inplace_writes_allowed():
        return _tf_write_in_place(cache, update, index)
    if not kernels.uses("scatter_cache_writes"):
        return None
    b, h, d = ops.shape(cache)[0], ops.shape(cache)[1], ops.shape(cache)[3]
    rows = ops.repeat(ops.arange(b, dtype="int32"), h)  # [b * h]
    heads = ops.tile(ops.arange(h, dtype="int32"), [b])  # [b * h]
    slots = ops.full((b * h,), ops.cast(index, "int32"), dtype="int32")
    indices = ops.stack([rows, heads, slots], axis=1)  # [b * h, 3]
    return ops.scatter_update(cache, indices, ops.reshape(update, (b * h, d)))


def _inplace_writes_allowed():
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return not tf.executing_eagerly() and not in_xla_context()


def _tf_write_in_place(cache, update, index):
    """`InplaceUpdate` of rows `(b * h + head) * max_len + index` of the cache as `[-1, d]`."""
    import tensorflow as tf

    shape = tf.shape(cache)
    b, h, length, d = shape[0], shape[1], shape[2], shape[3]
    rows = tf.range(b * h) * length + tf.cast(index, tf.int32)
    out = tf.raw_ops.InplaceUpdate(
        x=tf.reshape(cache, [-1, d]), i=rows, v=tf.reshape(update, [b * h, d])
    )
    return tf.reshape(out, shape)


# Beam search's shared caches (`decoding.beam_cache`) in a TensorFlow graph outside XLA start
# this many positions long and double when full: each step's attention reads the positions
# written so far, rounded up, instead of the whole output buffer.
GROWING_CACHE_START = 16


def growing_cache_length(max_length):
    """The first length of beam search's growing caches (an int32 scalar at most `max_length`),
    or None where caches keep one length (other backends, eager, XLA: fixed shapes)."""
    if not _inplace_writes_allowed():
        return None
    import tensorflow as tf

    start = tf.minimum(GROWING_CACHE_START, tf.cast(max_length, tf.int32))
    # A length unknown when traced, so that the search's loop accepts caches whose length
    # changes (tf.while_loop keeps the shapes its variables enter with).
    return tf.raw_ops.PlaceholderWithDefault(input=start, shape=[])


def grown_caches(caches, index, max_length):
    """`caches` (per layer `(keys, values)` `[b, rows, length, d]`) as they are while position
    `index` is inside them, else twice as long (at most `max_length`), zeros after the old
    positions: a fresh buffer, which the search may write in place."""
    import tensorflow as tf

    length = tf.shape(caches[0][0])[2]

    def grow():
        longer = tf.minimum(2 * length, tf.cast(max_length, tf.int32))
        padding = [[0, 0], [0, 0], [0, longer - length], [0, 0]]
        return [tuple(tf.pad(x, padding) for x in pair) for pair in caches]

    return tf.cond(index < length, lambda: [tuple(pair) for pair in caches], grow)


def fresh_zeros(shape, dtype):
    """Zeros in a buffer of their own that graph optimizers never turn into a constant (TF's
    `Empty` op is marked do-not-optimize), so in-place cache writes may change it; `ops.zeros` on
    other backends."""
    if keras.backend.backend() != "tensorflow":
        return ops.zeros(shape, dtype=dtype)
    import tensorflow as tf

    shape = tf.stack([tf.cast(s, tf.int32) for s in shape])
    return tf.raw_ops.Empty(shape=shape, dtype=tf.as_dtype(dtype), init=True)


# ------------------------------------------------------------------------ layer normalization


def layer_norm(kernels, layer, inputs):
    """`layer` (a `LayerNormalization`) applied with a hand-written TensorFlow gradient, or None
    where it does not apply (other backends, other axes, `rms_scaling`, no center or scale).

    Differentiated automatically, Keras's arithmetic keeps several activation-sized tensors per
    layer for the backward pass; here only the centred input `x - mean` and
    `1 / sqrt(var + epsilon)` are kept, and the backward pass is the closed form
    `dx = (g - mean(g) - x_hat * mean(g * x_hat)) / sqrt(var + epsilon)` with `g = dy * gamma`.
    """
    last_axis = (-1, [-1], len(inputs.shape) - 1, [len(inputs.shape) - 1])
    if (
        not kernels.uses("fused_layer_norm")
        or keras.backend.backend() != "tensorflow"
        or layer.rms_scaling
        or not (layer.center and layer.scale)
        or layer.axis not in last_axis
    ):
        return None
    compute = keras.backend.result_type(inputs.dtype, "float32")
    outputs = _tf_layer_norm(
        ops.cast(inputs, compute),
        ops.cast(layer.gamma, compute),
        ops.cast(layer.beta, compute),
        layer.epsilon,
    )
    return ops.cast(outputs, layer.compute_dtype)


def _tf_layer_norm(x, gamma, beta, epsilon):
    import tensorflow as tf

    @tf.custom_gradient
    def layer_norm(x, gamma, beta):
        # x - mean computed once and reused for the variance, and no tf.nn.moments (its
        # SquaredDifference of x against a stopped-gradient mean): 18 normalisations of a
        # [128, 1, 512] decoder step take 0.63 against 0.88 ms on 2 AMD EPYC cores. The
        # backward pass's x_hat is computed only when a gradient is asked for.
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        centered = x - mean
        variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
        inv_std = tf.math.rsqrt(variance + epsilon)
        outputs = beta + centered * (inv_std * gamma)

        def grad(d_outputs):
            x_hat = centered * inv_std
            batch_axes = list(range(len(x.shape) - 1))
            d_beta = tf.reduce_sum(d_outputs, axis=batch_axes)
            d_gamma = tf.reduce_sum(d_outputs * x_hat, axis=batch_axes)
            g = d_outputs * gamma
            mean_g = tf.reduce_mean(g, axis=-1, keepdims=True)
            mean_g_x_hat = tf.reduce_mean(g * x_hat, axis=-1, keepdims=True)
            d_x = (g - mean_g - x_hat * mean_g_x_hat) * inv_std
            return d_x, d_gamma, d_beta

        return outputs, grad

    return layer_norm(x, gamma, beta)
