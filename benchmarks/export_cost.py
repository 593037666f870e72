"""The SavedModel export's cost from two checkouts of this repository, run alternately (a fresh
process per figure, so that machine load falls on both alike): the seconds
`export_saved_model` takes for an untrained preset model, the SavedModel's size, and the
seconds a fresh process (TensorFlow already imported) takes to load it.

Usage (from the repository root; run it alone on the machine: the figures are times):
    git worktree add /tmp/before <commit>
    python benchmarks/export_cost.py /tmp/before . [--preset transformer_small] [--rounds 3]

One JSON line per export and load (`checkout`: `first` or `second`), then a summary line with
the medians and their ratios (second / first).
With `BENCH_LABEL`, the ledger writes the checkouts as `A` and `B` and the command as the
commits compared, `commit 1a2b3c4 vs commit 5d6e7f8: python benchmarks/export_cost.py A B ...`
(`ledger.compared`), so that the line reruns anywhere.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks import ledger  # noqa: E402
from benchmarks.common import demo_vocabulary, emit  # noqa: E402

# Run with PYTHONPATH=<checkout>: that checkout's export of an untrained model.
EXPORT = r"""
import json, os, sys, time
import keras
from keras_transformer.data.tokenizer import Tokenizer
from keras_transformer.export import ExportPlan, export_saved_model
from keras_transformer.models import Transformer

preset, work, spm_path = sys.argv[1:4]
tokenizer = Tokenizer(spm_path)
keras.utils.set_random_seed(0)
model = Transformer.from_preset(preset, vocab_size=tokenizer.vocab_size)
plan = ExportPlan(data=dict(max_source_length=64, max_target_length=64))
start = time.perf_counter()
path = export_saved_model(model, tokenizer, plan, os.path.join(work, "saved"), "demo")
export_s = time.perf_counter() - start
size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
print(json.dumps({"export_s": export_s, "size_mb": size / 2**20, "path": path}))
"""

LOAD = r"""
import json, sys, time
import tensorflow as tf
import tensorflow_text  # noqa: F401
start = time.perf_counter()
loaded = tf.saved_model.load(sys.argv[1])
load_s = time.perf_counter() - start
start = time.perf_counter()
loaded.signatures["serving_default"](text=tf.constant(["the tiny ship keeps a red cat"]))
print(json.dumps({"load_s": load_s, "first_request_s": time.perf_counter() - start}))
"""


def _child(checkout, code, *args):
    env = dict(ledger.unlabelled_env(), TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.path.abspath(checkout)
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
        cwd=os.path.abspath(checkout),
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"{checkout}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--preset", default="transformer_small")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    figures = {"first": [], "second": []}
    vocabulary = tempfile.mkdtemp(prefix="kt-export-cost-spm-")
    spm_path = demo_vocabulary(vocabulary)  # one tokenizer for every export
    for _ in range(args.rounds):
        for name, checkout in (("first", args.first), ("second", args.second)):
            with tempfile.TemporaryDirectory(prefix="kt-export-cost-") as work:
                exported = _child(checkout, EXPORT, args.preset, work, spm_path)
                loaded = _child(checkout, LOAD, exported.pop("path"))
            row = {**exported, **loaded}
            figures[name].append(row)
            emit(what="export_cost", checkout=name, preset=args.preset,
                 **{k: round(v, 3) for k, v in row.items()})  # fmt: skip
    medians = {
        name: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        for name, rows in figures.items()
    }
    summary = {f"{name}_{key}": round(v, 3) for name, m in medians.items() for key, v in m.items()}
    for key in medians["first"]:
        summary[f"{key}_ratio"] = round(medians["second"][key] / medians["first"][key], 3)
    emit(what="export_cost_summary", preset=args.preset, rounds=args.rounds, **summary)
    shutil.rmtree(vocabulary, ignore_errors=True)


if __name__ == "__main__":
    main()
