"""Greedy and beam search over a next-token log-probability function, and their use on the model.

Everything here is written with `keras.ops` and `ops.while_loop` so it runs on the TensorFlow and
JAX backends and compiles with XLA: all buffers have a fixed size (`max_length` generated tokens)
and the loop writes one position per step. Beams are folded into the batch dimension
(`[batch * beams, ...]`) when the step function is called, so the model sees an ordinary batch.

The step function contract (shared by `greedy_search` and `beam_search`):

    step_fn(ids, index, state) -> (log_probs, new_state)

    ids:       int32 `[rows, max_length + 1]`; column 0 holds the start token (BOS) and columns
               `1 .. index` the tokens generated so far; later columns are 0.
    index:     int32 scalar, the column of the last token (the one to feed to a cached decoder).
    state:     any nest of tensors with leading dimension `rows` (e.g. a key/value cache); beam
               search repeats it for each beam and reorders it with the beams, except the parts
               wrapped in `SharedByBeams` (held once per input, e.g. caches the beams share).
    log_probs: float `[rows, vocab]`, log p(token at column `index + 1` | ids[:, :index + 1]).
               With `token_ids` (a vocabulary shortlist) `[rows, n]`: column `j` is the
               log-probability of the id `token_ids[j]`.

References:
    Vaswani et al., 2017, "Attention Is All You Need", section 6.1 (beam 4, alpha 0.6);
    Wu et al., 2016, "Google's Neural Machine Translation System", section 7 (length penalty).
"""

import dataclasses
from typing import Any, NamedTuple

import keras
from keras import ops

from keras_transformer.config import EOS_ID, DecodingSettings
from keras_transformer.decoding.beam_cache import SharedByBeams, shared_beam_decoder
from keras_transformer.decoding.beams import (  # noqa: F401 (the beam helpers, importable here)
    BeamState,
    DecodingResult,
    _best_hypotheses,
    _column_ids,
    _force_eos,
    _initial_beam_state,
    _initial_sequences,
    _map_per_beam,
    _merge_finished,
    _output_caps,
    _write_column,
    expand_to_beams,
    flatten_beams,
    gather_beams,
    gather_flat_beams,
    length_penalty,
    static_rows,
    unflatten_beams,
)
from keras_transformer.decoding.constraints import constrained_beam_search
from keras_transformer.decoding.sampling import sampling_picker
from keras_transformer.decoding.shortlist import row_shortlists
from keras_transformer.decoding.top_k import blocked_top_k
from keras_transformer.fast_paths import Kernels
from keras_transformer.layers.attention import OwnedCache
from keras_transformer.lexical_table import glossary_pieces
from keras_transformer.search_rules import (
    CANDIDATES_PER_BEAM,
    HALF_NEG_INF,
    NEG_INF,
)


class ConstrainedResult(NamedTuple):
    """`translate_ids`' answer with `constraints`: a `DecodingResult`'s fields and
    `constraints_met` bool `[batch]`, whether the input's outputs meet all its constraints
    (False: they are its unconstrained answers)."""

    ids: Any
    scores: Any
    token_scores: Any
    constraints_met: Any


# --------------------------------------------------------------------------- greedy search


def greedy_search(
    step_fn, initial_ids, initial_state, max_length, eos_id=EOS_ID, alpha=0.0, max_lengths=None,
    pick=None, token_ids=None,
):  # fmt: skip
    """Picks the most likely next token at every step until EOS (or the one `pick` draws).

    Args:
        step_fn: next-token function, see the module docstring (rows = batch).
        initial_ids: int `[batch]` start tokens (BOS).
        initial_state: nest of tensors with leading dimension `batch`, passed to `step_fn`.
        max_length: most tokens generated per input, EOS included (Python int or int scalar);
            it is also the length of the output buffer.
        eos_id: the end-of-sequence token.
        alpha: length-penalty exponent used for the returned scores only.
        max_lengths: optional int `[batch]`, a smaller limit per input; EOS is forced at the limit.
        pick: optional `pick(log_probs [batch, vocab], index) -> int32 [batch]` choosing each
            token instead of the argmax (e.g. `decoding.sampling.sampling_picker`).
        token_ids: optional int32 `[n]`, a vocabulary shortlist: `step_fn`'s log-probabilities
            are `[batch, n]`, column `j` for the id `token_ids[j]` (None: `[batch, vocab]`).

    Returns:
        A `DecodingResult`: `ids` int32 `[batch, max_length]` generated tokens (EOS included,
        then 0), `scores` float32 `[batch]` `sum(log p) / length_penalty(length, alpha)` (the
        model's log-probabilities, whatever `pick` does) and `token_scores` float32
        `[batch, max_length]`: log p of each token of `ids` (EOS included, then 0).

    Example:
    ```python
    result = greedy_search(step_fn, ops.full((batch,), 2), cache, max_length=60)
    result.ids, result.scores  # [batch, 60], [batch]
    ```
    """
    caps = _output_caps(initial_ids, max_length, max_lengths)  # [batch]
    batch_shape = ops.shape(caps)
    sequences = _initial_sequences(initial_ids, batch_shape, max_length)  # [batch, max_len + 1]
    token_scores = ops.zeros(ops.shape(sequences), dtype="float32")  # [batch, max_len + 1]
    log_prob_sums = ops.zeros(batch_shape, dtype="float32")  # [batch]
    finished = ops.zeros(batch_shape, dtype="bool")  # [batch]
    lengths = ops.zeros(batch_shape, dtype="int32")  # [batch] tokens generated, EOS included

    def cond(index, sequences, token_scores, log_prob_sums, finished, lengths, state):
        return ops.logical_and(ops.less(index, max_length), ops.logical_not(ops.all(finished)))

    def body(index, sequences, token_scores, log_prob_sums, finished, lengths, state):
        log_probs, state = step_fn(sequences, index, state)  # [batch, vocab]
        log_probs = ops.cast(log_probs, "float32")
        must_end = ops.expand_dims(ops.greater_equal(index + 1, caps), 1)  # [batch, 1]
        log_probs = _force_eos(log_probs, must_end, eos_id, token_ids)
        if pick is None:
            columns = ops.cast(ops.argmax(log_probs, axis=-1), "int32")  # [batch]
        else:
            columns = pick(log_probs, index)  # [batch]
        token_log_probs = ops.take_along_axis(log_probs, ops.expand_dims(columns, 1), axis=1)
        token_log_probs = ops.squeeze(token_log_probs, 1)  # [batch]
        tokens = columns if token_ids is None else ops.take(token_ids, columns, axis=0)
        # Rows that already ended keep 0 (padding) and their score.
        tokens = ops.where(finished, 0, tokens)
        token_log_probs = ops.where(finished, 0.0, token_log_probs)
        log_prob_sums = ops.where(finished, log_prob_sums, log_prob_sums + token_log_probs)
        lengths = ops.where(finished, lengths, index + 1)
        finished = ops.logical_or(finished, ops.equal(tokens, eos_id))
        sequences = _write_column(sequences, index + 1, tokens)
        token_scores = _write_column(token_scores, index + 1, token_log_probs)
        return index + 1, sequences, token_scores, log_prob_sums, finished, lengths, state

    index = ops.convert_to_tensor(0, dtype="int32")
    loop_vars = (index, sequences, token_scores, log_prob_sums, finished, lengths, initial_state)
    _, sequences, token_scores, log_prob_sums, _, lengths, _ = ops.while_loop(cond, body, loop_vars)
    scores = log_prob_sums / length_penalty(ops.maximum(lengths, 1), alpha)
    return DecodingResult(sequences[:, 1:], scores, token_scores[:, 1:])


# --------------------------------------------------------------------------- beam search


def _beam_search_continues(state, max_length, max_penalty):
    """False once no input can improve: `beam_size` hypotheses finished and the best alive
    one, even at the largest length penalty, scores below the worst of them; or the buffer is
    full."""
    best_alive = state.alive_log_probs[:, 0] / max_penalty  # [batch]
    worst_finished = ops.where(state.finished_flags[:, -1], state.finished_scores[:, -1], NEG_INF)
    no_alive = ops.less_equal(state.alive_log_probs[:, 0], HALF_NEG_INF)  # [batch]
    done = ops.logical_or(no_alive, ops.greater_equal(worst_finished, best_alive))
    return ops.logical_and(ops.less(state.index, max_length), ops.logical_not(ops.all(done)))


def _top_candidates(state, log_probs, k, length, token_ids=None):
    """The best `2k` one-token extensions of the alive beams (`log_probs` `[batch, k, n]`, the
    columns' ids `token_ids` `[n]` with a shortlist).

    Returns `(log_probs [batch, 2k], source beams [batch, 2k], tokens [batch, 2k],
    (sequences [batch, 2k, L], token scores [batch, 2k, L]))`.
    """
    vocab = ops.shape(log_probs)[-1]
    candidates = ops.expand_dims(state.alive_log_probs, 2) + log_probs  # [batch, k, vocab]
    candidates = ops.reshape(candidates, (static_rows(log_probs), k * vocab))  # [b, k * vocab]
    top_log_probs, top_indices = blocked_top_k(candidates, CANDIDATES_PER_BEAM * k)  # [b, 2k]
    top_beams = ops.cast(top_indices // vocab, "int32")  # [batch, 2k]
    top_tokens = ops.cast(top_indices % vocab, "int32")  # [batch, 2k] columns
    if token_ids is not None:
        top_tokens = ops.take(token_ids, top_tokens, axis=0)  # [batch, 2k] their ids
    # log p of each candidate's new token alone (not a difference of sums: no rounding).
    flat_log_probs = ops.reshape(log_probs, (static_rows(log_probs), k * vocab))
    top_token_log_probs = ops.take_along_axis(flat_log_probs, top_indices, axis=1)  # [batch, 2k]
    top_seqs = gather_beams(state.alive_seqs, top_beams)  # [batch, 2k, L]
    top_seqs = _write_column(top_seqs, length, top_tokens)
    top_token_scores = gather_beams(state.alive_token_scores, top_beams)  # [batch, 2k, L]
    top_token_scores = _write_column(top_token_scores, length, top_token_log_probs)
    return top_log_probs, top_beams, top_tokens, (top_seqs, top_token_scores)


def _beam_search_step(state, step_fn, k, caps, alpha, eos_id, token_ids=None):
    """One token more for every alive beam; the next `BeamState`."""
    log_probs, cache = step_fn(flatten_beams(state.alive_seqs), state.index, state.cache)
    log_probs = unflatten_beams(ops.cast(log_probs, "float32"), k)  # [batch, k, vocab]
    length = state.index + 1  # tokens in each candidate, EOS included
    must_end = ops.reshape(ops.greater_equal(length, caps), (-1, 1, 1))
    log_probs = _force_eos(log_probs, must_end, eos_id, token_ids)
    top_log_probs, top_beams, top_tokens, top_rows = _top_candidates(
        state, log_probs, k, length, token_ids
    )
    ends = ops.equal(top_tokens, eos_id)  # [batch, 2k]

    # Alive: the best k candidates that did not end; their caches follow them.
    alive_log_probs, alive_indices = ops.top_k(ops.where(ends, NEG_INF, top_log_probs), k)
    origin = ops.take_along_axis(top_beams, alive_indices, axis=1)  # [batch, k] source beam
    alive_seqs, alive_token_scores = (gather_beams(x, alive_indices) for x in top_rows)
    finished_rows, finished_scores, finished_flags = _merge_finished(
        state, top_log_probs, top_rows, ends, k, alpha, length
    )
    return BeamState(
        index=length,
        alive_seqs=alive_seqs,  # [batch, k, L]
        alive_log_probs=alive_log_probs,
        alive_token_scores=alive_token_scores,  # [batch, k, L]
        finished_seqs=finished_rows[0],
        finished_token_scores=finished_rows[1],
        finished_scores=finished_scores,
        finished_flags=finished_flags,
        cache=_map_per_beam(lambda x: gather_flat_beams(x, origin, k), cache),
    )


def beam_search(
    step_fn,
    initial_ids,
    initial_state,
    beam_size,
    max_length,
    alpha=DecodingSettings.alpha,
    eos_id=EOS_ID,
    max_lengths=None,
    return_all=False,
    token_ids=None,
):
    """Beam search with GNMT's length penalty, keeping alive and finished hypotheses apart.

    Each step extends every alive beam by every token and keeps the top `2 * beam_size`
    candidates: those ending in EOS among the first `beam_size` of them compete for the
    `beam_size` finished slots (score = `log p / ((5 + length) / 6) ** alpha`, length counting
    EOS), the others for the alive slots. Taking twice the beam means finished candidates can
    never crowd out all live ones; with `beam_size=1` the search is greedy search. The search
    stops when, for every input, `beam_size` hypotheses have finished and none of the alive ones
    can still beat the worst of them (log-probabilities only fall as a sequence grows, so the
    best an alive beam can reach is its log-probability over the largest length penalty), or
    when `max_length` tokens have been generated. EOS is forced at each input's length limit, so
    every input gets finished hypotheses.

    Args:
        step_fn: next-token function, see the module docstring; rows = `batch * beam_size`, beams
            of one input adjacent (`flatten_beams` order).
        initial_ids: int `[batch]` start tokens (BOS).
        initial_state: nest of tensors with leading dimension `batch`; they are repeated for each
            beam (`expand_to_beams`) and reordered with the beams at every step.
        beam_size: beams per input `k` (Python int).
        max_length: most tokens generated per input, EOS included (Python int or int scalar); the
            length of the output buffer.
        alpha: length-penalty exponent (0 = plain log-probability).
        eos_id: the end-of-sequence token.
        max_lengths: optional int `[batch]`, a smaller limit per input.
        return_all: return all `beam_size` finished hypotheses (n-best) instead of the best.
        token_ids: optional int32 `[n]`, a vocabulary shortlist: `step_fn`'s log-probabilities
            are `[rows, n]`, column `j` for the id `token_ids[j]` (None: `[rows, vocab]`).

    Returns:
        A `DecodingResult`: `ids` int32 `[batch, max_length]` (EOS included, then 0), `scores`
        float32 `[batch]` and `token_scores` float32 like `ids`: log p of each token (EOS
        included, then 0), tracked with the hypotheses during the search and summing to the
        unnormalised score; with `return_all`, `[batch, beam_size, max_length]`,
        `[batch, beam_size]` and `[batch, beam_size, max_length]`, sorted from the best score
        down.

    Example:
    ```python
    result = beam_search(step_fn, bos, cache, beam_size=5, max_length=60, alpha=1.0)
    result.ids, result.scores  # [batch, 60], [batch]
    ```
    """
    k = int(beam_size)
    if k < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    caps = _output_caps(initial_ids, max_length, max_lengths)  # [batch]
    batch = ops.shape(caps)[0]
    max_penalty = length_penalty(caps, alpha)  # [batch] the largest penalty any output gets
    state = _initial_beam_state(initial_ids, initial_state, k, max_length, batch)
    # One loop variable, the named state (a 1-tuple: ops.while_loop unpacks tuples).
    (state,) = ops.while_loop(
        lambda state: _beam_search_continues(state, max_length, max_penalty),
        lambda state: (_beam_search_step(state, step_fn, k, caps, alpha, eos_id, token_ids),),
        (state,),
    )
    return _best_hypotheses(state, alpha, return_all)


# --------------------------------------------------------------------------- the model


def _banned_tokens_mask(ids, banned_ids):
    """Boolean like `ids` (the columns' ids `[vocab]`, or a shortlist's `[n]`), True at ids that
    must never be generated (padding, BOS)."""
    mask = ops.zeros(ops.shape(ids), dtype="bool")
    for token in banned_ids:
        mask = ops.logical_or(mask, ops.equal(ids, token))
    return mask


def _static_or_tensor(value):
    return value if isinstance(value, int) else ops.cast(value, "int32")


def translate_ids(
    model,
    source_ids,
    settings=None,
    max_length=None,
    use_cache=True,
    return_all=False,
    prefix_ids=None,
    seed=0,
    kernels=None,
    shortlist=None,
    constraints=None,
    **changes,
):
    """Translates padded source ids with a `Transformer`: beam search (greedy for beam 1), or
    sampling when `settings.sampling_topk > 0`.

    The source is encoded once; the decoder runs one token per step with its key/value cache
    (`model.decode_step`), the encoder keys/values computed once and shared by the beams. An
    output is at most `source length + max_extra_length` tokens (per input, EOS included), and
    never longer than `max_length`. Padding and BOS are never generated.

    Args:
        model: a `keras_transformer.models.Transformer`.
        source_ids: int `[batch, s_len]`, 0-padded, ending in EOS as in training.
        settings: a `DecodingSettings` (None: its defaults): beam size, length penalty, output
            length, sampling, special ids. Sampling draws one output per input (no beams).
        max_length: optional cap on the output length (e.g. the model's maximum target length).
        use_cache: False re-runs the full decoder on the whole prefix at every step (slow; a
            reference for tests).
        return_all: return every beam's finished hypothesis (n-best), best first.
        prefix_ids: optional int `[batch, p]`, 0-padded target prefixes: output `i` starts with
            the non-zero ids of row `i` (forced one per step; the search continues after them).
            The prefix counts in the output's length limit (as in CTranslate2's
            `max_decoding_length`) but not in its score: forced ids score log p = 0, so the
            score is the continuation's log-probability over the whole output's length penalty.
            A row must leave room for EOS (at most `max_extra_length` ids, and fewer than
            `max_length`).
        seed: sampling only: an int (input `i` gets `seed + i`) or int `[batch]`, one seed per
            input; an input's sample depends on its seed alone, and repeats with it.
        kernels: the search's fast paths (`keras_transformer.fast_paths.Kernels` or a setting;
            None: the model's `kernels`, or none for a model without them; never the current
            setting): `shared_beam_caches` holds beam search's caches once per input,
            `inplace_cache_writes` writes the search's own caches in place.
        shortlist: optional lexical table (`keras_transformer.data.shortlist.LexicalTable`, or
            anything with its `translations` `[source_vocab, K]` and `frequent` `[M]`): the
            projection runs over the batch's shortlist and each row's softmax over its own
            (`decoding.shortlist.row_shortlists`: the table's translations of the row's source
            pieces, the frequent pieces, the special ids, its prefix's and constraints' ids);
            scores are log-probabilities normalised over the row's own shortlist, so a row's
            answer does not depend on the other rows. With every id in the shortlist the
            search finds what it finds without one.
        constraints: optional int `[batch, C, P]`, up to `C` target piece sequences per input
            (0-padded; zeros: none) that its outputs must hold (`decoding.constraints`; not with
            sampling); unmeetable ones give the unconstrained answer, flagged.
        **changes: fields of `settings` to replace (e.g. `beam_size=1`).

    Returns:
        A `DecodingResult`: `ids` int32 `[batch, T]` without BOS, EOS included and 0-padded
        after it (`T = min(s_len + max_extra_length, max_length)`), `scores` float32 `[batch]`
        length-normalised log-probabilities and `token_scores` float32 `[batch, T]`, log p of
        each token (tracked during the search: no second pass over the model); with
        `return_all`, `[batch, beam_size, T]`, `[batch, beam_size]` and `[batch, beam_size, T]`
        (greedy search's or sampling's one output as a beam of one); with `constraints`, a
        `ConstrainedResult` (and `constraints_met` bool `[batch]`).

    Example:
    ```python
    result = translate_ids(model, source_ids, DecodingSettings(beam_size=5))
    result.ids, result.scores  # [batch, T], [batch]
    ```
    """
    settings = DecodingSettings() if settings is None else settings
    settings = dataclasses.replace(settings, **changes) if changes else settings
    k = 1 if settings.sampling else settings.beam_size
    # The model's own kernels (a model without any: the plain search), never the current
    # setting: this runs while a graph is traced.
    kernels = Kernels.get(getattr(model, "kernels", "none") if kernels is None else kernels)
    source_ids = ops.cast(ops.convert_to_tensor(source_ids), "int32")
    buffer = _output_buffer_length(source_ids, settings.max_extra_length, max_length)
    encoder_output, source_mask = model.encode(source_ids, training=False)
    caps = ops.sum(ops.cast(source_mask, "int32"), axis=1) + settings.max_extra_length  # [batch]
    initial_ids = ops.full(ops.shape(source_ids)[:1], settings.bos_id, dtype="int32")  # [batch]
    columns = _shortlist_columns(shortlist, source_ids, (prefix_ids, constraints))
    log_probs_fn, initial_state = _log_probs_step(
        model, source_ids, (encoder_output, source_mask), settings, buffer, use_cache, kernels,
        columns,
    )  # fmt: skip
    token_ids = None if columns is None else columns[0]
    if prefix_ids is not None:
        log_probs_fn, initial_state = _forcing_prefix(
            log_probs_fn, initial_state, prefix_ids, token_ids
        )
    search = (log_probs_fn, initial_ids, initial_state)
    if constraints is not None:
        again = (model, source_ids, settings, max_length, use_cache, return_all, prefix_ids, seed)
        again += (kernels, shortlist)  # translate_ids' arguments, for the unconstrained answers
        return _constrained_translation(search, buffer, constraints, caps, token_ids, again)
    if k > 1:
        return beam_search(
            *search, k, buffer, settings.alpha, settings.eos_id, max_lengths=caps,
            return_all=return_all, token_ids=token_ids,
        )  # fmt: skip
    pick = None
    if settings.sampling:
        seeds = _row_seeds(seed, initial_ids)  # [batch]
        pick = sampling_picker(
            settings.sampling_topk, settings.sampling_temperature, settings.sampling_topp, seeds
        )
    result = greedy_search(
        *search, buffer, settings.eos_id, settings.alpha, max_lengths=caps, pick=pick,
        token_ids=token_ids,
    )  # fmt: skip
    if return_all:  # a beam of one: [batch, 1, T], [batch, 1], [batch, 1, T]
        result = DecodingResult(*(ops.expand_dims(x, 1) for x in result))
    return result


def _shortlist_columns(shortlist, source_ids, extra):
    """A shortlist's `(ids [n], real [n], member [batch, n])` for the batch
    (`decoding.shortlist.row_shortlists`): the batch's columns and each row's own among them,
    holding the row's ids of the `extra` tensors (prefixes, constraints; None skipped) and,
    where the shortlist names the glossary tags' ids (`glossary_ids`, `(separator, end)`), the
    target pieces of the row's soft glossary; None without a shortlist."""
    if shortlist is None:
        return None
    extra = list(extra)
    tags = getattr(shortlist, "glossary_ids", None)
    if tags is not None:
        extra.append(glossary_pieces(ops, source_ids, *tags))
    return row_shortlists(shortlist.translations, shortlist.frequent, source_ids, extra)


def _constrained_translation(search, buffer, constraints, caps, token_ids, arguments):
    """`translate_ids`' `ConstrainedResult`: the constrained beam search, and for the inputs
    whose constraints it could not meet, `translate_ids(*arguments)`'s answers (`arguments`:
    the call's, without constraints; a fresh search with its own caches, as the first one owned
    its own)."""
    settings, return_all = arguments[2], arguments[5]
    if settings.sampling:
        raise ValueError("constraints need beam search, not sampling (sampling_topk > 0)")
    result, met = constrained_beam_search(
        search, settings, buffer, constraints, max_lengths=caps, return_all=return_all,
        token_ids=token_ids,
    )  # fmt: skip

    def merged():
        unconstrained = translate_ids(*arguments)
        return tuple(_rows_where(met, x, y) for x, y in zip(result, unconstrained))

    result = ops.cond(ops.all(met), lambda: tuple(result), merged)
    return ConstrainedResult(*result, met)


def _rows_where(rows, x, y):
    """`x` where `rows` (bool `[batch]`) else `y`, for `[batch, ...]` tensors."""
    rows = ops.reshape(rows, (-1,) + (1,) * (len(x.shape) - 1))
    return ops.where(rows, x, y)


def _row_seeds(seed, initial_ids):
    """int32 `[batch]`: `seed + row` for an int seed, else the given per-row seeds."""
    if isinstance(seed, int):
        return ops.arange(ops.shape(initial_ids)[0], dtype="int32") + seed
    return ops.broadcast_to(ops.cast(seed, "int32"), ops.shape(initial_ids))


def _log_probs_step(model, source_ids, encoded, settings, buffer, use_cache, kernels, columns=None):
    """`(step_fn, initial_state)` of the search: the model's next-token log-probabilities,
    padding and BOS made impossible, for its `k` rows per input (1 when `settings` sample,
    else the beam size); `encoded` is `model.encode`'s output and mask. With a
    shortlist's `columns` `(ids [n], real [n])` the log-probabilities are `[rows, n]`,
    normalised over the real columns (padding columns impossible)."""
    k = 1 if settings.sampling else settings.beam_size
    if columns is None:
        output_ids, allowed = None, None
        ids = ops.arange(model.vocab_size, dtype="int32")
    else:
        output_ids, _, member = columns
        ids = output_ids
        allowed = ops.repeat(member, k, axis=0)  # [batch * k, n]: each row's own columns
    banned = _banned_tokens_mask(ids, (settings.pad_id, settings.bos_id))  # [vocab] or [n]
    if use_cache:
        step_fn, initial_state = _cached_step(model, *encoded, buffer, k, kernels, output_ids)
    else:
        step_fn, initial_state = _uncached_step(model, source_ids, k, output_ids)

    def log_probs_fn(ids, index, state):  # [rows, vocab] log p
        logits, state = step_fn(ids, index, state)
        logits = ops.cast(logits, "float32")
        if allowed is not None:  # another row's and padding columns: out of the normaliser
            logits = ops.where(allowed, logits, NEG_INF)
        log_probs = ops.log_softmax(logits, axis=-1)
        return ops.where(banned, NEG_INF, log_probs), state

    return log_probs_fn, initial_state


def _forcing_prefix(log_probs_fn, initial_state, prefix_ids, token_ids=None):
    """`(step_fn, initial_state)` that leave only the prefix's next id possible while a row's
    prefix lasts, at log-probability 0: the prefix is given, not chosen, so its cost enters
    neither the search's ranking nor the score (as CTranslate2's `target_prefix`). Counting it
    would make a costly prefix favour long outputs, since the length penalty divides it by more.
    The prefixes travel in the state, so they follow the beams. `token_ids`: a shortlist's
    column ids (it holds the prefixes' ids)."""
    prefix_ids = ops.cast(ops.convert_to_tensor(prefix_ids), "int32")  # [batch, p]
    prefix_ids = ops.pad(prefix_ids, ((0, 0), (0, 1)))  # a 0 column: no prefix past the end

    def step_fn(ids, index, state):
        inner, prefix = state  # prefix: [rows, p + 1]
        log_probs, inner = log_probs_fn(ids, index, inner)  # [rows, vocab]
        width = ops.shape(prefix)[1]
        column = ops.full((ops.shape(prefix)[0], 1), ops.minimum(index, width - 1), "int32")
        forced = ops.take_along_axis(prefix, column, axis=1)  # [rows, 1] the id to force now,
        # 0 once the prefix is over
        vocab = _column_ids(log_probs, token_ids)  # [vocab] (or a shortlist's [n])
        active = ops.greater(forced, 0)  # [rows, 1]
        is_forced = ops.logical_and(active, ops.equal(vocab, forced))  # [rows, vocab]
        other = ops.logical_and(active, ops.logical_not(is_forced))
        log_probs = ops.where(is_forced, 0.0, log_probs)
        return ops.where(other, NEG_INF, log_probs), (inner, prefix)

    return step_fn, (initial_state, prefix_ids)


def _output_buffer_length(source_ids, max_extra_length, max_length):
    """Generated tokens at most: source length + `max_extra_length`, capped by `max_length`
    (a Python int when the source length is static, else an int32 scalar)."""
    s_len = source_ids.shape[1]
    if s_len is None:
        s_len = ops.shape(source_ids)[1]
    buffer = s_len + max_extra_length
    if max_length is not None:
        if isinstance(buffer, int):
            buffer = min(buffer, int(max_length))
        else:
            buffer = ops.minimum(buffer, int(max_length))
    return _static_or_tensor(buffer)


def _cached_step(model, encoder_output, source_mask, buffer, k, kernels, output_ids=None):
    """`(step_fn, initial_state)` decoding one token per step with the key/value caches.

    The state is the per-layer self-attention cache; the rest is fixed during the search: the
    encoder's keys/values (computed once, repeated per beam) and the tied embedding transposed
    once. The search owns these caches (fresh buffers, see `init_cache`), so with the kernel
    `inplace_cache_writes` it hands them to the layers as `OwnedCache`s, whose keys/values are
    written in place. For beam search the kernel `shared_beam_caches` holds the caches once per
    input instead (`_shared_step`). `output_ids` (a shortlist's): the logits of those ids only.
    """
    if k > 1 and kernels.uses("shared_beam_caches"):
        return _shared_step(model, encoder_output, source_mask, buffer, k, kernels, output_ids)
    cache = model.init_cache(encoder_output, buffer, output_ids=output_ids)
    initial_state = cache.pop("self_attention")  # per layer ([batch, h, buffer, d], same)
    if kernels.uses("inplace_cache_writes"):
        initial_state = [OwnedCache(*pair) for pair in initial_state]
    fixed = dict(cache)
    fixed["cross_attention"] = keras.tree.map_structure(
        lambda x: expand_to_beams(x, k), cache["cross_attention"]
    )  # per layer ([batch * k, h, s_len, d], same)
    memory_mask = expand_to_beams(source_mask, k)  # [batch * k, s_len]

    def step_fn(ids, index, self_attention):
        tokens = ops.take(ids, ops.reshape(index, (1,)), axis=1)  # [rows, 1]
        cache = {**fixed, "self_attention": self_attention}
        logits, cache = model.decode_step(tokens, index, cache, memory_mask)
        return logits[:, 0], cache["self_attention"]  # [rows, vocab]

    return step_fn, initial_state


def _shared_step(model, encoder_output, source_mask, buffer, k, kernels, output_ids=None):
    """`(step_fn, initial_state)` as `_cached_step`'s for `k` beams, each input's caches held once
    for all its beams (`decoding.beam_cache`): no cache is repeated per beam or reordered.

    Each step writes every beam's keys/values into its own slot of its input's cache. The state
    that follows the beams is each hypothesis's slot history: int32 `[rows, buffer]`, the slot
    holding its key/value at each position (its own slot for the current one, its ancestors'
    before), from which each step builds the self-attention mask.
    """
    batch = ops.shape(source_mask)[0]
    in_place = kernels.uses("inplace_cache_writes")  # the search's own buffers
    decode, self_attention = shared_beam_decoder(
        model, encoder_output, source_mask, buffer, k, in_place, output_ids
    )  # self_attention: per layer ([batch, h * k, buffer, d], same)
    slots = ops.arange(batch * k, dtype="int32") % k  # [rows] each row's own slot

    def step_fn(ids, index, state):
        history, shared = state  # [rows, buffer], SharedByBeams(per layer (keys, values))
        history = _write_column(history, index, slots)
        tokens = ops.take(ids, ops.reshape(index, (1,)), axis=1)  # [rows, 1]
        logits, layers = decode(tokens, index, history, shared.value)
        return logits[:, 0], (history, SharedByBeams(layers))  # [rows, vocab]

    initial_state = (ops.zeros((batch, buffer), "int32"), SharedByBeams(self_attention))
    return step_fn, initial_state


def _uncached_step(model, source_ids, k, output_ids=None):
    """`(step_fn, initial_state)` re-running the whole model on the prefix at every step (slow;
    the reference the cached decoding is tested against); `output_ids`: a shortlist's columns
    of the logits."""
    repeated_source = expand_to_beams(source_ids, k)  # [batch * k, s_len]

    def step_fn(ids, index, unused):
        inputs = {"source_ids": repeated_source, "target_ids": ids[:, :-1]}
        logits = model(inputs, training=False)  # [rows, buffer, vocab]
        logits = ops.take(logits, ops.reshape(index, (1,)), axis=1)[:, 0]  # [rows, vocab]
        if output_ids is not None:
            logits = ops.take(logits, output_ids, axis=1)  # [rows, n]
        return logits, unused

    return step_fn, ops.zeros(ops.shape(source_ids)[:1], dtype="int32")
