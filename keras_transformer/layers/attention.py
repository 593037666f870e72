"""Scaled dot-product attention and multi-head attention with a fixed-size key/value cache."""

import contextlib
import math
import threading

import keras
from keras import ops

from keras_transformer.tf_utils import in_xla_context

# Logit given to forbidden keys; the softmax runs in float32, where it is finite.
_MASKED_LOGIT = -1e9

# Fast path (measured in benchmarks/README.md): when query, key and value are the same tensor
# (self-attention), or key and value are (cross-attention), project them with one matmul over the
# concatenated kernels instead of one matmul each. The weights stay three separate Dense layers,
# so checkpoints and configs do not change; tests/test_fast_paths.py checks both paths agree.
FUSE_PROJECTIONS = True


def scaled_dot_product_attention(query, key, value, mask=None, dropout_fn=None):
    """softmax(Q K^T / sqrt(d_k)) V, the paper's equation (1).

    Args:
        query: `[..., q_len, d_k]`.
        key: `[..., k_len, d_k]`.
        value: `[..., k_len, d_v]`.
        mask: optional boolean tensor broadcastable to `[..., q_len, k_len]`; True means the query
            may attend to the key. Rows with no allowed key give all-zero weights (never NaN).
        dropout_fn: optional callable applied to the attention weights (attention dropout).

    Returns:
        `(output, attention_weights)` with shapes `[..., q_len, d_v]` and `[..., q_len, k_len]`.

    Example:
    >>> q = k = np.eye(2, dtype="float32")
    >>> v = np.array([[2.0, 3.0], [4.0, 5.0]], "float32")
    >>> out, w = scaled_dot_product_attention(q, k, v)  # w ~ [[.67, .33], [.33, .67]]

    References:
        Vaswani et al., 2017, "Attention Is All You Need", section 3.2.1.
    """
    compute_dtype = keras.backend.standardize_dtype(query.dtype)
    d_k = ops.shape(query)[-1]
    query = ops.multiply(query, ops.cast(1.0 / math.sqrt(d_k), compute_dtype))
    # einsum contracts the last axes directly (a batched matmul with the key "adjoint"), so no
    # transposed copy of the keys is materialised.
    logits = ops.einsum("...qd,...kd->...qk", query, key)  # [..., q_len, k_len]
    # The softmax runs in float32 so that half-precision policies keep a stable normalisation.
    logits = ops.cast(logits, "float32")
    if mask is not None:
        mask = ops.cast(mask, "bool")
        logits = ops.where(mask, logits, _MASKED_LOGIT)
    weights = ops.softmax(logits, axis=-1)
    if mask is not None:
        # A fully masked row softmaxes to uniform weights over forbidden keys; zero it instead.
        weights = ops.where(mask, weights, ops.zeros_like(weights))
    weights = ops.cast(weights, compute_dtype)
    dropped = dropout_fn(weights) if dropout_fn is not None else weights
    output = ops.matmul(dropped, value)
    return output, weights


def _write_at(cache, update, index):
    """`cache` `[b, h, max_len, d]` with `update` `[b, h, n, d]` written at positions index...

    One new position (the usual decoding step) is scattered in (`CACHE_WRITE`): in a TF graph
    `slice_update` runs as a separately compiled XLA kernel per call and costs several times
    more (benchmarks/README.md). Inside `inplace_cache_writes()` (TF graphs outside XLA), it is
    written into the cache's own buffer instead: a scatter copies the whole cache. Longer updates
    (a prefix) use `slice_update`.
    """
    update = ops.cast(update, cache.dtype)
    if update.shape[2] == 1 and _inplace_writes_allowed():
        return _tf_write_in_place(cache, update, index)
    if update.shape[2] == 1 and CACHE_WRITE == "scatter":
        b, h, d = ops.shape(cache)[0], ops.shape(cache)[1], ops.shape(cache)[3]
        rows = ops.repeat(ops.arange(b, dtype="int32"), h)  # [b * h]
        heads = ops.tile(ops.arange(h, dtype="int32"), [b])  # [b * h]
        slots = ops.full((b * h,), ops.cast(index, "int32"), dtype="int32")
        indices = ops.stack([rows, heads, slots], axis=1)  # [b * h, 3]
        return ops.scatter_update(cache, indices, ops.reshape(update, (b * h, d)))
    if update.shape[2] == 1 and CACHE_WRITE == "where":
        slot = ops.equal(ops.arange(ops.shape(cache)[2]), index)  # [max_len]
        return ops.where(ops.reshape(slot, (1, 1, -1, 1)), update, cache)
    return ops.slice_update(cache, [0, 0, index, 0], update)


_INPLACE = threading.local()


@contextlib.contextmanager
def inplace_cache_writes():
    """Decoding-cache writes traced inside update the cache's buffer instead of copying it.

    For callers that own their caches, as `decoding.translate_ids` does: the cache passed to
    `decode_step` is then changed in place, so it must not be read again, and it must be a tensor
    of its own, never a constant (`fresh_zeros` makes one). TensorFlow graphs only; eagerly,
    under XLA and on other backends writes are unchanged. Beam-4 decoding at the base shapes
    measured 1.05-1.11x faster than with the scatter's copies (benchmarks/README.md).
    """
    previous = getattr(_INPLACE, "on", False)
    _INPLACE.on = True
    try:
        yield
    finally:
        _INPLACE.on = previous


def fresh_zeros(shape, dtype):
    """Zeros in a buffer of their own that graph optimizers never turn into a constant (TF's
    `Empty` op is marked do-not-optimize); `ops.zeros` on other backends."""
    if keras.backend.backend() != "tensorflow":
        return ops.zeros(shape, dtype=dtype)
    import tensorflow as tf

    shape = tf.stack([tf.cast(s, tf.int32) for s in shape])
    return tf.raw_ops.Empty(shape=shape, dtype=tf.as_dtype(dtype), init=True)


def _inplace_writes_allowed():
    if not INPLACE_CACHE_WRITES or not getattr(_INPLACE, "on", False):
        return False
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


# How one decoding step is written into a (keys, values) cache: "scatter" (default: the fewest
# bytes moved), "where" (a blend over the cache) or "slice" (slice_update); all give equal caches.
CACHE_WRITE = "scatter"
# False: `inplace_cache_writes()` has no effect (the copying writes above; for tests and A/B runs).
INPLACE_CACHE_WRITES = True


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention (paper section 3.2.2) with an optional fixed-size key/value cache.

    The query, key and value are projected to `num_heads` heads of `key_dim` features, attended
    with `scaled_dot_product_attention`, concatenated and projected back to the query's width.

    For incremental decoding the layer takes a `cache` of shape
    `[batch, 2, num_heads, max_length, key_dim]` (keys stacked on values), or the same as a pair
    `(keys, values)` of `[batch, num_heads, max_length, key_dim]` tensors (the faster form: no
    slicing apart at every step); the updated cache comes back in the form it was given:
    - self-attention: pass the current step's input as `query`, the cache and `cache_update_index`;
      the step's projected key/value are written at that index (`ops.slice_update`, so shapes stay
      static for XLA) and the layer returns `(output, updated_cache)`;
    - cross-attention: build the cache once with `compute_key_value_cache(encoder_output)` and pass
      it with `cache_update_index=None`; keys and values are then not recomputed.

    Args:
        num_heads: number of attention heads `h`.
        key_dim: size of each head for queries and keys (`d_k`).
        value_dim: size of each head for values (`d_v`); defaults to `key_dim`.
        dropout: dropout rate on the attention weights.
        use_bias: whether the projections have biases.
        output_dim: width of the output; defaults to the query's last dimension.
        kernel_initializer: initializer of the projection kernels.

    Call arguments:
        query: `[batch, q_len, dim]`.
        value: `[batch, k_len, dim]`; ignored when a cross-attention cache is given.
        key: `[batch, k_len, dim]`; defaults to `value`.
        attention_mask: boolean `[batch, q_len, k_len]` (or broadcastable), True = may attend.
        use_causal_mask: also forbid attending to later positions.
        cache: key/value cache, see above.
        cache_update_index: int scalar, position of `query` inside the cache (self-attention).
        return_attention_scores: also return the weights `[batch, heads, q_len, k_len]`.
        training: enables dropout.

    Returns:
        `output`, then `attention_scores` if requested, then the cache if one was given.

    Example:
    >>> mha = MultiHeadAttention(num_heads=8, key_dim=64)
    >>> y = mha(x, x, use_causal_mask=True)  # x: [batch, len, 512] -> y: [batch, len, 512]

    References:
        Vaswani et al., 2017, "Attention Is All You Need", section 3.2.2.
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_dim=None,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if num_heads <= 0 or key_dim <= 0:
            raise ValueError(
                f"num_heads and key_dim must be positive, got num_heads={num_heads}, "
                f"key_dim={key_dim}"
            )
        self.num_heads = int(num_heads)
        self.key_dim = int(key_dim)
        self.value_dim = int(value_dim) if value_dim else int(key_dim)
        self.dropout = float(dropout)
        self.use_bias = bool(use_bias)
        self.output_dim = output_dim
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def _dense(self, units, name):
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=keras.initializers.get(
                keras.initializers.serialize(self.kernel_initializer)
            ),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        out_dim = self.output_dim or query_shape[-1]
        self.query_dense = self._dense(self.num_heads * self.key_dim, "query")
        self.query_dense.build(query_shape)
        self.key_dense = self._dense(self.num_heads * self.key_dim, "key")
        self.key_dense.build(key_shape)
        self.value_dense = self._dense(self.num_heads * self.value_dim, "value")
        self.value_dense.build(value_shape)
        self.output_dense = self._dense(out_dim, "attention_output")
        self.output_dense.build(tuple(query_shape[:-1]) + (self.num_heads * self.value_dim,))
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def _split_heads(self, x, head_dim):
        # [batch, len, heads * head_dim] -> [batch, heads, len, head_dim]
        shape = ops.shape(x)
        x = ops.reshape(x, (shape[0], shape[1], self.num_heads, head_dim))
        return ops.transpose(x, (0, 2, 1, 3))

    def _can_fuse(self, *denses):
        if not FUSE_PROJECTIONS or self.key_dim != self.value_dim:
            return False
        return all(not d.lora_enabled and not d.quantization_mode for d in denses)

    def _fused_projection(self, x, denses):
        """`x` through the `denses` at once: a list of `[batch, heads, len, head_dim]`, one each.

        Same result as applying each Dense and splitting heads, with one (wider) matmul. The
        product is split on its last axis (whose gradient is a cheap concatenation).
        """
        kernel = ops.concatenate([ops.cast(d.kernel, self.compute_dtype) for d in denses], axis=-1)
        y = ops.matmul(x, kernel)  # [batch, len, n * heads * head_dim]
        if self.use_bias:
            bias = ops.concatenate([ops.cast(d.bias, self.compute_dtype) for d in denses], axis=-1)
            y = ops.add(y, bias)
        return [self._split_heads(part, self.key_dim) for part in ops.split(y, len(denses), -1)]

    def compute_key_value_cache(self, value, key=None, stacked=True):
        """Projects `key`/`value` once: `[batch, 2, heads, k_len, key_dim]`, or with
        `stacked=False` the pair `(keys, values)` of `[batch, heads, k_len, key_dim]`.

        Needs `key_dim == value_dim` (keys and values are stacked).
        """
        if key is None and self._can_fuse(self.key_dense, self.value_dense):
            k, v = self._fused_projection(value, (self.key_dense, self.value_dense))
        else:
            key = value if key is None else key
            k = self._split_heads(self.key_dense(key), self.key_dim)
            v = self._split_heads(self.value_dense(value), self.value_dim)
        return ops.stack([k, v], axis=1) if stacked else (k, v)

    def call(
        self,
        query,
        value=None,
        key=None,
        attention_mask=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
        return_attention_scores=False,
        training=None,
    ):
        value = query if value is None else value
        key = value if key is None else key
        cross_cached = cache is not None and cache_update_index is None
        if (
            not cross_cached
            and query is key
            and key is value
            and self._can_fuse(self.query_dense, self.key_dense, self.value_dense)
        ):
            denses = (self.query_dense, self.key_dense, self.value_dense)
            q, k, v = self._fused_projection(query, denses)  # each [b, h, len, d]
        else:
            q = self._split_heads(self.query_dense(query), self.key_dim)  # [b, h, q_len, d_k]
            k = v = None
            fuse_kv = key is value and self._can_fuse(self.key_dense, self.value_dense)
            if not cross_cached and fuse_kv:
                k, v = self._fused_projection(value, (self.key_dense, self.value_dense))

        split_cache = isinstance(cache, (tuple, list))
        if cross_cached:
            # Cross-attention with keys/values computed once per source sentence.
            k, v = tuple(cache) if split_cache else (cache[:, 0], cache[:, 1])
        else:
            if k is None:
                k = self._split_heads(self.key_dense(key), self.key_dim)  # [b, h, k_len, d_k]
                v = self._split_heads(self.value_dense(value), self.value_dim)
            if split_cache:
                # (keys, values), each [b, h, max_len, d], never sliced apart.
                k = _write_at(cache[0], k, cache_update_index)
                v = _write_at(cache[1], v, cache_update_index)
                cache = (k, v)
            elif cache is not None:
                step = ops.stack([k, v], axis=1)  # [b, 2, h, q_len, d]
                start = [0, 0, 0, cache_update_index, 0]
                cache = ops.slice_update(cache, start, ops.cast(step, cache.dtype))
                k, v = cache[:, 0], cache[:, 1]

        mask = self._compute_mask(q, k, attention_mask, use_causal_mask, cache, cache_update_index)
        out, weights = scaled_dot_product_attention(
            q, k, v, mask=mask, dropout_fn=lambda w: self.dropout_layer(w, training=training)
        )
        # [b, h, q_len, d_v] -> [b, q_len, h * d_v]
        out = ops.transpose(out, (0, 2, 1, 3))
        shape = ops.shape(out)
        out = ops.reshape(out, (shape[0], shape[1], self.num_heads * self.value_dim))
        out = self.output_dense(out)

        results = [out]
        if return_attention_scores:
            results.append(weights)
        if cache is not None:
            results.append(cache)
        return results[0] if len(results) == 1 else tuple(results)

    def _compute_mask(self, q, k, attention_mask, use_causal_mask, cache, cache_update_index):
        """Boolean mask `[batch or 1, 1, q_len, k_len]` (None when nothing is masked)."""
        mask = None
        if attention_mask is not None:
            mask = ops.cast(attention_mask, "bool")
            if len(mask.shape) == 3:
                mask = ops.expand_dims(mask, 1)  # broadcast over heads
        q_len, k_len = ops.shape(q)[2], ops.shape(k)[2]
        causal = None
        if cache is not None and cache_update_index is not None:
            # Query i sits at cache slot cache_update_index + i; later slots are empty or future.
            q_pos = ops.arange(q_len) + cache_update_index
            causal = ops.expand_dims(q_pos, 1) >= ops.expand_dims(ops.arange(k_len), 0)
        elif use_causal_mask:
            causal = ops.expand_dims(ops.arange(q_len), 1) >= ops.expand_dims(ops.arange(k_len), 0)
        if causal is not None:
            causal = ops.reshape(causal, (1, 1, q_len, k_len))
            mask = causal if mask is None else ops.logical_and(mask, causal)
        return mask

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "output_dim": self.output_dim,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
