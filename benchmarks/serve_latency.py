"""Serving speed of an exported SavedModel through its `serving_default` signature.

Usage (from the repository root, PYTHONPATH=$PWD):
    python benchmarks/serve_latency.py --model saved_models/quickstart [--source FILE]
    python benchmarks/serve_latency.py --demo     # exports an untrained small model first

Loads the SavedModel with TensorFlow alone (plus tensorflow_text for its tokenizer ops), as TF
Serving would, and prints JSON lines: `single_sentence_latency` (p50/p95/mean milliseconds over
`--calls` one-sentence requests after a warm-up call) and `batch32_throughput` (sentences/s over
`--batches` requests of 32 sentences). Sentences come from `--source` (one per line) or the
built-in synthetic corpus. `--model` takes the model directory (latest version) or a version.
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

from benchmarks.common import emit  # noqa: E402


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

    from keras_transformer.data.synthetic import generate
    from keras_transformer.data.tokenizer import Tokenizer, train_sentencepiece
    from keras_transformer.export import export_saved_model
    from keras_transformer.models import Transformer

    work = tempfile.mkdtemp(prefix="kt-serve-bench-")
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    pairs = generate("train", size=5000, seed=1)
    spm_path = os.path.join(work, "spm.model")
    train_sentencepiece([s for pair in pairs for s in pair], spm_path, 2000, verbose=False)
    tokenizer = Tokenizer(spm_path)
    keras.utils.set_random_seed(0)
    model = Transformer.from_preset(preset, vocab_size=tokenizer.vocab_size)
    data = dict(max_source_length=64, max_target_length=64)
    return export_saved_model(model, tokenizer, None, data, os.path.join(work, "saved"), "demo")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="SavedModel directory (model dir or version dir)")
    parser.add_argument("--demo", action="store_true", help="export an untrained model first")
    parser.add_argument("--preset", default="transformer_small", help="preset of --demo")
    parser.add_argument("--source", help="sentences, one per line (default: synthetic)")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--batches", type=int, default=3)
    args = parser.parse_args()
    if not args.model and not args.demo:
        parser.error("give --model DIR or --demo")
    path = export_demo(args.preset) if args.demo else latest_version(args.model)
    if args.source:
        with open(args.source, encoding="utf-8") as f:
            sentences = [line.rstrip("\n") for line in f if line.strip()]
    else:
        sentences = synthetic_sentences(max(32 * args.batches, args.calls))
    serve = tf.saved_model.load(path).signatures["serving_default"]

    serve(text=tf.constant(sentences[:1]))  # warm-up (first-call tracing of the graph's functions)
    times = []
    for i in range(args.calls):
        one = tf.constant([sentences[i % len(sentences)]])
        start = time.perf_counter()
        serve(text=one)["translation"].numpy()
        times.append((time.perf_counter() - start) * 1e3)
    emit(
        what="single_sentence_latency",
        model=path,
        calls=args.calls,
        p50_ms=round(float(np.percentile(times, 50)), 1),
        p95_ms=round(float(np.percentile(times, 95)), 1),
        mean_ms=round(float(np.mean(times)), 1),
    )

    batches = [sentences[(i * 32) % len(sentences) :][:32] for i in range(args.batches)]
    serve(text=tf.constant(batches[0]))
    start = time.perf_counter()
    for batch in batches:
        serve(text=tf.constant(batch))["translation"].numpy()
    seconds = time.perf_counter() - start
    emit(
        what="batch32_throughput",
        model=path,
        batches=args.batches,
        sentences_per_s=round(sum(len(b) for b in batches) / seconds, 2),
    )


if __name__ == "__main__":
    main()
