"""Transformer encoder block and the stack of N blocks."""

import keras

from keras_transformer.layers._blocks import BlockBase, StackBase
from keras_transformer.layers.masks import key_padding_mask


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerEncoderBlock(BlockBase):
    """One encoder layer: self-attention and a feed-forward network, each with a residual.

    Post-norm as in the paper, `x = LayerNorm(x + Dropout(SelfAttention(x)))` then
    `x = LayerNorm(x + Dropout(FFN(x)))`; `norm_first=True` gives the pre-norm variant.

    Args:
        num_heads: attention heads; must divide the input width `d_model`.
        d_ff: inner width of the feed-forward network.
        dropout: residual dropout rate (`P_drop`, 0.1 in the paper).
        attention_dropout: dropout on attention weights.
        activation_dropout: dropout inside the feed-forward network.
        activation: feed-forward activation.
        norm_first: pre-norm instead of the paper's post-norm.
        layer_norm_epsilon: LayerNorm epsilon.
        kernel_initializer: initializer of all projection kernels.
        kernels: the fast paths of its sub-layers (`keras_transformer.fast_paths.Kernels`, a
            setting such as `"none"`, or None for the current setting), chosen here once.

    Call arguments:
        inputs: `[batch, length, d_model]`.
        padding_mask: boolean `[batch, length]`, True at real tokens (a Keras mask is used when
            this is not given; with neither, every token is real).
        return_attention_scores: also return the self-attention weights
            `[batch, heads, length, length]`.
        training: enables dropout.

    Example:
    >>> import numpy as np
    >>> block = TransformerEncoderBlock(num_heads=8, d_ff=2048)
    >>> x, ids = np.zeros((2, 9, 512), "float32"), np.array([[5] * 9, [5] * 6 + [0] * 3])
    >>> tuple(block(x, padding_mask=ids != 0).shape)
    (2, 9, 512)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", section 3.1.
    """

    def build(self, input_shape):
        d_model = input_shape[-1]
        self.self_attention = self._attention(d_model, "self_attention")
        self.self_attention.build(input_shape, input_shape)
        self.self_attention_norm = self._norm("self_attention_norm")
        self.self_attention_norm.build(input_shape)
        self._build_feed_forward(input_shape)
        self.built = True

    def call(
        self, inputs, padding_mask=None, mask=None, return_attention_scores=False, training=None
    ):
        padding_mask = mask if padding_mask is None else padding_mask

        def attention(h):
            return self.self_attention(
                h,
                h,
                attention_mask=key_padding_mask(padding_mask),
                return_attention_scores=True,
                training=training,
            )

        x, scores = self._residual(self.self_attention_norm, inputs, attention, training)
        x = self._feed_forward_sublayer(x, training)
        return (x, scores) if return_attention_scores else x


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerEncoder(StackBase):
    """A stack of `num_layers` `TransformerEncoderBlock`s (the paper's N = 6).

    Args:
        num_layers: number of blocks.
        num_heads, d_ff, dropout, attention_dropout, activation_dropout, activation, norm_first,
        layer_norm_epsilon, kernel_initializer, kernels: passed to every `TransformerEncoderBlock`.

    Call arguments:
        inputs: embedded source `[batch, length, d_model]` (token embedding + positions).
        padding_mask: boolean `[batch, length]`, True at real tokens (a Keras mask is used when
            this is not given; with neither, every token is real).
        return_attention_scores: also return a list with each block's self-attention weights.
        training: enables dropout.

    Example:
    >>> import numpy as np
    >>> encoder = TransformerEncoder(num_layers=2, num_heads=8, d_ff=2048)
    >>> embedded_source, source_ids = np.zeros((2, 9, 512), "float32"), np.ones((2, 9), "int32")
    >>> memory = encoder(embedded_source, padding_mask=source_ids != 0)
    >>> tuple(memory.shape)
    (2, 9, 512)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", section 3.1.
    """

    block_class = TransformerEncoderBlock

    def call(
        self, inputs, padding_mask=None, mask=None, return_attention_scores=False, training=None
    ):
        padding_mask = mask if padding_mask is None else padding_mask
        x, all_scores = inputs, []
        for block in self.blocks:
            x, scores = block(
                x, padding_mask=padding_mask, return_attention_scores=True, training=training
            )
            all_scores.append(scores)
        x = self._finish(x)
        return (x, all_scores) if return_attention_scores else x
