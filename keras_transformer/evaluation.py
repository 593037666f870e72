"""Translation quality with sacreBLEU (BLEU and chrF on detokenized text)."""

import sacrebleu


def score_translations(hypotheses, references):
    """Corpus BLEU and chrF of `hypotheses` against one reference each.

    Returns a dict with `bleu`, `chrf` (floats) and the sacreBLEU `signature` strings, so that
    figures can be compared across papers and runs.
    """
    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: they must align"
        )
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": round(float(bleu_score.score), 2),
        "chrf": round(float(chrf_score.score), 2),
        "signature": {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())},
        "sentences": len(hypotheses),
    }


def average_checkpoints(model, paths):
    """Sets `model`'s weights to the element-wise mean of the checkpoints at `paths`.

    The paper averages the last 5 (base) or 20 (big) checkpoints, written 10 minutes apart;
    the mean of nearby points of one run is a smoother, usually slightly better, model.

    Args:
        model: a built Keras model whose weights match the checkpoints.
        paths: Keras weight files (`*.weights.h5`), at least one.

    Returns:
        `model`, holding the averaged weights (non-float weights, if any, from the last file).

    Example:
    >>> average_checkpoints(model, sorted(glob.glob("workdir/checkpoints/*.weights.h5"))[-5:])
    """
    import numpy as np

    paths = list(paths)
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint path")
    sums = None
    for path in paths:
        model.load_weights(path)
        values = [np.asarray(w.numpy()) for w in model.weights]
        if sums is None:
            sums = [v.astype("float64") if v.dtype.kind == "f" else v for v in values]
        else:
            sums = [s + v if v.dtype.kind == "f" else v for s, v in zip(sums, values, strict=True)]
    for weight, total in zip(model.weights, sums, strict=True):
        if total.dtype.kind == "f":
            weight.assign((total / len(paths)).astype(weight.dtype))
    return model
