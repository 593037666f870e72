"""The paper's building blocks as serializable Keras 3 layers (keras.ops only, any backend)."""

from keras_transformer.layers.attention import MultiHeadAttention, scaled_dot_product_attention
from keras_transformer.layers.decoder import TransformerDecoder, TransformerDecoderBlock
from keras_transformer.layers.embedding import (
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    positional_encoding,
)
from keras_transformer.layers.encoder import TransformerEncoder, TransformerEncoderBlock
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.masks import causal_mask, padding_mask
from keras_transformer.layers.normalization import LayerNormalization

__all__ = [
    "LayerNormalization",
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "SinusoidalPositionalEncoding",
    "TokenEmbedding",
    "TransformerDecoder",
    "TransformerDecoderBlock",
    "TransformerEncoder",
    "TransformerEncoderBlock",
    "causal_mask",
    "padding_mask",
    "positional_encoding",
    "scaled_dot_product_attention",
]
