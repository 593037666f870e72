"""Tagged back-translation, measured end to end through the CLI: what half a corpus gains from
the other half's target side alone, against having the other half's real pairs.

On a parallel corpus directory (`train`, `dev`, `test` `.SRC`/`.TGT` files; by default
`data/tatoeba-en-de`, the Tatoeba English-German pairs of `docs/benchmarks.md#the-corpus`):

1. split the training pairs into halves A and B (a seeded permutation: deterministic);
2. train SRC->TGT on A (`a_only`, the baseline);
3. train TGT->SRC on A (`reverse`), export it with sampling (`export --sampling-topk K`) and
   back-translate B's target side into synthetic sources (`translate --input --output
   --sampling-topk K --temperature T --seed S`; Edunov et al. 2018: sampled back-translation
   beats beam at scale);
4. train SRC->TGT on A plus the synthetic B, tagged (`data.train: [text:A, bt:text:synthetic-B]`,
   Caswell et al. 2019): `a_bt`; with `--untagged`, also without the tag: `a_bt_untagged`;
5. train SRC->TGT on A plus B's real pairs (`a_b`): the ceiling.

Every training run is `keras-transformer train --config configs/small.yaml` with
`train.max_minutes=--minutes` (the same budget for all). Prints one JSON line per system (test
and dev sacreBLEU/chrF, steps, training minutes, pairs) and one for the back-translation
(lines, seconds); with `BENCH_LABEL` set they are appended to the ledger
`benchmarks/results/back_translation.jsonl` (`benchmarks/ledger.py`). The work directory keeps
every workdir, export and file: run the same command again after a kill and finished steps
are skipped (a finished workdir prints its result; a finished back-translation is kept).

    BENCH_LABEL=tatoeba_30min PYTHONPATH=$PWD TF_CPP_MIN_LOG_LEVEL=2 \\
        python benchmarks/back_translation.py --corpus data/tatoeba-en-de \\
        --minutes 30 --work workdirs/bt_tatoeba
"""

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-m", "keras_transformer.cli"]


def _read(path):
    """The lines of a text file (split on `\\n` only, as the corpus reader does)."""
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    return lines[:-1] if lines and not lines[-1] else lines


def _write(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def split_halves(args, data):
    """Writes `A.SRC`, `A.TGT`, `B.SRC`, `B.TGT` under `data`: the training pairs split by a
    seeded permutation (each half in corpus order); returns the pairs in each half."""
    source = _read(os.path.join(args.corpus, f"train.{args.src}"))
    target = _read(os.path.join(args.corpus, f"train.{args.tgt}"))
    if len(source) != len(target):
        raise SystemExit(f"train.{args.src} and train.{args.tgt} differ in length")
    order = list(range(len(source)))
    random.Random(args.split_seed).shuffle(order)
    halves = {"A": sorted(order[: len(order) // 2]), "B": sorted(order[len(order) // 2 :])}
    for name, indices in halves.items():
        _write(os.path.join(data, f"{name}.{args.src}"), [source[i] for i in indices])
        _write(os.path.join(data, f"{name}.{args.tgt}"), [target[i] for i in indices])
    return {name: len(indices) for name, indices in halves.items()}


def _text(source, target):
    return f"text:{source},{target}"


def train(args, work, name, train_spec, reverse=False):
    """`keras-transformer train` of one system (skipped by the CLI itself when finished);
    returns its `result.json`."""
    src, tgt = (args.tgt, args.src) if reverse else (args.src, args.tgt)
    corpus = os.path.abspath(args.corpus)
    workdir = os.path.join(work, name)
    command = [
        *CLI, "train", "--config", args.config, "--workdir", workdir,
        "--set", f"data.train={json.dumps(train_spec)}",
        "--set", f"data.dev={_text(f'{corpus}/dev.{src}', f'{corpus}/dev.{tgt}')}",
        "--set", f"data.test={_text(f'{corpus}/test.{src}', f'{corpus}/test.{tgt}')}",
        "--set", f"train.max_minutes={args.minutes}",
        "--set", f"export.base_dir={os.path.join(work, 'saved_models')}",
        "--set", f"export.name={name}",
    ]  # fmt: skip
    for override in args.set:
        command += ["--set", override]
    print(f"[{time.strftime('%H:%M:%S')}] training {name} ...", file=sys.stderr, flush=True)
    with open(os.path.join(work, f"{name}.log"), "a") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    with open(os.path.join(workdir, "result.json")) as f:
        return json.load(f)


def back_translate(args, work, data):
    """Exports the reverse model with sampling and translates B's target side with it; returns
    `(synthetic source file, lines, seconds of translation)` (0 when an earlier run finished
    it)."""
    output = os.path.join(data, f"B.bt.{args.src}")
    if os.path.exists(output) and not os.path.exists(output + ".progress"):
        return output, len(_read(output)), 0.0
    export_dir = os.path.join(work, "saved_models_sampling")
    model = os.path.join(export_dir, "reverse")
    if not os.path.isdir(model):
        subprocess.run(
            [*CLI, "export", "--workdir", os.path.join(work, "reverse"), "--output", export_dir,
             "--sampling-topk", str(args.sampling_topk), "--temperature", str(args.temperature)],
            check=True, cwd=REPO,
        )  # fmt: skip
    started = time.time()
    done = subprocess.run(
        [*CLI, "translate", "--model", model, "--input", os.path.join(data, f"B.{args.tgt}"),
         "--output", output, "--sampling-topk", str(args.sampling_topk),
         "--temperature", str(args.temperature), "--seed", str(args.seed),
         "--batch-size", "64"],
        check=True, cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    print(done.stdout, end="", file=sys.stderr)
    # The command's own timing (translation only, not start-up and model loading), else ours.
    timed = re.search(r"translated in ([0-9.]+) s", done.stdout)
    return output, len(_read(output)), float(timed.group(1)) if timed else time.time() - started


def _emit_system(args, system, result, pairs):
    emit(
        figure="back_translation",
        system=system,
        corpus=args.corpus,
        minutes=args.minutes,
        sampling_topk=args.sampling_topk,
        temperature=args.temperature,
        overrides=args.set,
        train_pairs=pairs,
        test_bleu=result["test"]["bleu"],
        test_chrf=result["test"]["chrf"],
        dev_bleu=result["dev"]["bleu"],
        dev_chrf=result["dev"]["chrf"],
        steps=result["step"],
        train_min=round(result["training_seconds"] / 60, 1),
    )


def run(args, work):
    data = os.path.join(work, "data")
    os.makedirs(data, exist_ok=True)
    sizes = split_halves(args, data)

    def half(name, src, tgt):
        return _text(os.path.join(data, f"{name}.{src}"), os.path.join(data, f"{name}.{tgt}"))

    a, b = half("A", args.src, args.tgt), half("B", args.src, args.tgt)
    _emit_system(args, "a_only", train(args, work, "a_only", a), sizes["A"])
    reverse = train(args, work, "reverse", half("A", args.tgt, args.src), reverse=True)
    _emit_system(args, "reverse", reverse, sizes["A"])
    synthetic, lines, seconds = back_translate(args, work, data)
    emit(
        figure="back_translation", system="back_translate", corpus=args.corpus, lines=lines,
        seconds=round(seconds, 1), lines_per_second=round(lines / seconds, 1) if seconds else None,
        sampling_topk=args.sampling_topk, temperature=args.temperature, seed=args.seed,
    )  # fmt: skip
    bt = _text(synthetic, os.path.join(data, f"B.{args.tgt}"))
    both = sizes["A"] + sizes["B"]
    _emit_system(args, "a_bt", train(args, work, "a_bt", [a, f"bt:{bt}"]), both)
    if args.untagged:
        _emit_system(args, "a_bt_untagged", train(args, work, "a_bt_untagged", [a, bt]), both)
    _emit_system(args, "a_b", train(args, work, "a_b", [a, b]), both)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--corpus", default=os.path.join(REPO, "data", "tatoeba-en-de")
    )
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--minutes", type=float, default=30.0, help="training budget per system")
    parser.add_argument("--config", default=os.path.join(REPO, "configs", "small.yaml"))
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="for every training"
    )
    parser.add_argument("--sampling-topk", type=int, default=10, help="back-translation top-k")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1, help="sampling seed")
    parser.add_argument("--split-seed", type=int, default=1, help="seed of the A/B split")
    parser.add_argument("--untagged", action="store_true", help="also train A + untagged BT")
    parser.add_argument("--work", default=None, help="work directory (default: a new temp one)")
    args = parser.parse_args()
    work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="back_translation_"))
    os.makedirs(work, exist_ok=True)
    print(f"work directory: {work}", file=sys.stderr, flush=True)
    run(args, work)


if __name__ == "__main__":
    main()
