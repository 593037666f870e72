"""The confidence's calibration: a monotone logistic map fitted on a dev set against chrF.

The `Translator`'s `confidence` output is `sigmoid(bias + a * score + b * n-best margin)` with
`a, b >= 0`, the score being the search's own (the length-normalised log-probability the
hypotheses are ranked by). More probable and more clearly preferred translations never get a
lower confidence, and along an n-best list, where both the score and the margin fall, the
confidence never rises: the best hypothesis is always the most confident. `fit_calibration`
fits `a`, `b` and `bias` at export on the dev set, the target being each sentence's chrF / 100
(a logistic regression on soft labels), and `calibration_report` measures how well the
confidence ranks the sentences.
"""

import numpy as np
import sacrebleu

from keras_transformer.search_rules import MAX_MARGIN, MIN_SCORE  # the map's, once


def sentence_chrf(hypotheses, references):
    """sacreBLEU's sentence chrF (0-100) of each hypothesis against its reference."""
    metric = sacrebleu.metrics.CHRF()
    return np.array(
        [metric.sentence_score(h, [r]).score for h, r in zip(hypotheses, references)], "float64"
    )


def features(scores, margins):
    """`[n, 2]` float64: the search's scores and the n-best margins, clipped as the graph clips
    them (`Translator._confidence`)."""
    scores = np.asarray(scores, "float64")
    return np.stack(
        [np.maximum(scores, MIN_SCORE), np.clip(margins, -MAX_MARGIN, MAX_MARGIN)], axis=1
    )


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.clip(x, -60, 60)))


def fit_calibration(x, target, steps=2000, learning_rate=0.5):
    """Fits `sigmoid(bias + x @ w)` to `target` in [0, 1] (cross-entropy, `w >= 0`).

    Projected gradient descent on standardised features (the loss is convex; the projection
    keeps the map monotone). Returns `{"score_weight", "margin_weight", "bias"}` in the
    original units.
    """
    x = np.asarray(x, "float64")
    target = np.clip(np.asarray(target, "float64"), 0.0, 1.0)
    center, scale = x.mean(axis=0), x.std(axis=0)
    scale = np.where(scale > 1e-9, scale, np.inf)  # a constant feature gets weight 0
    z = (x - center) / scale
    w, bias = np.zeros(x.shape[1]), 0.0
    for _ in range(steps):
        error = _sigmoid(bias + z @ w) - target  # the cross-entropy's gradient in the logit
        w = np.maximum(w - learning_rate * (z.T @ error) / len(z), 0.0)
        bias -= learning_rate * float(np.mean(error))
    weights = w / scale
    return {
        "score_weight": float(weights[0]),
        "margin_weight": float(weights[1]),
        "bias": float(bias - np.sum(weights * center)),
    }


def apply_calibration(calibration, x):
    """The confidence of feature rows `x` `[n, 2]` under `calibration` (numpy mirror of the
    graph's map)."""
    x = np.asarray(x, "float64")
    logit = (
        calibration["bias"]
        + calibration["score_weight"] * x[:, 0]
        + calibration["margin_weight"] * x[:, 1]
    )
    return _sigmoid(logit)


def _ranks(values):
    """Average ranks (ties share the mean of their ranks), 0-based."""
    values = np.asarray(values, "float64")
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a, b):
    """Spearman's rank correlation of two sequences (0 when either is constant)."""
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = np.sqrt(np.sum(ra**2) * np.sum(rb**2))
    return float(np.sum(ra * rb) / denominator) if denominator > 0 else 0.0


def calibration_report(confidence, hypotheses, references, chrf):
    """How well `confidence` ranks the sentences: Spearman with sentence chrF, and the corpus
    chrF of the lowest-confidence decile against the rest."""
    confidence = np.asarray(confidence, "float64")
    order = np.argsort(confidence, kind="stable")
    low = set(order[: max(1, len(order) // 10)].tolist())
    groups = {True: ([], []), False: ([], [])}
    for i, (h, r) in enumerate(zip(hypotheses, references)):
        groups[i in low][0].append(h)
        groups[i in low][1].append(r)

    def corpus_chrf(group):
        hyps, refs = group
        return round(float(sacrebleu.metrics.CHRF().corpus_score(hyps, [refs]).score), 2)

    return {
        "sentences": len(confidence),
        "spearman_chrf": round(spearman(confidence, chrf), 4),
        "chrf_lowest_decile": corpus_chrf(groups[True]),
        "chrf_rest": corpus_chrf(groups[False]) if groups[False][0] else None,
        "mean_confidence": round(float(np.mean(confidence)), 4),
        "mean_sentence_chrf": round(float(np.mean(chrf)), 2),
    }


def fit_on_dev(hypotheses, references, scores, margins):
    """The confidence's map fitted on dev translations (their search scores and n-best
    margins) against their sentence chrF: `(map, card figures)`, the figures being the map,
    `fitted: True` and `calibration_report`'s. Both exports (SavedModel, LiteRT) fit with it."""
    x = features(scores, margins)
    chrf = sentence_chrf(hypotheses, references)
    fitted = fit_calibration(x, chrf / 100.0)
    report = calibration_report(apply_calibration(fitted, x), hypotheses, references, chrf)
    return fitted, {"fitted": True, **fitted, **report}


def decoding_speed(sentences, seconds, tokens, request):
    """The model card's `decoding_speed` of `sentences` decoded in `seconds` (`tokens` output
    tokens; `request` says how they were sent)."""
    return {
        "sentences": sentences,
        "seconds": round(seconds, 3),
        "sentences_per_second": round(sentences / seconds, 2),
        "tokens_per_second": round(float(tokens) / seconds, 1),
        "request": request,
    }
