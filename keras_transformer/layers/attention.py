"""Scaled dot-product attention and multi-head attention with a fixed-size key/value cache."""

import math
from typing import Any, NamedTuple

import keras
from keras import ops

from keras_transformer.fast_paths import Kernels
from keras_transformer.layers import _fast_paths
from keras_transformer.layers._initializers import clone_initializer
from keras_transformer.layers._specs import CallTracedSpec

# The logit of a masked key is the package's one finite "minus infinity" (`search_rules`).
from keras_transformer.search_rules import NEG_INF


def head_size(d_model, num_heads):
    """`d_model / num_heads`, the width of each head, with a clear error when it does not
    divide."""
    if d_model % num_heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
    return d_model // num_heads


def scaled_dot_product_attention(
    query, key, value, mask=None, dropout_fn=None, zero_empty_rows=True
):  # fmt: skip
    """softmax(Q K^T / sqrt(d_k)) V, the paper's equation (1).

    Args:
        query: `[..., q_len, d_k]`.
        key: `[..., k_len, d_k]`.
        value: `[..., k_len, d_v]`.
        mask: optional boolean tensor broadcastable to `[..., q_len, k_len]`; True means the query
            may attend to the key. Rows with no allowed key give all-zero weights (never NaN).
        dropout_fn: optional callable applied to the attention weights (attention dropout).
        zero_empty_rows: give rows with no allowed key all-zero weights (a pass over the
            weights). False where the caller knows every row has an allowed key (beam search's
            caches: each hypothesis sees its own position); a row without one then spreads its
            weights evenly over its keys.

    Returns:
        `(output, attention_weights)` with shapes `[..., q_len, d_v]` and `[..., q_len, k_len]`.

    Example:
    >>> import numpy as np
    >>> q = k = np.eye(2, dtype="float32")
    >>> v = np.array([[2.0, 3.0], [4.0, 5.0]], "float32")
    >>> out, w = scaled_dot_product_attention(q, k, v)
    >>> np.asarray(w, "float64").round(2).tolist()
    [[0.67, 0.33], [0.33, 0.67]]

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
        logits = ops.where(mask, logits, NEG_INF)
    weights = ops.softmax(logits, axis=-1)
    if mask is not None and zero_empty_rows:
        # A fully masked row softmaxes to uniform weights over forbidden keys; zero it instead.
        weights = ops.where(mask, weights, ops.zeros_like(weights))
    weights = ops.cast(weights, compute_dtype)
    dropped = dropout_fn(weights) if dropout_fn is not None else weights
    output = ops.matmul(dropped, value)
    return output, weights


def write_cache(cache, update, index, kernels=None, owned=False):
    """`cache` `[batch, heads, max_len, d]` with `update` `[batch, heads, n, d]` written at
    positions `index .. index + n - 1`; shapes stay static (XLA).

    `kernels` (a `keras_transformer.fast_paths.Kernels`; None: the plain `slice_update`) may
    write one decoding step faster; `owned` (the caller never reads `cache` again) lets them
    write it in place."""
    if kernels is not None:
        fast = _fast_paths.write_cache(kernels, cache, update, index, owned)
        if fast is not None:
            return fast
    return ops.slice_update(cache, [0, 0, index, 0], ops.cast(update, cache.dtype))


def cache_zeros(shape, dtype):
    """Zeros `shape` for a key/value cache that its owner may later give up as an `OwnedCache`:
    in TensorFlow graphs a buffer of its own, which graph optimizers never fold into a constant,
    so in-place writes may change it; `ops.zeros` elsewhere."""
    return _fast_paths.fresh_zeros(shape, dtype)


def growing_cache_length(max_length):
    """The first length of caches that grow as decoding goes (beam search's shared caches,
    `decoding.beam_cache`): an int32 scalar, at most `max_length`, in a TensorFlow graph
    outside XLA; None elsewhere, where caches keep one length (fixed shapes)."""
    return _fast_paths.growing_cache_length(max_length)


def grown_caches(caches, index, max_length):
    """Growing caches (per layer `(keys, values)` `[batch, rows, length, d]`) long enough for
    position `index`: as they are while it is inside them, else twice as long (at most
    `max_length`), the old positions kept and zeros after them."""
    return _fast_paths.grown_caches(caches, index, max_length)


class OwnedCache(NamedTuple):
    """A self-attention cache `(keys, values)` that its caller gives up to the layer: the caller
    never reads it again after passing it, so the step's keys/values may be written into its
    buffers in place (fast path `inplace_cache_writes`, TF graphs outside XLA). `translate_ids`
    passes its own caches so; a plain tuple is never changed."""

    keys: Any
    values: Any


def call_outputs(output, scores=None, cache=None):
    """The return convention of the public layers' `call` (as Keras's `MultiHeadAttention` and
    KerasHub's cached layers): `output` alone, then the attention scores when they were asked
    for (`scores` not None), then the updated cache when one was given (`cache` not None).

    Internally every attention and block computes the fixed triple `(output, scores, cache)`;
    only the public `call` packs it by its flags, here."""
    extras = tuple(x for x in (scores, cache) if x is not None)
    return (output, *extras) if extras else output


def _check_call_arguments(name, value, key, cache, cache_update_index):
    """Refuses the calls whose missing argument would silently change what is attended: no
    `value` (bidirectional self-attention where causal may have been meant), a cache with
    `value` but no `cache_update_index` (a forgotten index would make a self-attention cache a
    cross-attention one) and an index without a cache; and a cache of another form than
    `(keys, values)`."""
    layer = f"MultiHeadAttention {name!r}"
    if cache is not None and len(cache) != 2:
        raise ValueError(
            f"{layer} takes one form of cache, a `(keys, values)` pair, but got "
            f"{type(cache).__name__} of {len(cache)} parts; beam search's caches shared by the "
            "beams of an input (whose mask stands for `attention_mask` and the causal mask) are "
            "attended by keras_transformer.decoding.beam_cache, not by this layer"
        )
    if cache is None:
        if value is None:
            raise ValueError(
                f"{layer} got no `value`: pass `value=query` for self-attention (and "
                "`use_causal_mask=True` where a position must not see later ones); only a "
                "`cache` may stand in for `value`"
            )
        if cache_update_index is not None:
            raise ValueError(f"{layer} got a `cache_update_index` but no `cache` to write at it")
    elif cache_update_index is None and (value is not None or key is not None):
        raise ValueError(
            f"{layer} got a `cache` without `cache_update_index`, which makes it a "
            "cross-attention cache whose keys/values replace `value` and `key`: pass "
            "`value=None` for that, or `cache_update_index` to write a self-attention cache"
        )


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(CallTracedSpec, keras.layers.Layer):
    """Multi-head attention (paper section 3.2.2) with an optional fixed-size key/value cache.

    The query, key and value are projected to `num_heads` heads of `key_dim` features, attended
    with `scaled_dot_product_attention`, concatenated and projected back to the query's width.

    For incremental decoding the layer takes a `cache`: a pair `(keys, values)` of
    `[batch, num_heads, max_length, key_dim]` tensors.
    - self-attention: pass the current step's input as `query`, the cache and `cache_update_index`;
      the step's projected key/value are written at that index (`write_cache`: shapes stay
      static for XLA) and the layer returns `(output, updated_cache)`; a caller that never
      reads the cache it passed again may pass it as an `OwnedCache` (still the pair), whose
      buffers are then written in place (TF graphs outside XLA; `translate_ids` does);
    - cross-attention: build the cache once with `compute_key_value_cache(encoder_output)` and pass
      it with `cache_update_index=None`; keys and values are then not recomputed.
    The cache has this one form; beam search's caches shared by the beams of an input are
    decoding's own (`keras_transformer.decoding.beam_cache`), not this layer's: it attends
    with this layer's weights through `attend_with(attend, query)`, which projects and merges
    the heads around an `attend` function of the caller's.

    Args:
        num_heads: number of attention heads `h`.
        key_dim: size of each head for queries and keys (`d_k`).
        value_dim: size of each head for values (`d_v`); defaults to `key_dim`.
        dropout: dropout rate on the attention weights.
        use_bias: whether the projections have biases.
        output_dim: width of the output; defaults to the query's last dimension.
        kernel_initializer: initializer of the projection kernels.
        kernels: the fast paths (`keras_transformer.fast_paths.Kernels`, a setting such as
            `"none"`, or None for the current setting), chosen here once.

    Call arguments:
        query: `[batch, q_len, dim]`.
        value: `[batch, k_len, dim]`, required: `value=query` for self-attention (the layer
            never guesses it). None only with a `cache`: with `cache_update_index` (a
            self-attention cache) the step's keys/values come from `query`; without it (a
            cross-attention cache) the cache's keys/values replace `value`, and passing `value`
            or `key` as well is an error.
        key: `[batch, k_len, dim]`; defaults to `value` (the usual case).
        attention_mask: boolean `[batch, q_len, k_len]` (or broadcastable), True = may attend;
            None lets every query attend every key.
        use_causal_mask: also forbid attending to later positions (False by default: a
            decoder's self-attention must ask for it; a self-attention cache is always causal).
        cache: the `(keys, values)` cache, see above.
        cache_update_index: int scalar, position of `query` inside the cache (self-attention).
        return_attention_scores: also return the weights `[batch, heads, q_len, k_len]`.
        training: enables dropout.

    Returns:
        `output`, then `attention_scores` if requested, then the updated cache if one was given
        (`call_outputs`: Keras's convention, `(output, scores)` with `return_attention_scores`).

    Example:
    >>> import numpy as np
    >>> mha = MultiHeadAttention(num_heads=8, key_dim=64)
    >>> x = np.zeros((2, 10, 512), "float32")
    >>> tuple(mha(x, x, use_causal_mask=True).shape)
    (2, 10, 512)

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
        kernels=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.kernels = Kernels.get(kernels)
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

    def _dense(self, units, name, input_shape):
        dense = keras.layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name=name,
        )
        dense.build(input_shape)
        return dense

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        out_dim = self.output_dim or query_shape[-1]
        heads_shape = tuple(query_shape[:-1]) + (self.num_heads * self.value_dim,)
        self.query_dense = self._dense(self.num_heads * self.key_dim, "query", query_shape)
        self.key_dense = self._dense(self.num_heads * self.key_dim, "key", key_shape)
        self.value_dense = self._dense(self.num_heads * self.value_dim, "value", value_shape)
        self.output_dense = self._dense(out_dim, "attention_output", heads_shape)
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def _split_heads(self, x):
        # [batch, len, heads * head_dim] -> [batch, heads, len, head_dim]
        shape = ops.shape(x)
        head_dim = x.shape[-1] // self.num_heads
        if x.shape[1] == 1:  # one position (a decoding step): the move is a reshape, no copy
            return ops.reshape(x, (shape[0], self.num_heads, 1, head_dim))
        x = ops.reshape(x, (shape[0], shape[1], self.num_heads, head_dim))
        return ops.transpose(x, (0, 2, 1, 3))

    def _project(self, x, denses, training=None, fused=None):
        """`x` through each Dense of `denses`, split into heads: one `[b, h, len, d]` each
        (`fused`: their `fused_weights`, computed before)."""
        fast = _fast_paths.fused_projection(
            self.kernels, x, denses, self.compute_dtype, self._split_heads, training, fused
        )
        if fast is not None:
            return fast
        return [
            self._split_heads(_fast_paths.call_dense(self.kernels, d, x, training)) for d in denses
        ]

    def compute_key_value_cache(self, value, key=None, training=None):
        """Projects `key`/`value` once: the pair `(keys, values)` of `[batch, heads, k_len, d]`
        for cross-attention during decoding."""
        if key is None or key is value:
            keys, values = self._project(value, (self.key_dense, self.value_dense), training)
        else:
            (keys,), (values,) = (
                self._project(key, (self.key_dense,), training),
                self._project(value, (self.value_dense,), training),
            )
        return keys, values

    def _queries_keys_values(self, query, key, value, cache, cache_update_index, training=None):
        """Projected `(q, k, v)`, each `[b, h, len, d]`, the cache written where there is one."""
        if cache is not None and cache_update_index is None:  # cross-attention, cached
            (q,) = self._project(query, (self.query_dense,))
            return (q, *cache), cache
        if query is key and key is value:
            q, k, v = self._project(
                query, (self.query_dense, self.key_dense, self.value_dense), training
            )
        else:
            (q,) = self._project(query, (self.query_dense,), training)
            k, v = self.compute_key_value_cache(value, key, training)
        if cache is not None:  # self-attention while decoding: k, v are this step's
            owned = isinstance(cache, OwnedCache)
            k = write_cache(cache[0], k, cache_update_index, self.kernels, owned)
            v = write_cache(cache[1], v, cache_update_index, self.kernels, owned)
            cache = OwnedCache(k, v) if owned else (k, v)
        return (q, k, v), cache

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
        _check_call_arguments(self.name, value, key, cache, cache_update_index)
        value = query if value is None else value
        key = value if key is None else key
        (q, k, v), cache = self._queries_keys_values(
            query, key, value, cache, cache_update_index, training
        )
        mask = self._compute_mask(q, k, attention_mask, use_causal_mask, cache, cache_update_index)
        out, weights = scaled_dot_product_attention(
            q, k, v, mask=mask, dropout_fn=self._dropout_fn(training)
        )
        out = self._merge_heads(out, training)
        return call_outputs(out, weights if return_attention_scores else None, cache)

    def fused_weights(self):
        """The query, key and value projections' weights as one matmul's `(kernel, bias)`
        (fast path `fused_projections`), or None where that path does not apply. A decoding
        loop computes them once and passes them to `attend_with`, so that its steps do not
        concatenate the kernels again."""
        denses = (self.query_dense, self.key_dense, self.value_dense)
        return _fast_paths.fused_weights(self.kernels, denses, self.compute_dtype)

    def attend_with(self, attend, query, keys_values=True, training=None, fused=None):
        """This layer's attention with the attending done by `attend`, for caches the layer
        does not know (decoding's caches shared by the beams of an input,
        `keras_transformer.decoding.beam_cache`).

        This layer's projections of `query` `[b, q_len, dim]` (`(q, k, v)`, or `(q,)` without
        `keys_values`), each `[b, h, q_len, d]`, go to `attend(projections, dropout_fn)`, which
        returns `(out [b, h, q_len, d_v], weights, cache)` (`dropout_fn`: this layer's
        attention dropout, for the weights). Returns `(output [b, q_len, output_dim], weights,
        cache)`, `out`'s heads merged and projected. No masks and no checks: `attend` owns
        them. `fused`: this layer's `fused_weights()`, computed before (with `keys_values`)."""
        denses = (self.query_dense, self.key_dense, self.value_dense)
        if not keys_values:
            denses, fused = denses[:1], None
        projections = self._project(query, denses, fused=fused)
        out, weights, cache = attend(projections, self._dropout_fn(training))
        return self._merge_heads(out, training), weights, cache

    def _dropout_fn(self, training):
        return lambda weights: self.dropout_layer(weights, training=training)

    def _merge_heads(self, out, training):
        """`[b, h, q_len, d_v]` -> `[b, q_len, output_dim]`: the heads concatenated, projected."""
        width = self.num_heads * self.value_dim
        if out.shape[2] == 1:  # one position (a decoding step): the move is a reshape, no copy
            out = ops.reshape(out, (ops.shape(out)[0], 1, width))
        else:
            out = ops.transpose(out, (0, 2, 1, 3))
            shape = ops.shape(out)
            out = ops.reshape(out, (shape[0], shape[1], width))
        return _fast_paths.call_dense(self.kernels, self.output_dense, out, training)

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
                "kernels": self.kernels.to_config(),
            }
        )
        return config
