"""How far the exported `confidence` can be trusted on sentences its map never saw.

The export fits the confidence's map on the dev set (`keras_transformer.export.calibration`);
the model card's Spearman and decile figures are computed on those same dev sentences. This
script asks the exported SavedModel (`serving_default`, as TF Serving would) for the translations
and confidences of the **test** set, held out from the fit, and reports Spearman's rank
correlation with sentence chrF and the corpus chrF of the lowest-confidence tenth against the
rest, beside the card's in-sample dev figures. One JSON line (`figure: confidence`; with
`BENCH_LABEL` set, appended to `benchmarks/results/confidence.jsonl`).

    BENCH_LABEL=quickstart python benchmarks/confidence.py --workdir workdirs/quickstart

`--workdir` is a trained workdir: its `result.json` names the export, its config the test set.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit  # noqa: E402

BATCH = 64


def held_out_figures(serve, pairs):
    """`calibration_report` of the export's confidence on `pairs` `[(source, reference)]`."""
    import numpy as np
    import tensorflow as tf

    from keras_transformer.export import calibration as calib

    confidence, hypotheses = [], []
    for start in range(0, len(pairs), BATCH):
        out = serve(text=tf.constant([s for s, _ in pairs[start : start + BATCH]]))
        confidence.extend(np.asarray(out["confidence"]).tolist())
        hypotheses.extend(t.decode("utf-8") for t in np.asarray(out["translation"]))
    references = [r for _, r in pairs]
    chrf = calib.sentence_chrf(hypotheses, references)
    return calib.calibration_report(confidence, hypotheses, references, chrf)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="a trained workdir (with result.json)")
    parser.add_argument("--model", help="the SavedModel (default: the one result.json names)")
    args = parser.parse_args()
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops the export runs)

    from keras_transformer.config import load_config
    from keras_transformer.data import read_pairs
    from keras_transformer.workdir import Workdir

    layout = Workdir(args.workdir)
    with open(layout.result, encoding="utf-8") as f:
        result = json.load(f)
    config = load_config(layout.config)
    model = args.model or result["saved_model"]
    with open(os.path.join(model, "assets.extra", "model_card.json"), encoding="utf-8") as f:
        fitted = json.load(f)["calibration"]
    if not config.data.test:
        raise SystemExit(f"{args.workdir}: the config has no data.test to hold out")
    pairs = read_pairs(config.data.test)
    test = held_out_figures(tf.saved_model.load(model).signatures["serving_default"], pairs)
    emit(
        figure="confidence",
        system="keras-transformer",
        config=config.name,
        test=config.data.test,
        steps=result.get("step"),
        model=model,
        fitted_on_dev_sentences=fitted.get("sentences"),
        score_weight=fitted.get("score_weight"),
        margin_weight=fitted.get("margin_weight"),
        bias=fitted.get("bias"),
        dev_spearman_chrf_in_sample=fitted.get("spearman_chrf"),
        test_sentences=test["sentences"],
        test_spearman_chrf=test["spearman_chrf"],
        test_chrf_lowest_decile=test["chrf_lowest_decile"],
        test_chrf_rest=test["chrf_rest"],
        test_mean_confidence=test["mean_confidence"],
        test_mean_sentence_chrf=test["mean_sentence_chrf"],
    )


if __name__ == "__main__":
    main()
