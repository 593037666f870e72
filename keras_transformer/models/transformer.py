"""The encoder-decoder Transformer as a functional Keras model."""

import keras
from keras import ops

from keras_transformer.fast_paths import Kernels
from keras_transformer.layers._blocks import head_size
from keras_transformer.layers._fast_paths import fresh_zeros
from keras_transformer.layers.decoder import TransformerDecoder
from keras_transformer.layers.embedding import SinusoidalPositionalEncoding, TokenEmbedding
from keras_transformer.layers.encoder import TransformerEncoder
from keras_transformer.layers.masks import padding_mask
from keras_transformer.models._hyper_parameters import HyperParameters, take
from keras_transformer.models._train_step import TrainStep

# The paper's sizes (Table 3) plus small ones for tests and CPUs.
PRESETS = {
    "transformer_base": dict(num_layers=6, d_model=512, num_heads=8, d_ff=2048, dropout=0.1),
    # The paper uses P_drop = 0.3 for the big EN-DE model (0.1 for EN-FR).
    "transformer_big": dict(num_layers=6, d_model=1024, num_heads=16, d_ff=4096, dropout=0.3),
    "transformer_small": dict(num_layers=3, d_model=256, num_heads=4, d_ff=1024, dropout=0.1),
    "transformer_tiny": dict(num_layers=2, d_model=64, num_heads=4, d_ff=128, dropout=0.1),
}


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(HyperParameters, TrainStep, keras.Model):
    """The Transformer of "Attention Is All You Need" as a functional Keras model.

    The graph is built in `__init__` from the library's layers: a token embedding shared by the
    source, the target and the pre-softmax projection (scaled by sqrt(d_model)), sinusoidal
    positions, dropout, an encoder and a decoder stack of `num_layers` blocks each.

    Args:
        vocab_size: size of the (shared) vocabulary; id 0 is padding.
        num_layers: blocks in the encoder and in the decoder (N).
        d_model: model width.
        num_heads: attention heads (h).
        d_ff: feed-forward inner width.
        dropout: residual dropout `P_drop` (sub-layer outputs and embedding sums).
        attention_dropout: dropout on attention weights.
        activation_dropout: dropout inside the feed-forward networks.
        token_dropout: word dropout: during training each source and target input token's
            embedding is zeroed with this probability (the whole vector; its position stays),
            the others scaled by `1 / (1 - token_dropout)` (Gal & Ghahramani, 2016; Sennrich
            & Zhang, 2019, for small corpora). 0 (the paper's) adds no layer.
        activation: feed-forward activation.
        norm_first: pre-norm blocks instead of the paper's post-norm.
        share_embeddings: one embedding matrix for source and target (needs one vocabulary).
        tie_output_projection: use the target embedding as the pre-softmax projection.
        source_vocab_size: source vocabulary size when `share_embeddings=False`.
        num_encoder_layers, num_decoder_layers: override `num_layers` per stack.
        layer_norm_epsilon: LayerNorm epsilon.
        dtype: dtype policy of the layers (e.g. `"mixed_bfloat16"`); logits are always float32.
        kernels: the fast paths of its layers and of the searches run on it
            (`keras_transformer.fast_paths.Kernels`, a setting such as `"none"`, or None for the
            current setting), chosen here once and recorded in the config.

    Call arguments:
        inputs: dict with `"source_ids"` `[batch, s_len]` and `"target_ids"` `[batch, t_len]`
            (int, 0 = padding); `target_ids` is the decoder input (BOS-shifted target).

    Returns:
        Logits `[batch, t_len, vocab_size]` (float32).

    The arguments but `dtype` are the model's hyper-parameters, all but `vocab_size` by keyword:
    the keys of the config's `model:` section, which declares them and their defaults
    (`keras_transformer.config.ModelConfig`), and `tie_output_projection` and
    `source_vocab_size`. They are kept as given in `model.hyper_parameters` (a dict), read as
    attributes (`model.d_model`) and saved as the config of `.keras` files
    (`models._hyper_parameters`).

    Training steps (gradient accumulation, the loss's statistics for the metrics, a
    multi-worker workaround) come from `keras_transformer.models._train_step.TrainStep`.

    Example:
    ```python
    model = Transformer.from_preset("transformer_base", vocab_size=37000)
    logits = model({"source_ids": src, "target_ids": tgt_in})
    ```

    References:
        Vaswani et al., 2017, "Attention Is All You Need".
    """

    def __init__(
        self, vocab_size, *, tie_output_projection=True, source_vocab_size=None, dtype=None,
        kernels=None, **kwargs,
    ):  # fmt: skip
        hyper_parameters = {
            "vocab_size": vocab_size,
            **take(kwargs),
            "tie_output_projection": tie_output_projection,
            "source_vocab_size": source_vocab_size,
        }
        _check(**hyper_parameters)
        kernels = Kernels.get(kernels)
        self._make_layers(dtype=dtype, kernels=kernels.to_config(), **hyper_parameters)
        inputs, logits = self._functional_graph()
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self.hyper_parameters = hyper_parameters
        self.kernels = kernels
        self.head_dim = self.d_model // self.num_heads

    def _make_layers(
        self, vocab_size, num_layers, d_model, dropout, token_dropout, share_embeddings,
        tie_output_projection, source_vocab_size, num_encoder_layers, num_decoder_layers, dtype,
        **block_arguments,
    ):  # fmt: skip
        """The model's layers, as its attributes (the functional graph's names as before)."""
        self.target_embedding = TokenEmbedding(
            vocab_size, d_model, dtype=dtype, name="token_embedding"
        )
        self.source_embedding = self.target_embedding
        if not share_embeddings:
            self.source_embedding = TokenEmbedding(
                source_vocab_size or vocab_size, d_model, dtype=dtype, name="source_embedding"
            )
        # Word dropout: one mask value per token, broadcast over the embedding's width.
        self.source_token_dropout, self.target_token_dropout = (
            (None, None)
            if not token_dropout
            else tuple(
                keras.layers.Dropout(
                    token_dropout, noise_shape=(None, None, 1), dtype=dtype, name=name
                )
                for name in ("source_token_dropout", "target_token_dropout")
            )
        )
        self.positional_encoding = SinusoidalPositionalEncoding(
            dtype=dtype, name="positional_encoding"
        )
        self.source_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="source_dropout")
        self.target_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="target_dropout")
        stack_arguments = dict(dropout=dropout, dtype=dtype, **block_arguments)
        self.encoder = TransformerEncoder(
            num_encoder_layers or num_layers, name="encoder", **stack_arguments
        )
        self.decoder = TransformerDecoder(
            num_decoder_layers or num_layers, name="decoder", **stack_arguments
        )
        self.output_projection = (
            None
            if tie_output_projection
            else keras.layers.Dense(vocab_size, dtype=dtype, name="output_projection")
        )
        self.to_float32 = keras.layers.Activation("linear", dtype="float32", name="logits")

    def _functional_graph(self):
        """`(inputs, logits)` of the model: the paper's figure 1, wired by `encode`,
        `_embed_target` and `_project` (the same the decoding and inspection methods use)."""
        source_ids = keras.Input(shape=(None,), dtype="int32", name="source_ids")
        target_ids = keras.Input(shape=(None,), dtype="int32", name="target_ids")
        memory, source_mask = self.encode(source_ids, training=None)
        y = self.decoder(
            self._embed_target(target_ids),
            memory,
            decoder_padding_mask=padding_mask(target_ids),
            encoder_padding_mask=source_mask,
        )
        return {"source_ids": source_ids, "target_ids": target_ids}, self._project(y)

    @classmethod
    def from_preset(cls, preset, vocab_size, **kwargs):
        """Builds `preset` ("transformer_base", "transformer_big", "transformer_small",
        "transformer_tiny") with `vocab_size`; other keyword arguments override the preset."""
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        return cls(vocab_size=vocab_size, **{**PRESETS[preset], **kwargs})

    # ------------------------------------------------------------------ inference

    def encode(self, source_ids, training=False):
        """Runs the encoder on `[batch, s_len]` ids.

        Returns `(encoder_output [batch, s_len, d_model], source_mask [batch, s_len])`.
        """
        source_mask = padding_mask(source_ids)
        x = self._embed_source(source_ids, training)
        return self.encoder(x, padding_mask=source_mask, training=training), source_mask

    def _embed_source(self, source_ids, training=None):
        """The encoder's input: the source ids embedded (scaled), word dropout, positions,
        dropout."""
        x = self._embed(source_ids, self.source_embedding, self.source_token_dropout, training)
        return self.source_dropout(x, training=training)

    def _embed_target(self, target_ids, training=None, start_index=0):
        """The decoder's input: the target ids embedded (scaled), word dropout, positions from
        `start_index` added, dropout."""
        y = self._embed(
            target_ids, self.target_embedding, self.target_token_dropout, training, start_index
        )
        return self.target_dropout(y, training=training)

    def _embed(self, ids, embedding, token_dropout, training, start_index=0):
        """`ids` embedded, with word dropout (when the model has it) and positions added."""
        x = embedding(ids)
        if token_dropout is not None:
            x = token_dropout(x, training=training)
        return self.positional_encoding(x, start_index=start_index)

    def init_cache(self, encoder_output, max_length):
        """The decoding cache for `max_length` target positions.

        Returns a dict with `"self_attention"`, one `(keys, values)` pair of zeros
        `[batch, heads, max_length, head_dim]` per decoder layer, and `"cross_attention"`, one
        `(keys, values)` pair `[batch, heads, s_len, head_dim]` per layer: the encoder output's
        keys/values, computed here once per sentence. With tied embeddings it also holds
        `"output_kernel"` (`output_kernel()`): the embedding transposed once here rather than at
        every step. (Beam search's caches shared by the beams of a sentence are decoding's own:
        `keras_transformer.decoding.beam_cache.shared_beam_decoder`.)
        """
        return self._init_cache(encoder_output, max_length, self.num_heads)

    def _init_cache(self, encoder_output, max_length, rows):
        """`init_cache` with self-attention buffers of `rows` rows per sentence (`num_heads`; a
        private hook: decoding's shared beam caches hold `num_heads * beams`)."""
        batch = ops.shape(encoder_output)[0]
        layers = self.num_decoder_layers or self.num_layers
        shape = (batch, rows, max_length, self.head_dim)
        dtype = self.decoder.compute_dtype
        cache = {
            "cross_attention": self.decoder.compute_cross_attention_cache(encoder_output),
            # Buffers of their own, never folded into graph constants: `translate_ids` writes
            # them in place (`layers.attention.OwnedCache`, kernel `inplace_cache_writes`).
            "self_attention": [
                (fresh_zeros(shape, dtype), fresh_zeros(shape, dtype)) for _ in range(layers)
            ],
        }
        if self.output_projection is None:
            cache["output_kernel"] = self.output_kernel()
        return cache

    def output_kernel(self):
        """The tied pre-softmax projection: the embedding matrix transposed to
        `[d_model, vocab_size]` in the compute dtype, materialised.

        `decode_step` multiplies by it directly. At decoding's few rows a product with a
        transposed operand runs slower on CPUs (figures in docs/guides/performance.md), so
        `init_cache` transposes once per decoding call instead of once per step. An untied
        `output_projection` (a Dense layer) already multiplies by its own `[d_model, vocab_size]`
        kernel and is called as it is.
        """
        embedding = self.target_embedding
        return ops.transpose(ops.cast(embedding.embeddings, embedding.compute_dtype))

    def decode_step(self, target_ids, cache_index, cache, source_mask):
        """Decodes `target_ids` `[batch, n]` placed at positions `cache_index .. cache_index+n-1`.

        Returns float32 logits `[batch, n, vocab_size]` for the next tokens and the cache with
        those positions' keys/values written in. Run step by step from `cache_index=0` this equals
        the full forward pass. `source_mask` is required: without it the padded source positions
        would be attended.
        """
        if source_mask is None:
            raise ValueError(
                "decode_step needs `source_mask` (from `encode`), True at real source tokens"
            )

        def decoder(y):  # (output, self-attention cache)
            return self.decoder(
                y,
                None,
                encoder_padding_mask=source_mask,
                self_attention_cache=cache["self_attention"],
                cache_update_index=cache_index,
                cross_attention_cache=cache["cross_attention"],
            )

        return self._decode_step_with(decoder, target_ids, cache_index, cache)

    def _decode_step_with(self, decoder, target_ids, cache_index, cache):
        """`decode_step` around `decoder(y) -> (output, self-attention cache)`, which runs the
        decoder stack on the embedded step. A private hook: decoding runs its own stack on the
        caches shared by the beams (`keras_transformer.decoding.beam_cache`)."""
        y, self_cache = decoder(self._embed_target(target_ids, False, start_index=cache_index))
        logits = self._project(y, cache.get("output_kernel"))
        return logits, {**cache, "self_attention": self_cache}

    def _project(self, y, output_kernel=None):
        """Float32 logits of the decoder's output `y`: the pre-softmax projection (the tied
        embedding, or `output_kernel` when `init_cache` transposed it, or the untied Dense)."""
        if output_kernel is not None:  # the tied embedding, already transposed
            logits = ops.matmul(y, output_kernel)
        elif self.output_projection is None:
            logits = self.target_embedding(y, reverse=True)
        else:
            logits = self.output_projection(y)
        return self.to_float32(logits)

    def attention_scores(self, source_ids, target_ids):
        """Attention weights of one forward pass (inference mode), for inspection and plots.

        Returns `{"encoder_self_attention": [per layer [batch, heads, s_len, s_len]],
        "decoder_self_attention": [...], "decoder_cross_attention": [per layer
        [batch, heads, t_len, s_len]]}`.
        """
        source_mask = padding_mask(source_ids)
        memory, enc_scores = self.encoder(
            self._embed_source(source_ids, False),
            padding_mask=source_mask,
            return_attention_scores=True,
            training=False,
        )
        _, dec_scores = self.decoder(
            self._embed_target(target_ids, False),
            memory,
            decoder_padding_mask=padding_mask(target_ids),
            encoder_padding_mask=source_mask,
            return_attention_scores=True,
        )
        return {
            "encoder_self_attention": enc_scores,
            "decoder_self_attention": [s["self_attention"] for s in dec_scores],
            "decoder_cross_attention": [s["cross_attention"] for s in dec_scores],
        }


def _check(
    vocab_size, d_model, num_heads, token_dropout, share_embeddings, source_vocab_size, **unused
):
    """Fails early, with a clear message, on hyper-parameters that cannot build a model."""
    head_size(d_model, num_heads)
    if not 0.0 <= token_dropout < 1.0:
        raise ValueError(f"token_dropout must be in [0, 1), got {token_dropout}")
    if share_embeddings and source_vocab_size not in (None, vocab_size):
        raise ValueError(
            "share_embeddings=True needs one vocabulary: source_vocab_size "
            f"({source_vocab_size}) != vocab_size ({vocab_size})"
        )


def build_transformer(model_config, vocab_size, dtype=None):
    """Builds a `Transformer` from the config's `model` section (a `ModelConfig` or a dict).

    This is the one place where the config is unpacked into layer arguments.
    """
    values = model_config if isinstance(model_config, dict) else vars(model_config)
    return Transformer(vocab_size=vocab_size, dtype=dtype, **values)
