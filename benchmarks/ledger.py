"""The results ledger: one append-only JSON-lines file per benchmark, `results/<benchmark>.jsonl`.

Every line is one measured figure with where and how it was taken: `date` (UTC, ISO 8601),
`machine` (the CPU's model name and core count), `cpu_flags` (the instruction-set flags that
move the figures: AVX-512, bfloat16, AMX, VNNI), `label` (what the run tried), `command` (the
command line that reproduces it), then the benchmark's own fields. Lines are only ever appended;
`docs/results.md` is generated from these files (`python -m benchmarks.results_page`).

A benchmark script appends its figures when the environment names the run:

    BENCH_LABEL=vocab_8000 python benchmarks/quality_budget.py --set data.vocab_size=8000

Without `BENCH_LABEL` the scripts only print their JSON lines (smoke tests, development).
"""

import datetime
import json
import os
import platform
import shlex
import sys

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
# The flags that decide oneDNN's defaults and the bfloat16/int8 kernels on a CPU.
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni",
         "amx_bf16", "amx_tile", "amx_int8")


def cpu_info(path="/proc/cpuinfo"):
    """`(model name, relevant flags)` of this machine's CPU (`platform.processor()` elsewhere)."""
    name, flags = platform.processor() or platform.machine(), []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    present = set(value.split())
                    flags = [flag for flag in FLAGS if flag in present]
                    break
    except OSError:
        pass
    return name, flags


def ledger_path(benchmark):
    """The ledger file of `benchmark` (a script's name without `.py`)."""
    return os.path.join(RESULTS, f"{benchmark}.jsonl")


def record(benchmark, fields, label=None, command=None):
    """Appends `fields` to `benchmark`'s ledger with the date, machine, CPU flags, label and
    command line; a no-op (returns None) when no label is given and `BENCH_LABEL` is unset."""
    label = label or os.environ.get("BENCH_LABEL")
    if not label:
        return None
    name, flags = cpu_info()
    line = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{name}, {os.cpu_count()} cores",
        "cpu_flags": flags,
        "label": label,
        "command": command or shlex.join(["python", *sys.argv]),
    }
    line.update({key: value for key, value in fields.items() if key not in line})
    os.makedirs(RESULTS, exist_ok=True)
    with open(ledger_path(benchmark), "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    return line


def read(benchmark):
    """The ledger's lines, as dicts, in the order they were appended."""
    with open(ledger_path(benchmark), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def benchmarks():
    """The names of the benchmarks that have a ledger, sorted."""
    return sorted(n[: -len(".jsonl")] for n in os.listdir(RESULTS) if n.endswith(".jsonl"))


def unlabelled_env():
    """This process's environment without `BENCH_LABEL`: for child benchmark processes whose
    lines the parent records itself (`compare.py`, `ab_checkouts.py`)."""
    return {key: value for key, value in os.environ.items() if key != "BENCH_LABEL"}
