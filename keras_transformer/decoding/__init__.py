"""Decoding: greedy and beam search over a next-token function; `translate_ids` for the model;
`language_model_step` for decoder-only language models; `DecodingSettings`, the one type that
carries the decoding settings.

The beam helpers (`expand_to_beams`, `gather_beams`, `length_penalty`, ...) are importable from
`keras_transformer.decoding.search`.
"""

from keras_transformer.config import DecodingSettings
from keras_transformer.decoding.language_model import language_model_step
from keras_transformer.decoding.search import beam_search, greedy_search, translate_ids

__all__ = [
    "DecodingSettings",
    "beam_search",
    "greedy_search",
    "language_model_step",
    "translate_ids",
]
