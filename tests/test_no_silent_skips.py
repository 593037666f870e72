"""Under CI=true a skip of a test the `test` extra is meant to run fails the run
(`tests/_no_silent_skips.py`, with the list `MUST_RUN` in `tests/conftest.py`): at collection (a
module-level `importorskip`) and while a test runs, in one process and under pytest-xdist."""

import ast
import os
import re
import subprocess
import sys

import pytest
from conftest import MUST_RUN

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)

_CONFTEST = f"""
import sys
sys.path.insert(0, {TESTS!r})
from _no_silent_skips import NoSilentSkips

def pytest_configure(config):
    config.pluginmanager.register(NoSilentSkips({{
        "test_tiny_module.py": "a module that must run",
        "test_tiny.py::test_needs_it": "a test that must run",
    }}))
"""

_TINY = """
import pytest

def test_runs():
    pass

def test_needs_it():
    pytest.importorskip("no_such_module_anywhere_47")

def test_optional():
    pytest.skip("not on the list: may skip")
"""

_TINY_MODULE = """
import pytest

pytest.importorskip("no_such_module_anywhere_47")

def test_never_collected():
    pass
"""


def _pytest(directory, *arguments, ci):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CI"))}
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", *arguments],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(_CONFTEST)
    (tmp_path / "test_tiny.py").write_text(_TINY)
    (tmp_path / "test_tiny_module.py").write_text(_TINY_MODULE)
    return tmp_path


@pytest.mark.parametrize("workers", [None, "2"], ids=["one-process", "xdist"])
def test_a_must_run_skip_fails_under_ci_naming_the_test(tiny, workers):
    arguments = ["-n", workers] if workers else ["-p", "no:xdist"]
    done = _pytest(tiny, *arguments, ci=True)
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert "must-run tests skipped under CI" in output, output
    assert "SKIPPED IN CI test_tiny.py::test_needs_it" in output, output
    assert "SKIPPED IN CI test_tiny_module.py" in output, output
    assert "a test that must run" in output and "a module that must run" in output
    # A skip not on the list stays a skip.
    assert "SKIPPED IN CI test_tiny.py::test_optional" not in output


def test_outside_ci_the_same_skips_pass(tiny):
    done = _pytest(tiny, "-p", "no:xdist", ci=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "3 skipped" in output and "1 passed" in output, output
    assert "SKIPPED IN CI" not in output


@pytest.mark.scenario
def test_the_real_list_catches_a_missing_keras_hub(tmp_path):
    """The suite's own conftest under CI=true: with `keras_hub` unimportable, the KerasHub layer
    module's collection skip fails the run and is named."""
    blocked = tmp_path / "blocked" / "keras_hub"
    blocked.mkdir(parents=True)
    # A missing package raises ModuleNotFoundError, the only ImportError `importorskip` skips on
    # (pytest 9.1+ lets any other ImportError through as a collection error).
    (blocked / "__init__.py").write_text(
        "raise ModuleNotFoundError('keras_hub blocked by the test', name='keras_hub')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CI"))}
    env.update(CI="true", PYTHONPATH=os.pathsep.join([str(blocked.parent), ROOT]))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "tests/test_layers_keras_hub.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert "SKIPPED IN CI tests/test_layers_keras_hub.py" in output, output


def _test_functions(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_every_skip_in_the_suite_is_on_the_list():
    """Each `pytest.skip`, `importorskip` or skip mark in tests/ is in a module or test listed in
    MUST_RUN (a new one must be listed, or the list's comment says why it may skip), and every
    entry names a module and test that exist."""
    for entry in MUST_RUN:
        module, _, test = entry.partition("::")
        path = os.path.join(ROOT, module)
        assert os.path.isfile(path), entry
        assert not test or test.split("[")[0] in _test_functions(path), entry
    skipping = re.compile(r"pytest\.(importorskip|skip)\(|mark\.skip(if)?\b")
    for name in sorted(os.listdir(TESTS)):
        if not name.endswith(".py") or name == "test_no_silent_skips.py":
            continue
        with open(os.path.join(TESTS, name), encoding="utf-8") as f:
            source = f.read()
        module = f"tests/{name}"
        if module in MUST_RUN:
            continue
        tree = ast.parse(source)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and skipping.search(ast.get_source_segment(
                source, node
            )):  # fmt: skip
                assert f"{module}::{node.name}" in MUST_RUN, f"{module}::{node.name} may skip"
        top_level = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        for node in top_level:
            assert not skipping.search(ast.get_source_segment(source, node) or ""), module
