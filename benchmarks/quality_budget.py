"""Translation quality per CPU budget: `configs/small.yaml` trained for a fixed number of minutes
on a parallel corpus, against TF Model Garden's peer trained for the same minutes, one after the
other on the same machine.

For each run (ours first, then the peer unless `--no-peer`) prints one JSON line: sacreBLEU and
chrF on the test split (and dev, for ours), optimizer steps, target tokens trained, training
minutes, the load average, and the CPU's flags that matter for the precision choice (AVX512-BF16,
AMX, AVX512-FP16). Ours goes through the CLI exactly as a user runs it (`keras-transformer train`
with `train.max_minutes`, which averages checkpoints, scores dev and test with the `decode`
settings and exports); the peer is TF Model Garden's `Seq2SeqTransformer` trained and decoded
(beam 4, alpha 0.6) by `peer_mg_translate.py`, one of the peer scripts kept outside this
repository (`PEER`, run by the Python of their environment, `PEER_PYTHON`).

Run from the repository root, with the corpus in `data/tatoeba-en-de` (the Tatoeba
English-German pairs: `docs/benchmarks.md#the-corpus`); with
`BENCH_LABEL` set, the lines are also appended to the ledger
`benchmarks/results/quality_budget.jsonl` (`benchmarks/ledger.py`):

    BENCH_LABEL=default PYTHONPATH=$PWD TF_CPP_MIN_LOG_LEVEL=2 \\
        python benchmarks/quality_budget.py --corpus data/tatoeba-en-de --minutes 30

The corpus directory holds `train`, `dev` and `test` `.en`/`.de` files (`--src`/`--tgt` name
other suffixes). `--set KEY=VALUE` (repeatable) changes our config, for one-change-at-a-time
comparisons (`--label` names the line); `--no-peer` skips the peer; `--work DIR` keeps the
workdirs (default: a new temporary directory). `--steps N` trains ours for N optimizer steps
instead of `--minutes` (the budget schedule then decays to zero at step N), and skips the peer:
a comparison that the machine's speed, which drifts from day to day on shared machines, does
not move.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(REPO, "..", "shared", "bench", "peer_mg_translate.py")
PEER_PYTHON = "/tmp/peers/mg/bin/python"
FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16", "avx512f", "avx_vnni", "avx2")


def cpu_flags():
    """The CPU flags (of /proc/cpuinfo) that matter for the precision choice."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    present = set(line.split(":", 1)[1].split())
                    return [flag for flag in FLAGS if flag in present]
    except OSError:
        pass
    return []


def _load():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _trained_tokens(logdir, seconds):
    """Target tokens trained: the logged tokens/s, averaged over the run, times its seconds."""
    import numpy as np
    import tensorflow as tf

    speeds = []
    for path in glob.glob(os.path.join(logdir, "train", "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "tokens_per_second":
                    speeds.append(float(np.asarray(tf.make_ndarray(value.tensor))))
    return int(sum(speeds) / len(speeds) * seconds) if speeds else None


def run_ours(args, work):
    corpus = os.path.abspath(args.corpus)

    def spec(split):
        return f"text:{corpus}/{split}.{args.src},{corpus}/{split}.{args.tgt}"

    workdir = os.path.join(work, f"ours_{args.label}")
    command = [
        sys.executable, "-m", "keras_transformer.cli", "train",
        "--config", args.config, "--workdir", workdir,
        "--set", f"data.train={spec('train')}",
        "--set", f"data.dev={spec('dev')}",
        "--set", f"data.test={spec('test')}",
        "--set", f"train.max_minutes={'null' if args.steps else args.minutes}",
        "--set", f"train.steps={args.steps or 10000000}",
        "--set", f"export.base_dir={os.path.join(work, 'saved_models')}",
        "--set", f"export.name={args.label}",
    ]  # fmt: skip
    for override in args.set:
        command += ["--set", override]
    started = time.time()
    log = open(os.path.join(work, f"ours_{args.label}.log"), "w")
    subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    with open(os.path.join(workdir, "result.json")) as f:
        result = json.load(f)
    emit(
        figure="quality_budget",
        system="keras-transformer",
        label=args.label,
        overrides=args.set,
        corpus=args.corpus,
        minutes=None if args.steps else args.minutes,
        budget_steps=args.steps,
        test_bleu=result["test"]["bleu"],
        test_chrf=result["test"]["chrf"],
        dev_bleu=result["dev"]["bleu"],
        dev_chrf=result["dev"]["chrf"],
        steps=result["step"],
        train_tokens=_trained_tokens(os.path.join(workdir, "logs"), result["training_seconds"]),
        train_min=round(result["training_seconds"] / 60, 1),
        averaged_checkpoints=result.get("averaged_checkpoints"),
        precision=result.get("precision"),
        precision_timing=_read_json(os.path.join(workdir, "precision.json")),
        wall_min=round((time.time() - started) / 60, 1),
        load_1min=_load(),
        cpu_flags=cpu_flags(),
    )


def _read_json(path):
    """The file's JSON, or None where there is none (runs not in `auto` precision)."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError:
        return None


def run_peer(args, work):
    peer_work = os.path.join(work, "peer")
    started = time.time()
    done = subprocess.run(
        [PEER_PYTHON, PEER, os.path.abspath(args.corpus), peer_work, str(args.minutes)],
        check=True,
        capture_output=True,
        text=True,
    )
    result = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")][-1]
    emit(
        figure="quality_budget",
        system="modelgarden",
        corpus=args.corpus,
        minutes=args.minutes,
        test_bleu=result["bleu"],
        test_chrf=result["chrf"],
        steps=result["steps"],
        train_tokens=result["train_tokens"],
        train_min=result["train_min"],
        wall_min=round((time.time() - started) / 60, 1),
        load_1min=_load(),
        cpu_flags=cpu_flags(),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--corpus", default=os.path.join(REPO, "data", "tatoeba-en-de")
    )
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument(
        "--steps", type=int, default=None, help="train ours for N steps instead (no peer then)"
    )
    parser.add_argument("--config", default=os.path.join(REPO, "configs", "small.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--label", default="default")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--peer-only", action="store_true")
    parser.add_argument("--work", default=None)
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="quality_budget_")
    os.makedirs(work, exist_ok=True)
    if not args.peer_only:
        run_ours(args, work)
    if not (args.no_peer or args.steps):
        run_peer(args, work)


if __name__ == "__main__":
    main()
