"""Transformer decoder block and the stack of N blocks, with key/value caches for decoding."""

import keras

from keras_transformer.layers._blocks import BlockBase, StackBase
from keras_transformer.layers.masks import key_padding_mask


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerDecoderBlock(BlockBase):
    """One decoder layer: causal self-attention, encoder-decoder attention and a feed-forward net.

    Each sub-layer has a residual connection and LayerNorm (post-norm as in the paper,
    `norm_first=True` for pre-norm). The self-attention is causal: position i attends positions
    <= i only.

    Args:
        num_heads: attention heads; must divide the input width `d_model`.
        d_ff: inner width of the feed-forward network.
        dropout: residual dropout rate (0.1 in the paper).
        attention_dropout: dropout on attention weights.
        activation_dropout: dropout inside the feed-forward network.
        activation: feed-forward activation.
        norm_first: pre-norm instead of the paper's post-norm.
        layer_norm_epsilon: LayerNorm epsilon.
        kernel_initializer: initializer of all projection kernels.

    Call arguments:
        inputs: embedded target `[batch, t_len, d_model]`.
        encoder_output: `[batch, s_len, d_model]`; None when `cross_attention_cache` is given.
        decoder_padding_mask: boolean `[batch, t_len]`, True at real target tokens.
        encoder_padding_mask: boolean `[batch, s_len]`, True at real source tokens.
        self_attention_cache: `(keys, values)`, each `[batch, heads, max_len, head_dim]`, for
            incremental decoding.
        cache_update_index: int scalar, the position of `inputs` in the cache.
        cross_attention_cache: `(keys, values)`, each `[batch, heads, s_len, head_dim]`, from
            `compute_cross_attention_cache`.
        return_attention_scores: also return `{"self_attention": ..., "cross_attention": ...}`.
        training: enables dropout.

    Returns:
        The output `[batch, t_len, d_model]`, then the scores dict if requested, then the updated
        self-attention cache if one was given.

    Example:
    >>> import numpy as np
    >>> block = TransformerDecoderBlock(num_heads=8, d_ff=2048)
    >>> target_x = np.zeros((2, 7, 512), "float32")  # embedded target
    >>> memory = np.zeros((2, 9, 512), "float32")  # encoder output
    >>> source_ids = np.ones((2, 9), "int32")
    >>> y = block(target_x, encoder_output=memory, encoder_padding_mask=source_ids != 0)
    >>> tuple(y.shape)
    (2, 7, 512)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", section 3.1.
    """

    def build(self, inputs_shape, encoder_output_shape=None):
        input_shape = inputs_shape
        d_model = input_shape[-1]
        encoder_output_shape = encoder_output_shape or input_shape
        self.self_attention = self._attention(d_model, "self_attention")
        self.self_attention.build(input_shape, input_shape)
        self.self_attention_norm = self._norm("self_attention_norm")
        self.self_attention_norm.build(input_shape)
        self.cross_attention = self._attention(d_model, "cross_attention")
        self.cross_attention.build(input_shape, encoder_output_shape)
        self.cross_attention_norm = self._norm("cross_attention_norm")
        self.cross_attention_norm.build(input_shape)
        self._build_feed_forward(input_shape)
        self.built = True

    def compute_cross_attention_cache(self, encoder_output):
        """Keys/values of the encoder output: `(keys, values)`, each
        `[batch, heads, s_len, head_dim]`."""
        return self.cross_attention.compute_key_value_cache(encoder_output)

    def call(
        self,
        inputs,
        encoder_output=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_cache=None,
        cache_update_index=None,
        cross_attention_cache=None,
        return_attention_scores=False,
        training=None,
    ):
        x, self_scores, *new_cache = self._self_attention_sublayer(
            inputs, decoder_padding_mask, self_attention_cache, cache_update_index, training
        )
        x, cross_scores = self._cross_attention_sublayer(
            x, encoder_output, encoder_padding_mask, cross_attention_cache, training
        )
        x = self._feed_forward_sublayer(x, training)

        results = [x]
        if return_attention_scores:
            results.append({"self_attention": self_scores, "cross_attention": cross_scores})
        if self_attention_cache is not None:
            results.append(new_cache[0])
        return results[0] if len(results) == 1 else tuple(results)

    def _self_attention_sublayer(self, x, padding_mask, cache, cache_update_index, training):
        """Causal self-attention with its residual: `(x, scores)`, and the updated cache if any."""
        residual = x
        if self.norm_first:
            x = self.self_attention_norm(x)
        x, scores, *cache = self.self_attention(
            x,
            x,
            attention_mask=key_padding_mask(padding_mask),
            use_causal_mask=True,
            cache=cache,
            cache_update_index=cache_update_index,
            return_attention_scores=True,
            training=training,
        )
        x = self.residual_dropout(x, training=training)
        x = residual + x
        if not self.norm_first:
            x = self.self_attention_norm(x)
        return (x, scores, *cache)

    def _cross_attention_sublayer(self, x, encoder_output, padding_mask, cache, training):
        """Encoder-decoder attention with its residual: `(x, scores)`."""
        residual = x
        if self.norm_first:
            x = self.cross_attention_norm(x)
        x, scores = self.cross_attention(
            x,
            encoder_output,
            attention_mask=key_padding_mask(padding_mask),
            cache=cache,
            return_attention_scores=True,
            training=training,
        )[:2]
        x = self.residual_dropout(x, training=training)
        x = residual + x
        if not self.norm_first:
            x = self.cross_attention_norm(x)
        return x, scores


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerDecoder(StackBase):
    """A stack of `num_layers` `TransformerDecoderBlock`s (the paper's N = 6).

    For incremental decoding each cache is a list with one `(keys, values)` pair of
    `[batch, heads, length, head_dim]` tensors per layer (`length` = the longest output for the
    self-attention cache, the source length for the cross-attention cache); the updated
    self-attention cache comes back as such a list.

    Args:
        num_layers: number of blocks.
        num_heads, d_ff, dropout, attention_dropout, activation_dropout, activation, norm_first,
        layer_norm_epsilon, kernel_initializer: passed to every `TransformerDecoderBlock`.

    Call arguments:
        inputs: embedded target `[batch, t_len, d_model]`.
        encoder_output: `[batch, s_len, d_model]` (may be None when the cross cache is given).
        decoder_padding_mask, encoder_padding_mask: boolean token masks, True at real tokens.
        self_attention_cache, cache_update_index, cross_attention_cache: see above.
        return_attention_scores: also return a list of each block's scores dict.
        training: enables dropout.

    Example:
    >>> import numpy as np
    >>> decoder = TransformerDecoder(num_layers=2, num_heads=8, d_ff=2048)
    >>> embedded_target = np.zeros((2, 7, 512), "float32")
    >>> memory, source_ids = np.zeros((2, 9, 512), "float32"), np.ones((2, 9), "int32")
    >>> y = decoder(embedded_target, memory, encoder_padding_mask=source_ids != 0)
    >>> tuple(y.shape)
    (2, 7, 512)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", section 3.1.
    """

    block_class = TransformerDecoderBlock

    def build(self, inputs_shape, encoder_output_shape=None):
        self._encoder_output_shape = encoder_output_shape
        super().build(inputs_shape)

    def _build_block(self, block, input_shape):
        block.build(input_shape, self._encoder_output_shape)

    def compute_cross_attention_cache(self, encoder_output):
        """One `(keys, values)` pair per layer, each `[batch, heads, s_len, head_dim]`, computed
        once per source sentence."""
        return [block.compute_cross_attention_cache(encoder_output) for block in self.blocks]

    def call(
        self,
        inputs,
        encoder_output=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_cache=None,
        cache_update_index=None,
        cross_attention_cache=None,
        return_attention_scores=False,
        training=None,
    ):
        x, all_scores, new_caches = inputs, [], []
        none = [None] * len(self.blocks)
        self_caches = none if self_attention_cache is None else self_attention_cache
        cross_caches = none if cross_attention_cache is None else cross_attention_cache
        for block, self_cache, cross_cache in zip(self.blocks, self_caches, cross_caches):
            out = block(
                x,
                encoder_output,
                decoder_padding_mask=decoder_padding_mask,
                encoder_padding_mask=encoder_padding_mask,
                self_attention_cache=self_cache,
                cache_update_index=cache_update_index,
                cross_attention_cache=cross_cache,
                return_attention_scores=True,
                training=training,
            )
            x, scores = out[0], out[1]
            all_scores.append(scores)
            if self_cache is not None:
                new_caches.append(out[2])
        x = self._finish(x)
        results = [x]
        if return_attention_scores:
            results.append(all_scores)
        if self_attention_cache is not None:
            results.append(new_caches)
        return results[0] if len(results) == 1 else tuple(results)
