"""Where a training step (or a beam-4 decoding call) spends its time: TF profiler op statistics.

Usage: python benchmarks/profile_ops.py '{"xla": false}' [top_n]
       python benchmarks/profile_ops.py '{"decode": true, ...shapes}' [top_n]
Prints the `top_n` TensorFlow op types by total self time, per training step or per decoding call
(a development aid, not a benchmark).
"""

import glob
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: E402

from benchmarks.common import parse_shapes  # noqa: E402
from benchmarks.train_throughput import build_and_compile, make_dataset  # noqa: E402


def main(argv):
    cfg = parse_shapes(argv)
    top_n = int(argv[2]) if len(argv) > 2 else 30
    logdir = tempfile.mkdtemp()
    if cfg.get("decode"):
        from benchmarks.decode_throughput import build_model, sources
        from keras_transformer.decoding import translate_ids

        model, src = build_model(cfg), sources(cfg)

        @tf.function
        def fn(s):
            return translate_ids(model, s, beam_size=4, alpha=0.6, max_length=cfg["tgt"])

        fn(src)[0].numpy()
        cfg["steps"] = 1
        tf.profiler.experimental.start(logdir)
        fn(src)[0].numpy()
        tf.profiler.experimental.stop()
    else:
        model, _ = build_and_compile(cfg)
        ds = make_dataset(cfg)
        model.fit(ds.take(1), verbose=0)
        tf.profiler.experimental.start(logdir)
        model.fit(ds.skip(1).take(cfg["steps"]), verbose=0)
        tf.profiler.experimental.stop()
    path = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0]
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    by_type, by_op, count = {}, {}, {}
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            for ev in line.events:
                name = names.get(ev.metadata_id, "")
                if ":" not in name or name.startswith("tf_"):  # TF ops: "op_name:OpType"
                    continue
                op_type = name.rsplit(":", 1)[1]
                dur = ev.duration_ps / 1e6  # microseconds
                by_type[op_type] = by_type.get(op_type, 0.0) + dur
                by_op[name] = by_op.get(name, 0.0) + dur
                count[op_type] = count.get(op_type, 0) + 1
    total = sum(by_type.values())
    steps = cfg["steps"]
    print(f"total op time {total / 1e3 / steps:.1f} ms per step (summed over threads)")
    for name, t in sorted(by_type.items(), key=lambda kv: -kv[1])[:top_n]:
        share = 100 * t / total
        print(f"{t / 1e3 / steps:9.1f} ms {share:5.1f}%  {count[name] // steps:5d}x {name}")
    print("--- top ops")
    for name, t in sorted(by_op.items(), key=lambda kv: -kv[1])[:top_n]:
        print(f"{t / 1e3 / steps:9.1f} ms {100 * t / total:5.1f}%  {name[-120:]}")


if __name__ == "__main__":
    main(sys.argv)
