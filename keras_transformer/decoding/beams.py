"""The beam search's state and the helpers both searches share (`decoding.search`'s beam
search and `decoding.constraints`' constrained one): beams folded into the batch, the loop
state `BeamState`, the finished pool and the final answer (`DecodingResult`). Everything is
written with `keras.ops` and has a fixed size (see `decoding.search`).

References:
    Wu et al., 2016, "Google's Neural Machine Translation System", section 7 (length penalty).
"""

from typing import Any, NamedTuple

import keras
from keras import ops

from keras_transformer.decoding.beam_cache import SharedByBeams
from keras_transformer.search_rules import (
    CANDIDATES_PER_BEAM,
    HALF_NEG_INF,
    LENGTH_PENALTY_DIVISOR,
    LENGTH_PENALTY_OFFSET,
    NEG_INF,
)


def length_penalty(length, alpha):
    """GNMT's length penalty `((5 + length) / 6) ** alpha` (`search_rules`; float32, same
    shape as `length`)."""
    length = ops.cast(length, "float32")
    return ops.power((LENGTH_PENALTY_OFFSET + length) / LENGTH_PENALTY_DIVISOR, alpha)


def static_rows(x):
    """`x`'s leading dimension where it is known when traced, else -1: a reshape that also
    computes another dimension keeps it (a search's loop keeps its variables' shapes)."""
    return -1 if x.shape[0] is None else x.shape[0]


def flatten_beams(x):
    """`[batch, beams, ...]` -> `[batch * beams, ...]`."""
    shape = ops.shape(x)
    rows = -1 if None in x.shape[:2] else x.shape[0] * x.shape[1]
    return ops.reshape(x, (rows,) + tuple(shape[2:]))


def unflatten_beams(x, beam_size):
    """`[batch * beams, ...]` -> `[batch, beams, ...]`."""
    shape = ops.shape(x)
    batch = -1 if x.shape[0] is None else x.shape[0] // beam_size
    return ops.reshape(x, (batch, beam_size) + tuple(shape[1:]))


def expand_to_beams(x, beam_size):
    """`[batch, ...]` -> `[batch * beams, ...]`: each row repeated `beam_size` times in a row."""
    return ops.repeat(x, beam_size, axis=0)


def _flat_indices(beam_indices, old_beams):
    """Rows of a flattened `[batch * old_beams, ...]` tensor picked by `beam_indices`.

    `beam_indices` `[batch, new_beams]` -> `[batch * new_beams]`.
    """
    batch = ops.shape(beam_indices)[0]
    offsets = ops.arange(batch, dtype="int32") * old_beams  # [batch]
    flat = ops.cast(beam_indices, "int32") + ops.expand_dims(offsets, 1)  # [batch, new_beams]
    return ops.reshape(flat, (-1,))


def gather_beams(x, beam_indices):
    """Picks beams per batch element: `x` `[batch, old_beams, ...]`, `beam_indices`
    `[batch, new_beams]` -> `[batch, new_beams, ...]`."""
    old_beams = ops.shape(x)[1]
    new_beams = ops.shape(beam_indices)[1]
    rows = ops.take(flatten_beams(x), _flat_indices(beam_indices, old_beams), axis=0)
    return unflatten_beams(rows, new_beams)


def gather_flat_beams(x, beam_indices, old_beams):
    """Like `gather_beams` for beam-folded tensors: `x` `[batch * old_beams, ...]`,
    `beam_indices` `[batch, new_beams]` -> `[batch * new_beams, ...]`."""
    return ops.take(x, _flat_indices(beam_indices, old_beams), axis=0)


def _initial_sequences(initial_ids, rows_shape, max_length):
    """`[*rows_shape, max_length + 1]` int32 zeros with `initial_ids` in column 0."""
    ids = ops.cast(initial_ids, "int32")
    while len(ids.shape) < len(rows_shape):
        ids = ops.expand_dims(ids, -1)
    first = ops.broadcast_to(ops.expand_dims(ids, -1), tuple(rows_shape) + (1,))
    rest = ops.zeros(tuple(rows_shape) + (max_length,), dtype="int32")
    return ops.concatenate([first, rest], axis=-1)


def _write_column(sequences, column, tokens):
    """`sequences` `[..., length]` with `tokens` `[...]` written at `column` (a scalar), in
    `sequences`' dtype (token ids, or per-token log-probabilities)."""
    length = ops.shape(sequences)[-1]
    at_column = ops.equal(ops.arange(length, dtype="int32"), column)  # [length]
    tokens = ops.cast(tokens, sequences.dtype)
    return ops.where(at_column, ops.expand_dims(tokens, -1), sequences)


def _output_caps(batch_shape_like, max_length, max_lengths):
    """Per-input maximum number of generated tokens (EOS included): `[batch]` int32."""
    if max_lengths is None:
        return ops.full(ops.shape(batch_shape_like)[:1], max_length, dtype="int32")
    return ops.minimum(ops.cast(max_lengths, "int32"), ops.cast(max_length, "int32"))


def _column_ids(log_probs, token_ids):
    """The vocabulary id of each column of `log_probs` `[..., n]`: `token_ids` `[n]`, or the
    columns' own indices when there is no shortlist."""
    if token_ids is not None:
        return token_ids
    return ops.arange(ops.shape(log_probs)[-1], dtype="int32")


def _force_eos(log_probs, must_end, eos_id, token_ids=None):
    """Leaves only EOS possible in the rows where `must_end` (broadcast over the vocabulary).

    Most steps no row must end: they skip this pass over the `[rows, vocab]` log-probabilities.
    """

    def forced():
        not_eos = ops.not_equal(_column_ids(log_probs, token_ids), eos_id)  # [vocab]
        return ops.where(ops.logical_and(must_end, not_eos), NEG_INF, log_probs)

    return ops.cond(ops.any(must_end), forced, lambda: log_probs)


class DecodingResult(NamedTuple):
    """What a search found for each input (as OpenNMT-tf's `DecodingResult`): what
    `greedy_search`, `beam_search` and `translate_ids` return, one type whatever the settings.
    `T` is the output length (EOS included, then 0-padding); with `return_all`, each field has
    an n-best axis after the batch, best first.

    ids: int32 `[batch, T]` (`[batch, n, T]`), the output tokens without BOS.
    scores: float32 `[batch]` (`[batch, n]`), length-normalised log-probabilities.
    token_scores: float32, shaped like `ids`: log p of each output token (EOS included, then 0),
        tracked with the hypotheses during the search; they sum to the score times the length
        penalty.
    """

    ids: Any
    scores: Any
    token_scores: Any


def _map_per_beam(fn, state):
    """`fn` applied to every tensor of the nest `state` outside its `SharedByBeams` parts."""

    def visit(node):
        if isinstance(node, SharedByBeams):
            return node  # kept as it is
        return None if keras.tree.is_nested(node) else fn(node)  # None: look inside

    return keras.tree.traverse(visit, state, top_down=True)


class BeamState(NamedTuple):
    """The loop state of `beam_search` (`k` beams; `L = max_length + 1` columns, BOS first).

    Alive and finished hypotheses are kept apart, each sorted from the best down, so column 0
    is the best alive hypothesis and column `k - 1` the worst finished one. Each hypothesis
    carries the log-probability of each of its tokens (column `t` for the token in column `t`
    of its sequence; 0 at BOS and after EOS), reordered with it.
    """

    index: Any  # [] int32: tokens generated so far (the column of the last one)
    alive_seqs: Any  # [batch, k, L] int32
    alive_log_probs: Any  # [batch, k] float32, NEG_INF for empty slots
    alive_token_scores: Any  # [batch, k, L] float32: log p of each token of alive_seqs
    finished_seqs: Any  # [batch, k, L] int32
    finished_token_scores: Any  # [batch, k, L] float32: log p of each token of finished_seqs
    finished_scores: Any  # [batch, k] float32: log p / length_penalty, NEG_INF when empty
    finished_flags: Any  # [batch, k] bool: the slot holds a finished hypothesis
    cache: Any  # the step function's state, leading dimension batch * k


def _initial_beam_state(initial_ids, initial_state, k, max_length, batch):
    alive_seqs = _initial_sequences(initial_ids, (batch, k), max_length)  # [batch, k, L]
    # All beams start identical; only the first is live, so the first step does not pick k
    # copies of the same continuation.
    first_beam = ops.equal(ops.arange(k, dtype="int32"), 0)  # [k]
    alive_log_probs = ops.where(
        first_beam, ops.zeros((batch, k), "float32"), ops.full((batch, k), NEG_INF, "float32")
    )  # [batch, k]
    no_token_scores = ops.zeros(ops.shape(alive_seqs), "float32")  # [batch, k, L]
    return BeamState(
        index=ops.convert_to_tensor(0, dtype="int32"),
        alive_seqs=alive_seqs,
        alive_log_probs=alive_log_probs,
        alive_token_scores=no_token_scores,
        finished_seqs=ops.zeros_like(alive_seqs),
        finished_token_scores=no_token_scores,
        finished_scores=ops.full((batch, k), NEG_INF, "float32"),
        finished_flags=ops.zeros((batch, k), "bool"),
        cache=_map_per_beam(lambda x: expand_to_beams(x, k), initial_state),
    )


def _merge_finished(state, top_log_probs, top_rows, ends, k, alpha, length):
    """The best `k` of the old finished hypotheses and the candidates that end now:
    `((sequences, token scores), scores, flags)`.

    As in fairseq, an EOS candidate counts only if it ranks among the top k (the 2k only keep
    the alive beams full), so beam size 1 is exactly greedy search.
    """
    possible = ops.greater(top_log_probs, HALF_NEG_INF)  # [batch, 2k]
    in_top_k = ops.less(ops.arange(CANDIDATES_PER_BEAM * k, dtype="int32"), k)  # [2k]
    new_flags = ops.logical_and(ops.logical_and(ends, possible), in_top_k)  # [batch, 2k]
    new_scores = top_log_probs / length_penalty(length, alpha)
    new_scores = ops.where(new_flags, new_scores, NEG_INF)  # [batch, 2k]
    all_scores = ops.concatenate([state.finished_scores, new_scores], axis=1)  # [batch, 3k]
    all_flags = ops.concatenate([state.finished_flags, new_flags], axis=1)  # [batch, 3k]
    finished_scores, keep = ops.top_k(all_scores, k)  # [batch, k]
    finished_flags = ops.take_along_axis(all_flags, keep, axis=1)  # [batch, k]
    old_rows = (state.finished_seqs, state.finished_token_scores)
    rows = tuple(
        gather_beams(ops.concatenate([old, new], axis=1), keep)  # [batch, 3k, L] -> [batch, k, L]
        for old, new in zip(old_rows, top_rows)
    )
    return rows, finished_scores, finished_flags


def _best_hypotheses(state, alpha, return_all):
    """The `DecodingResult` of the finished hypotheses, without the BOS column."""
    # With EOS forced at every limit an input always has finished hypotheses; fall back to the
    # alive ones anyway so the result never holds an empty slot.
    any_finished = state.finished_flags[:, 0]  # [batch]
    alive_scores = state.alive_log_probs / length_penalty(ops.maximum(state.index, 1), alpha)
    rows_finished = ops.reshape(any_finished, (-1, 1, 1))  # [batch, 1, 1]
    sequences = ops.where(rows_finished, state.finished_seqs, state.alive_seqs)
    token_scores = ops.where(
        rows_finished, state.finished_token_scores, state.alive_token_scores
    )  # [batch, k, L]
    scores = ops.where(ops.expand_dims(any_finished, 1), state.finished_scores, alive_scores)
    sequences, token_scores = sequences[:, :, 1:], token_scores[:, :, 1:]  # [batch, k, max_len]
    if return_all:
        return DecodingResult(sequences, scores, token_scores)
    return DecodingResult(sequences[:, 0], scores[:, 0], token_scores[:, 0])
