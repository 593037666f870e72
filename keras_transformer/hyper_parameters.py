"""The model's hyper-parameters, declared once: each one's name, default and roles.

This module imports nothing of the package nor Keras, so that both sides of the design's rule
read it: the layers (which never see the config) and the config. The config's `model:` section
(`keras_transformer.config.ModelConfig`) has these keys, in this order, with these defaults (it
adds each key's help and valid values); the encoder and decoder blocks' and stacks' arguments
of these names default to these values (`BLOCK`); `keras_transformer.models.Transformer` takes
them all as keyword arguments and `DecoderOnlyTransformer` those it has (`DECODER_ONLY`); a
fine-tuned model must keep its parent's `WEIGHTS`.
"""

import dataclasses
from typing import Optional


def _declare(default, *, block=False, decoder_only=True, weights=True):
    """A hyper-parameter: its `default` and its roles, kept in the field's metadata.

    block: an argument of every encoder and decoder block (`keras_transformer.layers`).
    decoder_only: the decoder-only language model has it too.
    weights: it shapes the weights or gives them their meaning; False for what only regularises
        training (the dropouts), which a fine-tuned model may change.
    """
    roles = {"block": block, "decoder_only": decoder_only, "weights": weights}
    return dataclasses.field(default=default, metadata=roles)


@dataclasses.dataclass(frozen=True)
class ModelHyperParameters:
    """The model's hyper-parameters with their defaults (the paper's base model) and roles
    (`_declare`). `ModelHyperParameters.d_model` is a default; an instance, a set of values."""

    num_layers: int = _declare(6)
    num_encoder_layers: Optional[int] = _declare(None, decoder_only=False)
    num_decoder_layers: Optional[int] = _declare(None, decoder_only=False)
    d_model: int = _declare(512)
    num_heads: int = _declare(8, block=True)
    d_ff: int = _declare(2048, block=True)
    dropout: float = _declare(0.1, block=True, weights=False)
    attention_dropout: float = _declare(0.0, block=True, weights=False)
    activation_dropout: float = _declare(0.0, block=True, weights=False)
    token_dropout: float = _declare(0.0, decoder_only=False, weights=False)
    activation: str = _declare("relu", block=True)
    norm_first: bool = _declare(False, block=True)
    share_embeddings: bool = _declare(True, decoder_only=False)
    layer_norm_epsilon: float = _declare(1e-6, block=True)


def names(**roles):
    """The names of the hyper-parameters with the given `roles` (e.g. `block=True`), in the
    order of their declaration."""
    return tuple(
        f.name
        for f in dataclasses.fields(ModelHyperParameters)
        if all(f.metadata[role] == wanted for role, wanted in roles.items())
    )


# Every hyper-parameter: the keys of the config's `model:` section, in its order.
ALL = names()
# The blocks' arguments among them (the blocks add `kernel_initializer` and `kernels`).
BLOCK = names(block=True)
# Those of the decoder-only language model.
DECODER_ONLY = names(decoder_only=True)
# Those a fine-tuned model must keep from its parent.
WEIGHTS = names(weights=True)
# `{name: default}`.
DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelHyperParameters)}
