"""`prepare` throughput with 1 and 2 worker processes (`data.prepare_workers`) on generated pairs.

Generates `--pairs` pairs (default 3,000,000) with `prepare_scale.generate_corpus` in a
temporary directory, then runs `keras-transformer prepare` of them with `configs/small.yaml`
once per worker count (`--workers`, default 1 2), each in a fresh child process and a fresh
workdir (the vocabulary is trained each time: it counts). Prints one JSON line per run (wall
seconds, pairs/s, the shards' sha256, and `phase_seconds`: the manifest's seconds of sampling the
vocabulary's sentences, training it and writing the shards (the rest is the process's start and
end), and `cpu_seconds` of the process and its workers) and the speedup of the last count over
the first (target: 2 workers >= 1.5x on a 2-core machine); the shards must be identical. Run
alone, from the repository root (with `BENCH_LABEL`, the lines also go to the ledger
`benchmarks/results/prepare_workers.jsonl`):

    BENCH_LABEL=prepare_workers_3m PYTHONPATH=$PWD TF_CPP_MIN_LOG_LEVEL=2 \\
        python benchmarks/prepare_workers.py --tmp /tmp/bench

Options: `--pairs N`, `--workers N ...`, `--config FILE`, `--tmp DIR` (kept with `--keep`).
"""

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _shards_sha256(prepared):
    digest = hashlib.sha256()
    for name in sorted(os.listdir(prepared)):
        if name.endswith(".tfrecord"):
            with open(os.path.join(prepared, name), "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def _prepare(args, corpus, workers):
    workdir = os.path.join(args.tmp, f"work-{workers}")
    shutil.rmtree(workdir, ignore_errors=True)
    command = [sys.executable, "-m", "keras_transformer.cli", "prepare", "--config", args.config]
    command += ["--workdir", workdir, "--set", f"data.train=text:{corpus}.src,{corpus}.tgt"]
    command += ["--set", f"data.prepare_workers={workers}"]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started, cpu = time.time(), _children_cpu_seconds()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds, cpu = time.time() - started, _children_cpu_seconds() - cpu
    if done.returncode:
        raise SystemExit(f"prepare with {workers} workers failed:\n{done.stderr[-3000:]}")
    prepared = os.path.join(workdir, "prepared")
    with open(os.path.join(prepared, "manifest.json")) as f:
        phases = json.load(f).get("phase_seconds", {})
    phases["cpu_seconds"] = round(cpu, 1)  # the process's and its workers' (user + system)
    return seconds, _shards_sha256(prepared), phases


def _children_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=3_000_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--config", default=os.path.join(REPO, "configs", "small.yaml"))
    parser.add_argument("--tmp")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    own_tmp = args.tmp is None
    args.tmp = args.tmp or tempfile.mkdtemp(prefix="prepare_workers-")
    try:
        from prepare_scale import generate_corpus

        corpus = os.path.join(args.tmp, "corpus")
        if not os.path.exists(corpus + ".src"):
            generate_corpus(corpus, args.pairs, seed=1)
        seconds, digests = {}, set()
        for workers in args.workers:
            seconds[workers], digest, phases = _prepare(args, corpus, workers)
            digests.add(digest)
            emit(
                benchmark="prepare_workers", workers=workers, pairs=args.pairs,
                seconds=round(seconds[workers], 1),
                pairs_per_second=round(args.pairs / seconds[workers]), shards_sha256=digest,
                phase_seconds=phases,
            )  # fmt: skip
        first, last = args.workers[0], args.workers[-1]
        emit(
            benchmark="prepare_workers", speedup=f"{last}/{first}",
            ratio=round(seconds[first] / seconds[last], 3), identical_shards=len(digests) == 1,
        )  # fmt: skip
    finally:
        if own_tmp and not args.keep:
            shutil.rmtree(args.tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
