"""Models built from the library's layers."""

from keras_transformer.models.transformer import PRESETS, Transformer, build_transformer

__all__ = ["PRESETS", "Transformer", "build_transformer"]
