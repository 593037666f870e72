"""Test BLEU with and without the vocabulary shortlist, on a trained workdir: the SavedModel
exported with and without `--shortlist`, and the LiteRT `dynamic_int8` export run with
`shortlist=False` and `shortlist=True` (one export holds both); with `--bfloat16`, also the
SavedModel exported with `--precision bfloat16`, without and with the shortlist.

Usage (from the repository root, PYTHONPATH=$PWD; a trained workdir, e.g. on Tatoeba with
`configs/small.yaml`):
    python benchmarks/shortlist_quality.py --workdir workdirs/tatoeba [--k 100 --m 100]

The workdir's lexical table (`keras-transformer shortlist`, `WORKDIR/shortlist.npz`) is built
when missing, with `--k` and `--m`. The final model (the last `--average N` checkpoints
averaged, default 1; `--alpha`, default the config's) is exported four ways into a temporary
directory; each translates the test set (`data.test` of the workdir's config) in batches of
`--batch-size` and sacreBLEU scores it against the references. One JSON line per system
(`bleu`, `chrf`, `seconds`: a speed figure only when the machine ran nothing else), then one
with the differences with minus without (`saved_model_delta`, `litert_int8_delta`: the issue's
"within 0.2") and the share of test sentences translated identically; with `--bfloat16`, one
more (`bfloat16_bleu_deltas`: bfloat16 minus float32, without and with the shortlist, and the
shares translated identically). Ledger `shortlist_quality` with BENCH_LABEL set.
"""

import argparse
import os
import re
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import emit  # noqa: E402
from keras_transformer.data.shortlist import DEFAULT_K, DEFAULT_M  # noqa: E402


def _cli(*argv):
    from keras_transformer import cli

    code = cli.main(list(argv))
    if code != 0:
        raise SystemExit(f"keras-transformer {' '.join(argv)} exited {code}")


def _exports(args, work):
    """`{system: texts -> translations}` of the four systems."""
    from keras_transformer import litert
    from keras_transformer.commands.signatures import load_serving_function

    common = ["--workdir", args.workdir, "--average", str(args.average)]
    common += [] if args.alpha is None else ["--alpha", str(args.alpha)]
    systems = {}
    exports = (("saved_model", "--no-shortlist"), ("saved_model_shortlist", "--shortlist"))
    for precision in ("float32", "bfloat16") if args.bfloat16 else ("float32",):
        for name, flag in exports:
            name += "" if precision == "float32" else f"_{precision}"
            flags = (flag, "--precision", precision, "--output", work, "--name", name)
            _cli("export", *common, *flags)
            serve = load_serving_function(os.path.join(work, name))
            systems[name] = lambda texts, serve=serve: serve(texts)[0]
    path = os.path.join(work, "litert-int8")
    _cli("export", *common, "--format", "litert", "--quantization", "dynamic_int8",
         "--shortlist", "--output", path)  # fmt: skip
    for name, listed in (("litert_int8", False), ("litert_int8_shortlist", True)):
        translator = litert.load(path, shortlist=listed)
        systems[name] = lambda texts, t=translator: t.translate(texts)["translation"]
    return systems


def _short(spec):
    """A data spec with each path cut to its last two parts (the ledger names no machine's
    directories): `text:/x/y/corpus/test.en,...` -> `text:corpus/test.en,...`."""
    return re.sub(r"[^:,]*/([^/:,]+/[^/:,]+)", r"\1", spec)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, help="a trained workdir")
    parser.add_argument("--average", type=int, default=1, help="checkpoints averaged")
    parser.add_argument(
        "--alpha", type=float, default=None, help="length penalty (default: config)"
    )
    parser.add_argument(
        "--k", type=int, default=DEFAULT_K, help="the table's translations per piece"
    )
    parser.add_argument("--m", type=int, default=DEFAULT_M, help="its most frequent pieces")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--bfloat16", action="store_true", help="also the SavedModel in bfloat16 (export.precision)"
    )
    args = parser.parse_args()
    import sacrebleu

    from keras_transformer.config import load_config
    from keras_transformer.data import read_pairs

    if not os.path.exists(os.path.join(args.workdir, "shortlist.npz")):
        _cli("shortlist", "--workdir", args.workdir, "--k", str(args.k), "--m", str(args.m))
    config = load_config(os.path.join(args.workdir, "config.yaml"))
    test = read_pairs(config.data.test, verbose=False)
    sources, references = [s for s, _ in test], [t for _, t in test]
    common = dict(workdir=args.workdir, test=_short(config.data.test), test_sentences=len(test),
                  k=args.k, m=args.m)  # fmt: skip
    outputs, bleu = {}, {}
    with tempfile.TemporaryDirectory(prefix="kt-shortlist-quality-") as work:
        for system, translate in _exports(args, work).items():
            started, out = time.perf_counter(), []
            for start in range(0, len(sources), args.batch_size):
                out += list(translate(sources[start : start + args.batch_size]))
            seconds = time.perf_counter() - started
            outputs[system] = out
            bleu[system] = sacrebleu.corpus_bleu(out, [references]).score
            emit(what="shortlist_test_bleu", system=system, bleu=round(bleu[system], 2),
                 chrf=round(sacrebleu.corpus_chrf(out, [references]).score, 2),
                 seconds=round(seconds, 1), **common)  # fmt: skip

    def same(a, b):
        return round(sum(x == y for x, y in zip(outputs[a], outputs[b])) / len(sources), 4)

    emit(what="shortlist_bleu_deltas",
         saved_model_delta=round(bleu["saved_model_shortlist"] - bleu["saved_model"], 2),
         litert_int8_delta=round(bleu["litert_int8_shortlist"] - bleu["litert_int8"], 2),
         saved_model_same=same("saved_model", "saved_model_shortlist"),
         litert_int8_same=same("litert_int8", "litert_int8_shortlist"), **common)  # fmt: skip
    if args.bfloat16:
        emit(what="bfloat16_bleu_deltas",
             saved_model_delta=round(bleu["saved_model_bfloat16"] - bleu["saved_model"], 2),
             saved_model_shortlist_delta=round(
                 bleu["saved_model_shortlist_bfloat16"] - bleu["saved_model_shortlist"], 2),
             saved_model_same=same("saved_model", "saved_model_bfloat16"),
             saved_model_shortlist_same=same("saved_model_shortlist",
                                             "saved_model_shortlist_bfloat16"),
             **common)  # fmt: skip


if __name__ == "__main__":
    main()
