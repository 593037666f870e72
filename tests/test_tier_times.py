"""The CI's time-by-file summary (tests/_tier_times.py): sums by file, the workers' busy share,
and the section printed only where `--durations` asks for times."""

import json
import os
import subprocess
import sys
import time
import types

from _tier_times import TierTimes, file_of

HERE = os.path.dirname(os.path.abspath(__file__))


def _report(nodeid, duration):
    return types.SimpleNamespace(nodeid=nodeid, duration=duration)


def test_times_are_summed_by_file_and_ranked():
    times = TierTimes(workers=2)
    for nodeid, seconds in [
        ("tests/test_a.py::test_x", 3.0), ("tests/test_a.py::test_x", 1.0),  # call, teardown
        ("tests/test_a.py::test_y[p]", 2.0), ("tests/test_b.py::test_z", 10.0),
        ("tests/test_c.py", 0.5),  # a module-level report (collection, setup of a fixture)
    ]:  # fmt: skip
        times.pytest_runtest_logreport(_report(nodeid, seconds))
    lines = times.lines(wall=10.0, top=2)
    # 16.5 s of tests over 2 workers x 10 s: 82% (rounded) of their time.
    assert lines[0] == "16 s of tests in 10 s with 2 worker(s): 82% of the workers' time ran tests"
    assert len(lines) == 3  # the two costliest files
    assert lines[1].split()[-1] == "tests/test_b.py" and lines[1].split()[0] == "10.0"
    assert lines[2].split()[-1] == "tests/test_a.py" and lines[2].split()[0] == "6.0"
    assert lines[2].split()[-3] == "2"  # two tests, three reports
    assert file_of("tests/test_a.py::test_y[a::b]") == "tests/test_a.py"
    assert TierTimes().lines(wall=5.0) == []  # nothing ran: nothing to say


def test_the_section_is_printed_only_with_durations(tmp_path):
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {HERE!r})\nimport _tier_times\n\n"
        "def pytest_configure(config):\n    _tier_times.register(config)\n",
        encoding="utf-8",
    )
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n", encoding="utf-8")

    # Without the caller's PYTEST_* variables (.ci/run puts --durations in PYTEST_ADDOPTS; an
    # xdist worker has its own), as tests/test_tiers.py starts its pytest runs.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}

    def run(*flags):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
             *flags, str(tmp_path)],
            capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    with_times = run("--durations=5")
    assert "time by test file" in with_times
    assert "with 1 worker(s)" in with_times and "test_one.py" in with_times.split("time by")[1]
    assert "time by test file" not in run()


def test_a_test_over_the_scenario_limit_fails_the_run_unless_its_marker_says_why(tmp_path):
    """`KT_TESTS_SCENARIO_LIMIT_S` (.ci/run: 60 s, the scenario tier only): a test whose call
    ran longer fails the run unless `@pytest.mark.scenario(slow="...")` gives the reason (or
    it stays under `KT_TESTS_SCENARIO_FAIL_S`); the summary names each one. Here the limit is
    0.2 s and the slow tests sleep 0.5 s."""
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {HERE!r})\nimport _tier_times\n\n"
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'scenario: the scenario tier')\n"
        "    _tier_times.register(config)\n",
        encoding="utf-8",
    )
    (tmp_path / "test_slow.py").write_text(
        "import time\nimport pytest\n\n"
        "@pytest.mark.scenario(slow='sleeps to be slow')\n"
        "def test_slow_with_a_reason():\n    time.sleep(0.5)\n\n"
        "@pytest.mark.scenario\n"
        "def test_fast():\n    pass\n",
        encoding="utf-8",
    )
    (tmp_path / "test_unexplained.py").write_text(
        "import time\nimport pytest\n\npytestmark = pytest.mark.scenario\n\n"
        "def test_slow_without_a_reason():\n    time.sleep(0.5)\n",
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KT_TESTS_"))}

    def run(*args, limit="0.2", fail=None):
        variables = dict(env, KT_TESTS_SCENARIO_LIMIT_S=limit) if limit else dict(env)
        if fail:
            variables["KT_TESTS_SCENARIO_FAIL_S"] = fail
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
            capture_output=True, text=True, cwd=tmp_path, timeout=240, env=variables,
        )  # fmt: skip
        return done.returncode, done.stdout

    code, out = run("-p", "no:xdist")
    assert code == 1, out  # every test passed; the unexplained one fails the run
    section = out.split("took over 0 s", 1)[1]
    assert "test_unexplained.py::test_slow_without_a_reason  (NO REASON" in section
    assert "test_slow.py::test_slow_with_a_reason  (slow: sleeps to be slow)" in section
    assert "test_fast" not in section and "1 test(s) took over 0 s without a reason" in section
    # Past the limit but under KT_TESTS_SCENARIO_FAIL_S (.ci/run: 90 s, the machine's margin):
    # named, and the run passes; past it, the run fails.
    code, out = run("-p", "no:xdist", fail="5")
    assert code == 0 and "(0 over 5 s: the run fails)" in out and "NO REASON" in out, out
    assert run("-p", "no:xdist", fail="0.3")[0] == 1
    assert run("-p", "no:xdist", "test_slow.py")[0] == 0  # the only slow one says why
    assert run("-p", "no:xdist", limit="")[0] == 0  # off unless asked (a local run)
    code, out = run("-n", "2")  # through pytest-xdist's controller: the reason travels
    assert code == 1 and "(slow: sleeps to be slow)" in out and "NO REASON" in out, out


def _span(nodeid, start, stop, worker):
    node = types.SimpleNamespace(gateway=types.SimpleNamespace(id=worker))
    return types.SimpleNamespace(nodeid=nodeid, duration=stop - start, start=start, stop=stop,
                                 node=node)  # fmt: skip


def test_the_workers_time_outside_tests_is_split_into_start_up_gaps_and_the_tail():
    """Two workers from t=0 to 120 s: gw0 runs a (10-50 s) and b (60-100 s), gw1 runs c
    (12-80 s). Outside tests: 2 x 10 s before the first test; between tests gw1's 2 s late
    start and gw0's 10 s gap; the tail from 60 s (the last moment both ran) to the end:
    20 s of gw1 idle, then 20 s of both."""
    times = TierTimes(workers=2)
    times.started_at = 0.0
    for report in [_span("t.py::a", 10, 50, "gw0"), _span("t.py::c", 12, 80, "gw1"),
                   _span("t.py::b", 60, 100, "gw0")]:  # fmt: skip
        times.pytest_runtest_logreport(report)
    # A test rescheduled after its worker was recycled: the controller's report has no run.
    rerun = _span("t.py::d", 0, 0, "gw1")
    rerun.outcome = "rerun"
    times.pytest_runtest_logreport(rerun)
    lines = times.idle_lines(end=120.0)
    assert lines[0] == (
        "outside tests: 20 s of worker time before the first test, 12 s between tests "
        "(1 gaps over 5 s; 2 workers started for 2 places), 60 s in the tail (60 s after the "
        "last moment all 2 ran tests)"
    )
    assert lines[1] == "  gap   10.0 s on gw0: after t.py::a, before t.py::b"
    assert lines[2:] == ["  in the tail: t.py::b", "  in the tail: t.py::c"]
    assert TierTimes(workers=1).idle_lines(end=1.0) == []  # one worker: nothing to split


def test_waits_for_a_fixture_another_worker_builds_are_recorded_and_summed(tmp_path):
    """`shared_directory`: a second caller that waits on the lock while the first builds
    records its wait (`waits.jsonl`); the summary sums the waits, skipping a torn line."""
    import threading

    from shared_runs import shared_directory

    def build(path):
        time.sleep(1.6)
        (path / "built").write_text("yes")

    first = threading.Thread(target=shared_directory, args=(tmp_path, "run", build))
    first.start()
    time.sleep(0.3)
    assert (shared_directory(tmp_path, "run", build) / "built").read_text() == "yes"
    first.join()
    recorded = [json.loads(line) for line in (tmp_path / "waits.jsonl").read_text().splitlines()]
    assert [w["name"] for w in recorded] == ["run"] and 1.0 <= recorded[0]["seconds"] < 1.7
    with open(tmp_path / "waits.jsonl", "a") as f:
        f.write('{"name": "other", "seconds": 2.5, "test": "t.py::x"}\n{"name": "torn", "sec')
    times = TierTimes(workers=2, waits=str(tmp_path / "waits.jsonl"))
    lines = times.wait_lines()
    total = recorded[0]["seconds"] + 2.5
    assert lines[0] == f"waiting for shared fixtures others built: {total:.0f} s in 2 waits"
    assert lines[1] == "     2.5 s for other (t.py::x)"


def test_files_with_slow_tests_are_handed_out_first_each_file_kept_together():
    from _tier_times import slow_modules_first

    class Item:
        def __init__(self, nodeid, slow=None):
            self.nodeid, self.slow = nodeid, slow

        def get_closest_marker(self, name):
            if self.slow is None:
                return None
            return types.SimpleNamespace(kwargs={"slow": self.slow} if self.slow else {})

    items = [Item("tests/test_a.py::x", ""), Item("tests/test_b.py::y"),
             Item("tests/test_c.py::p", ""), Item("tests/test_c.py::q", "trains twice"),
             Item("tests/test_c.py::r"), Item("tests/test_d.py::z", "two processes")]  # fmt: skip
    slow_modules_first(items)
    assert [i.nodeid for i in items] == [
        "tests/test_c.py::p", "tests/test_c.py::q", "tests/test_c.py::r", "tests/test_d.py::z",
        "tests/test_a.py::x", "tests/test_b.py::y",
    ]  # fmt: skip
