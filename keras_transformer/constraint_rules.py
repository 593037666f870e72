"""The rules of the constrained beam search, written once for both engines: the graph's
(`keras_transformer.decoding.constraints`, with `keras.ops`) and the LiteRT runtime's numpy
search (`keras_transformer.litert.search`). Each function takes the array namespace it runs on
as its first argument `xp`: `decoding.constraints`' `keras.ops` one, or `NUMPY` here. The
runtime loads neither TensorFlow nor Keras, so this module imports only numpy and the
package's modules that import nothing else.

The rules (see `decoding.constraints`' docstring for the search they make): a hypothesis's
progress on each constraint is read off its last `P` tokens (`progress_after`); each step adds
each beam's best token and the next piece of each of its unmet constraints to the usual best
`2k` candidates (`next_pieces`, `candidates`), drops repeated ones (`earlier_same`), refuses EOS
to a hypothesis with an unmet constraint (`refuse_eos`), and takes `2k` candidates in turn from
the banks of equal progress (`bank_order`, `choose`), the first `k` that do not end staying
alive (`alive_order`). A sentence is done as `decoding.search`'s beam search says, with the
alive beams in any order (`sentences_done`).

An array namespace holds the `keras.ops` functions the rules call (numpy's, where they share
a name and a meaning) and three more: `cast(x, dtype)`, `top_k(x, k) -> (values, indices)`
(ties to the lower index) and `gather_beams(x, indices)` (`x` `[batch, n, ...]` at `indices`
`[batch, m]` -> `[batch, m, ...]`). `NUMPY` also has `keras.ops.while_loop` (a Python loop),
for `markup_rules`.
"""

import numpy as np

from keras_transformer.search_rules import CANDIDATES_PER_BEAM, HALF_NEG_INF, NEG_INF


class _Numpy:
    """numpy as an array namespace (module docstring)."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def cast(x, dtype):
        return np.asarray(x).astype(dtype)

    @staticmethod
    def top_k(x, k):
        indices = np.argsort(-x, axis=-1, kind="stable")[..., :k]
        return np.take_along_axis(x, indices, axis=-1), indices

    @staticmethod
    def gather_beams(x, indices):
        indices = np.asarray(indices).reshape(indices.shape + (1,) * (np.ndim(x) - 2))
        return np.take_along_axis(x, indices, axis=1)

    @staticmethod
    def while_loop(cond, body, loop_vars):
        """`keras.ops.while_loop` as a Python loop: `loop_vars` a tuple, `body` returns one."""
        loop_vars = tuple(loop_vars)
        while cond(*loop_vars):
            loop_vars = tuple(body(*loop_vars))
        return loop_vars


NUMPY = _Numpy()


def _dim(xp, x, axis):
    size = x.shape[axis]
    return xp.shape(x)[axis] if size is None else size


def constraint_lengths(xp, constraints):
    """int32 `[batch, C]`: the pieces of each constraint (its non-zero ids)."""
    return xp.sum(xp.cast(xp.greater(constraints, 0), "int32"), axis=-1)


def progress_after(xp, windows, constraints, lengths, old):
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
    p = _dim(xp, constraints, 2)
    prefix = xp.arange(1, p + 1, dtype="int32")  # [P] prefix lengths j
    position = xp.arange(p, dtype="int32")  # [P] position q in the prefix
    # The window's column holding prefix position q of a j-long prefix: P - j + q.
    column = xp.expand_dims(p - prefix, 1) + xp.expand_dims(position, 0)  # [P(j), P(q)]
    used = xp.less(xp.expand_dims(position, 0), xp.expand_dims(prefix, 1))  # [P, P]
    column = xp.clip(column, 0, p - 1)
    picked = xp.take(windows, xp.reshape(column, (-1,)), axis=2)  # [batch, M, P * P]
    picked = xp.reshape(picked, (-1, _dim(xp, windows, 1), 1, p, p))  # [batch, M, 1, P, P]
    pieces = xp.expand_dims(xp.expand_dims(constraints, 1), 3)  # [batch, 1, C, 1, P]
    same = xp.logical_or(xp.equal(picked, pieces), xp.logical_not(used))
    fits = xp.less_equal(prefix, xp.expand_dims(xp.expand_dims(lengths, 1), 3))
    matched = xp.logical_and(xp.all(same, axis=-1), fits)  # [batch, M, C, P]
    new = xp.max(xp.where(matched, prefix, 0), axis=-1)  # [batch, M, C]
    lengths = xp.expand_dims(lengths, 1)  # [batch, 1, C]
    return xp.where(xp.greater_equal(old, lengths), lengths, new)


def all_met(xp, progress, lengths):
    """bool `[batch, n]`: every constraint met (`progress` `[batch, n, C]`)."""
    return xp.all(xp.greater_equal(progress, xp.expand_dims(lengths, 1)), axis=-1)


def constrained_rows(xp, constraints):
    """bool `[batch]`: the inputs with at least one constraint."""
    return xp.any(xp.greater(constraint_lengths(xp, constraints), 0), axis=1)


def windows(xp, alive_seqs, index, beams, tokens, p):
    """int32 `[batch, M, P]`: the last `P - 1` tokens of each candidate's beam (columns up to
    `index` of `alive_seqs` `[batch, k, L]`; -1 at BOS and before), then its new token."""
    width = _dim(xp, alive_seqs, 2)
    columns = index - (p - 2) + xp.arange(p - 1, dtype="int32")  # [P - 1]
    before = xp.take(alive_seqs, xp.clip(columns, 0, width - 1), axis=2)  # [batch, k, P - 1]
    before = xp.where(xp.greater_equal(columns, 1), before, -1)
    before = xp.gather_beams(before, beams)  # [batch, M, P - 1]
    return xp.concatenate([before, xp.expand_dims(tokens, 2)], axis=2)


def next_pieces(xp, progress, constraints, batch, k):
    """`(wanted bool, pieces int32)` `[batch, k, C]`: whether each beam has still to meet each
    constraint, and the constraint's piece it would take next."""
    lengths = constraint_lengths(xp, constraints)  # [batch, C]
    c, p = _dim(xp, constraints, 1), _dim(xp, constraints, 2)
    wanted = xp.less(progress, xp.expand_dims(lengths, 1))  # [batch, k, C]
    at = xp.expand_dims(xp.minimum(progress, p - 1), 3)  # [batch, k, C, 1]
    pieces = xp.broadcast_to(xp.expand_dims(constraints, 1), (batch, k, c, p))
    return wanted, xp.squeeze(xp.take_along_axis(pieces, at, axis=3), 3)


def candidates(xp, top, alive_log_probs, best, forced, batch, k, c):
    """Every candidate of a step, `[batch, M]` each, `M = 2k + k + k * C`: `(log_probs, token
    log p, beams, columns)`.

    Args:
        top: the usual best `2k` candidates, `(log_probs, token log p, beams, columns)`
            `[batch, 2k]` each, in the unconstrained search's order (they come first).
        alive_log_probs: float32 `[batch, k]`.
        best: each beam's best token, `(token log p, column)` `[batch, k]` each.
        forced: each beam's next piece of each constraint, `(token log p, column)`
            `[batch, k, C]` each, log p NEG_INF where the piece is not wanted.
    """
    alive = xp.expand_dims(alive_log_probs, 2)  # [batch, k, 1]
    (best_token, best_columns), (forced_token, forced_columns) = best, forced
    beam_ids = xp.arange(k, dtype="int32")
    parts = [
        top,
        (alive_log_probs + best_token, best_token, xp.broadcast_to(beam_ids, (batch, k)),
         best_columns),
        (xp.reshape(alive + forced_token, (batch, k * c)), xp.reshape(forced_token, (batch, -1)),
         xp.broadcast_to(xp.repeat(beam_ids, c), (batch, k * c)),
         xp.reshape(forced_columns, (batch, -1))),
    ]  # fmt: skip
    return tuple(xp.concatenate([part[i] for part in parts], axis=1) for i in range(4))


def earlier_same(xp, beams, columns):
    """bool `[batch, M]`: an earlier candidate extends the same beam by the same token."""
    m = _dim(xp, beams, 1)
    same = xp.logical_and(
        xp.equal(xp.expand_dims(beams, 2), xp.expand_dims(beams, 1)),
        xp.equal(xp.expand_dims(columns, 2), xp.expand_dims(columns, 1)),
    )  # [batch, M(i), M(j)]
    index = xp.arange(m, dtype="int32")
    earlier = xp.less(xp.expand_dims(index, 0), xp.expand_dims(index, 1))  # j < i
    return xp.any(xp.logical_and(same, earlier), axis=2)


def bank_order(xp, values, banks, most_bank, count):
    """int32 `[batch, count]`: the candidates taken in turn from each bank (the highest bank
    first, best value first within a bank, then the lower index); impossible ones last."""
    m = _dim(xp, values, 1)
    index = xp.arange(m, dtype="int32")
    valid = xp.greater(values, HALF_NEG_INF)  # [batch, M]
    v_i, v_j = xp.expand_dims(values, 2), xp.expand_dims(values, 1)
    better = xp.logical_or(
        xp.greater(v_j, v_i),
        xp.logical_and(
            xp.equal(v_j, v_i), xp.less(xp.expand_dims(index, 0), xp.expand_dims(index, 1))
        ),
    )  # [batch, M(i), M(j)]: j goes before i
    same_bank = xp.equal(xp.expand_dims(banks, 2), xp.expand_dims(banks, 1))
    ahead = xp.logical_and(xp.logical_and(better, same_bank), xp.expand_dims(valid, 1))
    rank = xp.sum(xp.cast(ahead, "int32"), axis=2)  # [batch, M] place within the bank
    key = rank * (most_bank + 1) + (most_bank - banks)
    key = xp.where(valid, key, m * (most_bank + 1) + index)  # impossible: last, in order
    _, order = xp.top_k(-xp.cast(key, "float32"), count)
    return xp.cast(order, "int32")


def refuse_eos(xp, log_probs, progress, lengths, is_eos):
    """`log_probs` `[batch, k, n]` with EOS impossible for the hypotheses with an unmet
    constraint (`is_eos`: bool, broadcast to `log_probs`, where a column is EOS)."""
    unmet = xp.expand_dims(xp.logical_not(all_met(xp, progress, lengths)), 2)  # [batch, k, 1]
    return xp.where(xp.logical_and(unmet, is_eos), NEG_INF, log_probs)


def choose(xp, alive_seqs, index, progress, candidates, constraints, k):
    """The `2k` candidates a step keeps, `[batch, 2k]` indices (in the banks' order; the usual
    first `2k` in rows without constraints), and every candidate's progress `[batch, M, C]`.
    `candidates`: `(log_probs, beams, tokens)` `[batch, M]` each (`candidates`' without the
    token log p, tokens as ids)."""
    values, beams, tokens = candidates
    lengths = constraint_lengths(xp, constraints)  # [batch, C]
    constrained = xp.any(xp.greater(lengths, 0), axis=1)  # [batch]
    old = xp.gather_beams(progress, beams)  # [batch, M, C]
    last = windows(xp, alive_seqs, index, beams, tokens, _dim(xp, constraints, 2))
    new_progress = progress_after(xp, last, constraints, lengths, old)  # [batch, M, C]
    banks = xp.sum(new_progress, axis=2)  # [batch, M] constraint pieces met
    most_bank = xp.sum(lengths, axis=1, keepdims=True)  # [batch, 1]
    count = CANDIDATES_PER_BEAM * k
    by_bank = bank_order(xp, values, banks, most_bank, count)  # [batch, 2k]
    usual = xp.broadcast_to(xp.arange(count, dtype="int32"), xp.shape(by_bank))
    return xp.where(xp.expand_dims(constrained, 1), by_bank, usual), new_progress


def alive_order(xp, top_log_probs, ends, constrained, k):
    """int32 `[batch, k]`: the kept candidates (`[batch, 2k]`, `ends` where EOS) that stay
    alive: the first `k` that do not end, in the banks' order; the best `k` in rows without
    constraints (`constrained` bool `[batch]`)."""
    _, best_k = xp.top_k(xp.where(ends, NEG_INF, top_log_probs), k)
    place = -xp.cast(xp.arange(CANDIDATES_PER_BEAM * k, dtype="int32"), "float32")
    _, first_k = xp.top_k(xp.where(ends, NEG_INF, place), k)
    return xp.where(xp.expand_dims(constrained, 1), first_k, best_k)  # [batch, k]


def sentences_done(xp, alive_log_probs, finished_flags, finished_scores, max_penalty):
    """bool `[batch]`: `decoding.search`'s stopping rule per input, with the alive beams in
    any order (the banks'): none is possible, or none can beat the worst finished one."""
    best = xp.max(alive_log_probs, axis=1)  # [batch]
    worst_finished = xp.where(finished_flags[:, -1], finished_scores[:, -1], NEG_INF)
    return xp.logical_or(
        xp.less_equal(best, HALF_NEG_INF), xp.greater_equal(worst_finished, best / max_penalty)
    )


def constraints_met(xp, finished_flags, constraints):
    """bool `[batch]`: the search met an input's constraints (it has a finished hypothesis,
    which holds them all) or it has none."""
    return xp.logical_or(finished_flags[:, 0], xp.logical_not(constrained_rows(xp, constraints)))
