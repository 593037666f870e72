"""What the graph search (`keras_transformer.decoding.search`, written with `keras.ops`) and the
LiteRT runtime's numpy search (`keras_transformer.litert.search`) take from one place: the
numbers they agree on, the rule that breaks ties between equal candidates, and the calibrated
confidence of what they found (`nbest_margins`, `confidence`: the SavedModel's graph, the
LiteRT runtime and the calibration's fit). The runtime loads
neither TensorFlow nor Keras, so this module imports only numpy and the standard library.

References:
    Wu et al., 2016, "Google's Neural Machine Translation System", section 7 (length penalty).
"""

import numpy as np

# The package's one finite "minus infinity": the logit of a masked key (the softmax runs in
# float32, where it is finite), the log-probability of an impossible token in the searches and
# the score of an empty n-best slot; sums of a few stay finite in float32 (no inf - inf = NaN).
NEG_INF = -1.0e9
# Anything at or below is treated as impossible.
HALF_NEG_INF = 0.5 * NEG_INF
# GNMT's length penalty `((LENGTH_PENALTY_OFFSET + length) / LENGTH_PENALTY_DIVISOR) ** alpha`,
# computed in float32 by both searches.
LENGTH_PENALTY_OFFSET = 5.0
LENGTH_PENALTY_DIVISOR = 6.0
# Beam search keeps each input's best `CANDIDATES_PER_BEAM * k` one-token extensions, so that
# hypotheses ending in EOS never crowd out all the live ones.
CANDIDATES_PER_BEAM = 2


def top_k_indices(values, k):
    """Indices of the `k` largest of each row of numpy `values` `[rows, n]`, best first, ties
    to the lower index: the tie rule of `ops.top_k` (TensorFlow's and JAX's), with which the
    graph search ranks (old finished hypotheses come before new ones, so they win ties)."""
    return np.argsort(-values, axis=1, kind="stable")[:, :k]


def candidate_order(values, beams, ids, k):
    """Indices of the `k` best candidates of each row, given as numpy `values`, `beams` and
    token `ids` `[rows, n]`: `ops.top_k`'s order over the graph's flattened `[beams * vocab]`
    candidates, i.e. value first, then the lower beam, then the lower id."""
    return np.lexsort((ids, beams, -values), axis=-1)[:, :k]


# The confidence's map (`export.calibration` fits it): `sigmoid(bias + score_weight *
# max(score, MIN_SCORE) + margin_weight * margin)`, the n-best margin clipped to MAX_MARGIN.
MAX_MARGIN = 20.0
MIN_SCORE = -50.0
DEFAULT_CALIBRATION = {"score_weight": 2.0, "margin_weight": 0.0, "bias": 1.0}


def nbest_margins(xp, scores):
    """float32 `[c, K]`: each hypothesis's score (`scores` `[c, K]`, best first) minus the best
    score of the other hypotheses (0 for a single hypothesis), clipped to `MAX_MARGIN` (empty
    slots score NEG_INF). `xp`: `keras.ops` or `constraint_rules.NUMPY`."""
    width = scores.shape[1]  # K: the beam size, 1 for greedy search or sampling
    if width == 1:
        return xp.zeros_like(scores)
    # [c, K, K]: row j holds the scores with hypothesis j itself masked out.
    others = xp.where(xp.eye(width, dtype="bool"), NEG_INF, xp.expand_dims(scores, 1))
    return xp.clip(scores - xp.max(others, axis=-1), -MAX_MARGIN, MAX_MARGIN)


def confidence(xp, calibration, scores, margins):
    """The calibrated confidence (a dict of `score_weight`, `margin_weight`, `bias`) of
    hypotheses with these scores and n-best margins (both `[...]`)."""
    logit = (
        calibration["bias"]
        + calibration["score_weight"] * xp.maximum(scores, MIN_SCORE)
        + calibration["margin_weight"] * margins
    )
    return 1.0 / (1.0 + xp.exp(-xp.clip(logit, -60.0, 60.0)))
