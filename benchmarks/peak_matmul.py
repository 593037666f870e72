"""This CPU's practical matmul limit in one dtype: the best GFLOP/s of square matmuls through
TensorFlow (as `../shared/bench/peak_matmul.py` measures float32), for MFU.

Usage: python benchmarks/peak_matmul.py [float32|bfloat16]
Prints one JSON line: {"what": "peak_matmul_<dtype>", "gflops": ...}. For bfloat16 the inputs
and the product are bfloat16 (oneDNN accumulates in float32), as in `mixed_bfloat16` training.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from benchmarks.common import emit  # noqa: E402

SHORT = {"float32": "fp32", "bfloat16": "bf16"}


def peak_gflops(dtype, sizes=(1024, 2048, 4096), repeats=3, flops_per_timing=2e11):
    """The best GFLOP/s over `repeats` timings of each `n x n` matmul in `sizes`."""
    matmul = tf.function(tf.matmul)
    best = 0.0
    for n in sizes:
        a = tf.cast(tf.random.normal((n, n)), dtype)
        b = tf.cast(tf.random.normal((n, n)), dtype)
        matmul(a, b).numpy()  # trace, warm up
        reps = max(2, int(flops_per_timing / (2 * n**3)))
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(reps):
                c = matmul(a, b)
            c.numpy()
            best = max(best, 2 * n**3 * reps / (time.perf_counter() - start) / 1e9)
    return best


def main(argv):
    dtype = argv[1] if len(argv) > 1 else "float32"
    if dtype not in SHORT:
        sys.exit(f"peak_matmul.py: dtype must be one of {', '.join(SHORT)}, got {dtype!r}")
    emit(what=f"peak_matmul_{SHORT[dtype]}", gflops=round(peak_gflops(dtype), 1), dtype=dtype)


if __name__ == "__main__":
    main(sys.argv)
