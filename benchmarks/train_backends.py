"""The JAX backend against the TensorFlow backend: training tokens/s of the same model with
`model.fit` on this CPU, small and base shapes, in one run; prints every figure as a JSON line,
then one summary line per shape with the ratio of the medians (`jax_over_tf`). A figure, no
target: JAX's reason to be here is the accelerators (`accelerator_check.py`).

Usage (from the repository root):
    python benchmarks/train_backends.py [--rounds 2] [--shapes small,base] [--dtype float32]

Each round runs, per shape, `train_throughput.py` under `KERAS_BACKEND=tensorflow` (the
library's default for this device: `runtime.jit_compile: auto`, the TensorFlow fast paths) and
then under `KERAS_BACKEND=jax` (`JAX_PLATFORMS=cpu`; the step compiled by XLA), each in its own
process, alternately, so that drifts in the machine's load fall on both. The model, loss,
metrics and optimizer are the library's on both (`training.recipe.compile_model`); the data is
the bench's random full-length ids (`../shared/bench/README.md`). `BENCH_LABEL=...` appends
the lines to `results/train_backends.jsonl`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks import ledger  # noqa: E402
from benchmarks.common import BASE, SMALL  # noqa: E402

SHAPES = {"small": SMALL, "base": BASE}
BACKENDS = ("tensorflow", "jax")


def run_one(backend, cfg):
    env = dict(ledger.unlabelled_env(), KERAS_BACKEND=backend, PYTHONPATH=ROOT,
               TF_CPP_MIN_LOG_LEVEL="2")  # fmt: skip
    if backend == "jax":
        env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, "train_throughput.py"), json.dumps(cfg)],
        env=env, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{backend} run failed:\n{done.stderr[-3000:]}")
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shapes", default="small,base")
    parser.add_argument("--dtype", default="float32", help="a Keras dtype policy")
    args = parser.parse_args(argv)
    shapes = args.shapes.split(",")
    rates = {(shape, backend): [] for shape in shapes for backend in BACKENDS}
    for round_ in range(1, args.rounds + 1):
        for shape in shapes:
            for backend in BACKENDS:
                cfg = dict(SHAPES[shape], dtype=args.dtype)
                line = dict(run_one(backend, cfg), shape=shape, round=round_)
                print(json.dumps(line), flush=True)
                ledger.record("train_backends", line)
                rates[shape, backend].append(line["tokens_per_s"])
    for shape in shapes:
        tf_rate = statistics.median(rates[shape, "tensorflow"])
        jax_rate = statistics.median(rates[shape, "jax"])
        summary = dict(
            what="summary", shape=shape, dtype=args.dtype, rounds=args.rounds,
            tf_tokens_per_s=round(tf_rate, 1), jax_tokens_per_s=round(jax_rate, 1),
            jax_over_tf=round(jax_rate / tf_rate, 3),
        )  # fmt: skip
        print(json.dumps(summary), flush=True)
        ledger.record("train_backends", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
