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
`decoding.search.beam_search` does.

References:
    Post and Vilar, 2018, "Fast Lexically Constrained Decoding with Dynamic Beam Allocation for
    Neural Machine Translation" (NAACL);
    Hu et al., 2019, "Improved Lexically Constrained Decoding for Translation and Monolingual
    Rewriting" (NAACL).
"""

from keras import ops

from keras_transformer.config import EOS_ID, DecodingSettings
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
    unflatten_beams,
)
from keras_transformer.search_rules import CANDIDATES_PER_BEAM, HALF_NEG_INF, NEG_INF


def constraint_lengths(constraints):
    """int32 `[batch, C]`: the pieces of each constraint (its non-zero ids)."""
    return ops.sum(ops.cast(ops.greater(constraints, 0), "int32"), axis=-1)


def _dim(x, axis):
    size = x.shape[axis]
    return ops.shape(x)[axis] if size is None else size


def progress_after(windows, constraints, lengths, old):
    """Each candidate's progress on each constraint once its new token is written.

    Args:
        windows: int32 `[batch, M, P]`, each candidate's last `P` tokens, its new one last
            (-1 before the output's first token).
        constraints: int32 `[batch, C, P]`, lengths int32 `[batch, C]`.
        old: int32 `[batch, M, C]`, the progress of the hypothesis each candidate extends.

    Returns:
        int32 `[batch, M, C]`: a met constraint stays met (its length); otherwise the longest
        prefix of the constraint that the window ends with.
    """
    p = _dim(constraints, 2)
    prefix = ops.arange(1, p + 1, dtype="int32")  # [P] prefix lengths j
    position = ops.arange(p, dtype="int32")  # [P] position q in the prefix
    # The window's column holding prefix position q of a j-long prefix: P - j + q.
    column = ops.expand_dims(p - prefix, 1) + ops.expand_dims(position, 0)  # [P(j), P(q)]
    used = ops.less(ops.expand_dims(position, 0), ops.expand_dims(prefix, 1))  # [P, P]
    column = ops.clip(column, 0, p - 1)
    picked = ops.take(windows, ops.reshape(column, (-1,)), axis=2)  # [batch, M, P * P]
    picked = ops.reshape(picked, (-1, _dim(windows, 1), 1, p, p))  # [batch, M, 1, P, P]
    pieces = ops.expand_dims(ops.expand_dims(constraints, 1), 3)  # [batch, 1, C, 1, P]
    same = ops.logical_or(ops.equal(picked, pieces), ops.logical_not(used))
    fits = ops.less_equal(prefix, ops.expand_dims(ops.expand_dims(lengths, 1), 3))
    matched = ops.logical_and(ops.all(same, axis=-1), fits)  # [batch, M, C, P]
    new = ops.max(ops.where(matched, prefix, 0), axis=-1)  # [batch, M, C]
    lengths = ops.expand_dims(lengths, 1)  # [batch, 1, C]
    return ops.where(ops.greater_equal(old, lengths), lengths, new)


def _all_met(progress, lengths):
    """bool `[batch, n]`: every constraint met (`progress` `[batch, n, C]`)."""
    return ops.all(ops.greater_equal(progress, ops.expand_dims(lengths, 1)), axis=-1)


def _windows(alive_seqs, index, beams, tokens, p):
    """int32 `[batch, M, P]`: the last `P - 1` tokens of each candidate's beam (columns up to
    `index`; -1 at BOS and before), then its new token."""
    width = _dim(alive_seqs, 2)
    columns = index - (p - 2) + ops.arange(p - 1, dtype="int32")  # [P - 1]
    before = ops.take(alive_seqs, ops.clip(columns, 0, width - 1), axis=2)  # [batch, k, P - 1]
    before = ops.where(ops.greater_equal(columns, 1), before, -1)
    before = gather_beams(before, beams)  # [batch, M, P - 1]
    return ops.concatenate([before, ops.expand_dims(tokens, 2)], axis=2)


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
    flat = ops.reshape(alive + log_probs, (-1, k * vocab))
    top_values, top_indices = ops.top_k(flat, CANDIDATES_PER_BEAM * k)  # [batch, 2k]
    top_token = ops.take_along_axis(ops.reshape(log_probs, (-1, k * vocab)), top_indices, axis=1)
    top_beams = ops.cast(top_indices // vocab, "int32")
    top_columns = ops.cast(top_indices % vocab, "int32")
    # Each beam's best token.
    best_columns = ops.cast(ops.argmax(log_probs, axis=-1), "int32")  # [batch, k]
    best_token = ops.max(log_probs, axis=-1)  # [batch, k]
    # Each beam's next piece of each unmet constraint.
    lengths = constraint_lengths(constraints)  # [batch, C]
    c, p = _dim(constraints, 1), _dim(constraints, 2)
    wanted = ops.less(progress, ops.expand_dims(lengths, 1))  # [batch, k, C]
    at = ops.expand_dims(ops.minimum(progress, p - 1), 3)  # [batch, k, C, 1]
    pieces = ops.broadcast_to(ops.expand_dims(constraints, 1), (batch, k, c, p))
    pieces = ops.squeeze(ops.take_along_axis(pieces, at, axis=3), 3)  # [batch, k, C]
    forced_columns, present = _column_of(pieces, token_ids)
    forced_token = ops.take_along_axis(log_probs, forced_columns, axis=2)  # [batch, k, C]
    forced_token = ops.where(ops.logical_and(wanted, present), forced_token, NEG_INF)
    beam_ids = ops.arange(k, dtype="int32")
    parts = [
        (top_values, top_token, top_beams, top_columns),
        (state.alive_log_probs + best_token, best_token,
         ops.broadcast_to(beam_ids, (batch, k)), best_columns),
        (ops.reshape(alive + forced_token, (batch, k * c)), ops.reshape(forced_token, (batch, -1)),
         ops.broadcast_to(ops.repeat(beam_ids, c), (batch, k * c)),
         ops.reshape(forced_columns, (batch, -1))),
    ]  # fmt: skip
    return tuple(ops.concatenate([part[i] for part in parts], axis=1) for i in range(4))


def _earlier_same(beams, columns):
    """bool `[batch, M]`: an earlier candidate extends the same beam by the same token."""
    m = _dim(beams, 1)
    same = ops.logical_and(
        ops.equal(ops.expand_dims(beams, 2), ops.expand_dims(beams, 1)),
        ops.equal(ops.expand_dims(columns, 2), ops.expand_dims(columns, 1)),
    )  # [batch, M(i), M(j)]
    index = ops.arange(m, dtype="int32")
    earlier = ops.less(ops.expand_dims(index, 0), ops.expand_dims(index, 1))  # j < i
    return ops.any(ops.logical_and(same, earlier), axis=2)


def _bank_order(values, banks, most_bank, count):
    """int32 `[batch, count]`: the candidates taken in turn from each bank (the highest bank
    first, best value first within a bank, then the lower index); impossible ones last."""
    m = _dim(values, 1)
    index = ops.arange(m, dtype="int32")
    valid = ops.greater(values, HALF_NEG_INF)  # [batch, M]
    v_i, v_j = ops.expand_dims(values, 2), ops.expand_dims(values, 1)
    better = ops.logical_or(
        ops.greater(v_j, v_i),
        ops.logical_and(
            ops.equal(v_j, v_i), ops.less(ops.expand_dims(index, 0), ops.expand_dims(index, 1))
        ),
    )  # [batch, M(i), M(j)]: j goes before i
    same_bank = ops.equal(ops.expand_dims(banks, 2), ops.expand_dims(banks, 1))
    ahead = ops.logical_and(ops.logical_and(better, same_bank), ops.expand_dims(valid, 1))
    rank = ops.sum(ops.cast(ahead, "int32"), axis=2)  # [batch, M] place within the bank
    key = rank * (most_bank + 1) + (most_bank - banks)
    key = ops.where(valid, key, m * (most_bank + 1) + index)  # impossible: last, in order
    _, order = ops.top_k(-ops.cast(key, "float32"), count)
    return ops.cast(order, "int32")


def _refuse_eos(log_probs, progress, lengths, eos_id, token_ids):
    """`log_probs` `[batch, k, vocab]` with EOS impossible for the hypotheses with an unmet
    constraint."""
    unmet = ops.expand_dims(ops.logical_not(_all_met(progress, lengths)), 2)  # [batch, k, 1]
    is_eos = ops.equal(_column_ids(log_probs, token_ids), eos_id)  # [vocab]
    return ops.where(ops.logical_and(unmet, is_eos), NEG_INF, log_probs)


def _choose(state, progress, values, beams, tokens, constraints, k):
    """The `2k` candidates a step keeps, `[batch, 2k]` indices (in the banks' order; the usual
    first `2k` in rows without constraints), and every candidate's progress `[batch, M, C]`."""
    lengths = constraint_lengths(constraints)  # [batch, C]
    constrained = ops.any(ops.greater(lengths, 0), axis=1)  # [batch]
    old = gather_beams(progress, beams)  # [batch, M, C]
    windows = _windows(state.alive_seqs, state.index, beams, tokens, _dim(constraints, 2))
    new_progress = progress_after(windows, constraints, lengths, old)  # [batch, M, C]
    banks = ops.sum(new_progress, axis=2)  # [batch, M] constraint pieces met
    most_bank = ops.sum(lengths, axis=1, keepdims=True)  # [batch, 1]
    count = CANDIDATES_PER_BEAM * k
    by_bank = _bank_order(values, banks, most_bank, count)  # [batch, 2k]
    usual = ops.broadcast_to(ops.arange(count, dtype="int32"), ops.shape(by_bank))
    return ops.where(ops.expand_dims(constrained, 1), by_bank, usual), new_progress


def _constrained_step(state, progress, step_fn, k, caps, alpha, eos_id, constraints, token_ids):
    """One token more for every alive beam: the next `(BeamState, progress)`."""
    log_probs, cache = step_fn(flatten_beams(state.alive_seqs), state.index, state.cache)
    log_probs = unflatten_beams(ops.cast(log_probs, "float32"), k)  # [batch, k, vocab]
    length = state.index + 1
    lengths = constraint_lengths(constraints)  # [batch, C]
    constrained = ops.any(ops.greater(lengths, 0), axis=1)  # [batch]
    must_end = ops.reshape(ops.greater_equal(length, caps), (-1, 1, 1))
    log_probs = _force_eos(log_probs, must_end, eos_id, token_ids)
    log_probs = _refuse_eos(log_probs, progress, lengths, eos_id, token_ids)
    values, token_log_probs, beams, columns = _candidates(
        state, progress, log_probs, constraints, token_ids
    )
    values = ops.where(_earlier_same(beams, columns), NEG_INF, values)  # [batch, M]
    tokens = columns if token_ids is None else ops.take(token_ids, columns, axis=0)
    chosen, new_progress = _choose(state, progress, values, beams, tokens, constraints, k)

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
    _, best_k = ops.top_k(ops.where(ends, NEG_INF, top_log_probs), k)
    place = -ops.cast(ops.arange(CANDIDATES_PER_BEAM * k, dtype="int32"), "float32")
    _, first_k = ops.top_k(ops.where(ends, NEG_INF, place), k)
    alive_indices = ops.where(ops.expand_dims(constrained, 1), first_k, best_k)  # [batch, k]
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
    best = ops.max(state.alive_log_probs, axis=1)  # [batch]
    worst_finished = ops.where(state.finished_flags[:, -1], state.finished_scores[:, -1], NEG_INF)
    done = ops.logical_or(
        ops.less_equal(best, HALF_NEG_INF), ops.greater_equal(worst_finished, best / max_penalty)
    )
    return ops.logical_and(ops.less(state.index, max_length), ops.logical_not(ops.all(done)))


def constrained_beam_search(
    step_fn, initial_ids, initial_state, beam_size, max_length, constraints,
    alpha=DecodingSettings.alpha, eos_id=EOS_ID, max_lengths=None, return_all=False,
    token_ids=None,
):  # fmt: skip
    """`decoding.search.beam_search` whose outputs meet lexical constraints (module docstring).

    Args:
        step_fn, initial_ids, initial_state, beam_size, max_length, alpha, eos_id, max_lengths,
            return_all, token_ids: as `beam_search`'s (`beam_size` 1 included).
        constraints: int `[batch, C, P]`, 0-padded piece ids (`P` >= 1); rows of zeros are no
            constraint, an input without any searches as `beam_search` does.

    Returns:
        `(DecodingResult, met)`: the result as `beam_search`'s, and bool `[batch]`, whether the
        input's outputs meet all its constraints. Where they do not (a constraint longer than
        the length limit, or the search ended first), the outputs are the best alive hypotheses
        and meet nothing for sure: `translate_ids` answers those inputs unconstrained.
    """
    k = int(beam_size)
    if k < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    constraints = ops.cast(ops.convert_to_tensor(constraints), "int32")
    caps = _output_caps(initial_ids, max_length, max_lengths)  # [batch]
    batch = ops.shape(caps)[0]
    max_penalty = length_penalty(caps, alpha)
    state = _initial_beam_state(initial_ids, initial_state, k, max_length, batch)
    progress = ops.zeros((batch, k, _dim(constraints, 1)), "int32")

    def body(state, progress):
        return _constrained_step(
            state, progress, step_fn, k, caps, alpha, eos_id, constraints, token_ids
        )

    state, _ = ops.while_loop(
        lambda state, progress: _continues(state, max_length, max_penalty),
        body,
        (state, progress),
    )
    constrained = ops.any(ops.greater(constraint_lengths(constraints), 0), axis=1)
    met = ops.logical_or(state.finished_flags[:, 0], ops.logical_not(constrained))
    result = _best_hypotheses(state, alpha, return_all)
    return DecodingResult(*result), met
