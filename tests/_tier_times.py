"""Where a tier's time goes (a pytest plugin): with `--durations` (as `.ci/run` runs every
tier), the summary adds the test files that took the most time (setup, call and teardown of
their tests, summed) and how much of the workers' time ran tests: the sum of all test times
over workers x wall time. A share well under 100% means workers waited (for a fixture that
another worker was building, or at the end for the last long test); a file at the top of the
list is where a cut pays most.

It runs where the reports arrive: in the one pytest process, or in pytest-xdist's controller.
It imports only `time` and `pytest`, so a test can feed it reports of its own.
"""

import time

import pytest


def file_of(nodeid):
    """The file part of a node id (`tests/test_x.py::test_y[a]` -> `tests/test_x.py`)."""
    return nodeid.split("::", 1)[0]


class TierTimes:
    """Sums the reported test times by file (`pytest_runtest_logreport`).

    Args:
        workers: how many processes ran tests (pytest-xdist's `-n`; 1 without it).
    """

    def __init__(self, workers=1):
        self.workers = max(int(workers or 1), 1)
        self.started = time.monotonic()
        self.seconds = {}  # file -> summed seconds
        self.tests = {}  # file -> node ids seen

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        path = file_of(report.nodeid)
        self.seconds[path] = self.seconds.get(path, 0.0) + float(report.duration)
        self.tests.setdefault(path, set()).add(report.nodeid)

    def lines(self, wall, top=15):
        """The summary's lines for a tier that ran `wall` seconds."""
        total = sum(self.seconds.values())
        if not total:
            return []
        busy = total / (self.workers * wall) if wall > 0 else 0.0
        out = [
            f"{total:.0f} s of tests in {wall:.0f} s with {self.workers} worker(s): "
            f"{100 * busy:.0f}% of the workers' time ran tests"
        ]
        ranked = sorted(self.seconds.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        for path, seconds in ranked:
            out.append(
                f"{seconds:8.1f} s {100 * seconds / total:5.1f}% "
                f"{len(self.tests[path]):4d} tests  {path}"
            )
        return out

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter):
        lines = self.lines(time.monotonic() - self.started)
        if not lines:
            return
        terminalreporter.section("time by test file", sep="=")
        for line in lines:
            terminalreporter.line(line)


def register(config):
    """Registers `TierTimes` where the reports arrive, when `--durations` is given."""
    if hasattr(config, "workerinput") or getattr(config.option, "durations", None) is None:
        return
    workers = getattr(config.option, "numprocesses", None)
    workers = workers if isinstance(workers, int) else 1
    config.pluginmanager.register(TierTimes(workers), "tier-times")
