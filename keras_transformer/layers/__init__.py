"""The paper's building blocks as serializable Keras 3 layers (keras.ops only, any backend).

Helpers the layers share (`LayerNormalization`, `padding_mask`, `causal_mask`,
`positional_encoding`) are importable from their modules (`layers.normalization`, `layers.masks`,
`layers.embedding`).
"""

from keras_transformer.layers.attention import MultiHeadAttention, scaled_dot_product_attention
from keras_transformer.layers.decoder import TransformerDecoder, TransformerDecoderBlock
from keras_transformer.layers.embedding import SinusoidalPositionalEncoding, TokenEmbedding
from keras_transformer.layers.encoder import TransformerEncoder, TransformerEncoderBlock
from keras_transformer.layers.feed_forward import PositionwiseFeedForward

__all__ = [
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "SinusoidalPositionalEncoding",
    "TokenEmbedding",
    "TransformerDecoder",
    "TransformerDecoderBlock",
    "TransformerEncoder",
    "TransformerEncoderBlock",
    "scaled_dot_product_attention",
]
