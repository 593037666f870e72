"""Decoding: greedy and beam search over a next-token function; `translate_ids` for the model."""

from keras_transformer.config import DecodingSettings
from keras_transformer.decoding.search import (
    beam_search,
    expand_to_beams,
    flatten_beams,
    gather_beams,
    greedy_search,
    length_penalty,
    translate_ids,
    unflatten_beams,
)

__all__ = [
    "DecodingSettings",
    "beam_search",
    "expand_to_beams",
    "flatten_beams",
    "gather_beams",
    "greedy_search",
    "length_penalty",
    "translate_ids",
    "unflatten_beams",
]
