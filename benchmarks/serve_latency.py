"""Serving speed of an exported SavedModel through its `serving_default` signature.

Usage (from the repository root, PYTHONPATH=$PWD):
    python benchmarks/serve_latency.py --model saved_models/quickstart [--source FILE]
    python benchmarks/serve_latency.py --demo     # exports an untrained small model first

Loads the SavedModel with TensorFlow alone (plus tensorflow_text for its tokenizer ops), as TF
Serving would, and prints one JSON line (`what="request_size"`) per request size of `--sizes`
(default 1, 2, 4, 8, 16, 32, 64 sentences): p50/p99/mean milliseconds over `--calls` requests of
that many sentences (each request different sentences, after a warm-up request of that size) and
sentences/s. TF Serving's batching (`--enable_batching`) merges concurrent requests into one call
of the signature with their sentences concatenated, so the row of size n is what a batch of n
costs: the figures behind `batching_parameters` (docs/guides/export-serving.md). Sentences come
from `--source` (one per line) or the built-in synthetic corpus. `--model` takes the model
directory (latest version) or a version. With `BENCH_LABEL`, the lines also go to the ledger
`benchmarks/results/serve_latency.jsonl`.
"""

import argparse
import atexit
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_text  # noqa: E402,F401  (registers the SentencePiece ops of the graph)

from benchmarks.common import demo_vocabulary, emit  # noqa: E402


def latest_version(path):
    versions = [int(n) for n in os.listdir(path) if n.isdigit()] if os.path.isdir(path) else []
    if versions and not os.path.exists(os.path.join(path, "saved_model.pb")):
        return os.path.join(path, str(max(versions)))
    return path


def synthetic_sentences(n):
    from keras_transformer.data.synthetic import generate

    return [src for src, _ in generate("test", size=n, seed=3)]


def export_demo(preset):
    """An untrained `preset` model with a SentencePiece vocabulary of the synthetic corpus."""
    import keras

    from keras_transformer.data.tokenizer import Tokenizer
    from keras_transformer.export import ExportPlan, export_saved_model
    from keras_transformer.models import Transformer

    work = tempfile.mkdtemp(prefix="kt-serve-bench-")
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    tokenizer = Tokenizer(demo_vocabulary(work))
    keras.utils.set_random_seed(0)
    model = Transformer.from_preset(preset, vocab_size=tokenizer.vocab_size)
    plan = ExportPlan(data=dict(max_source_length=64, max_target_length=64))
    return export_saved_model(model, tokenizer, plan, os.path.join(work, "saved"), "demo")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="SavedModel directory (model dir or version dir)")
    parser.add_argument("--demo", action="store_true", help="export an untrained model first")
    parser.add_argument("--preset", default="transformer_small", help="preset of --demo")
    parser.add_argument("--source", help="sentences, one per line (default: synthetic)")
    parser.add_argument("--calls", type=int, default=50, help="requests per size")
    parser.add_argument("--sizes", default="1,2,4,8,16,32,64", help="sentences per request")
    args = parser.parse_args()
    if not args.model and not args.demo:
        parser.error("give --model DIR or --demo")
    path = export_demo(args.preset) if args.demo else latest_version(args.model)
    sizes = [int(n) for n in args.sizes.split(",")]
    if args.source:
        with open(args.source, encoding="utf-8") as f:
            sentences = [line.rstrip("\n") for line in f if line.strip()]
    else:
        sentences = synthetic_sentences(max(sizes) * args.calls)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    for size in sizes:
        figures = request_size_figures(serve, sentences, size, args.calls)
        emit(what="request_size", model=path, **figures)


def requests_of(sentences, size, count):
    """`count` requests of `size` sentences each, taken one after the other from `sentences`
    (cycling when they run out)."""
    return [[sentences[(i * size + j) % len(sentences)] for j in range(size)] for i in range(count)]


def request_size_figures(serve, sentences, size, calls):
    """Latency percentiles (ms) and sentences/s of `calls` requests of `size` sentences through
    the signature `serve`, after one warm-up request of that size."""
    requests = requests_of(sentences, size, calls + 1)
    serve(text=tf.constant(requests[0]))  # warm-up: first use of this batch shape
    times = []
    for request in requests[1:]:
        start = time.perf_counter()
        answers = serve(text=tf.constant(request))["translation"].numpy()
        times.append(time.perf_counter() - start)
        if len(answers) != size:
            raise RuntimeError(f"{len(answers)} translations for a request of {size} sentences")
    ms = np.asarray(times) * 1e3
    return dict(
        sentences=size,
        calls=calls,
        p50_ms=round(float(np.percentile(ms, 50)), 1),
        p99_ms=round(float(np.percentile(ms, 99)), 1),
        mean_ms=round(float(ms.mean()), 1),
        sentences_per_s=round(size * calls / float(np.sum(times)), 1),
    )


if __name__ == "__main__":
    main()
