"""A decoder-only (GPT-style) Transformer language model from the library's layers."""

import keras

from keras_transformer import hyper_parameters
from keras_transformer.fast_paths import Kernels
from keras_transformer.layers.decoder import TransformerDecoder
from keras_transformer.layers.embedding import SinusoidalPositionalEncoding, TokenEmbedding
from keras_transformer.layers.masks import padding_mask
from keras_transformer.models._hyper_parameters import HyperParameters, take


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderOnlyTransformer(HyperParameters, keras.Model):
    """A causal language model: the paper's decoder without encoder-decoder attention.

    A functional Keras model wired from the library's layers: a token embedding (scaled by
    sqrt(d_model)) that is also the pre-softmax projection, sinusoidal positions, dropout and a
    decoder-only `TransformerDecoder` (causal self-attention and feed-forward blocks). Logit
    `t` predicts token `t + 1` from tokens `0 .. t` only. Train it with `model.fit` on
    `(ids[:, :-1], ids[:, 1:])` pairs; generate with `keras_transformer.decoding`'s searches
    through `decoding.language_model_step`, which runs `init_cache` / `decode_step`.

    Args:
        vocab_size: vocabulary size; id 0 is padding.
        num_layers: decoder blocks.
        d_model: model width.
        num_heads: attention heads.
        d_ff: feed-forward inner width.
        dropout: residual dropout (sub-layer outputs and the embedding sums).
        attention_dropout: dropout on attention weights.
        activation_dropout: dropout inside the feed-forward networks.
        activation: feed-forward activation.
        norm_first: pre-norm blocks instead of the paper's post-norm.
        layer_norm_epsilon: LayerNorm epsilon.
        dtype: dtype policy of the layers (e.g. `"mixed_bfloat16"`); logits are always float32.
        kernels: the fast paths of its layers (`keras_transformer.fast_paths.Kernels`, a setting
            such as `"none"`, or None for the current setting), chosen here once.

    Call arguments:
        inputs: int `[batch, length]` token ids (0 = padding).

    Returns:
        Logits `[batch, length, vocab_size]` (float32).

    The arguments but `vocab_size` and `dtype` are hyper-parameters, by keyword, declared with
    their defaults in `keras_transformer.hyper_parameters` (`DECODER_ONLY`); they are kept in
    `model.hyper_parameters`, read as attributes and saved as the config of `.keras` files.

    Example:
    ```python
    model = DecoderOnlyTransformer(vocab_size=1000, num_layers=2, d_model=64, num_heads=4,
                                   d_ff=128)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ids[:, :-1], ids[:, 1:], epochs=5)
    ```

    References:
        Vaswani et al., 2017, "Attention Is All You Need"; Radford et al., 2018, "Improving
        Language Understanding by Generative Pre-Training" (the decoder-only language model).
    """

    def __init__(self, vocab_size, *, dtype=None, kernels=None, **kwargs):
        h = {"vocab_size": vocab_size, **take(kwargs, hyper_parameters.DECODER_ONLY)}
        kernels = Kernels.get(kernels)
        self._make_layers(dtype=dtype, kernels=kernels.to_config(), **h)
        ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        x = self.decoder(self._embed(ids), decoder_padding_mask=padding_mask(ids))
        super().__init__(inputs=ids, outputs=self._project(x), **kwargs)
        self.hyper_parameters = h
        self.kernels = kernels

    def _make_layers(self, vocab_size, num_layers, d_model, dtype, kernels, **block_arguments):
        """The model's layers, as its attributes (named as the functional graph's layers)."""
        self.token_embedding = TokenEmbedding(
            vocab_size, d_model, dtype=dtype, name="token_embedding"
        )
        self.positional_encoding = SinusoidalPositionalEncoding(
            dtype=dtype, name="positional_encoding"
        )
        self.decoder = TransformerDecoder(
            num_layers, decoder_only=True, kernels=kernels, dtype=dtype, name="decoder",
            **block_arguments,
        )  # fmt: skip
        self.to_float32 = keras.layers.Activation("linear", dtype="float32", name="logits")
        # Made after the decoder (as its seed is drawn): the same weights for a given seed.
        self.embedding_dropout = keras.layers.Dropout(
            block_arguments["dropout"], dtype=dtype, name="embedding_dropout"
        )

    def _embed(self, ids, training=None, start_index=0):
        """The decoder's input: `ids` embedded (scaled), positions from `start_index` added,
        dropout."""
        x = self.positional_encoding(self.token_embedding(ids), start_index=start_index)
        return self.embedding_dropout(x, training=training)

    def _project(self, x):
        """Float32 logits of the decoder's output `x`: the tied embedding's projection."""
        return self.to_float32(self.token_embedding(x, reverse=True))

    def init_cache(self, batch_size, max_length):
        """The empty key/value cache for `max_length` positions: one `(keys, values)` pair of
        zeros `[batch_size, heads, max_length, head_dim]` per decoder layer."""
        return self.decoder.init_self_attention_cache(batch_size, max_length)

    def decode_step(self, token_ids, cache_index, cache):
        """Runs `token_ids` `[batch, n]` placed at positions `cache_index .. cache_index + n - 1`.

        Returns float32 logits `[batch, n, vocab_size]` (each predicting the token after its
        position) and the cache with those positions' keys/values written in. Run from
        `cache_index=0` one token at a time, it equals the full forward pass. The ids must be
        real tokens: the cache keeps no padding mask (a prompt batch of several lengths goes
        through `decoding.language_model_step`'s `prompt_ids`, forced one token per step).
        """
        x = self._embed(token_ids, training=False, start_index=cache_index)
        x, cache = self.decoder(x, self_attention_cache=cache, cache_update_index=cache_index)
        return self._project(x), cache
