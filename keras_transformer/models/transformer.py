"""The encoder-decoder Transformer as a functional Keras model."""

import keras
from keras import ops

from keras_transformer import hyper_parameters
from keras_transformer.fast_paths import Kernels
from keras_transformer.layers.attention import cache_zeros, head_size
from keras_transformer.layers.decoder import TransformerDecoder
from keras_transformer.layers.embedding import (
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    project_with,
)
from keras_transformer.layers.encoder import TransformerEncoder
from keras_transformer.layers.masks import padding_mask
from keras_transformer.models._hyper_parameters import HyperParameters, take
from keras_transformer.models._train_step import TrainStep
from keras_transformer.models.guided_alignment import guided_alignment_loss

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
    those `keras_transformer.hyper_parameters` declares with their defaults (the keys of the
    config's `model:` section), and `tie_output_projection` and `source_vocab_size`. They are
    kept as given in `model.hyper_parameters` (a dict), read as attributes (`model.d_model`)
    and saved as the config of `.keras` files (`models._hyper_parameters`).

    Decoding runs one step at a time through the decoder step protocol: `embed_target`, then
    `decoder_step` (the decoder stack with its attentions given as functions, and `project`).
    `decode_step` runs it with the layers' own attentions on `init_cache`'s caches; decoding's
    caches shared by the beams of a sentence and the LiteRT export's decoder step run it with
    theirs (`TransformerDecoder.step`, `TransformerDecoderBlock.step`).

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
        self._make_layers(hyper_parameters, dtype, kernels.to_config())
        inputs, logits = self._functional_graph()
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self.hyper_parameters = hyper_parameters
        self.kernels = kernels
        self.head_dim = self.d_model // self.num_heads

    def _make_layers(self, h, dtype, kernels):
        """The model's layers, as its attributes (the functional graph's names as before), from
        its hyper-parameters `h`."""
        vocab_size, d_model, token_dropout = h["vocab_size"], h["d_model"], h["token_dropout"]
        self.target_embedding = TokenEmbedding(
            vocab_size, d_model, dtype=dtype, name="token_embedding"
        )
        self.source_embedding = self.target_embedding
        if not h["share_embeddings"]:
            self.source_embedding = TokenEmbedding(
                h["source_vocab_size"] or vocab_size, d_model, dtype=dtype, name="source_embedding"
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
        dropout = h["dropout"]
        self.source_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="source_dropout")
        self.target_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="target_dropout")
        stack_arguments = {name: h[name] for name in hyper_parameters.BLOCK}
        stack_arguments.update(dtype=dtype, kernels=kernels)
        self.encoder = TransformerEncoder(
            h["num_encoder_layers"] or h["num_layers"], name="encoder", **stack_arguments
        )
        self.decoder = TransformerDecoder(
            h["num_decoder_layers"] or h["num_layers"], name="decoder", **stack_arguments
        )
        self.output_projection = (
            None
            if h["tie_output_projection"]
            else keras.layers.Dense(vocab_size, dtype=dtype, name="output_projection")
        )
        self.to_float32 = keras.layers.Activation("linear", dtype="float32", name="logits")

    def _functional_graph(self):
        """`(inputs, logits)` of the model: the paper's figure 1, wired by `encode`,
        `embed_target` and `project` (the same the decoding and inspection methods use)."""
        source_ids = keras.Input(shape=(None,), dtype="int32", name="source_ids")
        target_ids = keras.Input(shape=(None,), dtype="int32", name="target_ids")
        memory, source_mask = self.encode(source_ids, training=None)
        y = self.decoder(
            self.embed_target(target_ids),
            memory,
            decoder_padding_mask=padding_mask(target_ids),
            encoder_padding_mask=source_mask,
        )
        return {"source_ids": source_ids, "target_ids": target_ids}, self.project(y)

    # Guided alignment (`models.guided_alignment.GuidedAlignment`), set by `compile_model` from
    # `train.guided_alignment_weight`; None: off.
    guided_alignment = None

    def call(self, inputs, training=None, mask=None):
        """The functional graph's logits. A batch that carries the pairs' link matrices
        (`inputs["alignment"]` `[batch, t_len, s_len]`, data prepared with
        `data.train_alignments`) adds, in training and with `guided_alignment` set, the guided
        alignment loss (`add_loss`: the train steps add it to the loss) of head 0 of the
        cross-attention of decoder layer `guided_alignment.layer`; otherwise the links are
        ignored. Inference never passes them: its graphs are the functional model's."""
        if isinstance(inputs, dict) and "alignment" in inputs:
            links = inputs["alignment"]
            inputs = {name: value for name, value in inputs.items() if name != "alignment"}
            if isinstance(mask, dict):
                mask = {name: mask.get(name) for name in inputs}
            if self.guided_alignment is not None and training:
                return self._guided_logits(inputs, links, training)
        return super().call(inputs, training=training, mask=mask)

    def _guided_logits(self, inputs, links, training):
        """The logits of the forward pass of the functional graph (the same layers, called in
        the same order), and the guided alignment loss of its attention added."""
        source_ids, target_ids = inputs["source_ids"], inputs["target_ids"]
        memory, source_mask = self.encode(source_ids, training=training)
        y, scores = self.decoder(
            self.embed_target(target_ids, training),
            memory,
            decoder_padding_mask=padding_mask(target_ids),
            encoder_padding_mask=source_mask,
            return_attention_scores=True,
            training=training,
        )
        guided = self.guided_alignment
        attention = scores[guided.layer]["cross_attention"][:, 0]  # head 0: [batch, t, s]
        # A functional model refuses `add_loss` (symbolic graphs only); in a call it is the
        # Layer's, which the train steps read back as `model.losses`.
        keras.layers.Layer.add_loss(self, guided.weight * guided_alignment_loss(attention, links))
        return self.project(y)

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

    def embed_target(self, target_ids, training=None, start_index=0, token_vectors=None):
        """The decoder's input `[batch, n, d_model]`: the target ids `[batch, n]` embedded
        (scaled by `target_embedding.output_scale`), word dropout, the positions from
        `start_index` added, dropout. The one place the decoder's input is made: the functional
        graph, `decode_step`, decoding's shared beam caches and the LiteRT export all call it.

        `token_vectors` `[batch, n, d_model]`: the ids' embeddings, already scaled, when the
        caller looks them up itself (the LiteRT export's int8 table); `target_ids` is then
        unused (None will do).
        """
        y = self._embed(
            target_ids, self.target_embedding, self.target_token_dropout, training, start_index,
            token_vectors,
        )  # fmt: skip
        return self.target_dropout(y, training=training)

    def _embed(self, ids, embedding, token_dropout, training, start_index=0, token_vectors=None):
        """`ids` embedded (or their `token_vectors`), with word dropout (when the model has it)
        and positions added."""
        x = embedding(ids) if token_vectors is None else token_vectors
        if token_dropout is not None:
            x = token_dropout(x, training=training)
        return self.positional_encoding(x, start_index=start_index)

    def init_cache(self, encoder_output, max_length, self_attention_rows=None, output_ids=None):
        """The decoding cache for `max_length` target positions.

        Returns a dict with `"self_attention"`, one `(keys, values)` pair of zeros
        `[batch, rows, max_length, head_dim]` per decoder layer, `rows` being
        `self_attention_rows` (default `num_heads`: one row per head, the layers' cache form;
        decoding's caches shared by the beams of a sentence hold more), and
        `"cross_attention"`, one `(keys, values)` pair `[batch, heads, s_len, head_dim]` per
        layer: the encoder output's keys/values, computed here once per sentence. With tied
        embeddings it also holds `"output_kernel"` (`output_kernel()`): the embedding transposed
        once here rather than at every step.

        `output_ids` int `[n]` (a vocabulary shortlist): the projection covers only these target
        ids, column `j` giving the logit of `output_ids[j]`: `"output_kernel"` holds their
        columns `[d_model, n]` (gathered once here, tied or not) and, for an untied projection,
        `"output_bias"` their biases `[n]`.
        """
        batch = ops.shape(encoder_output)[0]
        layers = self.num_decoder_layers or self.num_layers
        rows = self.num_heads if self_attention_rows is None else self_attention_rows
        shape = (batch, rows, max_length, self.head_dim)
        dtype = self.decoder.compute_dtype
        cache = {
            "cross_attention": self.decoder.compute_cross_attention_cache(encoder_output),
            # Buffers of their own, never folded into graph constants: `translate_ids` writes
            # them in place (`layers.attention.OwnedCache`, kernel `inplace_cache_writes`).
            "self_attention": [
                (cache_zeros(shape, dtype), cache_zeros(shape, dtype)) for _ in range(layers)
            ],
        }
        if output_ids is not None:
            cache["output_kernel"] = self.output_kernel(output_ids)
            if self.output_projection is not None and self.output_projection.use_bias:
                bias = ops.cast(self.output_projection.bias, self.output_projection.compute_dtype)
                cache["output_bias"] = ops.take(bias, output_ids, axis=0)
        elif self.output_projection is None:
            cache["output_kernel"] = self.output_kernel()
        return cache

    def output_kernel(self, output_ids=None):
        """The tied pre-softmax projection: the embedding matrix transposed to
        `[d_model, vocab_size]` in the compute dtype, materialised.

        `decode_step` multiplies by it directly. At decoding's few rows a product with a
        transposed operand runs slower on CPUs (figures in docs/guides/performance.md), so
        `init_cache` transposes once per decoding call instead of once per step. An untied
        `output_projection` (a Dense layer) already multiplies by its own `[d_model, vocab_size]`
        kernel and is called as it is.

        With `output_ids` int `[n]`: only those ids' columns, `[d_model, n]` (the rows of the
        tied embedding, or the columns of the untied projection's kernel).
        """
        if self.output_projection is not None:  # only asked for a shortlist's columns
            dense = self.output_projection
            kernel = ops.cast(dense.kernel, dense.compute_dtype)
            return kernel if output_ids is None else ops.take(kernel, output_ids, axis=1)
        embedding = self.target_embedding
        rows = ops.cast(embedding.embeddings, embedding.compute_dtype)  # [vocab, d_model]
        if output_ids is not None:
            rows = ops.take(rows, output_ids, axis=0)  # [n, d_model]
        return ops.transpose(rows)

    def decode_step(self, target_ids, cache_index, cache, source_mask):
        """Decodes `target_ids` `[batch, n]` placed at positions `cache_index .. cache_index+n-1`.

        Returns float32 logits `[batch, n, vocab_size]` for the next tokens and the cache with
        those positions' keys/values written in. Run step by step from `cache_index=0` this equals
        the full forward pass. `source_mask` is required: without it the padded source positions
        would be attended. It is `decoder_step` with the decoder's own attentions on `cache`
        (`init_cache`).
        """
        if source_mask is None:
            raise ValueError(
                "decode_step needs `source_mask` (from `encode`), True at real source tokens"
            )
        self_attentions, cross_attentions = self.decoder.attentions(
            encoder_padding_mask=source_mask,
            self_attention_cache=cache["self_attention"],
            cache_update_index=cache_index,
            cross_attention_cache=cache["cross_attention"],
        )
        logits, self_cache = self.decoder_step(
            self.embed_target(target_ids, False, start_index=cache_index),
            self_attentions,
            cross_attentions,
            cache.get("output_kernel"),
            cache.get("output_bias"),
        )
        return logits, {**cache, "self_attention": self_cache}

    def decoder_step(
        self, y, self_attentions, cross_attentions, output_kernel=None, output_bias=None
    ):
        """One decoding step after the embedding, with the attentions given as functions: the
        decoder step protocol, which `decode_step`, decoding's caches shared by the beams
        (`keras_transformer.decoding.beam_cache`) and the LiteRT export's decoder step
        (`keras_transformer.export.litert_graphs`) all run, each with attentions on caches of
        its own. Inference: no dropout.

        Args:
            y: the embedded step `[..., d_model]` (`embed_target`), any leading shape the
                attentions accept (`[rows, n, d_model]`, or `[rows, d_model]`).
            self_attentions: one function per decoder layer, `self_attention(h) -> (output,
                scores, cache)`: the layer's causal self-attention of `h` on its cache (scores
                may be None), and the cache with the step written in (whatever the caller
                keeps). They may use the blocks' layers (`model.decoder.blocks[i].
                self_attention`, a `MultiHeadAttention`: its `attend_with`, or its weights).
            cross_attentions: one function per decoder layer, `cross_attention(h) -> (output,
                scores)`: the attention of `h` on the encoder output.
            output_kernel: the tied embedding transposed (`init_cache`'s `"output_kernel"`),
                or a shortlist's columns of the projection (`init_cache(output_ids=...)`), or
                None.
            output_bias: the untied projection's biases of a shortlist's columns
                (`init_cache`'s `"output_bias"`), or None.

        Returns:
            `(logits, caches)`: float32 logits `[..., vocab_size]` (`project`; `[..., n]` with a
            shortlist's `output_kernel` of `n` columns) and the caches
            the self-attentions returned, one per layer.

        Example:
        ```python
        memory, mask = model.encode(source_ids)
        cache = model.init_cache(memory, max_length=20)
        self_attentions, cross_attentions = model.decoder.attentions(
            encoder_padding_mask=mask, self_attention_cache=cache["self_attention"],
            cache_update_index=0, cross_attention_cache=cache["cross_attention"])
        y = model.embed_target(bos_ids, start_index=0)  # [batch, 1, d_model]
        logits, self_caches = model.decoder_step(y, self_attentions, cross_attentions)
        ```
        """
        y, _, caches = self.decoder.step(y, self_attentions, cross_attentions, training=False)
        return self.project(y, output_kernel, output_bias), caches

    def project(self, y, output_kernel=None, output_bias=None):
        """Float32 logits `[..., vocab_size]` of the decoder's output `y` `[..., d_model]`: the
        pre-softmax projection (the tied embedding, or `output_kernel` when `init_cache`
        transposed it, or the untied Dense). A shortlist's `output_kernel` `[d_model, n]` (and,
        untied, its `output_bias` `[n]`) gives the logits of its `n` ids only, `[..., n]`."""
        if output_kernel is not None:  # the tied embedding transposed, or a shortlist's columns
            logits = project_with(y, output_kernel, self.kernels)
            if output_bias is not None:
                logits = logits + output_bias
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
            self.embed_target(target_ids, False),
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
