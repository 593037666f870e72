"""Guided alignment (Garg et al. 2019; as OpenNMT-tf's and Marian's): a loss that teaches one
attention head the word alignments of the training pairs.

`Transformer.call` adds it (`add_loss`) in training when the batch carries the pairs' link
matrices (`x["alignment"]`, from data prepared with `data.train_alignments`) and the model was
given a `GuidedAlignment` (`keras_transformer.training.compile_model`, from
`train.guided_alignment_weight` > 0). The train steps add the model's losses to the
label-smoothed loss on every backend and strategy, so there is no other road for it.
"""

import dataclasses

from keras import ops

# The floor of an attention weight under the logarithm (a weight of 0, e.g. underflowed in
# bfloat16, must not give an infinite loss).
_FLOOR = 1e-9


@dataclasses.dataclass(frozen=True)
class GuidedAlignment:
    """The guided alignment loss's settings: its `weight` and the decoder `layer` (a
    non-negative index) whose cross-attention head 0 it teaches."""

    weight: float
    layer: int


def resolve_alignment_layer(layers, layer):
    """The non-negative index of decoder layer `layer` (negative: from the end; -2 in a
    one-layer decoder: its only layer) of a `layers`-layer decoder: the layer
    `export.alignment_layer` names, for the export's alignments and for guided alignment."""
    if layer == -2 and layers == 1:
        return 0
    if not -layers <= int(layer) < layers:
        raise ValueError(f"alignment_layer {layer} is not a layer of a {layers}-layer decoder")
    return int(layer) % layers


def guided_alignment_loss(attention, links):
    """The mean over the target pieces that have a link of the cross-entropy between the
    reference alignment and the attention: `-sum_s r[t, s] log a[t, s]`, with `r` each row of
    `links` normalised to sum to 1; rows without a link (EOS, padding, unaligned pieces) count
    for nothing (0 when no row has one).

    Args:
        attention: float `[batch, target, source]`, one head's attention weights (rows sum to
            1 over the real source pieces).
        links: float `[batch, target, source]`, 1 (or any positive weight) where target piece t
            is aligned to source piece s (`data.pipeline`'s link matrices).

    Returns:
        A float32 scalar.
    """
    links = ops.cast(links, "float32")
    totals = ops.sum(links, axis=-1)  # [batch, target]
    reference = ops.divide_no_nan(links, totals[..., None])
    log_attention = ops.log(ops.maximum(ops.cast(attention, "float32"), _FLOOR))
    per_piece = -ops.sum(reference * log_attention, axis=-1)  # [batch, target]
    aligned = ops.cast(totals > 0, "float32")
    return ops.divide_no_nan(ops.sum(per_piece * aligned), ops.sum(aligned))
