"""Transformer decoder block and the stack of N blocks, with key/value caches for decoding;
encoder-decoder (the paper's) or decoder-only (GPT-style: no encoder-decoder attention)."""

import keras
from keras import ops

from keras_transformer.layers._blocks import BlockBase, StackBase
from keras_transformer.layers.attention import call_outputs
from keras_transformer.layers.masks import key_padding_mask


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerDecoderBlock(BlockBase):
    """One decoder layer: causal self-attention, encoder-decoder attention and a feed-forward net.

    Each sub-layer has a residual connection and LayerNorm (post-norm as in the paper,
    `norm_first=True` for pre-norm). The self-attention is causal: position i attends positions
    <= i only.

    Two modes, fixed when the layer is built (by its first call, or by `decoder_only`):
    - encoder-decoder (the paper's): built with an `encoder_output` (or a
      `cross_attention_cache`); every call needs one of them.
    - decoder-only (GPT-style, as KerasHub's): built without an encoder sequence; it has no
      encoder-decoder attention weights at all (causal self-attention and the feed-forward net
      only) and refuses `encoder_output`, `encoder_padding_mask` and `cross_attention_cache`.
    A call that does not match the mode raises a `ValueError` naming the argument; it never
    runs another computation. The mode is part of `get_config`.

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
        kernels: the fast paths of its sub-layers (`keras_transformer.fast_paths.Kernels`, a
            setting such as `"none"`, or None for the current setting), chosen here once.
        decoder_only: None (default): the mode is chosen by the first call, decoder-only when it
            has no `encoder_output` (nor `cross_attention_cache`); True or False fix it.

    Call arguments:
        inputs: embedded target `[batch, t_len, d_model]`.
        encoder_output: `[batch, s_len, d_model]` (encoder-decoder mode); None when
            `cross_attention_cache` is given, and always None in decoder-only mode.
        decoder_padding_mask: boolean `[batch, t_len]`, True at real target tokens (a Keras mask
            is used when this is not given; None: every token is real).
        encoder_padding_mask: boolean `[batch, s_len]`, True at real source tokens
            (encoder-decoder mode; None: every source token is real).
        self_attention_cache: `(keys, values)`, each `[batch, heads, max_len, head_dim]`
            (`init_self_attention_cache`), for incremental decoding; needs `cache_update_index`.
        cache_update_index: int scalar, the position of `inputs` in the cache; needs
            `self_attention_cache`.
        cross_attention_cache: `(keys, values)`, each `[batch, heads, s_len, head_dim]`, from
            `compute_cross_attention_cache` (encoder-decoder mode, instead of `encoder_output`).
        return_attention_scores: also return `{"self_attention": ..., "cross_attention": ...}`
            (`{"self_attention": ...}` in decoder-only mode).
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
    >>> gpt_block = TransformerDecoderBlock(num_heads=8, d_ff=2048)  # decoder-only
    >>> tuple(gpt_block(target_x, decoder_padding_mask=np.ones((2, 7), bool)).shape)
    (2, 7, 512)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", section 3.1.
    """

    def __init__(self, num_heads, d_ff, decoder_only=None, **kwargs):
        super().__init__(num_heads, d_ff, **kwargs)
        self.decoder_only = None if decoder_only is None else bool(decoder_only)

    def build(self, inputs_shape, encoder_output_shape=None, cross_attention_cache_shape=None):
        input_shape = inputs_shape
        if self.decoder_only is None:
            self.decoder_only = encoder_output_shape is None and cross_attention_cache_shape is None
        d_model = input_shape[-1]
        self.self_attention = self._attention(d_model, "self_attention")
        self.self_attention.build(input_shape, input_shape)
        self.self_attention_norm = self._norm("self_attention_norm")
        self.self_attention_norm.build(input_shape)
        self.cross_attention = self.cross_attention_norm = None
        if not self.decoder_only:
            self.cross_attention = self._attention(d_model, "cross_attention")
            self.cross_attention.build(input_shape, encoder_output_shape or input_shape)
            self.cross_attention_norm = self._norm("cross_attention_norm")
            self.cross_attention_norm.build(input_shape)
        self._build_feed_forward(input_shape)
        self.built = True

    def compute_cross_attention_cache(self, encoder_output):
        """Keys/values of the encoder output: `(keys, values)`, each
        `[batch, heads, s_len, head_dim]` (encoder-decoder mode only)."""
        if self.decoder_only:
            raise ValueError(f"{_describe(self)} is decoder-only: it has no cross-attention cache")
        return self.cross_attention.compute_key_value_cache(encoder_output)

    def init_self_attention_cache(self, batch_size, max_length):
        """The empty self-attention cache for `max_length` positions: `(keys, values)` zeros,
        each `[batch_size, heads, max_length, head_dim]`, in the compute dtype."""
        attention = self.self_attention
        keys = (batch_size, attention.num_heads, max_length, attention.key_dim)
        values = (batch_size, attention.num_heads, max_length, attention.value_dim)
        return ops.zeros(keys, self.compute_dtype), ops.zeros(values, self.compute_dtype)

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
        mask=None,
        training=None,
    ):
        decoder_padding_mask = mask if decoder_padding_mask is None else decoder_padding_mask
        self_attention, cross_attention = self.attentions(
            encoder_output, decoder_padding_mask, encoder_padding_mask, self_attention_cache,
            cache_update_index, cross_attention_cache, training,
        )  # fmt: skip
        x, scores, new_cache = self.step(inputs, self_attention, cross_attention, training)
        return call_outputs(x, scores if return_attention_scores else None, new_cache)

    def attentions(
        self,
        encoder_output=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_cache=None,
        cache_update_index=None,
        cross_attention_cache=None,
        training=None,
    ):
        """This block's own attentions for `step`, given `call`'s arguments (checked as `call`
        checks them): `(self_attention, cross_attention)`, the latter None in decoder-only mode.
        `self_attention(h)` is the causal self-attention of `h` (on `self_attention_cache` at
        `cache_update_index` when given) -> `(output, scores, updated cache or None)`;
        `cross_attention(h)` attends `encoder_output` (or `cross_attention_cache`) ->
        `(output, scores)`."""
        check_decoder_call(
            self, encoder_output, encoder_padding_mask, cross_attention_cache,
            self_attention_cache, cache_update_index,
        )  # fmt: skip

        def self_attention(h):  # (output, scores, cache): a cache given, one comes back
            y, scores, *cache = self.self_attention(
                h,
                h,
                attention_mask=key_padding_mask(decoder_padding_mask),
                use_causal_mask=True,
                cache=self_attention_cache,
                cache_update_index=cache_update_index,
                return_attention_scores=True,
                training=training,
            )
            return y, scores, (cache[0] if cache else None)

        def cross_attention(h):  # (output, scores)
            return self.cross_attention(
                h,
                encoder_output,
                attention_mask=key_padding_mask(encoder_padding_mask),
                cache=cross_attention_cache,
                return_attention_scores=True,
                training=training,
            )[:2]

        return self_attention, None if self.decoder_only else cross_attention

    def step(self, x, self_attention, cross_attention=None, training=None):
        """The block's computation around attentions given as functions: the decoder step
        protocol, which `call` runs with this block's own attentions (`attentions`) and
        decoding and the LiteRT export with theirs, on caches of their own.

        `self_attention(h)` -> `(output, scores, cache)` and `cross_attention(h)` ->
        `(output, scores)` (None, and not called, in decoder-only mode) each run in their
        residual connection (post- or pre-norm), then the feed-forward net; they may use this
        block's attention layers (`self.self_attention`, `self.cross_attention`) or their
        weights. `x` is `[..., d_model]`: any leading shape the attentions accept.

        Returns `(output like x, {"self_attention": scores, "cross_attention": scores},
        self_attention's cache)`.
        """
        x, self_scores, cache = self._residual(
            self.self_attention_norm, x, self_attention, training
        )
        scores = {"self_attention": self_scores}
        if not self.decoder_only:
            x, scores["cross_attention"] = self._residual(
                self.cross_attention_norm, x, cross_attention, training
            )
        return self._feed_forward_sublayer(x, training), scores, cache

    def get_config(self):
        return {**super().get_config(), "decoder_only": self.decoder_only}


def _describe(layer):
    return f"{type(layer).__name__} {layer.name!r}"


def check_decoder_call(
    layer, encoder_output, encoder_padding_mask, cross_attention_cache, self_attention_cache,
    cache_update_index,
):  # fmt: skip
    """Refuses a call that does not match `layer`'s mode (`layer.decoder_only`) or gives half of
    a pair of arguments: a missing argument never selects another computation silently."""
    if layer.decoder_only:
        for name, value in (
            ("encoder_output", encoder_output),
            ("encoder_padding_mask", encoder_padding_mask),
            ("cross_attention_cache", cross_attention_cache),
        ):
            if value is not None:
                raise ValueError(
                    f"{_describe(layer)} is decoder-only (built without an encoder sequence: no "
                    f"encoder-decoder attention) but got `{name}`; an encoder-decoder layer is "
                    "built by a first call with `encoder_output`, or with `decoder_only=False`"
                )
    elif encoder_output is None and cross_attention_cache is None:
        raise ValueError(
            f"{_describe(layer)} has encoder-decoder attention and needs `encoder_output` (or "
            "its `cross_attention_cache`); a decoder-only layer is built by a first call "
            "without one, or with `decoder_only=True`"
        )
    elif encoder_output is not None and cross_attention_cache is not None:
        raise ValueError(
            f"{_describe(layer)} got both `encoder_output` and `cross_attention_cache`: pass one"
        )
    if (self_attention_cache is None) != (cache_update_index is None):
        missing = "cache_update_index" if cache_update_index is None else "self_attention_cache"
        raise ValueError(
            f"{_describe(layer)}: `self_attention_cache` and `cache_update_index` go together, "
            f"`{missing}` is missing"
        )


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerDecoder(StackBase):
    """A stack of `num_layers` `TransformerDecoderBlock`s (the paper's N = 6).

    Encoder-decoder or decoder-only as its blocks (see `TransformerDecoderBlock`): the first
    call chooses, decoder-only when it has no `encoder_output` (nor `cross_attention_cache`),
    unless `decoder_only` fixes the mode; a call that does not match it raises. A decoder-only
    stack with a causal-LM head is a GPT-style model (`keras_transformer.models.
    DecoderOnlyTransformer`, or one of your own: docs/guides/causal-lm.md).

    For incremental decoding each cache is a list with one `(keys, values)` pair of
    `[batch, heads, length, head_dim]` tensors per layer (`length` = the longest output for the
    self-attention cache, from `init_self_attention_cache`; the source length for the
    cross-attention cache, from `compute_cross_attention_cache`); the updated self-attention
    cache comes back as such a list.

    Args:
        num_layers: number of blocks.
        num_heads, d_ff, dropout, attention_dropout, activation_dropout, activation, norm_first,
        layer_norm_epsilon, kernel_initializer, kernels, decoder_only: passed to every
        `TransformerDecoderBlock`.

    Call arguments:
        inputs: embedded target `[batch, t_len, d_model]`.
        encoder_output: `[batch, s_len, d_model]` in encoder-decoder mode (may be None when the
            cross cache is given); always None in decoder-only mode.
        decoder_padding_mask, encoder_padding_mask: boolean token masks, True at real tokens
            (a Keras mask stands in for `decoder_padding_mask`; None: every token is real);
            `encoder_padding_mask` in encoder-decoder mode only.
        self_attention_cache, cache_update_index: see above; one needs the other.
        cross_attention_cache: see above; encoder-decoder mode only.
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
    >>> gpt = TransformerDecoder(num_layers=2, num_heads=8, d_ff=2048)  # no encoder: decoder-only
    >>> tuple(gpt(embedded_target).shape), gpt.decoder_only
    ((2, 7, 512), True)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", section 3.1.
    """

    block_class = TransformerDecoderBlock

    def __init__(self, num_layers, num_heads, d_ff, decoder_only=None, **kwargs):
        super().__init__(num_layers, num_heads, d_ff, **kwargs)
        self.block_kwargs["decoder_only"] = decoder_only  # None: the first call chooses

    @property
    def decoder_only(self):
        """True or False once built (or given); None while the first call is to choose."""
        return self.block_kwargs["decoder_only"]

    def build(self, inputs_shape, encoder_output_shape=None, cross_attention_cache_shape=None):
        if self.decoder_only is None:
            self.block_kwargs["decoder_only"] = (
                encoder_output_shape is None and cross_attention_cache_shape is None
            )
        self._encoder_output_shape = encoder_output_shape
        super().build(inputs_shape)

    def _build_block(self, block, input_shape):
        block.build(input_shape, self._encoder_output_shape)

    def compute_cross_attention_cache(self, encoder_output):
        """One `(keys, values)` pair per layer, each `[batch, heads, s_len, head_dim]`, computed
        once per source sentence (encoder-decoder mode only)."""
        return [block.compute_cross_attention_cache(encoder_output) for block in self.blocks]

    def init_self_attention_cache(self, batch_size, max_length):
        """The empty self-attention cache: one `(keys, values)` pair of zeros
        `[batch_size, heads, max_length, head_dim]` per layer."""
        return [block.init_self_attention_cache(batch_size, max_length) for block in self.blocks]

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
        mask=None,
        training=None,
    ):
        decoder_padding_mask = mask if decoder_padding_mask is None else decoder_padding_mask
        self_attentions, cross_attentions = self.attentions(
            encoder_output, decoder_padding_mask, encoder_padding_mask, self_attention_cache,
            cache_update_index, cross_attention_cache, training,
        )  # fmt: skip
        x, all_scores, new_caches = self.step(inputs, self_attentions, cross_attentions, training)
        return call_outputs(
            x,
            all_scores if return_attention_scores else None,
            None if self_attention_cache is None else new_caches,
        )

    def attentions(
        self,
        encoder_output=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_cache=None,
        cache_update_index=None,
        cross_attention_cache=None,
        training=None,
    ):
        """The blocks' own attentions for `step`, given `call`'s arguments (checked as `call`
        checks them; the caches hold one pair per layer): `(self_attentions,
        cross_attentions)`, one function per block each (`TransformerDecoderBlock.attentions`).
        """
        check_decoder_call(
            self, encoder_output, encoder_padding_mask, cross_attention_cache,
            self_attention_cache, cache_update_index,
        )  # fmt: skip
        self_caches = self._per_layer("self_attention_cache", self_attention_cache)
        cross_caches = self._per_layer("cross_attention_cache", cross_attention_cache)
        arguments = (encoder_output, decoder_padding_mask, encoder_padding_mask)
        self_attentions, cross_attentions = [], []
        for block, self_cache, cross_cache in zip(self.blocks, self_caches, cross_caches):
            self_attention, cross_attention = block.attentions(
                *arguments, self_cache, cache_update_index, cross_cache, training
            )
            self_attentions.append(self_attention)
            cross_attentions.append(cross_attention)
        return self_attentions, cross_attentions

    def step(self, x, self_attentions, cross_attentions=None, training=None):
        """The stack's computation with each block's attentions given as functions: the
        decoder step protocol (`TransformerDecoderBlock.step`, block by block, then the
        pre-norm stack's final LayerNorm). `call` runs it with the blocks' own attentions
        (`attentions`); decoding and the LiteRT export with theirs, on caches of their own
        (`keras_transformer.models.Transformer.decoder_step`).

        Args:
            x: the embedded target `[..., d_model]` (any leading shape the attentions accept).
            self_attentions: one `self_attention(h) -> (output, scores, cache)` per block.
            cross_attentions: one `cross_attention(h) -> (output, scores)` per block
                (encoder-decoder mode; None in decoder-only mode).
            training: enables dropout.

        Returns:
            `(output like x, [each block's scores dict], [each self_attention's cache])`.
        """
        self_attentions = self._per_layer("self_attentions", self_attentions)
        cross_attentions = self._per_layer("cross_attentions", cross_attentions)
        all_scores, caches = [], []
        for block, self_attention, cross_attention in zip(
            self.blocks, self_attentions, cross_attentions
        ):
            x, scores, cache = block.step(x, self_attention, cross_attention, training)
            all_scores.append(scores)
            caches.append(cache)
        return self._finish(x), all_scores, caches

    def _per_layer(self, name, caches):
        """`caches` (one per block; or attentions), or one None per block; a list of another
        length raises."""
        if caches is None:
            return [None] * len(self.blocks)
        if len(caches) != len(self.blocks):
            raise ValueError(
                f"{_describe(self)} has {len(self.blocks)} layers but `{name}` holds "
                f"{len(caches)} caches"
            )
        return caches
