"""The CI's time-by-file summary (tests/_tier_times.py): sums by file, the workers' busy share,
and the section printed only where `--durations` asks for times."""

import os
import subprocess
import sys
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
