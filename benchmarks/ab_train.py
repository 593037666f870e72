"""In-process A/B comparison of training-step variants (a development aid for noisy machines).

Usage: python benchmarks/ab_train.py '<shapes JSON>' '<JSON list of variants>' [rounds]
A variant is a dict of shape overrides (e.g. {"metrics": false}) plus the fast paths
its model is built with (`keras_transformer.fast_paths`): `"fast_paths"` (a setting:
"all", "none" or a list of names) or `"without"` (names switched off), e.g.
{"without": ["fused_projections"]}.
The variants' steps are timed alternately, round after round, so machine load hits them alike;
prints each variant's median target tokens/s and its ratio to the first.
"""

import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402

from benchmarks.common import parse_shapes  # noqa: E402
from benchmarks.train_throughput import build_and_compile, make_dataset  # noqa: E402
from keras_transformer import fast_paths  # noqa: E402

VARIANT_KEYS = ("fast_paths", "without")


def variant_fast_paths(variant):
    """The fast-path setting of a variant: its "fast_paths", or all but its "without" names."""
    if "without" in variant:
        return [name for name in fast_paths.NAMES if name not in variant["without"]]
    return variant.get("fast_paths", "all")


def main(argv):
    base = parse_shapes(argv[:2])
    variants = json.loads(argv[2])
    rounds = int(argv[3]) if len(argv) > 3 else 3
    runs = []
    for variant in variants:
        cfg = {**base, **{k: v for k, v in variant.items() if k not in VARIANT_KEYS}}
        with fast_paths.fast_paths(variant_fast_paths(variant)):
            model, _ = build_and_compile(cfg)
            iterator = iter(make_dataset(cfg).repeat())
            model.make_train_function()
            keras.ops.convert_to_numpy(model.train_function(iterator)["loss"])  # trace, warm up
        runs.append((variant, cfg, model, iterator, []))
    cpu = {}  # tokens per second of process CPU time: less sensitive to other processes' load
    for round_index in range(rounds + 1):
        for variant, cfg, model, iterator, times in runs:
            start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(cfg["steps"]):
                logs = model.train_function(iterator)
            keras.ops.convert_to_numpy(logs["loss"])
            tokens = cfg["batch"] * cfg["tgt"] * cfg["steps"]
            if round_index:  # round 0 warms caches and allocators up
                times.append(tokens / (time.perf_counter() - start))
                cpu.setdefault(id(model), []).append(tokens / (time.process_time() - cpu_start))
    first = statistics.median(runs[0][4])
    first_cpu = statistics.median(cpu[id(runs[0][2])])
    for variant, _, model, _, times in runs:
        med = statistics.median(times)
        med_cpu = statistics.median(cpu[id(model)])
        print(
            json.dumps(
                dict(
                    variant=variant,
                    median_tokens_per_s=round(med, 1),
                    ratio=round(med / first, 3),
                    best_ratio=round(max(times) / max(runs[0][4]), 3),
                    cpu_ratio=round(med_cpu / first_cpu, 3),
                    all=[round(t) for t in times],
                )
            ),
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv)
