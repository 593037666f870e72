"""Beam search's decoding caches held once per input and shared by its beams (fast path
`shared_beam_caches`), and the attention on them.

With per-beam caches (`Transformer.init_cache`, the plain form) beam search repeats every cache
for each beam and reorders them with the beams at every step. Here each input's self-attention
cache has one slot per beam: each step writes each hypothesis's keys/values into the slot of its
beam, and a mask lets every hypothesis attend only to the keys its own history wrote (its
ancestors' slots at earlier positions). The encoder keys/values are held once per input. So no
cache is repeated per beam or reordered (`SharedByBeams` keeps the search's hands off them).
In a TensorFlow graph outside XLA the self-attention caches also start short (16 positions) and
double whenever a step reaches their end, up to the output buffer: each step's attention reads the
positions written so far, rounded up, not the whole buffer (sized for the longest output the
request allows). Every attention row here has an allowed key (a hypothesis sees its own
position, an input its own EOS), so the attention skips zeroing rows without one.

The public layers keep their one cache form, `(keys, values)`: this module runs the model's
decoder step protocol (`Transformer.embed_target`, `Transformer.decoder_step`) with attentions of
its own on these caches, which project and merge the heads with the layers' weights
(`MultiHeadAttention.attend_with`).
"""

import functools
from typing import Any, NamedTuple

from keras import ops

from keras_transformer.layers.attention import (
    growing_cache_length,
    grown_caches,
    scaled_dot_product_attention,
    write_cache,
)


class SharedByBeams(NamedTuple):
    """Marks the part of a step function's state held once per input, not once per beam: beam
    search neither repeats it for each beam nor reorders it with the beams (e.g. key/value caches
    the beams of one input share, `BeamCache`)."""

    value: Any


class BeamCache(NamedTuple):
    """A decoding cache held once per input and shared by its `beams` beam-search hypotheses.

    The attention's query rows are `batch * beams` (the beams of one input adjacent), one
    position each; every row attends to the keys/values of its input that `mask` allows. With
    it, beam search never reorders the caches (fast path `shared_beam_caches`).
    - Self-attention (with `cache_update_index`): `keys`, `values` `[batch, heads * beams,
      max_len, d]`, beam slot `i` of head `h` at row `h * beams + i`: each step writes the
      keys/values of the hypothesis in slot `i` there. `mask` bool `[batch, 1, beams,
      beams * max_len]`: True at (slot `s`, position `j`) when slot `s` holds, at position `j`,
      the querying hypothesis's own key (written by it or by its ancestor at step `j`).
    - Cross-attention: `keys`, `values` `[batch, heads, s_len, d]` (from
      `compute_key_value_cache`, not repeated per beam); `mask` bool `[batch, 1, beams, s_len]`.
    The mask stands for the attention mask and the causal mask.
    """

    keys: Any
    values: Any
    mask: Any


def _group_beams(x, beams):
    """`[batch * beams, heads, 1, d]` -> `[batch, heads, beams, d]`."""
    shape = ops.shape(x)
    x = ops.reshape(x, (-1, beams, shape[1], shape[3]))  # [batch, beams, heads, d]
    return ops.transpose(x, (0, 2, 1, 3))


def _ungroup_beams(x):
    """`[batch, heads, beams, d]` -> `[batch * beams, heads, 1, d]`."""
    shape = ops.shape(x)
    x = ops.transpose(x, (0, 2, 1, 3))  # [batch, beams, heads, d]
    return ops.reshape(x, (-1, shape[1], 1, shape[3]))


def _per_head(x, heads):
    """`[batch, heads * n, length, d]` -> `[batch, heads, n * length, d]` (a view)."""
    shape = ops.shape(x)
    return ops.reshape(x, (-1, heads, (shape[1] // heads) * shape[2], shape[3]))


def _attend(projections, dropout_fn, cache, cache_update_index, kernels, in_place):
    """Attention of `batch * beams` one-position queries on a `BeamCache`.

    `projections`: `(q, k, v)` for self-attention (this step's keys/values), `(q,)` for
    cross-attention, each `[batch * beams, heads, 1, d]`. Returns `(output [batch * beams,
    heads, 1, d_v], weights [batch, heads, beams, keys], cache)`, with the step's keys/values
    written into a self-attention cache (with the layer's `kernels`; `in_place`: into its
    buffers, which the search gives up).
    """
    q = projections[0]
    beams, heads = cache.mask.shape[2], q.shape[1]
    if cache_update_index is not None:  # self-attention: each beam's keys/values into its slot
        writes = []
        for buffer, x in zip((cache.keys, cache.values), projections[1:]):
            x = _group_beams(x, beams)  # [batch, heads, beams, d]
            x = ops.reshape(x, (-1, heads * beams, 1, x.shape[-1]))  # row h * beams + i
            writes.append(write_cache(buffer, x, cache_update_index, kernels, in_place))
        cache = BeamCache(*writes, cache.mask)
    keys, values = _per_head(cache.keys, heads), _per_head(cache.values, heads)
    # Every row has a key: a hypothesis sees its own position, an input its own EOS at least.
    out, weights = scaled_dot_product_attention(
        _group_beams(q, beams), keys, values, cache.mask, dropout_fn, zero_empty_rows=False
    )  # [batch, heads, beams, d_v]
    return _ungroup_beams(out), weights, cache


def beam_attention(layer, query, cache, cache_update_index=None, in_place=False, fused=None):
    """`(output [batch * beams, 1, dim], weights, cache)` of the `MultiHeadAttention` `layer`
    for `query` `[batch * beams, 1, dim]` on a `BeamCache`: self-attention (with
    `cache_update_index`) projects the query, key and value (`fused`: the layer's
    `fused_weights()`, computed once for all steps) and writes the step's keys/values into the
    cache (`in_place`: into its buffers, which the caller gives up); cross-attention projects
    the query only."""
    self_attention = cache_update_index is not None
    attend = functools.partial(
        _attend,
        cache=cache,
        cache_update_index=cache_update_index,
        kernels=layer.kernels,
        in_place=in_place,
    )
    return layer.attend_with(attend, query, keys_values=self_attention, fused=fused)


def _decode_step(model, target_ids, cache_index, cache, in_place, fused):
    """`model.decode_step` on per-layer `BeamCache`s (`cache["self_attention"]`,
    `cache["cross_attention"]`): `target_ids` has `batch * beams` rows; the caches' masks stand
    for the source mask; `fused` the self-attentions' `fused_weights()`. Returns `(logits,
    per-layer self-attention BeamCaches)`."""
    self_attentions, cross_attentions = [], []
    caches = zip(model.decoder.blocks, cache["self_attention"], cache["cross_attention"], fused)
    for block, self_cache, cross_cache, weights in caches:
        attention = _on_beam_cache(block.self_attention, self_cache, cache_index, in_place, weights)
        self_attentions.append(attention)
        cross_attentions.append(_on_beam_cache(block.cross_attention, cross_cache))
    y = model.embed_target(target_ids, False, start_index=cache_index)
    return model.decoder_step(
        y, self_attentions, cross_attentions, cache.get("output_kernel"), cache.get("output_bias")
    )


def _on_beam_cache(layer, cache, cache_update_index=None, in_place=False, fused=None):
    """An attention function of `Transformer.decoder_step`'s protocol: `beam_attention` of
    `layer` on the `BeamCache` `cache`, `(output, weights, cache)` for self-attention (with
    `cache_update_index`), `(output, weights)` for cross-attention."""
    if cache_update_index is None:
        return lambda h: beam_attention(layer, h, cache)[:2]
    return lambda h: beam_attention(layer, h, cache, cache_update_index, in_place, fused)


def shared_beam_decoder(
    model, encoder_output, source_mask, max_length, beams, in_place=False, output_ids=None
):
    """The decoding caches of `model` for `beams` beams per input, held once per input.

    Returns `(decode, self_attention)`: `self_attention` the initial self-attention caches, per
    layer `(keys, values)` `[batch, heads * beams, max_length, d]` zeros (in a TensorFlow graph
    outside XLA `layers.attention.growing_cache_length(max_length)` long: `decode` doubles them
    when full, so each step reads the positions written so far, rounded up); `decode(target_ids,
    index, history, self_attention) -> (logits, self_attention)` decodes `target_ids`
    `[batch * beams, 1]` at position `index`, where `history` int32 `[batch * beams,
    max_length]` holds for each hypothesis the beam slot of its key/value at each position (its
    own slot at `index`, its ancestors' before). The encoder keys/values (`[batch, heads, s_len,
    d]`, `source_mask` `[batch, s_len]` applied) and the tied embedding are fixed in `decode`.
    With `in_place` (the search's kernel `inplace_cache_writes`) each step writes its keys and
    values into the caches' own buffers: the caller must not read a cache it passed again.
    `output_ids` (a vocabulary shortlist, `init_cache`'s): the logits cover only those ids.
    """
    start = growing_cache_length(max_length)  # None: one length throughout
    length = max_length if start is None else start
    cache = model.init_cache(encoder_output, length, model.num_heads * beams, output_ids)
    self_attention = cache.pop("self_attention")  # per layer ([batch, h * k, length, d], same)
    batch, s_len = ops.shape(source_mask)[0], ops.shape(source_mask)[1]
    source_mask = ops.reshape(ops.cast(source_mask, "bool"), (-1, 1, 1, s_len))
    source_mask = ops.broadcast_to(source_mask, (batch, 1, beams, s_len))  # [batch, 1, k, s_len]
    cache["cross_attention"] = [
        BeamCache(keys, values, source_mask) for keys, values in cache["cross_attention"]
    ]  # per layer, keys/values [batch, h, s_len, d]
    positions = ops.arange(max_length, dtype="int32")  # [buffer]
    slot_ids = ops.reshape(ops.arange(beams, dtype="int32"), (1, 1, beams, 1))
    # The self-attentions' query/key/value kernels concatenated once, not at every step.
    fused = [block.self_attention.fused_weights() for block in model.decoder.blocks]

    def decode(target_ids, index, history, self_attention):
        if start is not None:  # growing caches: long enough for position `index`
            self_attention = grown_caches(self_attention, index, max_length)
            length = ops.shape(self_attention[0][0])[2]
            history, written = history[:, :length], positions[:length]
        else:
            length, written = max_length, positions
        batch = -1 if history.shape[0] is None else history.shape[0] // beams  # kept if known
        own = ops.equal(ops.reshape(history, (batch, beams, 1, length)), slot_ids)
        own = ops.logical_and(own, ops.less_equal(written, index))  # written so far
        mask = ops.reshape(own, (batch, 1, beams, beams * length))  # [batch, 1, k, k * length]
        layers = [BeamCache(keys, values, mask) for keys, values in self_attention]
        step_cache = {**cache, "self_attention": layers}
        logits, new = _decode_step(model, target_ids, index, step_cache, in_place, fused)
        return logits, [(c.keys, c.values) for c in new]

    return decode, self_attention
