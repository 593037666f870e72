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

import json
import os
import time

import pytest

# The file in the run's shared directory where tests/shared_runs.py records each wait for a
# fixture that another worker was building.
WAITS = "waits.jsonl"


def file_of(nodeid):
    """The file part of a node id (`tests/test_x.py::test_y[a]` -> `tests/test_x.py`)."""
    return nodeid.split("::", 1)[0]


class TierTimes:
    """Sums the reported test times by file (`pytest_runtest_logreport`).

    Args:
        workers: how many processes ran tests (pytest-xdist's `-n`; 1 without it).
    """

    def __init__(self, workers=1, waits=None):
        self.workers = max(int(workers or 1), 1)
        self.started = time.monotonic()
        self.started_at = time.time()  # the reports' clock (their `start`/`stop`)
        self.seconds = {}  # file -> summed seconds
        self.tests = {}  # file -> node ids seen
        self.spans = []  # (start, stop, worker, node id): each report's run on the wall clock
        self.waits = waits  # the shared fixtures' waits file (tests/shared_runs.py), if any

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        path = file_of(report.nodeid)
        self.seconds[path] = self.seconds.get(path, 0.0) + float(report.duration)
        self.tests.setdefault(path, set()).add(report.nodeid)
        start, stop = getattr(report, "start", None), getattr(report, "stop", None)
        # A test rescheduled after its worker was recycled is reported by the controller with
        # no run of its own (`rerun`, start and stop 0): not a span of any worker.
        if start and stop and stop >= start and getattr(report, "outcome", "") != "rerun":
            node = getattr(report, "node", None)  # xdist's controller: the worker it came from
            worker = getattr(getattr(node, "gateway", None), "id", None) or "main"
            self.spans.append((float(start), float(stop), worker, report.nodeid))

    @pytest.hookimpl
    def pytest_sessionstart(self, session):
        """The shared fixtures' waits file, in this run's base directory."""
        factory = getattr(session.config, "_tmp_path_factory", None)
        if self.waits is None and factory is not None:
            try:
                self.waits = os.path.join(str(factory.getbasetemp()), "shared", WAITS)
            except OSError:
                pass

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
        return out + self.idle_lines(self.started_at + wall) + self.wait_lines()

    def idle_lines(self, end, gap=5.0, top=5):
        """Where the workers' time outside tests went, from the reports' wall-clock spans: before
        the first test (start-up, collection), between tests (a worker recycled for its memory
        and its replacement starting, or one waiting for work), and in the tail after the last
        moment every worker ran a test (the run waiting for its last tests). The gaps between
        two tests of one worker longer than `gap` seconds are counted and the longest named."""
        if not self.spans or self.workers < 2:
            return []
        spans = sorted(self.spans)
        first = spans[0][0]
        events = sorted([(a, 1) for a, _, _, _ in spans] + [(b, -1) for _, b, _, _ in spans])
        running, last_full, previous = 0, first, first
        idle = idle_at_full = 0.0  # idle worker-seconds so far; up to the last moment all ran
        for t, step in events:
            idle += max(self.workers - running, 0) * max(t - previous, 0.0)
            previous = t
            running += step
            if running >= self.workers:
                last_full, idle_at_full = t, idle
        idle += max(self.workers - running, 0) * max(end - previous, 0.0)
        tail = idle - idle_at_full
        start_up = self.workers * max(first - self.started_at, 0.0)
        between = max(idle - tail, 0.0)
        workers = {}
        for a, b, worker, nodeid in spans:
            workers.setdefault(worker, []).append((a, b, nodeid))
        gaps = []
        for worker, runs in workers.items():
            for (_, b, before), (a, _, after) in zip(runs, runs[1:]):
                if a - b > gap:
                    gaps.append((a - b, worker, before, after))
        gaps.sort(reverse=True)
        alone = {}  # the tests still running after the last moment all ran: node id -> end
        for _, b, _, nodeid in spans:
            if b > last_full:
                alone[nodeid] = max(b, alone.get(nodeid, b))
        out = [
            f"outside tests: {start_up:.0f} s of worker time before the first test, "
            f"{between:.0f} s between tests ({len(gaps)} gaps over {gap:.0f} s; "
            f"{len(workers)} workers started for {self.workers} places), {tail:.0f} s in the "
            f"tail ({end - last_full:.0f} s after the last moment all {self.workers} ran tests)"
        ]
        for seconds, worker, before, after in gaps[:top]:
            out.append(f"  gap {seconds:6.1f} s on {worker}: after {before}, before {after}")
        for nodeid in sorted(alone, key=alone.get, reverse=True)[:top]:
            out.append(f"  in the tail: {nodeid}")
        return out

    def wait_lines(self, top=5):
        """The time tests spent waiting for a shared fixture another worker was building
        (inside their setup times above): its sum and the longest waits."""
        if not self.waits or not os.path.exists(self.waits):
            return []
        waits = []
        with open(self.waits, encoding="utf-8") as f:
            for line in f:
                try:
                    waits.append(json.loads(line))
                except ValueError:
                    continue  # a line torn by a worker that was killed while writing it
        if not waits:
            return []
        waits.sort(key=lambda w: -float(w.get("seconds", 0)))
        total = sum(float(w.get("seconds", 0)) for w in waits)
        out = [f"waiting for shared fixtures others built: {total:.0f} s in {len(waits)} waits"]
        for w in waits[:top]:
            out.append(f"  {float(w['seconds']):6.1f} s for {w.get('name')} ({w.get('test')})")
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


def slow_modules_first(items):
    """Reorders `items` in place: the test files holding a test whose `scenario` marker says
    why it is slow (`slow="..."`) first, then the others, each file's tests together and in
    their order. pytest-xdist hands tests out in this order, in chunks, and a worker left
    without any waits for the other's last tests: with the slow files last (alphabetically,
    the training ones are), one worker ran a minutes-long test alone at the end of the
    scenario tier; with the files of short tests last, the two workers finish together.
    Every worker sorts its own collection the same way, as xdist requires."""
    slow_files = set()
    for item in items:
        marker = item.get_closest_marker("scenario")
        if marker is not None and marker.kwargs.get("slow"):
            slow_files.add(file_of(item.nodeid))
    items.sort(key=lambda item: file_of(item.nodeid) not in slow_files)  # stable


class SlowFilesFirst:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        slow_modules_first(items)


def register(config):
    """Registers `SlowFilesFirst`, `TierTimes` where the reports arrive, when `--durations` is
    given, and `SlowScenarios` there when `KT_TESTS_SCENARIO_LIMIT_S` is set."""
    config.pluginmanager.register(SlowFilesFirst(), "slow-files-first")
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
