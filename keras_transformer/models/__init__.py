"""Models built from the library's layers: the `Transformer` and its builder from a config, and
the decoder-only `DecoderOnlyTransformer` language model."""

from keras_transformer.models.decoder_only import DecoderOnlyTransformer
from keras_transformer.models.transformer import Transformer, build_transformer

__all__ = ["DecoderOnlyTransformer", "Transformer", "build_transformer"]
