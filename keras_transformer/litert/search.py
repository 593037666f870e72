"""Greedy and beam search in numpy, for the LiteRT runtime: `keras_transformer.decoding.search`
(`greedy_search`, `beam_search`, as `translate_ids` runs them) over a decoder step that gives
each row's best next tokens instead of the whole vocabulary.

The runtime loads neither TensorFlow nor Keras, so this module imports only numpy, the standard
library and the package's modules that import nothing else: the constants and the tie rule it
shares with the graph search come from `keras_transformer.search_rules`, the special ids from
`keras_transformer.special_ids`.

The step contract (what the LiteRT decoder step gives the search):

    step(ids, index) -> (top_log_probs, top_ids, eos_log_probs)
        ids: int32 `[rows]`, the last token of each row (BOS at index 0); index: int, the column
        of that token (0 at the first call). top_log_probs float32 `[rows, K]` sorted best first
        and top_ids int32 `[rows, K]`: the row's best K next tokens once padding (0) and BOS
        were set to NEG_INF in the log-softmax; eos_log_probs float32 `[rows]`: log p(EOS).
        K >= 2 * beam_size (K >= 1 for greedy search).
    step.reorder(origin): beam search only: the caches of new row r become those of old row
        `origin[r]` (int `[rows]`); not called when `origin` is the identity.
    step.keep(sentences) (optional): only these sentences (sorted int indices into the current
        batch) continue; their rows stay, in order, and later calls get only their rows.

With lexical constraints (`search(..., constraints=...)`), the step also takes the ids whose
log-probabilities the search needs whatever their rank (each hypothesis's next piece of each
of its constraints) and gives them, and K >= 2 * beam_size + 1 (a hypothesis refused EOS has
its best 2k other tokens still):

    step(ids, index, wanted) -> (top_log_probs, top_ids, eos_log_probs, wanted_log_probs)
        wanted: int32 `[rows, W]`; wanted_log_probs float32 `[rows, W]`, their log p (padding
        and BOS NEG_INF, as in `top_log_probs`).

The constrained search's rules (progress, banks, EOS refused, the stopping rule) are
`keras_transformer.constraint_rules`' functions, the very ones the graph's
`decoding.constraints` runs, here on numpy; what is this module's own is where the candidates
come from: the usual best `2k` from the rows' top `K`, each beam's best token from its row's
first, the constraint pieces' log p from `wanted_log_probs`, forced rows (EOS at the limit) as
in the plain search.

Rows are sentence-major: sentence i has rows `i * k .. i * k + k - 1` (`flatten_beams` order).

Why the answers equal the graph's. The graph's beam search takes the top 2k of
`alive_log_probs[beam] + log_probs[beam, token]` over a sentence's `k * vocab` candidates (ties:
lower beam, then lower token id, as `top_k` over the flattened candidates). Adding the same
`alive` to a row's log-probabilities keeps their order, so a sentence's best 2k candidates are
among each row's best 2k, which the step gives; they are sorted here with the graph's
tie-breaking. A forced row (EOS at the input's limit, a prefix's id) is, in the graph, one token
with its value and NEG_INF everywhere else; its candidates here are that token and, as fillers,
the lowest other ids at `alive + NEG_INF` (rounded in float32, so fillers tie and `top_k` takes
them in id order). Everything else (finished and alive bookkeeping, the stop test, the best
hypotheses, GNMT's length penalty in float32) is the graph's, step for step.

Why a sentence can be dropped (`drop_finished`) without changing an answer. Greedy search: a
finished row only appends padding at log p 0. Beam search: a sentence is done in the graph's
`_beam_search_continues` when its best alive log-probability `a` is at most HALF_NEG_INF (every
later candidate is impossible, so none is ever flagged finished), or when its `k`-th finished
score `w >= a / length_penalty(cap)`. Log-probabilities are <= 0 (a forced id adds 0), so every
later candidate has `c <= a`, and it ends at a length `<= cap` (EOS is forced there), hence at a
penalty `p <= length_penalty(cap)` (alpha >= 0); so its score `c / p <= a / length_penalty(cap)
<= w` (float32 rounding is monotone), and `top_k` puts the old finished hypotheses first on
ties: the finished set never changes again, and alive log-probabilities only fall, so the
sentence stays done. A done sentence's answer is its finished hypotheses, once it has one; one
without any would be answered from its alive beams at the final length, so it is kept.

Where it can differ from the graph: a float32 tie between a row's K-th candidate and one it left
out (the step cannot say which id the graph would take); a vocabulary with fewer than 2k allowed
tokens (the graph's top 2k then holds padding and BOS); and the last ulp of `length_penalty`
(numpy's float32 `power` against TensorFlow's).
"""

import dataclasses
from typing import Any

import numpy as np

from keras_transformer import constraint_rules as rules
from keras_transformer import search_rules
from keras_transformer.special_ids import BOS_ID, EOS_ID

# The search's numbers in float32, as the graph has them.
NEG_INF = np.float32(search_rules.NEG_INF)
HALF_NEG_INF = np.float32(search_rules.HALF_NEG_INF)
_OFFSET = np.float32(search_rules.LENGTH_PENALTY_OFFSET)
_DIVISOR = np.float32(search_rules.LENGTH_PENALTY_DIVISOR)
_CANDIDATES = search_rules.CANDIDATES_PER_BEAM


def length_penalty(length, alpha):
    """GNMT's length penalty `((5 + length) / 6) ** alpha` (`search_rules`), in float32 as the
    graph has it."""
    length = np.asarray(length).astype(np.float32)
    return np.power((_OFFSET + length) / _DIVISOR, np.float32(alpha))


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the search reads of the decoding settings an export fixes (its metadata's
    `decoding`): the beams per sentence (1: greedy search), the length-penalty exponent
    (>= 0) and the special ids."""

    beam_size: int = 1
    alpha: float = 0.0
    eos_id: int = EOS_ID
    bos_id: int = BOS_ID


def search(
    step, settings, max_length, caps, prefix=None, return_all=False, drop_finished=True,
    constraints=None,
):  # fmt: skip
    """Greedy search (`settings.beam_size` 1) or beam search over `step` (module docstring),
    with the answers of `keras_transformer.decoding.translate_ids`.

    Args:
        step: the decoder step, already holding the sentences (`batch * beam_size` rows).
        settings: `Settings`: beam size, length penalty, special ids.
        max_length: most tokens generated per sentence, EOS included; the output's length.
        caps: int `[batch]`, each sentence's own limit (source length + max_extra_length, at
            most `max_length`): EOS is forced there.
        prefix: optional int `[batch, p]`, 0-padded: output i starts with row i's ids, forced at
            log p 0 (the search goes on after them).
        return_all: every beam's finished hypothesis (n-best), best first.
        drop_finished: stop stepping the sentences whose answer is settled, through `step.keep`
            (nothing is dropped when the step has none); the answers do not change.
        constraints: optional int `[batch, C, P]` lexical constraints, 0-padded piece ids
            (`decoding.constraints.constrained_beam_search`'s; not with `prefix`): beam search
            (`beam_size` 1 included) whose outputs hold them, over a step that gives wanted
            ids' log-probabilities (module docstring).

    Returns:
        `(ids, scores, token_scores)`: int32 `[batch, max_length]` (EOS included, then 0),
        float32 `[batch]` length-normalised log-probabilities, float32 `[batch, max_length]` log p
        of each token; with `return_all`, `[batch, beam_size, max_length]`, `[batch, beam_size]`
        and `[batch, beam_size, max_length]` (greedy search: a beam of one). With
        `constraints`, a fourth: bool `[batch]`, whether the outputs meet all the input's
        constraints (as `constrained_beam_search`'s `met`; where they do not, the outputs are
        its best alive hypotheses: answer them unconstrained).
    """
    k, max_length, alpha = int(settings.beam_size), int(max_length), settings.alpha
    if k < 1:
        raise ValueError(f"beam_size must be at least 1, got {settings.beam_size}")
    if constraints is not None and prefix is not None:
        raise ValueError("constraints and a prefix cannot be searched together")
    caps = np.minimum(np.asarray(caps).reshape(-1), max_length).astype(np.int32)  # [batch]
    batch = len(caps)
    if prefix is not None:  # a 0 column: nothing forced past the end
        prefix = np.pad(np.asarray(prefix, np.int32).reshape(batch, -1), ((0, 0), (0, 1)))
    begin = _Greedy.start if k == 1 else _Beams.start
    if constraints is not None:
        constraints = np.asarray(constraints, np.int32).reshape(
            batch, -1, np.shape(constraints)[-1]
        )
        begin = _Constrained.starter(constraints)
    state = begin(np.arange(batch), caps, prefix, k, max_length, settings.bos_id, alpha)
    outputs = _Outputs(batch, k, max_length)
    drop = drop_finished and hasattr(step, "keep")
    index, done = 0, state.done()
    while index < max_length and not done.all():
        state.advance(step, index, alpha, settings.eos_id)
        index += 1
        done = state.done()
        settled = done & state.answered()  # [n] sentences whose answer cannot change
        if drop and index < max_length and settled.any() and not done.all():
            outputs.write(state.sentences[settled], state.select(settled), index, alpha)
            state = state.select(~settled)
            step.keep(np.flatnonzero(~settled))
    outputs.write(state.sentences, state, index, alpha)
    answer = outputs.arrays(return_all)
    return answer if constraints is None else answer + (outputs.met,)


class _Outputs:
    """The answers, written per sentence as sentences are dropped and at the end."""

    def __init__(self, batch, k, max_length):
        self.ids = np.zeros((batch, k, max_length), np.int32)
        self.scores = np.zeros((batch, k), np.float32)
        self.token_scores = np.zeros((batch, k, max_length), np.float32)
        self.met = np.ones(batch, bool)

    def write(self, sentences, state, index, alpha):
        ids, scores, token_scores = state.results(index, alpha)
        self.ids[sentences], self.scores[sentences] = ids, scores
        self.token_scores[sentences] = token_scores
        self.met[sentences] = state.met()

    def arrays(self, return_all):
        fields = (self.ids, self.scores, self.token_scores)
        return fields if return_all else tuple(x[:, 0] for x in fields)


class _State:
    """Arrays with the sentences on their first axis; `select` keeps some sentences."""

    def select(self, keep):
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return type(self)(**{n: None if x is None else x[keep] for n, x in fields.items()})

    def met(self):
        """bool `[n]`: the outputs meet the sentences' constraints (no constraints: all)."""
        return np.ones(len(self.sentences), bool)


def _sequences(sentences, k, max_length, bos_id):
    """int32 `[n, k, max_length + 1]` zeros with BOS in column 0, and float32 zeros like it."""
    seqs = np.zeros((len(sentences), k, max_length + 1), np.int32)
    seqs[:, :, 0] = bos_id
    return seqs, np.zeros(seqs.shape, np.float32)


def _call(step, ids, index, need, wanted=None):
    """`step(ids, index)` (`step(ids, index, wanted)`) as float32/int32 arrays; its K checked
    against what the search needs."""
    more = () if wanted is None else (np.asarray(wanted, np.int32),)
    top_log_probs, top_ids, eos_log_probs, *wanted_log_probs = step(
        ids.astype(np.int32), index, *more
    )
    top_log_probs = np.asarray(top_log_probs, np.float32)  # [rows, K]
    if top_log_probs.ndim != 2 or top_log_probs.shape[1] < need:
        raise ValueError(
            f"the step gave {top_log_probs.shape} top log-probabilities; need K >= {need}"
        )
    found = (top_log_probs, np.asarray(top_ids, np.int32), np.asarray(eos_log_probs, np.float32))
    return found + tuple(np.asarray(x, np.float32) for x in wanted_log_probs)


def _forcing(index, caps, prefix, eos_log_probs, eos_id, k):
    """The rows whose next token is forced: `(forced [rows] bool, token [rows], value [rows])`.

    As in the graph, the prefix's id comes first (`_forcing_prefix`: it alone, at log p 0), then
    EOS at the limit (`_force_eos`: EOS alone, keeping the value it had: the model's, or 0 / NEG_INF
    in a row the prefix forced). Per sentence (`caps` `[n]`, `prefix` `[n, p + 1]`), then per row.
    """
    if prefix is None:
        given = np.zeros(len(caps), np.int32)  # [n] the prefix's id now, 0 for none
    else:
        given = prefix[:, min(index, prefix.shape[1] - 1)]
    by_prefix, must_end = np.repeat(given > 0, k), np.repeat(index + 1 >= caps, k)  # [rows]
    given = np.repeat(given, k)
    prefix_eos = np.where(given == eos_id, np.float32(0.0), NEG_INF)
    eos_value = np.where(by_prefix, prefix_eos, eos_log_probs)
    token = np.where(must_end, eos_id, given).astype(np.int32)
    value = np.where(must_end, eos_value, np.float32(0.0)).astype(np.float32)
    return by_prefix | must_end, token, value


@dataclasses.dataclass
class _Greedy(_State):
    """Greedy search's state (`greedy_search`'s loop variables); rows = sentences."""

    sentences: Any  # [n] int: each row's sentence in the batch
    caps: Any  # [n] int32
    prefix: Any  # [n, p + 1] int32 or None
    seqs: Any  # [n, L] int32, L = max_length + 1, BOS first
    token_scores: Any  # [n, L] float32
    sums: Any  # [n] float32: log p of the tokens so far
    finished: Any  # [n] bool
    lengths: Any  # [n] int32: tokens generated, EOS included

    @classmethod
    def start(cls, sentences, caps, prefix, k, max_length, bos_id, alpha):
        seqs, token_scores = _sequences(sentences, 1, max_length, bos_id)
        n = len(sentences)
        return cls(
            sentences=sentences,
            caps=caps,
            prefix=prefix,
            seqs=seqs[:, 0],
            token_scores=token_scores[:, 0],
            sums=np.zeros(n, np.float32),
            finished=np.zeros(n, bool),
            lengths=np.zeros(n, np.int32),
        )

    def done(self):
        return self.finished

    def answered(self):
        return self.finished

    def advance(self, step, index, alpha, eos_id):
        """One token per row: the argmax (the step's first), or the forced one."""
        top_log_probs, top_ids, eos_log_probs = _call(step, self.seqs[:, index], index, 1)
        forced, token, value = _forcing(index, self.caps, self.prefix, eos_log_probs, eos_id, 1)
        # The argmax of a forced row: its token, or id 0 (the lowest) when all are NEG_INF.
        token = np.where(value > NEG_INF, token, 0)
        tokens = np.where(forced, token, top_ids[:, 0])  # [n]
        log_probs = np.where(forced, np.maximum(value, NEG_INF), top_log_probs[:, 0])
        # Rows that already ended keep 0 (padding) and their score.
        tokens = np.where(self.finished, 0, tokens)
        log_probs = np.where(self.finished, np.float32(0.0), log_probs).astype(np.float32)
        self.sums = np.where(self.finished, self.sums, self.sums + log_probs)
        self.lengths = np.where(self.finished, self.lengths, index + 1).astype(np.int32)
        self.finished = self.finished | (tokens == eos_id)
        self.seqs[:, index + 1], self.token_scores[:, index + 1] = tokens, log_probs

    def results(self, index, alpha):
        scores = self.sums / length_penalty(np.maximum(self.lengths, 1), alpha)
        return self.seqs[:, None, 1:], scores[:, None], self.token_scores[:, None, 1:]


def _take(x, indices):
    """`x` `[n, m, ...]` at `indices` `[n, j]` along axis 1: `[n, j, ...]`."""
    indices = indices.reshape(indices.shape + (1,) * (x.ndim - 2))
    return np.take_along_axis(x, indices, axis=1)


def _row_candidates(top_log_probs, top_ids, forced, token, value):
    """Each row's best next tokens `(ids, log_probs)` `[rows, K]`: the step's, or for a forced
    row its token and fillers, the lowest other ids at NEG_INF (the graph's masked row)."""
    rows, width = top_ids.shape
    j = np.arange(width - 1)
    fillers = j + (j >= token[:, None])  # [rows, K - 1] the lowest ids but `token`
    forced_ids = np.concatenate([token[:, None], fillers], axis=1)
    forced_log_probs = np.full((rows, width), NEG_INF, np.float32)
    forced_log_probs[:, 0] = value
    ids = np.where(forced[:, None], forced_ids, top_ids).astype(np.int32)
    return ids, np.where(forced[:, None], forced_log_probs, top_log_probs)


def _top_candidates(alive_log_probs, ids, log_probs, k):
    """A sentence's best `2k` extensions of its alive beams, in `top_k`'s order over the graph's
    flattened `[k * vocab]` (value, then beam, then id): `(sums, beams, ids, log_probs)`
    `[n, 2k]`."""
    n, width = alive_log_probs.shape[0], ids.shape[1]
    sums = (alive_log_probs.reshape(-1, 1) + log_probs).reshape(n, k * width)  # float32
    beams = np.broadcast_to(np.repeat(np.arange(k, dtype=np.int32), width), sums.shape)
    ids, log_probs = ids.reshape(n, k * width), log_probs.reshape(n, k * width)
    order = search_rules.candidate_order(sums, beams, ids, _CANDIDATES * k)  # [n, 2k]
    return tuple(np.take_along_axis(x, order, axis=1) for x in (sums, beams, ids, log_probs))


@dataclasses.dataclass
class _Beams(_State):
    """Beam search's state (`BeamState`, without the caches, which the step holds)."""

    sentences: Any  # [n] int: each sentence's place in the batch
    caps: Any  # [n] int32
    max_penalty: Any  # [n] float32: length_penalty(caps), the largest any output gets
    prefix: Any  # [n, p + 1] int32 or None
    alive_seqs: Any  # [n, k, L] int32, L = max_length + 1, BOS first
    alive_log_probs: Any  # [n, k] float32, sorted, NEG_INF for empty slots
    alive_token_scores: Any  # [n, k, L] float32
    finished_seqs: Any  # [n, k, L] int32
    finished_token_scores: Any  # [n, k, L] float32
    finished_scores: Any  # [n, k] float32, NEG_INF when empty
    finished_flags: Any  # [n, k] bool

    @classmethod
    def start(cls, sentences, caps, prefix, k, max_length, bos_id, alpha):
        seqs, token_scores = _sequences(sentences, k, max_length, bos_id)
        n = len(sentences)
        alive_log_probs = np.full((n, k), NEG_INF, np.float32)
        alive_log_probs[:, 0] = 0.0  # beams start identical: only the first is live
        return cls(
            sentences=sentences,
            caps=caps,
            max_penalty=length_penalty(caps, alpha),
            prefix=prefix,
            alive_seqs=seqs,
            alive_log_probs=alive_log_probs,
            alive_token_scores=token_scores,
            finished_seqs=np.zeros_like(seqs),
            finished_token_scores=np.zeros_like(token_scores),
            finished_scores=np.full((n, k), NEG_INF, np.float32),
            finished_flags=np.zeros((n, k), bool),
        )

    def done(self):
        """`_beam_search_continues`'s test per sentence: no alive beam can change the answer."""
        best_alive = self.alive_log_probs[:, 0] / self.max_penalty  # [n]
        worst = np.where(self.finished_flags[:, -1], self.finished_scores[:, -1], NEG_INF)
        no_alive = self.alive_log_probs[:, 0] <= HALF_NEG_INF
        return no_alive | (worst >= best_alive)

    def answered(self):
        return self.finished_flags[:, 0]

    def advance(self, step, index, alpha, eos_id):
        """`_beam_search_step`: one token more for every alive beam; the step's caches follow."""
        k = self.alive_log_probs.shape[1]
        ids = self.alive_seqs[:, :, index].reshape(-1)  # [rows]
        top_log_probs, top_ids, eos_log_probs = _call(step, ids, index, _CANDIDATES * k)
        forced = _forcing(index, self.caps, self.prefix, eos_log_probs, eos_id, k)
        candidates = _row_candidates(top_log_probs, top_ids, *forced)  # [rows, K] each
        sums, beams, tokens, log_probs = _top_candidates(self.alive_log_probs, *candidates, k)
        length = index + 1  # tokens in each candidate, EOS included
        rows = (self.alive_seqs, self.alive_token_scores)
        top_rows = tuple(_take(x, beams) for x in rows)  # [n, 2k, L] each
        top_rows[0][:, :, length], top_rows[1][:, :, length] = tokens, log_probs
        ends = tokens == eos_id  # [n, 2k]
        # Alive: the best k candidates that did not end; the caches follow them.
        alive_sums = np.where(ends, NEG_INF, sums)
        alive = search_rules.top_k_indices(alive_sums, k)  # [n, k]
        origin = np.take_along_axis(beams, alive, axis=1)  # [n, k] source beam
        self.alive_log_probs = np.take_along_axis(alive_sums, alive, axis=1)
        self.alive_seqs, self.alive_token_scores = (_take(x, alive) for x in top_rows)
        self._merge_finished(sums, top_rows, ends, k, alpha, length)
        flat = (origin + k * np.arange(len(origin))[:, None]).reshape(-1)  # [rows]
        if not np.array_equal(flat, np.arange(flat.size)):
            step.reorder(flat)

    def _merge_finished(self, sums, top_rows, ends, k, alpha, length):
        """`_merge_finished`: the best k of the old finished hypotheses and the candidates that
        end now, an ending one counting only among the top k (so beam 1 is greedy search)."""
        in_top_k = np.arange(_CANDIDATES * k) < k  # [2k]
        new_flags = ends & (sums > HALF_NEG_INF) & in_top_k  # [n, 2k]
        new_scores = np.where(new_flags, sums / length_penalty(length, alpha), NEG_INF)
        scores = np.concatenate([self.finished_scores, new_scores.astype(np.float32)], axis=1)
        keep = search_rules.top_k_indices(scores, k)  # [n, k] of 3k
        self.finished_scores = np.take_along_axis(scores, keep, axis=1)
        flags = np.concatenate([self.finished_flags, new_flags], axis=1)
        self.finished_flags = np.take_along_axis(flags, keep, axis=1)
        old = (self.finished_seqs, self.finished_token_scores)
        merged = (_take(np.concatenate([a, b], axis=1), keep) for a, b in zip(old, top_rows))
        self.finished_seqs, self.finished_token_scores = merged

    def results(self, index, alpha):
        """`_best_hypotheses`: the finished hypotheses, or the alive ones where none finished."""
        any_finished = self.finished_flags[:, :1]  # [n, 1]
        alive_scores = self.alive_log_probs / length_penalty(max(index, 1), alpha)
        seqs = np.where(any_finished[:, :, None], self.finished_seqs, self.alive_seqs)
        token_scores = np.where(
            any_finished[:, :, None], self.finished_token_scores, self.alive_token_scores
        )
        scores = np.where(any_finished, self.finished_scores, alive_scores)
        return seqs[:, :, 1:], scores, token_scores[:, :, 1:]


@dataclasses.dataclass
class _Constrained(_Beams):
    """The constrained beam search's state (`decoding.constraints`' loop variables, without the
    caches): `_Beams`' and each hypothesis's progress on each constraint. Its alive beams are
    in the banks' order, not sorted."""

    constraints: Any  # [n, C, P] int32, 0-padded
    progress: Any  # [n, k, C] int32

    @classmethod
    def starter(cls, constraints):
        """`start`'s function for sentences with these constraints (`[batch, C, P]`)."""

        def start(sentences, caps, prefix, k, max_length, bos_id, alpha):
            beams = _Beams.start(sentences, caps, prefix, k, max_length, bos_id, alpha)
            fields = {f.name: getattr(beams, f.name) for f in dataclasses.fields(beams)}
            progress = np.zeros((len(sentences), k, constraints.shape[1]), np.int32)
            return cls(**fields, constraints=constraints[sentences], progress=progress)

        return start

    def done(self):
        """`decoding.constraints`' stopping rule per sentence (`constraint_rules`)."""
        return rules.sentences_done(
            rules.NUMPY, self.alive_log_probs, self.finished_flags, self.finished_scores,
            self.max_penalty,
        )  # fmt: skip

    def met(self):
        return rules.constraints_met(rules.NUMPY, self.finished_flags, self.constraints)

    def _candidates(self, step, index, eos_id):
        """Every candidate of the step, `[n, M]` each (`constraint_rules.candidates`), repeated
        ones impossible: `(log_probs, token log p, beams, tokens)`."""
        xp, (n, k), c = rules.NUMPY, self.alive_log_probs.shape, self.constraints.shape[1]
        lengths = rules.constraint_lengths(xp, self.constraints)  # [n, C]
        wanted, pieces = rules.next_pieces(xp, self.progress, self.constraints, n, k)
        ids = self.alive_seqs[:, :, index].reshape(-1)  # [rows]
        top_log_probs, top_ids, eos_log_probs, piece_log_probs = _call(
            step, ids, index, _CANDIDATES * k + 1, pieces.reshape(n * k, c)
        )
        forced, token, value = _forcing(index, self.caps, None, eos_log_probs, eos_id, k)
        row_ids, row_log_probs = _row_candidates(top_log_probs, top_ids, forced, token, value)
        # A forced row's pieces: only its token keeps a log p, as in the graph's masked row.
        kept = np.where(pieces.reshape(n * k, c) == token[:, None], value[:, None], NEG_INF)
        piece_log_probs = np.where(forced[:, None], kept, piece_log_probs)
        width = row_ids.shape[1]
        row_ids = row_ids.reshape(n, k, width)
        row_log_probs = rules.refuse_eos(
            xp, row_log_probs.reshape(n, k, width), self.progress, lengths, row_ids == eos_id
        ).astype(np.float32)
        piece_log_probs = rules.refuse_eos(
            xp, piece_log_probs.reshape(n, k, c), self.progress, lengths, pieces == eos_id
        ).astype(np.float32)
        sums, beams, tokens, log_probs = _top_candidates(
            self.alive_log_probs, row_ids.reshape(n * k, width),
            row_log_probs.reshape(n * k, width), k,
        )  # fmt: skip
        # Each beam's best token: the largest log p, the lowest id among equals (argmax's).
        first = np.lexsort((row_ids, -row_log_probs), axis=-1)[:, :, :1]  # [n, k, 1]
        best = tuple(
            np.take_along_axis(x, first, axis=2)[:, :, 0] for x in (row_log_probs, row_ids)
        )
        forced_log_probs = np.where(wanted, piece_log_probs, NEG_INF).astype(np.float32)
        values, token_log_probs, beams, tokens = rules.candidates(
            xp, (sums, log_probs, beams, tokens), self.alive_log_probs, best,
            (forced_log_probs, pieces), n, k, c,
        )  # fmt: skip
        values = np.where(rules.earlier_same(xp, beams, tokens), NEG_INF, values)
        return values.astype(np.float32), token_log_probs, beams, tokens

    def advance(self, step, index, alpha, eos_id):
        """`decoding.constraints._constrained_step`: one token more for every alive beam, the
        candidates taken by banks; the step's caches follow."""
        xp, (n, k) = rules.NUMPY, self.alive_log_probs.shape
        values, token_log_probs, beams, tokens = self._candidates(step, index, eos_id)
        chosen, new_progress = rules.choose(
            xp, self.alive_seqs, index, self.progress, (values, beams, tokens), self.constraints, k
        )
        top = tuple(
            np.take_along_axis(x, chosen, axis=1) for x in (values, token_log_probs, beams, tokens)
        )
        top_values, top_token, top_beams, top_tokens = top
        top_progress = _take(new_progress, chosen)  # [n, 2k, C]
        length = index + 1
        top_rows = tuple(_take(x, top_beams) for x in (self.alive_seqs, self.alive_token_scores))
        top_rows[0][:, :, length], top_rows[1][:, :, length] = top_tokens, top_token
        ends = top_tokens == eos_id  # [n, 2k]
        constrained = rules.constrained_rows(xp, self.constraints)  # [n]
        alive = rules.alive_order(xp, top_values, ends, constrained, k)  # [n, k]
        origin = np.take_along_axis(top_beams, alive, axis=1)  # [n, k] source beam
        self.alive_log_probs = np.take_along_axis(top_values, alive, axis=1)
        self.alive_seqs, self.alive_token_scores = (_take(x, alive) for x in top_rows)
        self._merge_finished(top_values, top_rows, ends, k, alpha, length)
        self.progress = _take(top_progress, alive)
        flat = (origin + k * np.arange(n)[:, None]).reshape(-1)  # [rows]
        if not np.array_equal(flat, np.arange(flat.size)):
            step.reorder(flat)
