"""CI's cost: the phases of one `.ci/run` log, one JSON line each, for the ledger.

`.ci/run` prints each phase's wall time and peak memory (`ci: scenario-tier: 4021s, peak memory
5.9 GB ...`), each pytest run's summary and its slowest tests (`--durations`), the line
coverage and the total. This reads a saved log and prints, per phase, its seconds, peak memory,
tests passed and its ten slowest tests; then one line for the whole run (`phase: all`). Run on the
machine that ran CI (the ledger line records this machine's CPU):

    CI=true bash .ci/run > ci.log 2>&1
    BENCH_LABEL=ci PYTHONPATH=$PWD python benchmarks/ci_times.py ci.log

(`BENCH_LABEL` appends the lines to `benchmarks/results/ci_times.jsonl`.)
"""

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit  # noqa: E402

PHASE = re.compile(r"^ci: ([\w-]+): (\d+)s, peak memory ([\d.]+|\?) GB")
PASSED = re.compile(r"\b(\d+) passed\b.* in ([\d.]+)s")
SLOW = re.compile(r"^\s*([\d.]+)s (call|setup|teardown)\s+(\S+)")
COVERAGE = re.compile(r"^ci: line coverage .*: ([\d.]+)%")
TOTAL = re.compile(r"^CI finished in (\d+)s")


def phases(lines, top=10):
    """`(phases, total)`: each phase's `{"phase", "seconds", "peak_gb", "tests", "slowest"}` in
    the log's order (a phase's pytest output comes before its `ci:` line), and the run's
    `{"seconds", "coverage"}` (None where the log has not got there)."""
    found, tests, slow, total = [], 0, [], {"seconds": None, "coverage": None}
    for line in lines:
        if match := SLOW.match(line):
            slow.append((float(match.group(1)), f"{match.group(2)} {match.group(3)}"))
        elif (match := PASSED.search(line)) and not line.startswith("ci:"):
            tests += int(match.group(1))
        elif match := PHASE.match(line):
            peak = match.group(3)
            slow.sort(key=lambda pair: -pair[0])
            found.append({
                "phase": match.group(1), "seconds": int(match.group(2)),
                "peak_gb": None if peak == "?" else float(peak), "tests": tests,
                "slowest": [[seconds, what] for seconds, what in slow[:top]],
            })  # fmt: skip
            tests, slow = 0, []
        elif match := COVERAGE.match(line):
            total["coverage"] = float(match.group(1))
        elif match := TOTAL.match(line):
            total["seconds"] = int(match.group(1))
    return found, total


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="a saved `.ci/run` log")
    args = parser.parse_args(argv)
    with open(args.log, encoding="utf-8", errors="replace") as f:
        found, total = phases(f.read().splitlines())
    if not found:
        parser.error(f"{args.log}: no `ci: PHASE: Ns, peak memory` line (not a .ci/run log?)")
    sys.argv = ["benchmarks/ci_times.py", "ci.log"]  # the command the ledger line shows
    for phase in found:
        emit(benchmark="ci_times", **phase)
    emit(benchmark="ci_times", phase="all", tests=sum(p["tests"] for p in found), **total)


if __name__ == "__main__":
    main()
