"""The LiteRT export's answers on a trained model: the float32 export against the SavedModel on
dev sentences (same translations), and sacreBLEU of float32, float16 and int8 on the test set.

Usage (from the repository root, PYTHONPATH=$PWD; a trained workdir, e.g. on Tatoeba):
    python benchmarks/litert_quality.py --workdir workdirs/tatoeba --alpha 1.0

The workdir's final model (`--average N`, default the last checkpoint) is exported as a
SavedModel and as LiteRT float32, float16 and dynamic_int8 with the same decoding settings. The
first `--sentences` dev sentences are translated by the SavedModel (`serving_default`) and the
float32 LiteRT export: the line counts the translations that are the same text, and the largest
score difference. Then every export translates the test set and sacreBLEU scores it. One JSON
line per figure (ledger `litert_quality` with BENCH_LABEL set).
"""

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from benchmarks.common import emit  # noqa: E402

QUANTIZATIONS = ("float32", "float16", "dynamic_int8")


def _export(workdir, work, average, alpha):
    """`{"saved_model": path, quantization: path}` of the workdir's final model."""
    from keras_transformer import cli

    common = ["--workdir", workdir, "--average", str(average)]
    common += [] if alpha is None else ["--alpha", str(alpha)]
    paths = {}
    code = cli.main(["export", *common, "--output", work, "--name", "saved_model"])
    assert code == 0
    paths["saved_model"] = os.path.join(work, "saved_model", "1")
    for q in QUANTIZATIONS:
        path = os.path.join(work, f"litert-{q}")
        assert cli.main(["export", *common, "--format", "litert", "--quantization", q,
                         "--output", path]) == 0  # fmt: skip
        paths[q] = path
    return paths


def _translators(paths):
    """`{name: texts -> (translations, scores)}`: each export through the CLI's loaders."""
    from keras_transformer.commands.signatures import load_litert_function, load_serving_function

    functions = {"saved_model": load_serving_function(paths["saved_model"])}
    for q in QUANTIZATIONS:
        functions[q] = load_litert_function(paths[q])
    return functions


def _translate(fn, sources, batch=64):
    out, scores = [], []
    for start in range(0, len(sources), batch):
        texts, s = fn(sources[start : start + batch])
        out += texts
        scores += s
    return out, np.asarray(scores)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--average", type=int, default=1, help="checkpoints averaged")
    parser.add_argument(
        "--alpha", type=float, default=None, help="length penalty (default: config)"
    )
    parser.add_argument("--sentences", type=int, default=100, help="dev sentences compared")
    args = parser.parse_args()
    import sacrebleu

    from keras_transformer.config import load_config
    from keras_transformer.data import read_pairs

    config = load_config(os.path.join(args.workdir, "config.yaml"))
    dev = read_pairs(config.data.dev)[: args.sentences]
    test = read_pairs(config.data.test)
    common = dict(workdir=args.workdir, average=args.average, alpha=args.alpha)
    with tempfile.TemporaryDirectory(prefix="kt-litert-quality-") as work:
        paths = _export(args.workdir, work, args.average, args.alpha)
        sizes = {
            name: sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(path) for f in fs)
            for name, path in paths.items()
        }
        functions = _translators(paths)
        sources = [s for s, _ in dev]
        reference, ref_scores = _translate(functions["saved_model"], sources)
        ours, our_scores = _translate(functions["float32"], sources)
        same = sum(a == b for a, b in zip(reference, ours))
        emit(what="litert_float32_vs_saved_model", dev_sentences=len(sources), same=same,
             max_score_difference=round(float(np.abs(ref_scores - our_scores).max()), 6),
             **common)  # fmt: skip
        bleu = {}
        for name, fn in functions.items():
            started = time.perf_counter()
            hypotheses, _ = _translate(fn, [s for s, _ in test])
            seconds = time.perf_counter() - started
            bleu[name] = sacrebleu.corpus_bleu(hypotheses, [[r for _, r in test]]).score
            emit(what="test_bleu", export=name, bleu=round(bleu[name], 2),
                 test_sentences=len(test), seconds=round(seconds, 1),
                 size_mb=round(sizes[name] / 1e6, 1), **common)  # fmt: skip
        deltas = {f"{q}_minus_float32": round(bleu[q] - bleu["float32"], 2) for q in QUANTIZATIONS}
        deltas["float32_minus_saved_model"] = round(bleu["float32"] - bleu["saved_model"], 2)
        del deltas["float32_minus_float32"]
        emit(what="bleu_deltas", **deltas, **common)


if __name__ == "__main__":
    main()
