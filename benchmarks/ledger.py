"""The results ledger: one append-only JSON-lines file per benchmark, `results/<benchmark>.jsonl`.

Every line is one measured figure with where and how it was taken: `date` (UTC, ISO 8601),
`machine` (the CPU's model name and core count), `cpu` (its family and model numbers, where
the name does not tell two generations apart: an "AMD EPYC" is a Zen 4 or a Zen 5, whose fp32
matrix products differ 2.3x), `cpu_flags` (the instruction-set flags that move the figures:
AVX-512, bfloat16, AMX, VNNI), `label` (what the run tried), `command` (the
command line that reproduces it, as run from the repository root), then the benchmark's own
fields. No line holds a path of the machine that measured it: a path inside the repository is
written relative to its root, a temporary one as `$TMPDIR/...`, one in the home directory as
`~/...`, any other as `DIR/<its last name>` (`portable`). Lines are only ever appended;
`docs/results.md` is generated from these files (`python -m benchmarks.results_page`).

A benchmark script appends its figures when the environment names the run:

    BENCH_LABEL=vocab_8000 python benchmarks/quality_budget.py --set data.vocab_size=8000

Without `BENCH_LABEL` the scripts only print their JSON lines (smoke tests, development).
"""

import datetime
import json
import os
import platform
import re
import shlex
import sys
import tempfile

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# An absolute path inside a string: after the start, a space, a quote, `=`, `:` or `,`.
_ABSOLUTE = re.compile(r"(?:(?<=^)|(?<=[\s'\"=:,(]))/(?:[\w.+@-]+/)*[\w.+@-]+/?")
# The flags that decide oneDNN's defaults and the bfloat16/int8 kernels on a CPU.
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni",
         "amx_bf16", "amx_tile", "amx_int8")


def _first_cpu(path):
    """`{field: value}` of the first processor's block of `/proc/cpuinfo` at `path` ({} where
    it cannot be read)."""
    fields = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    if fields:  # the end of the first processor's block
                        break
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_info(path="/proc/cpuinfo"):
    """`(model name, relevant flags)` of this machine's CPU (`platform.processor()` elsewhere)."""
    fields = _first_cpu(path)
    name = fields.get("model name") or platform.processor() or platform.machine()
    present = set(fields.get("flags", "").split())
    return name, [flag for flag in FLAGS if flag in present]


def cpu_generation(path="/proc/cpuinfo"):
    """`"family F, model M"` of this machine's first CPU (x86 Linux), or None."""
    fields = _first_cpu(path)
    if "cpu family" not in fields or "model" not in fields:
        return None
    return f"family {fields['cpu family']}, model {fields['model']}"


def ledger_path(benchmark):
    """The ledger file of `benchmark` (a script's name without `.py`)."""
    return os.path.join(RESULTS, f"{benchmark}.jsonl")


def _portable_path(path, root):
    path = os.path.normpath(path)
    for base, shown in (
        (os.path.realpath(root), "."),
        (os.path.normpath(root), "."),
        (os.path.realpath(tempfile.gettempdir()), "$TMPDIR"),
        ("/tmp", "$TMPDIR"),
        (os.path.expanduser("~"), "~"),
    ):
        if base not in ("/", "") and (path == base or path.startswith(base + os.sep)):
            rest = os.path.relpath(path, base)
            if shown == ".":
                return rest
            return shown if rest == "." else f"{shown}/{rest}"
    return f"DIR/{os.path.basename(path)}"


def portable(value, root=REPO):
    """`value` (a string, or a list or dict of them) with every absolute path written so that it
    means the same on another machine: relative to `root` (the repository) inside it, else
    `$TMPDIR/...`, `~/...` or `DIR/<its last name>`."""
    if isinstance(value, str):
        return _ABSOLUTE.sub(lambda m: _portable_path(m.group(0), root), value)
    if isinstance(value, list):
        return [portable(v, root) for v in value]
    if isinstance(value, dict):
        return {k: portable(v, root) for k, v in value.items()}
    return value


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
        "cpu": cpu_generation(),
        "cpu_flags": flags,
        "label": label,
        "command": portable(command or shlex.join(["python", *sys.argv])),
    }
    line.update({key: portable(value) for key, value in fields.items() if key not in line})
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
