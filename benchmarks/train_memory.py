"""Peak memory of a training step, from TensorFlow's own allocator (a development aid).

Usage (from the repository root, PYTHONPATH=$PWD):
    TF_CPU_ALLOCATOR_USE_BFC=true python benchmarks/train_memory.py '<shapes JSON>' \
        ['<JSON list of variants>']

Process RSS (what `train_throughput.py` reports as `max_rss_mb`) includes TensorFlow's ~780 MB
of libraries and whatever glibc keeps of freed memory, so it moves with allocation order. With
`TF_CPU_ALLOCATOR_USE_BFC=true` TensorFlow's CPU allocator keeps exact statistics: this prints,
per variant, the bytes in use between steps (weights, optimizer slots) and the peak within a
steady-state step. Shapes default to base. Variants are those of `ab_train.py` (shape overrides
such as {"optimizer": "keras"}, and the fast paths: `"fast_paths"` or `"without"`);
each runs in a process of its own, so their peaks do not mix.

Prints one JSON line per variant (what="train_step_memory").
"""

import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.common import BASE, emit, parse_shapes  # noqa: E402


def measure(cfg, variant, steps=3):
    import keras
    import tensorflow as tf

    from benchmarks.ab_train import VARIANT_KEYS, variant_fast_paths
    from benchmarks.train_throughput import build_and_compile, make_dataset
    from keras_transformer import fast_paths

    fast_paths.set_fast_paths(variant_fast_paths(variant))  # a process of its own
    cfg = {**cfg, **{k: v for k, v in variant.items() if k not in VARIANT_KEYS}}
    model, _ = build_and_compile(cfg)
    iterator = iter(make_dataset(cfg).repeat())
    model.make_train_function()
    peaks = []
    for _ in range(steps):  # the first step also builds the optimizer's slots
        tf.config.experimental.reset_memory_stats("CPU:0")
        between = tf.config.experimental.get_memory_info("CPU:0")["current"]
        keras.ops.convert_to_numpy(model.train_function(iterator)["loss"])
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
    emit(
        impl="keras_transformer",
        what="train_step_memory",
        variant=variant,
        between_steps_mb=round(between / 2**20, 1),
        step_peak_mb=round(peaks[-1] / 2**20, 1),
        first_step_peak_mb=round(peaks[0] / 2**20, 1),
        cfg=cfg,
    )


def main(argv):
    cfg = parse_shapes(argv[:2], BASE)
    if len(argv) > 3 and argv[3] == "--one":  # a child process: one variant
        measure(cfg, json.loads(argv[2]))
        return
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() not in ("1", "true"):
        sys.exit("set TF_CPU_ALLOCATOR_USE_BFC=true: only TF's BFC allocator keeps statistics")
    variants = json.loads(argv[2]) if len(argv) > 2 else [{}]
    for variant in variants:
        subprocess.run(
            [sys.executable, __file__, json.dumps(cfg), json.dumps(variant), "--one"], check=True
        )


if __name__ == "__main__":
    main(sys.argv)
