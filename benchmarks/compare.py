"""Ours against TF Model Garden, alternately, in one run: training and beam-4 decoding, small and
base shapes; prints every figure as a JSON line, then the ratios of the medians.

Usage (from the repository root):
    python benchmarks/compare.py [--rounds 2] [--shapes small,base] [--peer-python PATH]
        [--peers-dir ../shared/bench]
(`benchmarks/compare.sh` runs it with the defaults.)

Each round runs, one after the other: the Model Garden peer (training then beam-4 decoding, one
process), our `train_throughput.py` in float32, then (unless `--no-bf16`) in mixed_bfloat16, our
`decode_throughput.py`. At the start, `../shared/bench/peak_matmul.py` (float32) and our
`benchmarks/peak_matmul.py bfloat16` run once each, for MFU: float32 training against the float32
peak, bfloat16 training against the bfloat16 peak. The summary also says which precision
`runtime.mixed_precision: auto` picks from the two training rates
(`training.engines.precision.choose`: bfloat16 when at least 1.1x faster); Model Garden trains
in float32 only (see ../shared/bench).
The peer's peak memory is read from its own process at the moment it prints its
training figure (so it covers model building and training, as ours does).

Every process inherits this one's environment, so TensorFlow runtime settings apply to both sides
alike; the summary records `TF_ENABLE_ONEDNN_OPTS` ("tf default" when unset: TensorFlow then
decides per CPU; see benchmarks/README.md). E.g. `TF_ENABLE_ONEDNN_OPTS=1 benchmarks/compare.sh`.
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
from keras_transformer.training.engines.precision import choose  # noqa: E402

SHAPES = {"small": SMALL, "base": BASE}

# Runs a peer script in this interpreter and adds the process's peak RSS (MB) to each JSON line.
_PEER_WRAPPER = """
import io, json, resource, runpy, sys
class Out(io.TextIOBase):
    def __init__(self, inner): self.inner, self.buf = inner, ""
    def write(self, s):
        self.buf += s
        while "\\n" in self.buf:
            line, self.buf = self.buf.split("\\n", 1)
            if line.startswith("{"):
                rec = json.loads(line)
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                rec["max_rss_mb"] = round(rss / 1024, 1)
                line = json.dumps(rec)
            self.inner.write(line + "\\n"); self.inner.flush()
        return len(s)
    def flush(self): self.inner.flush()
sys.stdout = Out(sys.stdout)
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


def run(cmd, label):
    env = dict(ledger.unlabelled_env(), TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    records = []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            rec["run"] = label
            print(json.dumps(rec), flush=True)
            ledger.record("compare", rec)
            records.append(rec)
    if proc.returncode:
        print(json.dumps({"run": label, "error": proc.stderr[-2000:]}), flush=True)
    return records


def median(values):
    return statistics.median(values) if values else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shapes", default="small,base")
    parser.add_argument("--peer-python", default="/tmp/peers/mg/bin/python")
    parser.add_argument("--peers-dir", default=os.path.join(ROOT, "..", "shared", "bench"))
    parser.add_argument("--check", type=int, default=8, help="sources checked cached vs uncached")
    parser.add_argument(
        "--no-bf16", action="store_true", help="skip our mixed_bfloat16 training and its peak"
    )
    args = parser.parse_args()
    peers = os.path.abspath(args.peers_dir)
    py = sys.executable

    peak = run([args.peer_python, os.path.join(peers, "peak_matmul.py")], "peak_matmul")
    peak_gflops = peak[0]["gflops"] if peak else None
    peak_bf16 = None
    if not args.no_bf16:
        rec = run([py, os.path.join(HERE, "peak_matmul.py"), "bfloat16"], "peak_matmul_bf16")
        peak_bf16 = rec[0]["gflops"] if rec else None
    summary = []
    for name in args.shapes.split(","):
        shapes = dict(SHAPES[name])
        ours = dict(shapes, peak_gflops=peak_gflops)
        ours_bf16 = dict(shapes, dtype="mixed_bfloat16", peak_gflops=peak_bf16)
        figures = {}
        for r in range(args.rounds):
            for rec in run(
                [
                    args.peer_python,
                    "-c",
                    _PEER_WRAPPER,
                    os.path.join(peers, "peer_modelgarden.py"),
                    json.dumps(shapes),
                ],
                f"{name}/modelgarden/{r}",
            ):
                figures.setdefault(("mg", rec["what"]), []).append(rec)
            for rec in run(
                [py, os.path.join(HERE, "train_throughput.py"), json.dumps(ours)],
                f"{name}/ours_train/{r}",
            ):
                figures.setdefault(("ours", rec["what"]), []).append(rec)
            if not args.no_bf16:
                for rec in run(
                    [py, os.path.join(HERE, "train_throughput.py"), json.dumps(ours_bf16)],
                    f"{name}/ours_train_bf16/{r}",
                ):
                    figures.setdefault(("ours_bf16", rec["what"]), []).append(rec)
            decode_cfg = dict(shapes, check=args.check if r == 0 else 0)
            for rec in run(
                [py, os.path.join(HERE, "decode_throughput.py"), json.dumps(decode_cfg)],
                f"{name}/ours_decode/{r}",
            ):
                figures.setdefault(("ours", rec["what"]), []).append(rec)

        def med(who, what, key="tokens_per_s"):
            return median([rec[key] for rec in figures.get((who, what), []) if key in rec])

        train_ratio = med("ours", "train") / med("mg", "train")
        decode_ratio = med("ours", "beam4_decode") / med("mg", "beam4_decode")
        checks = [rec["identical_ids"] for rec in figures.get(("ours", "beam4_cache_check"), [])]
        bf16 = {}
        if not args.no_bf16:
            rates = {"float32": med("ours", "train"), "mixed_bfloat16": med("ours_bf16", "train")}
            bf16 = dict(
                ours_bf16_train_tokens_per_s=round(rates["mixed_bfloat16"], 1),
                ours_bf16_mfu=round(med("ours_bf16", "train", "mfu"), 3),
                bf16_over_fp32=round(rates["mixed_bfloat16"] / rates["float32"], 3),
                auto_picks=choose(rates),
                peak_matmul_bf16_gflops=peak_bf16,
            )
        summary.append(
            dict(
                shapes=name,
                rounds=args.rounds,
                ours_train_tokens_per_s=round(med("ours", "train"), 1),
                mg_train_tokens_per_s=round(med("mg", "train"), 1),
                train_ratio=round(train_ratio, 3),
                ours_mfu=round(med("ours", "train", "mfu"), 3),
                ours_beam4_tokens_per_s=round(med("ours", "beam4_decode"), 1),
                mg_beam4_tokens_per_s=round(med("mg", "beam4_decode"), 1),
                beam4_ratio=round(decode_ratio, 3),
                ours_greedy_tokens_per_s=round(med("ours", "greedy_decode"), 1),
                cached_equals_uncached=all(checks) if checks else None,
                ours_train_max_rss_mb=med("ours", "train", "max_rss_mb"),
                mg_train_max_rss_mb=med("mg", "train", "max_rss_mb"),
                peak_matmul_gflops=peak_gflops,
                tf_enable_onednn_opts=os.environ.get("TF_ENABLE_ONEDNN_OPTS", "tf default"),
                **bf16,
            )
        )
    print("=== ratios of medians (ours / Model Garden)")
    for row in summary:
        print(json.dumps(row), flush=True)
        ledger.record("compare", row)


if __name__ == "__main__":
    main()
