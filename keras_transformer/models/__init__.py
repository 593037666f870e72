"""Models built from the library's layers: the `Transformer` and its builder from a config."""

from keras_transformer.models.transformer import Transformer, build_transformer

__all__ = ["Transformer", "build_transformer"]
