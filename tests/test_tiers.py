"""The two tiers of the suite: the README's test command (the fast tier) collects no test marked
`scenario`, and `.ci/run`'s scenario tier collects only those; together they are every test."""

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from _recipes import marked_blocks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "tests")

# The collecting subprocess: one pytest session per argument list, in one process (the test
# modules are imported once), each writing `{node id: carries the scenario marker}`.
COLLECT = """
import json, sys
import pytest

class Probe:
    def pytest_collection_finish(self, session):
        self.items = {item.nodeid: item.get_closest_marker("scenario") is not None
                      for item in session.items}

results = []
for args in json.loads(sys.argv[1]):
    probe = Probe()
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *args], plugins=[probe])
    assert code in (0, 5), code
    results.append(probe.items)
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
"""


def _pytest_commands(text):
    """The argument lists of every `python -m pytest` in a shell command line."""
    commands = []
    for part in re.split(r"&&|\|\||;|\n", text):
        words = shlex.split(part)
        if "pytest" not in words:
            continue
        args = words[words.index("pytest") + 1 :]
        env = {w.split("=", 1)[0]: w.split("=", 1)[1] for w in words if re.match(r"^[A-Z_]+=", w)}
        commands.append((env, args))
    return commands


def _without_workers(args):
    """`args` without `-n N` and `-q` (the collection runs in one quiet process)."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "-n":
            skip = True
        elif arg not in ("-q",) and not arg.startswith("--durations"):
            kept.append(arg)
    return kept


def _modules_with_scenarios():
    """The test modules that hold at least one scenario test (what the collection reads: all
    of them would cost the import of every test module)."""
    found = []
    for name in sorted(os.listdir(HERE)):
        if name.startswith("test_") and name.endswith(".py"):
            with open(os.path.join(HERE, name), encoding="utf-8") as f:
                if "mark.scenario" in f.read():
                    found.append(os.path.join("tests", name))
    return found


def _collect_all(runs, tmp_path):
    """`[{node id: "scenario" | "fast"}]`: what `pytest ARGS` collects for each `args` of
    `runs`, in one subprocess."""
    out = tmp_path / "collected.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env.pop("PYTEST_ADDOPTS", None)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    argv = json.dumps([[*args, *_modules_with_scenarios()] for args in runs])
    done = subprocess.run([sys.executable, "-c", COLLECT, argv, str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(out) as f:
        return [{node: "scenario" if marked else "fast" for node, marked in collected.items()}
                for collected in json.load(f)]  # fmt: skip


def _readme_test_command():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        blocks = {kind: code for _, lang, kind, _, code in marked_blocks(f.read())}
    return blocks["ci:test"]


def _ci_scenario_commands():
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        text = f.read().replace("\\\n", " ")
    lines = [line.split("phase scenario-", 1)[1].split(" ", 1)[1]
             for line in text.splitlines() if line.startswith("phase scenario-")]  # fmt: skip
    return [command for line in lines for command in _pytest_commands(line.replace("env ", ""))]


def test_the_fast_tier_collects_no_scenario_and_the_scenario_tier_only_scenarios(tmp_path):
    fast = _pytest_commands(_readme_test_command())
    scenario = _ci_scenario_commands()
    assert len(fast) == 2 and len(scenario) == 2, (fast, scenario)
    # The environment of each command (oneDNN, threads) changes nothing of what it collects.
    runs = [[]] + [_without_workers(args) for _, args in fast + scenario]
    everything, *tiers = _collect_all(runs, tmp_path)
    assert "scenario" in everything.values() and "fast" in everything.values()
    fast_ids, scenario_ids = set(), set()
    for collected in tiers[: len(fast)]:
        wrong = sorted(n for n, tier in collected.items() if tier == "scenario")
        assert not wrong, f"the README's test command collects scenario tests: {wrong}"
        fast_ids |= set(collected)
    for collected in tiers[len(fast) :]:
        wrong = sorted(n for n, tier in collected.items() if tier == "fast")
        assert not wrong, f".ci/run's scenario tier collects fast tests: {wrong}"
        scenario_ids |= set(collected)
    # Every test runs in one tier or the other (the numerics reruns are subsets of the two).
    assert fast_ids | scenario_ids == set(everything)


def test_a_test_that_trains_a_run_a_shared_fixture_provides_fails(tmp_path):
    """The README's quickstart at toy scale is `toy_quickstart`'s run: trained again from
    scratch by a test, in the test's process or in a subprocess, it fails naming the fixture;
    interrupted or resumed runs (what scenario tests exercise) are not refused."""
    from _recipes import QUICKSTART, make_bin, run_block, toy_quickstart_config

    from keras_transformer.training import train

    config = toy_quickstart_config()
    runtime = dataclasses.replace(config.runtime, workdir=str(tmp_path / "in_process"))
    config = dataclasses.replace(config, runtime=runtime)
    try:
        train(config)
    except AssertionError as error:
        assert "shared fixture `toy_quickstart`" in str(error)
    else:
        raise AssertionError("the provided run was trained again")
    assert not os.path.exists(tmp_path / "in_process" / "checkpoints")

    bin_dir = make_bin(str(tmp_path / "bin"))
    try:
        run_block(QUICKSTART, tmp_path, bin_dir, "test_tiers")
    except AssertionError as error:
        assert "shared fixture `toy_quickstart`" in str(error)
    else:
        raise AssertionError("the provided run was trained again in a subprocess")


@pytest.mark.scenario(
    slow="two pytest runs whose workers restart at module boundaries, each importing TensorFlow"
)
def test_a_worker_over_its_memory_limit_is_replaced_and_no_test_is_lost():
    """With a limit every worker passes at once, each worker leaves at its first module
    boundary (tests/conftest.py): the tests it had not begun run on the workers that replace
    it, and every test passes as in one process. Three small modules of quick tests (eight in
    all): with two workers at least one of them crosses a module boundary, and what costs the
    time is each replacement's start (importing Keras and TensorFlow), and the 36 tests of the
    three modules it ran before, handed out in small chunks, made dozens of them."""
    modules = [f"tests/test_{m}.py" for m in ("repository", "distribution", "data_tagged")]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KT_TESTS_WORKER_MEMORY_GB="0.05")
    for name in [n for n in env if n.startswith("PYTEST_")]:  # an xdist worker's own, too
        env.pop(name)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *modules]
    counted = {}
    for extra in ([], ["-n", "2"]):
        done = subprocess.run(command + extra, cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        counted[bool(extra)] = dict(
            (word, int(n)) for n, word in re.findall(r"(\d+) (passed|rerun|failed)", done.stdout)
        )
    assert counted[True]["passed"] == counted[False]["passed"] > 0
    assert counted[True].get("rerun", 0) >= 1 and "failed" not in counted[True]


@pytest.mark.scenario
def test_a_worker_past_its_hard_limit_leaves_inside_a_module_and_no_test_is_lost():
    """Past the hard limit a worker does not wait for its module's end: it leaves before each
    next test (a worker's first test excepted, so every test runs), and the module's tests all
    pass, each begun once more on a fresh worker. A module of three tests shows it (two
    workers replaced inside it); each replacement is a worker's start."""
    module = "tests/test_data_tagged.py"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KT_TESTS_WORKER_MEMORY_GB="100",
               KT_TESTS_WORKER_HARD_MEMORY_GB="0.05")  # fmt: skip
    for name in [n for n in env if n.startswith("PYTEST_")]:
        env.pop(name)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", module, "-n", "1"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    counted = {word: int(n) for n, word in re.findall(r"(\d+) (passed|rerun|failed)", done.stdout)}
    collected = subprocess.run(command[:-2] + ["--collect-only"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=600)  # fmt: skip
    total = len([line for line in collected.stdout.splitlines() if "::" in line])
    assert counted["passed"] == total > 1
    assert counted.get("rerun", 0) == total - 1 and "failed" not in counted


def test_a_send_to_a_worker_that_has_just_left_loses_no_test():
    """Two workers recycled at once: xdist hands the first one's pending tests to the second,
    whose pipe is already closed. The send must not end the run (it did: `INTERNALERROR
    OSError: cannot send (already closed?)`); the tests stay the second worker's and are handed
    on when its own exit is processed."""
    import xdist.scheduler.load as xdist_scheduler
    from conftest import tolerate_sends_to_a_recycled_worker
    from xdist.workermanage import WorkerController

    tolerate_sends_to_a_recycled_worker()  # what a controller does (here: maybe a worker)

    class ClosedPipe:
        def send(self, item):
            raise OSError("cannot send (already closed?)")

    class Gone:
        shutting_down = False
        channel = ClosedPipe()

        def log(self, *args):
            pass

        sendcommand = WorkerController.sendcommand
        send_runtest_some = WorkerController.send_runtest_some

    gone = Gone()
    sched = xdist_scheduler.LoadScheduling.__new__(xdist_scheduler.LoadScheduling)
    sched.pending, sched.node2pending, sched.maxschedchunk = [4, 5, 6, 7], {gone: []}, None
    sched._send_tests(gone, 2)
    assert sched.node2pending[gone] == [4, 5] and sched.pending == [6, 7]


def test_the_collection_of_a_worker_sent_home_at_its_start_is_dropped():
    """Near a run's end: a replacement worker becomes ready while the controller shuts down,
    so xdist tells it to leave and never schedules it; another worker is recycled, which resets
    the shutdown; then the first one's collection arrives. It must not end the run (it did:
    `INTERNALERROR assert <WorkerController gw7> in {}` in `add_node_collection`), and the
    scheduler must not take it as a worker."""
    import xdist.scheduler.load as xdist_scheduler
    from conftest import ignore_the_collection_of_a_worker_sent_home
    from xdist.dsession import DSession

    ignore_the_collection_of_a_worker_sent_home()  # what a controller does

    class Hooks:
        def pytest_xdist_node_collection_finished(self, node, ids):
            pass

    session = DSession.__new__(DSession)
    session.config = type("Config", (), {"hook": Hooks()})()
    session.shuttingdown, session.terminal = False, None
    session._session = type("Session", (), {"testscollected": 0})()
    sched = xdist_scheduler.LoadScheduling.__new__(xdist_scheduler.LoadScheduling)
    sched.node2pending, sched.node2collection, sched.collection = {}, {}, None
    session.sched = sched
    sent_home = object()
    session.worker_collectionfinish(sent_home, ["tests/test_a.py::test_one"])
    assert sched.node2pending == {} and sched.node2collection == {}
