"""Our training and beam-4 decoding throughput from two checkouts of this repository, run
alternately (one process per figure), so that machine load hits both alike: for "is a change
within noise of before?" on a shared machine.

Usage (from the repository root):
    git worktree add /tmp/before <commit>
    python benchmarks/ab_checkouts.py /tmp/before . [--rounds 2] [--shapes small,base]

Prints every figure as a JSON line (with `checkout`), then per shape the ratio of the medians
(second checkout / first) for training and beam-4 decoding tokens/s.
With `BENCH_LABEL`, the ledger writes the checkouts as `A` and `B` and the command as the
commits compared, `commit 1a2b3c4 vs commit 5d6e7f8: python benchmarks/ab_checkouts.py A B ...`
(`ledger.compared`), so that the line reruns anywhere.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks import ledger  # noqa: E402
from benchmarks.common import BASE, SMALL  # noqa: E402

SHAPES = {"small": SMALL, "base": BASE}


def run(checkout, script, cfg):
    env = dict(
        ledger.unlabelled_env(), TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.path.abspath(checkout)
    )
    proc = subprocess.run(
        [sys.executable, os.path.join("benchmarks", script), json.dumps(cfg)],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise RuntimeError(f"{checkout} {script} failed: {proc.stderr[-2000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shapes", default="small,base")
    args = parser.parse_args()
    figures = {}
    for shape in args.shapes.split(","):
        decode_cfg = {**SHAPES[shape], "check": 0, "greedy": False, "runs": 2}
        for round_index in range(args.rounds):
            for checkout in (args.first, args.second):
                for script, cfg, what in (
                    ("train_throughput.py", SHAPES[shape], "train"),
                    ("decode_throughput.py", decode_cfg, "beam4_decode"),
                ):
                    for record in run(checkout, script, cfg):
                        if record.get("what") != what:
                            continue
                        record.update(checkout=checkout, shapes=shape, round=round_index)
                        print(json.dumps(record), flush=True)
                        ledger.record("ab_checkouts", record)
                        figures.setdefault((shape, what, checkout), []).append(
                            record["tokens_per_s"]
                        )
    for shape in args.shapes.split(","):
        summary = {"shapes": shape, "rounds": args.rounds}
        for what in ("train", "beam4_decode"):
            first = figures[(shape, what, args.first)]
            second = figures[(shape, what, args.second)]
            summary[f"{what}_first"] = [round(v, 1) for v in first]
            summary[f"{what}_second"] = [round(v, 1) for v in second]
            ratio = statistics.median(second) / statistics.median(first)
            summary[f"{what}_ratio"] = round(ratio, 3)
        print(json.dumps(summary), flush=True)
        ledger.record("ab_checkouts", summary)


if __name__ == "__main__":
    main()
