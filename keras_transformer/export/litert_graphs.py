"""The two graphs of a LiteRT export, written with the model's own layers: the encoder (source
ids to each decoder layer's cross-attention keys and values) and one decoder step.

The step takes no cache it must write. Each decoder layer's self-attention keys and values live
in the runtime's buffers, shared by the beams of a sentence as in
`keras_transformer.decoding.beam_cache` (one slot per beam; an additive bias lets each
hypothesis see only the keys its own history wrote); the step attends to them and to its own
new key, and returns the new keys and values, which the runtime writes into the slots. So no
cache is copied into or out of the graph, and beams are reordered by reordering a small table of
slot ids in the runtime, not the caches. The cross-attention keys and values are computed once
per sentence by the encoder graph and shared by its beams.

Shapes (`B` sentences, `k` beams, `H` heads, `d` head size, `T` the cache's positions, `S`
source tokens, `L` decoder layers; only `B`, `T` and `S` vary; the runtime grows `T` as the
output grows, `keras_transformer.litert.graphs`):

- encoder: `source_ids` int32 `[B, S]` -> `cross_keys_{l}`, `cross_values_{l}` `[B, H, S, d]`.
- step: `ids` int32 `[B * k]` (each hypothesis's last token), `position` int32 `[1]`,
  `self_keys_{l}`, `self_values_{l}` `[B, H, k * T, d]` (slot `s`, position `t` at `s * T +
  t`), `self_bias` float32 `[B, 1, k, k * T]` (0 where the hypothesis may attend, -1e9
  elsewhere), `cross_keys_{l}`, `cross_values_{l}`, `cross_bias` float32 `[B, 1, 1, S]` ->
  `top_log_probs` float32 `[B * k, K]` (best first), `top_ids` int32 `[B * k, K]`,
  `eos_log_probs` float32 `[B * k]`, `new_keys_{l}`, `new_values_{l}` `[B, H, k, d]`.

- constrained step (`constrained_step_function`, an export made for lexical constraints): the
  step's inputs and `wanted_ids` int32 `[B * k, W]` (each hypothesis's next piece of each of
  its constraints) -> the step's outputs, `K = 2 * k + 1` (a hypothesis refused EOS still has
  its best `2k` others), and `wanted_log_probs` float32 `[B * k, W]`, their log-probabilities.

- masked shortlist step (`step_function(..., masked=True)`, the shortlist step of
  `dynamic_int8` exports made before the hidden step): the step's inputs and `output_mask`
  float32 `[vocab]` (0 at a batch's shortlist, NEG_INF elsewhere, added to the logits) -> the
  same outputs, the log-softmax and the top ones over the shortlist alone; constrained
  (`constrained_step_function(..., masked=True)`, a `dynamic_int8` export with both): also
  `wanted_ids`, target ids, after `output_mask`, which is `[B * k, vocab]` there (one mask per
  hypothesis, each row's own shortlist: `"row_mask"` in the export's metadata; exports made
  before it take the batch's `[vocab]`).

- hidden step (`hidden_step_function`, a `dynamic_int8` export with a vocabulary shortlist):
  the step's inputs -> `new_keys_{l}`, `new_values_{l}` and `hidden` float32 `[B * k,
  d_model]`, the decoder's output before the projection; the runtime projects it onto a
  batch's shortlist with an int8 model it writes for the batch
  (`keras_transformer.litert.projection`) in front of the gathered head
  (`gathered_head_function`): `banned` float32 `[B * k, n]` (the columns' logits, NEG_INF at
  the padding and at padding's and BOS's columns), `special` float32 `[B * k, 2]` (padding's
  and BOS's own logits), `output_ids` int32 `[n]` -> the step's `top_log_probs`, `top_ids`
  (target ids), `eos_log_probs`.

- shortlist step (`shortlist_step_function`, a float export with a vocabulary shortlist): the
  step's inputs and `output_ids` int32 `[n]` (a batch's shortlist), `output_kernel` float32
  `[d_model, n]` (the projection's columns of those ids, made once per batch by the runtime
  from the export's `shortlist_output.npz`), `output_bias` float32 `[n]` (the untied
  projection's biases, 0 when tied, at the real columns; NEG_INF at the padding; the runtime
  resizes it to `[B * k, n]`, each row's own biases, NEG_INF outside its own shortlist) -> the same
  outputs, the projection and the normaliser over those `n` columns only, `top_ids` the
  target ids of the best columns.

- constrained shortlist step (`shortlist_constrained_step_function`, an export with both): the
  shortlist step's inputs and `wanted_ids` int32 `[B * k, W]`, each a **column** of
  `output_ids` -> the constrained step's outputs over the shortlist's columns.

The log-probabilities are the model's log-softmax with padding and BOS made impossible, as in
`keras_transformer.decoding.search`; only the top `K` of each row leave the graph (the search
needs no more: a sentence's best `2k` candidates are among its rows' best `2k` each).
"""

import math

import numpy as np
from keras import ops

from keras_transformer.decoding.top_k import TOP_K_BLOCK, top_k_of_blocks
from keras_transformer.decoding.top_k import blocked_top_k as _blocked_top_k
from keras_transformer.search_rules import NEG_INF


def encoder_function(model):
    """`fn(source_ids) -> {cross_keys_l, cross_values_l}` for `model` (a `Transformer`)."""

    def encoder(source_ids):
        encoder_output, _ = model.encode(source_ids, training=False)
        outputs = {}
        for i, block in enumerate(model.decoder.blocks):
            keys, values = block.cross_attention.compute_key_value_cache(encoder_output)
            outputs[f"cross_keys_{i}"], outputs[f"cross_values_{i}"] = keys, values
        return outputs

    return encoder


def _heads(x, beams, heads):
    """`[B * k, H * d]` -> `[B, H, k, d]`."""
    x = ops.reshape(x, (-1, beams, heads, x.shape[-1] // heads))
    return ops.transpose(x, (0, 2, 1, 3))


def _merge(x):
    """`[B, H, k, d]` -> `[B * k, H * d]`."""
    x = ops.transpose(x, (0, 2, 1, 3))
    return ops.reshape(x, (-1, x.shape[2] * x.shape[3]))


def _self_attention(layer, h, keys, values, bias, beams):
    """One step of `layer`'s self-attention on the shared slots: `(output, (new_keys,
    new_values))`; the step's own key/value joins the cached ones without being written."""
    heads = layer.num_heads
    q = _heads(layer.query_dense(h), beams, heads)
    q = q * (1.0 / math.sqrt(layer.key_dim))
    new_keys = _heads(layer.key_dense(h), beams, heads)  # [B, H, k, d]
    new_values = _heads(layer.value_dense(h), beams, heads)
    cached = ops.einsum("bhqd,bhkd->bhqk", q, keys) + bias  # [B, H, k, k * T]
    own = ops.sum(q * new_keys, axis=-1, keepdims=True)  # [B, H, k, 1]
    weights = ops.softmax(ops.concatenate([cached, own], axis=-1), axis=-1)
    out = ops.matmul(weights[..., :-1], values) + weights[..., -1:] * new_values
    return layer.output_dense(_merge(out)), (new_keys, new_values)


def _cross_attention(layer, h, keys, values, bias, beams):
    """`layer`'s cross-attention of the `k` beams of each sentence on its encoder keys/values."""
    q = _heads(layer.query_dense(h), beams, layer.num_heads)
    q = q * (1.0 / math.sqrt(layer.key_dim))
    weights = ops.softmax(ops.einsum("bhqd,bhkd->bhqk", q, keys) + bias, axis=-1)
    return layer.output_dense(_merge(ops.matmul(weights, values)))


def _gather_rows(params, indices):
    """`params[r, indices[r, j]]` along axis 1, as one batched GATHER once converted."""
    import tensorflow as tf  # the export's backend

    return tf.gather(params, indices, axis=1, batch_dims=1)


def blocked_top_k(x, k, block=TOP_K_BLOCK):
    """`ops.top_k(x, k)` over `[rows, vocab]` in two passes (`decoding.top_k.blocked_top_k`:
    the same values and indices), its gathers as LiteRT's batched GATHER."""
    return _blocked_top_k(x, k, block, gather=_gather_rows)


def columns_top_k(x, k, block=TOP_K_BLOCK):
    """`blocked_top_k` over a shortlist's columns `[rows, n]`, whose number is known only at
    run time: `n` must be a multiple of `block` of at least `k` blocks (the runtime pads a
    batch's shortlist so: the export's `shortlist.column_block`)."""
    blocks = ops.reshape(x, (ops.shape(x)[0], -1, block))
    return top_k_of_blocks(blocks, k, gather=_gather_rows)


def quantized_rows(matrix):
    """`(int8 [n, m], float32 [n])`: each row of `matrix` scaled to [-127, 127] (symmetric,
    per row, as the converter quantizes a fully-connected layer's weights per output)."""
    matrix = np.asarray(matrix, "float32")
    scale = np.maximum(np.abs(matrix).max(axis=1), 1e-12) / 127.0
    return np.round(matrix / scale[:, None]).astype("int8"), scale.astype("float32")


SCALE_STEPS = 2**30  # the largest row scale, in `fixed_point_scales`' steps


def fixed_point_scales(scale):
    """`(int32 [n], unit)`: the float32 row scales `scale` as whole multiples of `unit` (the
    largest is `SCALE_STEPS` units), so that `steps * unit` gives them back.

    The converter's `Optimize.DEFAULT` quantizes every float32 constant of 1,024 elements or
    more to int8 with one scale for the whole tensor: a `[vocab]` float32 scale vector would
    come back with 127 levels shared by all rows, and a row 100 times smaller than the largest
    would lose most of its scale. Integer constants are left alone. A scale `r` times the largest
    comes back to float32's rounding while `r >= 2**-6`, and within `2**-31 / r` below that.
    """
    scale = np.asarray(scale, "float64")
    unit = max(float(scale.max(initial=0.0)), 1e-30) / SCALE_STEPS
    return np.round(scale / unit).astype("int32"), unit


def _embedding(model, quantized):
    """`embed(ids [B * k], position [1]) -> [B * k, d_model]`: the decoder's input, made by
    `Transformer.embed_target`. `quantized` (from `quantized_rows`): the rows are looked up in
    int8 and only they are dequantized (a table the converter quantized would be dequantized
    whole at every step), with their own scales (`fixed_point_scales`) times the embedding's
    `output_scale`, and given to `embed_target` as the ids' vectors."""
    lookup = None
    if quantized is not None:
        steps, unit = fixed_point_scales(quantized[1])
        table, steps = ops.convert_to_tensor(quantized[0]), ops.convert_to_tensor(steps)
        unit = unit * model.target_embedding.output_scale

        def lookup(ids):  # [B * k, 1, d_model]
            rows = ops.cast(ops.take(table, ids, axis=0), "float32")
            row_scales = ops.cast(ops.take(steps, ids, axis=0), "float32") * unit
            return ops.expand_dims(rows * ops.expand_dims(row_scales, 1), 1)

    def embed(ids, position):
        if lookup is None:
            x = model.embed_target(ops.expand_dims(ids, 1), False, position[0])
        else:
            x = model.embed_target(None, False, position[0], token_vectors=lookup(ids))
        return ops.reshape(x, (-1, model.d_model))

    return embed


def _attentions(model, beams, self_bias, cross_bias, caches):
    """`(self_attentions, cross_attentions)`: the decoder step protocol's functions
    (`Transformer.decoder_step`) on the step's inputs."""
    self_attentions, cross_attentions = [], []
    for i, block in enumerate(model.decoder.blocks):
        self_kv = caches[f"self_keys_{i}"], caches[f"self_values_{i}"]
        cross_kv = caches[f"cross_keys_{i}"], caches[f"cross_values_{i}"]

        def self_attention(h, layer=block.self_attention, kv=self_kv):
            y, new = _self_attention(layer, h, *kv, self_bias, beams)
            return y, None, new

        def cross_attention(h, layer=block.cross_attention, kv=cross_kv):
            return _cross_attention(layer, h, *kv, cross_bias, beams), None

        self_attentions.append(self_attention)
        cross_attentions.append(cross_attention)
    return self_attentions, cross_attentions


def _new_caches(new):
    """`{new_keys_l, new_values_l}` of the self-attentions' returned caches."""
    outputs = {}
    for i, (keys, values) in enumerate(new):
        outputs[f"new_keys_{i}"], outputs[f"new_values_{i}"] = keys, values
    return outputs


def _scored_step(model, beams, top_k, banned_ids, eos_id, quantized_embedding):
    """`fn(ids, position, self_bias, cross_bias, caches, output_mask=None) -> (outputs, banned
    logits [B * k, vocab], normaliser [B * k, 1])`: `step_function`'s step (`output_mask`: the
    masked shortlist step's), and what the log-probability of any id is made of (`banned
    logits - normaliser`)."""
    vocab = model.vocab_size
    ban = [NEG_INF if i in banned_ids else 0.0 for i in range(vocab)]
    banned_columns = sorted(set(int(i) for i in banned_ids))
    embed = _embedding(model, quantized_embedding)

    def step(ids, position, self_bias, cross_bias, caches, output_mask=None):
        attentions = _attentions(model, beams, self_bias, cross_bias, caches)
        x = embed(ids, position)  # [B * k, d_model]
        logits, new = model.decoder_step(x, *attentions)  # [B * k, vocab]
        outputs = _new_caches(new)
        if output_mask is None:
            banned = logits + ops.convert_to_tensor(ban)
            normaliser = ops.logsumexp(logits, axis=-1, keepdims=True)  # log-softmax's, over all
        else:  # ids outside the shortlist: out of the normaliser too
            banned, normaliser = _masked_scores(logits, output_mask, ban, banned_columns)
            logits = banned  # at EOS, never banned, the masked logit
        top_logits, top_ids = blocked_top_k(banned, top_k)
        outputs["top_log_probs"] = top_logits - normaliser
        outputs["top_ids"] = ops.cast(top_ids, "int32")
        outputs["eos_log_probs"] = logits[:, eos_id] - normaliser[:, 0]
        return outputs, banned, normaliser

    return step


def _masked_scores(logits, output_mask, ban, banned_columns):
    """`(banned logits, normaliser)` of the masked shortlist step with one vocabulary-wide add
    (not two): the mask and the ban summed first (`[vocab]`) and added to the logits at once;
    the normaliser, the log-sum-exp of the masked logits with the banned ids in (as in the step
    without a mask), is made of the banned logits' and the banned ids' own masked logits
    (`[B * k, len(banned_columns)]`)."""
    banned = logits + (output_mask + ops.convert_to_tensor(ban))  # [B * k, vocab]
    columns = ops.convert_to_tensor(banned_columns, dtype="int32")
    axis = 1 if len(output_mask.shape) == 2 else 0  # 1: a mask per row, `[B * k, vocab]`
    special = ops.take(logits, columns, axis=1) + ops.take(output_mask, columns, axis=axis)
    parts = ops.concatenate([ops.logsumexp(banned, axis=-1, keepdims=True), special], axis=-1)
    return banned, ops.logsumexp(parts, axis=-1, keepdims=True)


def step_function(model, beams, top_k, banned_ids, eos_id, quantized_embedding=None, masked=False):
    """`fn(ids, position, self_bias, cross_bias, caches) -> outputs` (module docstring) for
    `model` with `beams` hypotheses per sentence (`quantized_embedding`: see `_embedding`);
    `masked`: the masked shortlist step, `fn(..., caches, output_mask)`."""
    scored = _scored_step(model, beams, top_k, banned_ids, eos_id, quantized_embedding)

    def step(ids, position, self_bias, cross_bias, caches):
        return scored(ids, position, self_bias, cross_bias, caches)[0]

    def masked_step(ids, position, self_bias, cross_bias, caches, output_mask):
        return scored(ids, position, self_bias, cross_bias, caches, output_mask)[0]

    return masked_step if masked else step


def constrained_step_function(
    model, beams, top_k, banned_ids, eos_id, quantized_embedding=None, masked=False
):
    """`fn(ids, position, self_bias, cross_bias, caches, wanted_ids) -> outputs`: the
    constrained step (module docstring), `step_function`'s outputs and `wanted_log_probs`
    float32 `[B * k, W]`, the log-probabilities of `wanted_ids` int32 `[B * k, W]` (each row's
    next constraint pieces), computed as the top ones are (padding and BOS impossible);
    `masked`: over a masked shortlist, `fn(..., caches, output_mask, wanted_ids)`, the wanted
    ids target ids (the batch's shortlist holds every constraint piece)."""
    import tensorflow as tf  # the export's backend; a batched GATHER converts to one op

    scored = _scored_step(model, beams, top_k, banned_ids, eos_id, quantized_embedding)

    def wanted_step(found, wanted_ids):
        outputs, banned, normaliser = found
        wanted = tf.gather(banned, wanted_ids, axis=1, batch_dims=1)  # [B * k, W]
        outputs["wanted_log_probs"] = wanted - normaliser
        return outputs

    def step(ids, position, self_bias, cross_bias, caches, wanted_ids):
        return wanted_step(scored(ids, position, self_bias, cross_bias, caches), wanted_ids)

    def masked_step(ids, position, self_bias, cross_bias, caches, output_mask, wanted_ids):
        found = scored(ids, position, self_bias, cross_bias, caches, output_mask)
        return wanted_step(found, wanted_ids)

    return masked_step if masked else step


def _scored_shortlist_step(model, beams, top_k, banned_ids, eos_id, quantized_embedding):
    """`fn(ids, position, self_bias, cross_bias, caches, output_ids, output_kernel, output_bias)
    -> (outputs, banned logits [B * k, n], normaliser [B * k, 1])`: `shortlist_step_function`'s
    step, and what the log-probability of any column is made of (`banned logits -
    normaliser`)."""
    embed = _embedding(model, quantized_embedding)

    def step(ids, position, self_bias, cross_bias, caches, output_ids, output_kernel,
             output_bias):  # fmt: skip
        attentions = _attentions(model, beams, self_bias, cross_bias, caches)
        x = embed(ids, position)  # [B * k, d_model]
        logits, new = model.decoder_step(x, *attentions, output_kernel)  # [B * k, n]
        head, banned, normaliser = shortlist_head(
            logits, output_ids, output_bias, top_k, banned_ids, eos_id
        )
        return {**_new_caches(new), **head}, banned, normaliser

    return step


def shortlist_head(logits, output_ids, output_bias, top_k, banned_ids, eos_id):
    """The shortlist step's outputs from its logits `[B * k, n]` over the columns `output_ids`:
    `({"top_log_probs", "top_ids", "eos_log_probs"}, banned logits [B * k, n], normaliser
    [B * k, 1])` (`shortlist_step_function`'s rules: `output_bias` added, padding out of the
    normaliser, `banned_ids` never among the top ones, `top_ids` target ids)."""
    logits = logits + output_bias  # padding columns: out of the normaliser
    banned = ops.zeros(ops.shape(output_ids), "bool")
    for token in banned_ids:
        banned = ops.logical_or(banned, ops.equal(output_ids, token))
    banned = logits + ops.where(banned, NEG_INF, 0.0)
    top_logits, top_columns = columns_top_k(banned, top_k)
    normaliser = ops.logsumexp(logits, axis=-1, keepdims=True)
    outputs = _column_scores(top_logits, top_columns, logits, normaliser, output_ids, eos_id)
    return outputs, banned, normaliser


def _column_scores(top_logits, top_columns, logits, normaliser, output_ids, eos_id):
    """The step's outputs over a shortlist's columns `output_ids`: the best columns' logits
    `top_logits` minus the `normaliser` `[B * k, 1]`, their target ids, and EOS's
    log-probability (its column of `logits`, where EOS is never banned)."""
    outputs = {"top_log_probs": top_logits - normaliser}
    outputs["top_ids"] = ops.cast(ops.take(output_ids, top_columns, axis=0), "int32")
    eos_column = ops.argmax(ops.cast(ops.equal(output_ids, eos_id), "int32"))
    eos = ops.take(logits, ops.expand_dims(eos_column, 0), axis=1)[:, 0]
    outputs["eos_log_probs"] = eos - normaliser[:, 0]
    return outputs


def hidden_step_function(model, beams, quantized_embedding=None):
    """`fn(ids, position, self_bias, cross_bias, caches) -> outputs`: the step's decoder stack
    alone, for a `dynamic_int8` export's gathered shortlist head (`export.litert.
    shortlist_head`): the new keys and values and `hidden` float32 `[B * k, d_model]`, the
    decoder's output before the projection (`Transformer.decoder.step`), which the runtime
    projects onto a batch's shortlist and gives to `gathered_head_function`'s graph."""
    embed = _embedding(model, quantized_embedding)

    def step(ids, position, self_bias, cross_bias, caches):
        attentions = _attentions(model, beams, self_bias, cross_bias, caches)
        hidden, _, new = model.decoder.step(embed(ids, position), *attentions, training=False)
        return {**_new_caches(new), "hidden": hidden}

    return step


def gathered_head_function(top_k, eos_id):
    """`fn(banned [B * k, n], special [B * k, s], output_ids [n]) -> outputs`: the shortlist
    step's outputs (`shortlist_head`'s `top_log_probs`, `top_ids`, `eos_log_probs`) from
    logits projected elsewhere (the runtime's int8 product of a batch's shortlist columns,
    `keras_transformer.litert.projection`): `banned` are the columns' logits with their biases
    and the ban added (NEG_INF at the padding and at the banned pieces), `special` the banned
    pieces' own logits (padding and BOS, in every shortlist: out of the top ones, in the
    normaliser, as `shortlist_head` keeps them). The normaliser takes the best column's logit
    (the top-k's first) as its shift, so the head reads the columns three times (the block
    maxima, the shifted exponentials, their sum) where `shortlist_head` reads them seven."""

    def head(banned, special, output_ids):
        top_logits, top_columns = columns_top_k(banned, top_k)
        shift = ops.maximum(top_logits[:, :1], ops.max(special, axis=-1, keepdims=True))
        total = ops.sum(ops.exp(banned - shift), axis=-1, keepdims=True)
        total = total + ops.sum(ops.exp(special - shift), axis=-1, keepdims=True)
        normaliser = shift + ops.log(total)
        return _column_scores(top_logits, top_columns, banned, normaliser, output_ids, eos_id)

    return head


def shortlist_step_function(model, beams, top_k, banned_ids, eos_id, quantized_embedding=None):
    """`fn(ids, position, self_bias, cross_bias, caches, output_ids, output_kernel, output_bias)
    -> outputs`: `step_function`'s step over a vocabulary shortlist. `output_ids` int32 `[n]`
    are the shortlist's target ids (`data.shortlist.batch_shortlist`), `output_kernel` float32
    `[d_model, n]` the projection's columns of them (`shortlist_output_rows`),
    `output_bias` float32 `[n]` the untied projection's biases (0 when tied) at the real
    columns and NEG_INF at the padding ones: the projection covers these columns alone, the
    log-softmax normalises over the real ones, padding and BOS are impossible, and `top_ids`
    are target ids (not columns). EOS must be one of the `output_ids`; `n` a multiple of
    `TOP_K_BLOCK` of at least `top_k` blocks (`columns_top_k`).

    The columns are an input rather than gathered in the graph: they are the same for every
    step of a batch, and gathering and dequantizing `n` rows at each step (LiteRT's GATHER,
    CAST and MUL run one thread, outside XNNPACK) cost more than the projection they save."""
    scored = _scored_shortlist_step(model, beams, top_k, banned_ids, eos_id, quantized_embedding)

    def step(ids, position, self_bias, cross_bias, caches, output_ids, output_kernel,
             output_bias):  # fmt: skip
        return scored(
            ids, position, self_bias, cross_bias, caches, output_ids, output_kernel, output_bias
        )[0]

    return step


def shortlist_constrained_step_function(
    model, beams, top_k, banned_ids, eos_id, quantized_embedding=None
):
    """`fn(ids, position, self_bias, cross_bias, caches, output_ids, output_kernel,
    output_bias, wanted_ids) -> outputs`: the constrained step over a vocabulary shortlist (an
    export with both), `shortlist_step_function`'s outputs and `wanted_log_probs` float32
    `[B * k, W]`. Its `wanted_ids` int32 `[B * k, W]` are **columns** of `output_ids` (the
    runtime maps each wanted target id to its column: the batch's shortlist holds every
    constraint piece)."""
    import tensorflow as tf  # the export's backend; a batched GATHER converts to one op

    scored = _scored_shortlist_step(model, beams, top_k, banned_ids, eos_id, quantized_embedding)

    def step(ids, position, self_bias, cross_bias, caches, output_ids, output_kernel,
             output_bias, wanted_ids):  # fmt: skip
        outputs, banned, normaliser = scored(
            ids, position, self_bias, cross_bias, caches, output_ids, output_kernel, output_bias
        )
        wanted = tf.gather(banned, wanted_ids, axis=1, batch_dims=1)  # [B * k, W]
        outputs["wanted_log_probs"] = wanted - normaliser
        return outputs

    return step


def shortlist_output_rows(model, quantization):
    """`{name: array}` the runtime makes a batch's shortlist columns from
    (`keras_transformer.litert.runtime`), written as `shortlist_output.npz`: the projection's
    rows, one per target id (the tied embedding, or the untied kernel transposed), `rows`
    float16 or float32 as `quantization` stores the weights (the shortlist step's
    `output_kernel`), or, `dynamic_int8`, int8 with their float32 `scales`, per row, as the
    converter quantizes the step's own projection (`quantized_rows`; the runtime's int8
    product of the columns, `keras_transformer.litert.projection`). Untied: also `bias`
    float32 `[vocab]`."""
    dense = model.output_projection
    if dense is None:
        matrix = np.asarray(model.target_embedding.embeddings, "float32")
    else:
        matrix = np.transpose(np.asarray(dense.kernel, "float32"))
    if quantization == "dynamic_int8":  # as the converter quantizes the step's projection
        rows, scales = quantized_rows(matrix)
        out = {"rows": rows, "scales": scales}
    else:
        out = {"rows": matrix.astype(quantization)}
    if dense is not None and dense.use_bias:
        out["bias"] = np.asarray(dense.bias, "float32")
    return out
