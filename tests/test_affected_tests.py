"""The contributor's loop (`.ci/affected_tests.py`): the test files a change can affect, through
the import graph; seconds, no TensorFlow."""

import importlib.util
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, ".ci", "affected_tests.py")


def _tool():
    spec = importlib.util.spec_from_file_location("affected_tests", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A tiny tree: a package whose `__init__` loads names on first use, a leaf imported inside a
# function (lazily), a helper and a conftest fixture, and tests that reach the leaf each way.
TREE = {
    "setup.py": 'setup(entry_points={"console_scripts": ["pkgcli=pkg.cli:main"]})\n',
    "pkg/__init__.py": """
        import importlib
        _EXPORTS = {"Model": "pkg.model"}
        def __getattr__(name):
            return getattr(importlib.import_module(_EXPORTS[name]), name)
    """,
    "pkg/leaf.py": "VALUE = 1\n",
    "pkg/middle.py": "def f():\n    from pkg import leaf\n    return leaf.VALUE\n",
    "pkg/model.py": "from pkg.middle import f\nclass Model:\n    pass\n",
    "pkg/other.py": "import os\n",
    "pkg/cli.py": "from pkg import middle\ndef main():\n    pass\n",
    "tests/conftest.py": """
        import pytest
        @pytest.fixture
        def built():
            from _helpers import build
            return build()
        @pytest.fixture
        def plain():
            return 1
    """,
    "tests/_helpers.py": """
        def build():
            from pkg.middle import f
            return f()
        def unrelated():
            from pkg import other
    """,
    "tests/test_direct.py": "from pkg.leaf import VALUE\n",
    "tests/test_through_middle.py": "def test():\n    from pkg import middle\n",
    "tests/test_lazy_export.py": "import pkg as p\ndef test():\n    p.Model()\n",
    "tests/test_fixture.py": "def test(built):\n    pass\n",
    "tests/test_cli_subprocess.py": 'import subprocess\nsubprocess.run(["pkgcli", "x"])\n',
    "tests/test_module_flag.py": 'import sys\nARGV = [sys.executable, "-m", "pkg.cli"]\n',
    "tests/test_other.py": "from pkg import other\ndef test(plain):\n    pass\n",
    "tests/test_reads_config.py": 'PATH = "configs/tiny.yaml"\n',
    "configs/tiny.yaml": "a: 1\n",
}


def _tree(tmp_path):
    for rel, text in TREE.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return _tool().Graph(str(tmp_path), packages=("pkg",))


def test_a_change_selects_the_tests_that_import_it_directly_or_through_other_modules(tmp_path):
    graph = _tree(tmp_path)
    selected, why = graph.affected(["pkg/leaf.py"])
    assert selected == [
        "tests/test_cli_subprocess.py",  # the console script: pkg.cli -> middle -> leaf (lazy)
        "tests/test_direct.py",
        "tests/test_fixture.py",  # its fixture's helper imports middle
        "tests/test_lazy_export.py",  # pkg.Model, loaded on first use from pkg.model
        "tests/test_module_flag.py",  # `python -m pkg.cli`
        "tests/test_through_middle.py",
    ]
    assert why == {"pkg/leaf.py": 6}
    # Nothing imports pkg.other but test_other (the helper's other function is never called).
    assert graph.affected(["pkg/other.py"])[0] == ["tests/test_other.py"]


def test_a_changed_test_selects_itself_and_setup_or_conftest_everything(tmp_path):
    graph = _tree(tmp_path)
    assert graph.affected(["tests/test_other.py"])[0] == ["tests/test_other.py"]
    everything = sorted(p for p in TREE if p.startswith("tests/test_"))
    assert graph.affected(["setup.py"])[0] == everything
    assert graph.affected(["tests/conftest.py"])[0] == everything
    # A file outside the graph: the tests whose strings name it.
    assert graph.affected(["configs/tiny.yaml"])[0] == ["tests/test_reads_config.py"]
    assert graph.affected(["docs/unread.md"])[0] == []


def test_on_this_repository_a_change_to_word_rules_selects_its_test_and_not_the_layers():
    # tests/test_word_rules.py imports keras_transformer.word_rules; tests/test_layers.py
    # imports the layers, which import nothing that imports it.
    selected, _ = _tool().Graph(ROOT).affected(["keras_transformer/word_rules.py"])
    assert "tests/test_word_rules.py" in selected
    assert "tests/test_glossary.py" in selected  # through keras_transformer.glossary
    assert "tests/test_layers.py" not in selected


def test_the_command_prints_the_pytest_run_of_the_fast_tier_or_both():
    def run(*args):
        done = subprocess.run(
            [sys.executable, SCRIPT, "--print", *args], capture_output=True, text=True,
            cwd=ROOT, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    fast = run("tests/test_tier_times.py")
    assert fast == "python -m pytest -q -m 'not scenario' tests/test_tier_times.py"
    both = run("--scenario", "tests/test_tier_times.py", "--", "-x")
    assert both == "python -m pytest -q -x tests/test_tier_times.py"
