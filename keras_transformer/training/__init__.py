"""Training: loss, metrics, schedule, callbacks, strategies and `train(config)`."""

from keras_transformer.training.losses import MaskedSparseCrossEntropy, masked_token_cross_entropy
from keras_transformer.training.metrics import MaskedAccuracy, Perplexity, TokenCount
from keras_transformer.training.schedules import TransformerSchedule
from keras_transformer.training.trainer import compile_model, make_optimizer

__all__ = [
    "MaskedAccuracy",
    "MaskedSparseCrossEntropy",
    "Perplexity",
    "TokenCount",
    "TransformerSchedule",
    "compile_model",
    "make_optimizer",
    "masked_token_cross_entropy",
]
