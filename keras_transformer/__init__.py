"""keras-transformer: the Transformer of "Attention Is All You Need" for TensorFlow/Keras 3."""

__version__ = "0.1.0"
