"""Under `CI=true`, a skipped test that must run is a failure (a pytest plugin).

A test module that skips when a dependency or a private import path is missing
(`pytest.importorskip`, `pytest.skip`) passes silently: a dependency change could switch off
the CTranslate2 agreement checks and nobody would notice. `tests/conftest.py` registers
`NoSilentSkips(MUST_RUN)`: with `CI` set to `true` (or `1`), every skip of a listed module or
test, at collection (a module-level `importorskip`) or while it runs, makes the run fail and is
named with its reason in the summary. Outside CI skips stay skips (a developer without the
`test` extra can still run the rest).

It runs where the reports arrive: in the one pytest process, or in pytest-xdist's controller
(the workers send it every skipped collection report and every test report). It imports only
`os` and `pytest`, so a test can load it into a throwaway pytest run.
"""

import os

import pytest


def in_ci():
    """Whether `CI` says this is a CI run (`true`, `1` or `yes`, any case)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


class NoSilentSkips:
    """Records the skips of `must_run` and fails the session on them under CI.

    Args:
        must_run: `{node id or node id prefix: why it must run}`; an entry is a module
            (`tests/test_x.py`), a test function (`tests/test_x.py::test_y`, with all its
            parameters) or one parametrized case.
    """

    def __init__(self, must_run):
        self.must_run = dict(must_run)
        self.skipped = {}  # node id -> (list entry, skip message)

    def entry(self, nodeid):
        """The `must_run` entry covering `nodeid`, else None."""
        for key in self.must_run:
            if nodeid == key or nodeid.startswith((key + "::", key + "[")):
                return key
        return None

    def _record(self, report):
        # An expected failure (`xfail`) is reported as skipped: it ran, so it is no skip.
        if not report.skipped or hasattr(report, "wasxfail") or not in_ci():
            return
        key = self.entry(report.nodeid)
        if key is None:
            return
        longrepr = report.longrepr
        message = longrepr[2] if isinstance(longrepr, (tuple, list)) else str(longrepr)
        self.skipped.setdefault(report.nodeid, (key, message))

    @pytest.hookimpl
    def pytest_collectreport(self, report):
        self._record(report)  # a module-level importorskip skips the module's collection

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        self._record(report)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session):
        if self.skipped and not hasattr(session.config, "workerinput"):
            if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter):
        if not self.skipped:
            return
        terminalreporter.section("must-run tests skipped under CI", sep="=", red=True)
        for nodeid, (key, message) in sorted(self.skipped.items()):
            terminalreporter.line(
                f"SKIPPED IN CI {nodeid}: {message} (must run: {self.must_run[key]})", red=True
            )
        terminalreporter.line(
            "a test the `test` extra is installed to run was skipped: install what it needs "
            "(pip install -e '.[test]') or fix the import path; the list is MUST_RUN in "
            "tests/conftest.py",
            red=True,
        )
