"""Beam size and length penalty chosen on dev: decodes a dev set with a trained workdir's model
under each (beam size, alpha) of a grid and prints one JSON line per setting with sacreBLEU and
chrF, the output length ratio and the decoding seconds.

The model is loaded once (the workdir's config and vocabulary, the last `--average` checkpoints,
as `keras-transformer export` does); each setting builds the `Translator` that
`keras-transformer export --beam-size K --alpha A` would save (`export_translator`), so the
figures are the SavedModel's. Choose on dev, then set `decode.beam_size`/`decode.alpha`
(and report test once).

Run from the repository root:

    PYTHONPATH=$PWD TF_CPP_MIN_LOG_LEVEL=2 python benchmarks/decode_sweep.py \\
        --workdir WORKDIR --source dev.en --reference dev.de --beams 1,4,8 --alphas 0.2,0.6,1.0
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit  # noqa: E402


def _floats(text):
    return [float(x) for x in text.split(",") if x.strip()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--source", required=True, help="dev sources, one per line")
    parser.add_argument("--reference", required=True, help="dev references, one per line")
    parser.add_argument("--beams", default="1,4,8")
    parser.add_argument("--alphas", default="0.2,0.6,1.0")
    parser.add_argument("--average", type=int, default=None, help="default: the config's")
    args = parser.parse_args()

    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import tensorflow as tf

    from keras_transformer.commands import load_workdir_model, read_lines
    from keras_transformer.config import decoding_settings
    from keras_transformer.evaluation import score_translations
    from keras_transformer.export.plan import ExportPlan
    from keras_transformer.export.saved_model import export_translator

    sources = read_lines(args.source, "source")
    references = read_lines(args.reference, "reference")
    config, final, spm_bytes = load_workdir_model(args.workdir, args.average, select=False)
    model, steps = final.model, final.steps
    for beam in [int(b) for b in _floats(args.beams)]:
        for alpha in _floats(args.alphas):
            settings = decoding_settings(config, True, beam_size=beam, alpha=alpha, n_best=1)
            plan = ExportPlan(settings=settings, data=config.data)
            translator = export_translator(model, spm_bytes, plan)
            start = time.perf_counter()
            # One call: the Translator sorts by length and decodes in chunks of
            # decode.batch_size inside its graph.
            out = translator(tf.constant(sources))
            hypotheses = [t.decode("utf-8") for t in out["translation"].numpy()]
            seconds = time.perf_counter() - start
            scores = score_translations(hypotheses, references)
            ratio = sum(len(h.split()) for h in hypotheses) / max(
                1, sum(len(r.split()) for r in references)
            )
            emit(
                figure="decode_sweep",
                workdir=os.path.abspath(args.workdir),
                steps=steps,
                beam_size=beam,
                alpha=alpha,
                bleu=scores["bleu"],
                chrf=scores["chrf"],
                length_ratio=round(ratio, 3),
                sentences=len(hypotheses),
                seconds=round(seconds, 1),
            )


if __name__ == "__main__":
    main()
