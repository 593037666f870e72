"""The machines the ledgers' figures were measured on: one name each, defined here and nowhere
else. The results page, the README's table and `figures.yaml` name a line's machine with
`name(line)`, and tests/test_ledgers.py fails where a page names a CPU another way.

A line is matched by what it records: the CPU's model name (`machine`), its family and model
numbers (`cpu`, written since 2026-12-06) and its flags (`cpu_flags`). Where the numbers are
recorded they decide; older lines are told apart by their flags: the Zen 5 has AVX-VNNI (the
VEX form) besides AVX512-VNNI, the Zen 4 only AVX512-VNNI, the Zen 3 no AVX-512 at all (lines
before 2026-11-25 were converted with a shorter flag list, without `avx512_vnni` and `fma`).

    python -m benchmarks.machines     prints the table docs/benchmarks.md holds
"""

import re
import sys


class Machine:
    """One machine: `key` (what figures.yaml writes), `name` (what every page writes), `flags`
    (the instruction sets that move the figures) and how a ledger line is recognised."""

    def __init__(self, key, name, flags, model, generation=None, having=(), lacking=()):
        self.key, self.name, self.flags = key, name, flags
        self.model = re.compile(model)  # the start of the line's `machine`
        self.generation = generation  # the line's `cpu`, where it records one
        self.having, self.lacking = set(having), set(lacking)  # `cpu_flags`, where it does not

    def matches(self, line):
        if not self.model.match(line.get("machine") or ""):
            return False
        recorded = line.get("cpu")
        if recorded and self.generation:
            return recorded == self.generation
        flags = set(line.get("cpu_flags") or ())
        return self.having <= flags and not self.lacking & flags


MACHINES = (
    Machine(
        "zen3",
        "AMD EPYC Zen 3",
        "family 25, model 1: AVX2 and FMA; no AVX-512",
        r"AMD EPYC\b",
        "family 25, model 1",
        having=("avx2",),
        lacking=("avx512f",),
    ),
    Machine(
        "zen4",
        "AMD EPYC Zen 4",
        "family 25, model 17: AVX-512 (on 256-bit units), AVX512-BF16, AVX512-VNNI; no AVX-VNNI, "
        "no AMX",
        r"AMD EPYC\b",
        "family 25, model 17",
        having=("avx512f", "avx512_bf16"),
        lacking=("avx_vnni",),
    ),
    Machine(
        "zen5",
        "AMD EPYC Zen 5",
        "AVX-512, AVX512-BF16, AVX512-VNNI and AVX-VNNI; no AMX",
        r"AMD EPYC\b",
        None,  # no line records its numbers
        having=("avx512f", "avx512_bf16", "avx_vnni"),
    ),
    Machine(
        "xeon",
        "Intel Xeon @ 2.5 GHz",
        "2 vCPUs: AVX-512, AVX512-BF16, AVX512-FP16, AVX-VNNI; no AMX",
        r"Intel Xeon @ 2\.5 GHz",
        having=("avx512f", "avx512_bf16", "avx512_fp16"),
        lacking=("amx_bf16",),
    ),
    Machine("h100", "NVIDIA H100", "80 GB (HBM3), 16 host cores", r"NVIDIA H100\b"),
    Machine(
        "h200",
        "NVIDIA H200",
        "141 GB (HBM3e), 16 host cores (an Intel CPU with AMX where a line records its flags)",
        r"NVIDIA H200\b",
    ),
)
BY_KEY = {machine.key: machine for machine in MACHINES}
NAMES = tuple(machine.name for machine in MACHINES)


def of(line):
    """The `Machine` a ledger line (a dict) was measured on; ValueError if none or several
    match: a new machine gets a row in `MACHINES` first."""
    found = [machine for machine in MACHINES if machine.matches(line)]
    if len(found) != 1:
        which = [m.key for m in found] or "no machine"
        raise ValueError(
            f"{line.get('machine')!r} {line.get('cpu')!r} {line.get('cpu_flags')!r}: {which} "
            "in benchmarks/machines.py"
        )
    return found[0]


def name(line):
    """The name of the machine a ledger line was measured on (`AMD EPYC Zen 5`)."""
    return of(line).name


def names(keys):
    """figures.yaml's `machine` (a key, or keys joined by `, `) as the pages write it."""
    return ", ".join(BY_KEY[key.strip()].name for key in str(keys).split(","))


def keys(text):
    """The keys in figures.yaml's `machine` text, in order."""
    return [key.strip() for key in str(text).split(",")]


def table():
    """The machines as a Markdown table: name, then the flags that matter."""
    rows = ["| machine | its CPU (family and model where recorded) and flags |", "|---|---|"]
    rows += [f"| {machine.name} | {machine.flags} |" for machine in MACHINES]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
