"""Models built from the library's layers."""

from keras_transformer.models.transformer import PRESETS, Transformer

__all__ = ["PRESETS", "Transformer"]
