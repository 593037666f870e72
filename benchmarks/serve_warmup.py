"""First-request latency of a SavedModel in a fresh process, with and without the warmup replay.

Usage (from the repository root, PYTHONPATH=$PWD):
    python benchmarks/serve_warmup.py --model saved_models/quickstart [--runs 3]
    python benchmarks/serve_warmup.py --demo [--preset transformer_small]   # untrained export

Each run starts a fresh Python process that imports only `tensorflow`, `tensorflow_text` and
TF Serving's protos, loads the SavedModel and then, in the `warmup` mode, replays
`assets.extra/tf_serving_warmup_requests` the way TF Serving does at load time (each record's
`PredictRequest` run once against its signature) before timing its first real request: one
sentence through `serving_default` (`--signature` picks another of the text-only signatures).
One JSON line per run (`load_s`, `replay_s`, `records`, `first_request_ms`, `second_request_ms`),
then one summary line per mode (medians). Run it alone on the machine: the figures are latencies.
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import emit  # noqa: E402

CHILD = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
started = time.perf_counter()
import tensorflow as tf
import tensorflow_text  # noqa: F401
from tensorflow_serving.apis import prediction_log_pb2

path, mode, signature_key, sentence = sys.argv[1:5]
loaded = tf.saved_model.load(path)
load_s = time.perf_counter() - started
records, replay_s = 0, 0.0
if mode == "warmup":
    start = time.perf_counter()
    warmup = os.path.join(path, "assets.extra", "tf_serving_warmup_requests")
    for raw in tf.data.TFRecordDataset(warmup):
        request = prediction_log_pb2.PredictionLog.FromString(raw.numpy()).predict_log.request
        inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
        loaded.signatures[request.model_spec.signature_name](**inputs)
        records += 1
    replay_s = time.perf_counter() - start
signature = loaded.signatures[signature_key]
times = []
for _ in range(2):
    start = time.perf_counter()
    out = signature(text=tf.constant([sentence]))
    [v.numpy() for v in out.values()]
    times.append((time.perf_counter() - start) * 1e3)
print(json.dumps({"load_s": round(load_s, 3), "replay_s": round(replay_s, 3), "records": records,
                  "first_request_ms": round(times[0], 1), "second_request_ms": round(times[1], 1)}))
"""


def run_child(path, mode, signature, sentence):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("PYTHONPATH", None)  # the SavedModel needs none of our code
    done = subprocess.run(
        [sys.executable, "-c", CHILD, path, mode, signature, sentence],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if done.returncode != 0:
        raise SystemExit(f"the fresh process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    from benchmarks.serve_latency import export_demo, latest_version, synthetic_sentences

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="SavedModel directory (model dir or version dir)")
    parser.add_argument("--demo", action="store_true", help="export an untrained model first")
    parser.add_argument("--preset", default="transformer_small", help="preset of --demo")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per mode")
    parser.add_argument("--signature", default="serving_default", help="signature to time")
    parser.add_argument("--sentence", help="the request (default: a synthetic sentence)")
    args = parser.parse_args()
    if not args.model and not args.demo:
        parser.error("give --model DIR or --demo")
    path = export_demo(args.preset) if args.demo else latest_version(args.model)
    sentence = args.sentence or synthetic_sentences(1)[0]
    results = {}
    for run in range(args.runs):
        for mode in ("no_warmup", "warmup"):  # interleaved: drifts hit both modes alike
            result = run_child(path, mode, args.signature, sentence)
            results.setdefault(mode, []).append(result)
            emit(what="first_request", mode=mode, run=run, model=path, **result)
    for mode, rows in results.items():
        firsts = sorted(r["first_request_ms"] for r in rows)
        emit(
            what="first_request_summary",
            mode=mode,
            model=path,
            signature=args.signature,
            runs=len(rows),
            median_first_request_ms=firsts[len(firsts) // 2],
            median_replay_s=sorted(r["replay_s"] for r in rows)[len(rows) // 2],
        )


if __name__ == "__main__":
    main()
