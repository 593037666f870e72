"""Where a tier's time goes (a pytest plugin): with `--durations` (as `.ci/run` runs every
tier), the summary adds the test files that took the most time (setup, call and teardown of
their tests, summed) and how much of the workers' time ran tests: the sum of all test times
over workers x wall time. A share well under 100% means workers waited (for a fixture that
another worker was building, or at the end for the last long test); a file at the top of the
list is where a cut pays most.

It runs where the reports arrive: in the one pytest process, or in pytest-xdist's controller.
It imports only `os`, `time` and `pytest`, so a test can feed it reports of its own.

`SlowScenarios`, with `KT_TESTS_SCENARIO_LIMIT_S` set (`.ci/run` sets 60 for the scenario tier
only: a local run on a loaded machine is not failed): a test whose call took longer than that
many seconds of wall time is named in the summary, with its marker's reason,
`@pytest.mark.scenario(slow="trains two 300-step quickstarts, one per backend")`, or without
one; one without a reason fails the run once its call passes `KT_TESTS_SCENARIO_FAIL_S` (the
limit where unset; `.ci/run`: 90). The margin is the machine's: two workers on two cores, the
same test's wall time moved by a third between CI runs (84 s and 60 s), so a test that takes
55 s would fail one run in a few at 60; a new test that takes two minutes fails every run.
"""

import os
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


LIMIT_VARIABLE = "KT_TESTS_SCENARIO_LIMIT_S"
# The wall time past which a test without a reason fails the run (unset: the limit).
FAIL_VARIABLE = "KT_TESTS_SCENARIO_FAIL_S"
REASON = "scenario_slow"  # the user property that carries the marker's reason to the controller


class SlowScenarios:
    """The tests whose call ran longer than `limit` seconds: those without a reason on their
    `scenario` marker (`slow="..."`) fail the run."""

    def __init__(self, limit, fail=None):
        self.limit = float(limit)
        self.fail = self.limit if fail is None else max(float(fail), self.limit)
        self.slow = {}  # node id -> (seconds, reason or None)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        if report.when != "call" or float(report.duration) <= self.limit:
            return
        reason = dict(getattr(report, "user_properties", ()) or ()).get(REASON)
        self.slow[report.nodeid] = (float(report.duration), reason)

    def offenders(self, over=None):
        """The tests over the limit (or `over` seconds) without a reason."""
        over = self.limit if over is None else over
        return sorted(n for n, (t, reason) in self.slow.items() if not reason and t > over)

    def lines(self):
        out = []
        for nodeid, (seconds, reason) in sorted(self.slow.items(), key=lambda kv: -kv[1][0]):
            why = f"slow: {reason}" if reason else "NO REASON on its scenario marker"
            out.append(f"{seconds:8.1f} s  {nodeid}  ({why})")
        return out

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session):
        if self.offenders(self.fail) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter):
        if not self.slow:
            return
        terminalreporter.section(f"tests whose call took over {self.limit:.0f} s", sep="=")
        for line in self.lines():
            terminalreporter.line(line)
        if self.offenders():
            failing = len(self.offenders(self.fail))
            terminalreporter.line(
                f"{len(self.offenders())} test(s) took over {self.limit:.0f} s without a reason "
                f"({failing} over {self.fail:.0f} s: the run fails): make them faster, or say "
                'why on the marker: @pytest.mark.scenario(slow="...")',
                red=True,
            )


class ScenarioReasons:
    """On each item whose `scenario` marker gives `slow="..."`, a user property that every
    report of it carries (to xdist's controller too): where the tests are collected."""

    @pytest.hookimpl
    def pytest_collection_modifyitems(self, items):
        for item in items:
            marker = item.get_closest_marker("scenario")
            reason = marker.kwargs.get("slow") if marker is not None else None
            if reason:
                item.user_properties.append((REASON, str(reason)))


def register(config):
    """Registers `TierTimes` where the reports arrive, when `--durations` is given, and
    `SlowScenarios` there when `KT_TESTS_SCENARIO_LIMIT_S` is set."""
    if os.environ.get(LIMIT_VARIABLE, "").strip():
        config.pluginmanager.register(ScenarioReasons(), "scenario-reasons")
    if hasattr(config, "workerinput"):
        return
    limit = os.environ.get(LIMIT_VARIABLE, "").strip()
    if limit:
        fail = os.environ.get(FAIL_VARIABLE, "").strip() or None
        config.pluginmanager.register(SlowScenarios(limit, fail), "slow-scenarios")
    if getattr(config.option, "durations", None) is None:
        return
    workers = getattr(config.option, "numprocesses", None)
    workers = workers if isinstance(workers, int) else 1
    config.pluginmanager.register(TierTimes(workers), "tier-times")
