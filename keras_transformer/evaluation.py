"""Translation quality with sacreBLEU (BLEU and chrF on detokenized text).

Checkpoint averaging lives with the checkpoints, in `keras_transformer.workdir`.
"""

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
