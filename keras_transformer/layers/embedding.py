"""Token embeddings (shared with the pre-softmax projection) and sinusoidal positional encoding."""

import math

import keras
from keras import ops

from keras_transformer.layers import _fast_paths
from keras_transformer.layers._specs import CallTracedSpec


def project_with(x, kernel, kernels):
    """`x @ kernel`: hidden states `x` `[..., d_model]` by a pre-softmax kernel `[d_model, n]`
    (the tied embedding transposed, or a vocabulary shortlist's columns of it), with the
    `Kernels` `kernels` of the caller (fast path `flat_dense`)."""
    fast = _fast_paths.matmul(kernels, x, kernel)
    return ops.matmul(x, kernel) if fast is None else fast


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenEmbedding(CallTracedSpec, keras.layers.Layer):
    """Token embedding multiplied by sqrt(d_model), usable as the tied output projection.

    One matrix `[vocab_size, d_model]` serves the source embedding, the target embedding and the
    pre-softmax linear transformation, as in the paper (section 3.4). Its initial values follow a
    normal distribution with standard deviation `d_model ** -0.5`, so the scaled embeddings start
    with unit variance.

    Args:
        vocab_size: number of tokens.
        d_model: embedding width.
        scale: multiply the looked-up embeddings by `sqrt(d_model)` (the paper does).
        mask_zero: emit a Keras mask that is False where the id is 0 (padding).
        embeddings_initializer: initializer; defaults to `RandomNormal(stddev=d_model ** -0.5)`.

    Call arguments:
        inputs: int ids `[batch, length]`, or, with `reverse=True`, hidden states
            `[batch, length, d_model]`.
        reverse: project hidden states to logits `[batch, length, vocab_size]` with the transposed
            embedding matrix.

    Example:
    >>> import numpy as np
    >>> emb = TokenEmbedding(vocab_size=8000, d_model=512)
    >>> ids = np.array([[5, 9, 3, 0]])
    >>> x = emb(ids)
    >>> tuple(x.shape), tuple(emb(x, reverse=True).shape)
    ((1, 4, 512), (1, 4, 8000))

    References:
        Vaswani et al., 2017, "Attention Is All You Need", section 3.4;
        Press & Wolf, 2017, "Using the Output Embedding to Improve Language Models".
    """

    def __init__(
        self,
        vocab_size,
        d_model,
        scale=True,
        mask_zero=False,
        embeddings_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.d_model = int(d_model)
        self.scale = bool(scale)
        self.mask_zero = bool(mask_zero)
        if embeddings_initializer is None:
            embeddings_initializer = keras.initializers.RandomNormal(stddev=self.d_model**-0.5)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.supports_masking = self.mask_zero

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.d_model),
            initializer=self.embeddings_initializer,
        )
        self.built = True

    @property
    def output_scale(self):
        """What the looked-up rows are multiplied by: `sqrt(d_model)` with `scale`, else 1 (a
        Python float; the one place the scale is computed, for callers that look rows up in
        a table of their own, as the LiteRT export's int8 one)."""
        return math.sqrt(self.d_model) if self.scale else 1.0

    def call(self, inputs, reverse=False):
        if reverse:
            kernel = ops.cast(self.embeddings, self.compute_dtype)
            return ops.matmul(inputs, ops.transpose(kernel))
        ids = ops.cast(inputs, "int32")
        x = ops.take(ops.cast(self.embeddings, self.compute_dtype), ids, axis=0)
        if self.scale:
            x = ops.multiply(x, ops.cast(self.output_scale, self.compute_dtype))
        return x

    def compute_mask(self, inputs, mask=None):
        if not self.mask_zero:
            return None
        return ops.not_equal(inputs, 0)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.d_model,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "d_model": self.d_model,
                "scale": self.scale,
                "mask_zero": self.mask_zero,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            }
        )
        return config


def positional_encoding(positions, depth, dtype="float32"):
    """The paper's sinusoids for integer `positions` `[length]` -> `[length, depth]`.

    `PE(pos, 2i) = sin(pos / 10000^(2i/depth))` and `PE(pos, 2i+1) = cos(pos / 10000^(2i/depth))`,
    interleaved exactly as written in the paper.
    """
    half = (depth + 1) // 2
    i = ops.arange(half, dtype="float32")
    inv_timescale = ops.exp(-math.log(10000.0) * (2.0 * i) / float(depth))  # [half]
    angles = ops.expand_dims(ops.cast(positions, "float32"), 1) * ops.expand_dims(inv_timescale, 0)
    pe = ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1)  # [length, half, 2]
    pe = ops.reshape(pe, (-1, 2 * half))[:, :depth]
    return ops.cast(pe, dtype)


@keras.saving.register_keras_serializable(package="keras_transformer")
class SinusoidalPositionalEncoding(CallTracedSpec, keras.layers.Layer):
    """Adds the paper's fixed sinusoidal position encoding to its input.

    The encoding is computed on the fly from the positions, so any length works and the layer
    has no weights.

    Call arguments:
        inputs: `[batch, length, d_model]`.
        start_index: int scalar, the position of the first element (incremental decoding).

    Returns:
        `inputs + PE[start_index : start_index + length]`, same shape and dtype as `inputs`.

    Example:
    >>> import numpy as np
    >>> pe = SinusoidalPositionalEncoding()(np.zeros((1, 3, 4), "float32"))  # positions 0, 1, 2
    >>> np.asarray(pe, "float64")[0, 1].round(3).tolist()  # sin(1), cos(1), sin(1/100), cos(1/100)
    [0.841, 0.54, 0.01, 1.0]

    References:
        Vaswani et al., 2017, "Attention Is All You Need", section 3.5.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs, start_index=0):
        length = ops.shape(inputs)[-2]
        depth = inputs.shape[-1]
        positions = ops.arange(length) + ops.cast(start_index, "int32")
        pe = positional_encoding(positions, depth, dtype=self.compute_dtype)
        return ops.add(inputs, ops.cast(pe, inputs.dtype))

    def compute_mask(self, inputs, mask=None):
        return mask

    def compute_output_shape(self, input_shape):
        return input_shape
