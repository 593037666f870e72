"""Hard lexical constraints in beam search: every output contains each of its input's
constraints (a sequence of target piece ids) contiguously, or is flagged.

Constraints are int `[batch, C, P]`: up to `C` constraints per input, each up to `P` pieces,
0-padded (a row of zeros is no constraint). Each hypothesis carries its progress on every
constraint (`[batch, k, C]`: how many of its pieces the hypothesis has just produced, or the
whole length once met, for good). The progress is read off the last `P` tokens: the longest
prefix of the constraint they end with, so a hypothesis that leaves a partly-met constraint
falls back (to a shorter prefix it still ends with, else to 0).

Each step extends the alive beams by the usual best `2k` candidates, each beam's best token and,
for each beam, the next piece of every constraint it has not met ("forced" candidates), so that
a constraint can enter the beam however unlikely it is. The beam is then shared by "banks", the
number of constraint pieces a candidate has met (dynamic beam allocation, Post and Vilar 2018;
vectorised as Hu et al. 2019): candidates are taken in turn from each bank, the most advanced
bank first, best score first within a bank. EOS is impossible (log p = -inf) for a hypothesis
with an unmet constraint. Rows without constraints take the usual best `2k` candidates in the
usual order: their answers are exactly the unconstrained search's.

Every tensor has a fixed size; the search runs in the `tf.function`, under XLA and on JAX as
`decoding.search.beam_search` does. The rules themselves (progress, banks, EOS refusal, the
stopping rule) are `keras_transformer.constraint_rules`' functions run on `keras.ops` (`KERAS`):
the LiteRT runtime's numpy search runs the same functions on numpy.

References:
    Post and Vilar, 2018, "Fast Lexically Constrained Decoding with Dynamic Beam Allocation for
    Neural Machine Translation" (NAACL);
    Hu et al., 2019, "Improved Lexically Constrained Decoding for Translation and Monolingual
    Rewriting" (NAACL).
"""

from typing import Any, NamedTuple

from keras import ops

from keras_transformer import constraint_rules as rules
from keras_transformer.decoding.beams import (
    BeamState,
    DecodingResult,
    _best_hypotheses,
    _column_ids,
    _force_eos,
    _initial_beam_state,
    _map_per_beam,
    _merge_finished,
    _output_caps,
    _write_column,
    flatten_beams,
    gather_beams,
    gather_flat_beams,
    length_penalty,
    static_rows,
    unflatten_beams,
)
from keras_transformer.decoding.top_k import blocked_top_k
from keras_transformer.search_rules import CANDIDATES_PER_BEAM, NEG_INF


class _KerasOps:
    """`keras.ops` as `constraint_rules`' array namespace (its module docstring)."""

    gather_beams = staticmethod(gather_beams)

    def __getattr__(self, name):
        return getattr(ops, name)


KERAS = _KerasOps()


def constraint_lengths(constraints):
    """int32 `[batch, C]`: the pieces of each constraint (its non-zero ids)."""
    return rules.constraint_lengths(KERAS, constraints)


def _dim(x, axis):
    size = x.shape[axis]
    return ops.shape(x)[axis] if size is None else size


def _column_of(ids, token_ids):
    """`(columns, present)` of `ids` (any shape) among a shortlist's `token_ids` `[n]`, or the
    ids themselves without one."""
    if token_ids is None:
        return ids, ops.ones(ops.shape(ids), "bool")
    hits = ops.equal(ops.expand_dims(ids, -1), token_ids)  # [..., n]
    return ops.cast(ops.argmax(hits, axis=-1), "int32"), ops.any(hits, axis=-1)


def _candidates(state, progress, log_probs, constraints, token_ids):
    """Every candidate of a step, `[batch, M]` each, `M = 2k + k + k * C`: `(log_probs,
    token log p, beams, columns)`; the first `2k` are the usual best ones, in the usual order."""
    k, vocab = _dim(log_probs, 1), _dim(log_probs, 2)
    batch = ops.shape(log_probs)[0]
    alive = ops.expand_dims(state.alive_log_probs, 2)  # [batch, k, 1]
    flat = ops.reshape(alive + log_probs, (static_rows(log_probs), k * vocab))
    top_values, top_indices = blocked_top_k(flat, CANDIDATES_PER_BEAM * k)  # [batch, 2k]
    flat_log_probs = ops.reshape(log_probs, (static_rows(log_probs), k * vocab))
    top_token = ops.take_along_axis(flat_log_probs, top_indices, axis=1)
    top_beams = ops.cast(top_indices // vocab, "int32")
    top_columns = ops.cast(top_indices % vocab, "int32")
    # Each beam's best token.
    best_columns = ops.cast(ops.argmax(log_probs, axis=-1), "int32")  # [batch, k]
    best_token = ops.max(log_probs, axis=-1)  # [batch, k]
    # Each beam's next piece of each unmet constraint.
    wanted, pieces = rules.next_pieces(KERAS, progress, constraints, batch, k)  # [batch, k, C]
    forced_columns, present = _column_of(pieces, token_ids)
    forced_token = ops.take_along_axis(log_probs, forced_columns, axis=2)  # [batch, k, C]
    forced_token = ops.where(ops.logical_and(wanted, present), forced_token, NEG_INF)
    return rules.candidates(
        KERAS, (top_values, top_token, top_beams, top_columns), state.alive_log_probs,
        (best_token, best_columns), (forced_token, forced_columns), batch, k,
        _dim(constraints, 1),
    )  # fmt: skip


class _Loop(NamedTuple):
    """What every step of one constrained search reads, the same at each: the next-token
    function, the beams per input `k`, each input's length limit `caps` int `[batch]`, the
    length penalty's `alpha`, the EOS id, the constraints int `[batch, C, P]` and the
    shortlist's `token_ids` (None: the whole vocabulary)."""

    step_fn: Any
    k: int
    caps: Any
    alpha: float
    eos_id: int
    constraints: Any
    token_ids: Any


def _constrained_step(state, progress, loop):
    """One token more for every alive beam (`loop`: a `_Loop`): the next `(BeamState,
    progress)`."""
    step_fn, k, caps, alpha, eos_id, constraints, token_ids = loop
    log_probs, cache = step_fn(flatten_beams(state.alive_seqs), state.index, state.cache)
    log_probs = unflatten_beams(ops.cast(log_probs, "float32"), k)  # [batch, k, vocab]
    length = state.index + 1
    lengths = constraint_lengths(constraints)  # [batch, C]
    constrained = ops.any(ops.greater(lengths, 0), axis=1)  # [batch]
    must_end = ops.reshape(ops.greater_equal(length, caps), (-1, 1, 1))
    log_probs = _force_eos(log_probs, must_end, eos_id, token_ids)
    is_eos = ops.equal(_column_ids(log_probs, token_ids), eos_id)  # [vocab]
    log_probs = rules.refuse_eos(KERAS, log_probs, progress, lengths, is_eos)
    values, token_log_probs, beams, columns = _candidates(
        state, progress, log_probs, constraints, token_ids
    )
    values = ops.where(rules.earlier_same(KERAS, beams, columns), NEG_INF, values)  # [batch, M]
    tokens = columns if token_ids is None else ops.take(token_ids, columns, axis=0)
    chosen, new_progress = rules.choose(
        KERAS, state.alive_seqs, state.index, progress, (values, beams, tokens), constraints, k
    )

    def take(x):
        return ops.take_along_axis(x, chosen, axis=1)

    top_log_probs, top_token, top_beams, top_tokens = (
        take(x) for x in (values, token_log_probs, beams, tokens)
    )
    top_progress = gather_beams(new_progress, chosen)  # [batch, 2k, C]
    top_seqs = _write_column(gather_beams(state.alive_seqs, top_beams), length, top_tokens)
    top_token_scores = _write_column(
        gather_beams(state.alive_token_scores, top_beams), length, top_token
    )
    top_rows = (top_seqs, top_token_scores)
    ends = ops.equal(top_tokens, eos_id)  # [batch, 2k]
    # Alive: the first k that do not end, in the banks' order (the usual: the best k).
    alive_indices = rules.alive_order(KERAS, top_log_probs, ends, constrained, k)  # [batch, k]
    alive_log_probs = ops.take_along_axis(top_log_probs, alive_indices, axis=1)
    origin = ops.take_along_axis(top_beams, alive_indices, axis=1)  # [batch, k]
    alive_seqs, alive_token_scores = (gather_beams(x, alive_indices) for x in top_rows)
    finished_rows, finished_scores, finished_flags = _merge_finished(
        state, top_log_probs, top_rows, ends, k, alpha, length
    )
    state = BeamState(
        index=length,
        alive_seqs=alive_seqs,
        alive_log_probs=alive_log_probs,
        alive_token_scores=alive_token_scores,
        finished_seqs=finished_rows[0],
        finished_token_scores=finished_rows[1],
        finished_scores=finished_scores,
        finished_flags=finished_flags,
        cache=_map_per_beam(lambda x: gather_flat_beams(x, origin, k), cache),
    )
    return state, gather_beams(top_progress, alive_indices)


def _continues(state, max_length, max_penalty):
    """`decoding.search`'s stopping rule with the alive beams in any order (the banks')."""
    done = rules.sentences_done(
        KERAS, state.alive_log_probs, state.finished_flags, state.finished_scores, max_penalty
    )
    return ops.logical_and(ops.less(state.index, max_length), ops.logical_not(ops.all(done)))


def constrained_beam_search(
    search, settings, max_length, constraints, max_lengths=None, return_all=False, token_ids=None
):
    """`decoding.search.beam_search` whose outputs meet lexical constraints (module docstring).

    Args:
        search: `(step_fn, initial_ids, initial_state)`, as `beam_search`'s first three.
        settings: the `DecodingSettings`: its `beam_size` (1 included), `alpha` and `eos_id`.
        max_length, max_lengths, return_all, token_ids: as `beam_search`'s.
        constraints: int `[batch, C, P]`, 0-padded piece ids (`P` >= 1); rows of zeros are no
            constraint, an input without any searches as `beam_search` does.

    Returns:
        `(DecodingResult, met)`: the result as `beam_search`'s, and bool `[batch]`, whether the
        input's outputs meet all its constraints. Where they do not (a constraint longer than
        the length limit, or the search ended first), the outputs are the best alive hypotheses
        and meet nothing for sure: `translate_ids` answers those inputs unconstrained.
    """
    step_fn, initial_ids, initial_state = search
    k, alpha = int(settings.beam_size), settings.alpha
    if k < 1:
        raise ValueError(f"beam_size must be at least 1, got {settings.beam_size}")
    constraints = ops.cast(ops.convert_to_tensor(constraints), "int32")
    caps = _output_caps(initial_ids, max_length, max_lengths)  # [batch]
    batch = ops.shape(caps)[0]
    max_penalty = length_penalty(caps, alpha)
    state = _initial_beam_state(initial_ids, initial_state, k, max_length, batch)
    progress = ops.zeros((batch, k, _dim(constraints, 1)), "int32")
    loop = _Loop(step_fn, k, caps, alpha, settings.eos_id, constraints, token_ids)
    state, _ = ops.while_loop(
        lambda state, progress: _continues(state, max_length, max_penalty),
        lambda state, progress: _constrained_step(state, progress, loop),
        (state, progress),
    )
    met = rules.constraints_met(KERAS, state.finished_flags, constraints)
    result = _best_hypotheses(state, alpha, return_all)
    return DecodingResult(*result), met
