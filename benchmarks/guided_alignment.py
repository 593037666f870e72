"""Guided alignment, measured: the alignment error rate (AER) of the attention alignments and
the test BLEU of a model trained without and with guided alignment
(`train.guided_alignment_weight`), on the synthetic corpus, whose true alignment is known.

1. the training pairs' true alignments (`keras_transformer.alignment.true_alignment`, an empty
   line where a pair's alignment is ambiguous) written as a Pharaoh file, one line per pair;
2. train `plain` (no guidance) and `guided` (`data.train_alignments` = that file,
   `train.guided_alignment_weight` = `--weight`) with `keras-transformer train --config CONFIG`
   (the same config and budget), each exported with alignments (`export.alignments: true`);
3. for each, the AER on `synthetic_alignment_set(--size)` (`keras_transformer.alignment.measure`:
   scored on the pairs translated exactly) and test BLEU and chrF (sacreBLEU).

Prints one JSON line per system; with `BENCH_LABEL` set they are appended to the ledger
`benchmarks/results/guided_alignment.jsonl` (`benchmarks/ledger.py`). Finished trainings are
skipped when run again with the same `--work`.

    BENCH_LABEL=synthetic_quickstart PYTHONPATH=$PWD TF_CPP_MIN_LOG_LEVEL=2 \\
        python benchmarks/guided_alignment.py --work workdirs/guided_alignment_bench
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, train_system  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_alignments(pairs, path):
    """The true alignment of each pair as a Pharaoh line (empty where ambiguous); returns the
    number of pairs aligned."""
    from keras_transformer.alignment import format_pairs, true_alignment

    aligned = 0
    with open(path, "w", encoding="utf-8") as f:
        for source, target in pairs:
            links = true_alignment(source, target)
            aligned += links is not None
            f.write(format_pairs(links or []) + "\n")
    return aligned


def train(args, work, name, alignments=None):
    """`keras-transformer train` of one system (`common.train_system`), exported with
    alignments, guided when `alignments` is given; returns the path of its export."""
    settings = ["export.alignments=true"]
    if alignments:
        settings += [f"data.train_alignments={alignments}",
                     f"train.guided_alignment_weight={args.weight}"]  # fmt: skip
    return train_system(args.config, work, name, [*settings, *args.set])


def translate(model_dir, texts, batch_size=64):
    """The translations of the SavedModel's `serving_default`."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    from keras_transformer.export.saved_model import resolve_model_dir

    signature = tf.saved_model.load(resolve_model_dir(model_dir)).signatures["serving_default"]
    out = []
    for start in range(0, len(texts), batch_size):
        result = signature(text=tf.constant(texts[start : start + batch_size]))["translation"]
        out.extend(t.decode("utf-8", "replace") for t in result.numpy())
    return out


def run(args, work):
    import sacrebleu

    from keras_transformer.alignment import measure
    from keras_transformer.data import read_pairs

    path = os.path.join(work, "train.align")
    pairs = read_pairs(args.train, verbose=False)
    aligned = write_alignments(pairs, path)
    args.set = [f"data.train={args.train}", f"data.test={args.test}", *args.set]
    models = {"plain": train(args, work, "plain"), "guided": train(args, work, "guided", path)}
    test = read_pairs(args.test, verbose=False)
    sources, references = [s for s, _ in test], [t for _, t in test]
    for system, model in models.items():
        scores = measure(model, args.size)
        outputs = translate(model, sources)
        emit(
            figure="guided_alignment", system=system, train=args.train, test=args.test,
            weight=args.weight if system == "guided" else 0.0,
            training_pairs=len(pairs), training_pairs_aligned=aligned,
            alignment_set=scores["pairs"], translated_exactly=scores["exact"],
            # None without a pair translated exactly: no alignment to score.
            aer=round(scores["aer"], 4) if scores["exact"] else None,
            markup_kept=round(scores["markup_kept"], 4) if scores["exact"] else None,
            tags_around_right_words=round(scores["right_words"], 4) if scores["exact"] else None,
            test_sentences=len(test),
            test_bleu=round(sacrebleu.corpus_bleu(outputs, [references]).score, 2),
            test_chrf=round(sacrebleu.corpus_chrf(outputs, [references]).score, 2),
            overrides=args.set,
        )  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=os.path.join(REPO, "configs", "quickstart.yaml"))
    parser.add_argument("--train", default="synthetic:split=train", help="data.train")
    parser.add_argument("--test", default="synthetic:split=test,size=1000", help="data.test")
    parser.add_argument("--weight", type=float, default=1.0, help="guided_alignment_weight")
    parser.add_argument("--size", type=int, default=200, help="pairs of the alignment set")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="for every training"
    )
    parser.add_argument("--work", default=None, help="work directory (default: a new temp one)")
    args = parser.parse_args()
    work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="guided_alignment_"))
    os.makedirs(work, exist_ok=True)
    print(f"work directory: {work}", file=sys.stderr, flush=True)
    run(args, work)


if __name__ == "__main__":
    main()
