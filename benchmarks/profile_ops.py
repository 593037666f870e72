"""Where a training step (or a beam-4 decoding call) spends its time: TF profiler op statistics.

Usage: python benchmarks/profile_ops.py '{"xla": false}' [top_n]
       python benchmarks/profile_ops.py '{"decode": true, ...shapes}' [top_n]
       python benchmarks/profile_ops.py '{"export": true, "shortlist": 100, "beam": 4, ...}' [top_n]
Prints the `top_n` TensorFlow op types by total self time, per training step or per decoding call
(a development aid, not a benchmark). `"export": true` profiles one call of the exported
SavedModel's `serving_default` on `serve_compare`'s batch (strings in and out, as TF Serving runs
it; `"shortlist": k` exported over `serve_compare`'s synthetic lexical table of that k).

Op times overlap: TensorFlow runs independent ops side by side, so their sum exceeds the wall time
and an op that shares the cores looks slower than it is. The second table divides the wall time
instead: every moment is split evenly among the ops running then (idle moments are counted
apart), so the rows add up to the step and show what each kind of op costs in wall time. The last
line (JSON, `what="wall_breakdown"`; appended to `results/profile_ops.jsonl` when `BENCH_LABEL`
names the run) gives the matrix products' share (MatMul, fused MatMul, Einsum, BatchMatMul) and,
for training, the model FLOP rate they reach in that share.
"""

import glob
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: E402

from benchmarks.common import emit, parse_shapes, train_flops_per_token  # noqa: E402
from benchmarks.train_throughput import build_and_compile, make_dataset  # noqa: E402

MATMUL_OPS = ("MatMul", "FusedMatMul", "Einsum", "BatchMatMul")


def is_matmul(op_type):
    """Whether a TF op type (with or without oneDNN's `_Mkl` / `_MklNative` prefix) is a matrix
    product."""
    return any(
        op_type.replace("_MklNative", "").replace("_Mkl", "").startswith(m) for m in MATMUL_OPS
    )


def attribute_wall_time(intervals, start, end):
    """Divides the wall time `[start, end)` among the `(op_start, op_end, key)` intervals: each
    moment goes in equal parts to the ops running then. Returns `({key: time}, idle_time)`; the
    times add up to `end - start`."""
    edges = []
    for op_start, op_end, key in intervals:
        op_start, op_end = max(op_start, start), min(op_end, end)
        if op_end > op_start:
            edges += [(op_start, 1, key), (op_end, -1, key)]
    edges.sort(key=lambda e: (e[0], e[1]))
    shares, running, idle, last = {}, {}, 0, start
    for t, delta, key in edges + [(end, 0, None)]:
        if t > last:
            if running:
                n = sum(running.values())
                for k, c in running.items():
                    shares[k] = shares.get(k, 0) + (t - last) * c / n
            else:
                idle += t - last
            last = t
        if key is not None:
            running[key] = running.get(key, 0) + delta
            if not running[key]:
                del running[key]
    return shares, idle


def main(argv):
    cfg = parse_shapes(argv)
    top_n = int(argv[2]) if len(argv) > 2 else 30
    logdir = tempfile.mkdtemp()
    if cfg.get("export"):  # the exported SavedModel's serving_default, as TF Serving runs it
        from benchmarks import serve_compare
        from keras_transformer.data.shortlist import DEFAULT_M

        cfg["steps"], work = 1, tempfile.mkdtemp()
        table = None
        if cfg.get("shortlist"):  # the table of `serve_compare --shortlist` with k this
            table = serve_compare.synthetic_table(cfg["vocab"], cfg["shortlist"], DEFAULT_M)
        model = serve_compare.build_model(cfg)
        spm_bytes = serve_compare.word_vocabulary(cfg["vocab"])
        decode = serve_compare.saved_model_decoder(
            model, spm_bytes, cfg, work, beam=cfg.get("beam", 4), shortlist=table
        )
        decode(), decode()
        tf.profiler.experimental.start(logdir)
        decode()
        tf.profiler.experimental.stop()
        shutil.rmtree(work, ignore_errors=True)
    elif cfg.get("decode"):
        from benchmarks.decode_throughput import build_model, sources
        from keras_transformer.decoding import translate_ids

        model, src = build_model(cfg), sources(cfg)

        @tf.function
        def fn(s):
            result = translate_ids(model, s, beam_size=4, alpha=0.6, max_length=cfg["tgt"])
            return result.ids, result.scores

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
    shutil.rmtree(logdir, ignore_errors=True)
    by_type, by_op, count = {}, {}, {}
    kernels, calls = [], []  # (start, end, op type) of the ops; of the traced function's calls
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
                begin = line.timestamp_ns * 1000 + ev.offset_ps  # picoseconds
                span = (begin, begin + ev.duration_ps, op_type)
                if "/" in name.rsplit(":", 1)[0]:  # an op inside the function's graph
                    kernels.append(span)
                elif name.startswith("EagerLocalExecute: __inference"):
                    calls.append(span)
    total = sum(by_type.values())
    steps = cfg["steps"]
    print(f"total op time {total / 1e3 / steps:.1f} ms per step (summed over threads)")
    for name, t in sorted(by_type.items(), key=lambda kv: -kv[1])[:top_n]:
        share = 100 * t / total
        print(f"{t / 1e3 / steps:9.1f} ms {share:5.1f}%  {count[name] // steps:5d}x {name}")
    print("--- top ops")
    for name, t in sorted(by_op.items(), key=lambda kv: -kv[1])[:top_n]:
        print(f"{t / 1e3 / steps:9.1f} ms {100 * t / total:5.1f}%  {name[-120:]}")
    if not calls:
        return
    start, end = min(c[0] for c in calls), max(c[1] for c in calls)
    shares, idle = attribute_wall_time(kernels, start, end)
    ms = {k: t / 1e9 / steps for k, t in shares.items()}  # picoseconds -> ms per step
    wall, idle = (end - start) / 1e9 / steps, idle / 1e9 / steps
    matmul = sum(t for k, t in ms.items() if is_matmul(k))
    others = sorted(((t, k) for k, t in ms.items() if not is_matmul(k)), reverse=True)
    print(f"--- wall time, {wall:.1f} ms per step, divided among the ops running at each moment")
    print(
        f"{matmul:9.1f} ms {100 * matmul / wall:5.1f}%  matrix products ({', '.join(MATMUL_OPS)})"
    )
    for t, k in others[:top_n] + [(idle, "(no op running)")]:
        print(f"{t:9.1f} ms {100 * t / wall:5.1f}%  {k}")
    fields = dict(
        what="wall_breakdown",
        mode="export" if cfg.get("export") else "decode" if cfg.get("decode") else "train",
        step_ms=round(wall, 1),
        matmul_ms=round(matmul, 1),
        other_ms=round(wall - matmul - idle, 1),
        idle_ms=round(idle, 1),
        matmul_share=round(matmul / wall, 3),
        top_other_ms={k: round(t, 1) for t, k in others[:8]},
        cfg=cfg,
    )
    if not (cfg.get("decode") or cfg.get("export")):
        flops = train_flops_per_token(cfg) * cfg["batch"] * cfg["tgt"]  # per step
        fields["model_gflops_per_s_in_matmul_time"] = round(flops / (matmul / 1e3) / 1e9, 1)
    emit(**fields)


if __name__ == "__main__":
    main(sys.argv)
