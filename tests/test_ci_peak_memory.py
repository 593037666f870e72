"""`.ci/peak_memory.py`: the peak resident memory of a process tree, and the tests that held it."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLER = os.path.join(ROOT, ".ci", "peak_memory.py")

# A "worker" that names its test, then starts a child holding 300 MB for two seconds; beside it,
# an unnamed process holding 100 MB (counted in the total, put down to no test).
TREE = """
import os, subprocess, sys, time
with open(os.path.join(sys.argv[1], str(os.getpid())), "w") as f:
    f.write("tests/test_x.py::test_holds_300_mb")
hold = "import time; b = bytearray({mb} * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(2)"
children = [subprocess.Popen([sys.executable, "-c", hold.format(mb=300)])]
time.sleep(0.2)
relay = "import subprocess, sys; subprocess.run(sys.argv[1:])"
other = subprocess.Popen([sys.executable, "-c", relay, sys.executable, "-c", hold.format(mb=100)])
for child in children:
    child.wait()
"""


def test_the_peak_is_put_down_to_the_test_whose_process_tree_held_it(tmp_path):
    running = tmp_path / "running"
    running.mkdir()
    out = tmp_path / "peak"
    root = subprocess.Popen([sys.executable, "-c", TREE, str(running)])
    sampler = subprocess.run([sys.executable, SAMPLER, str(root.pid), str(out), str(running)],
                             timeout=60)  # fmt: skip
    root.wait(timeout=60)
    assert sampler.returncode == 0
    peak = int(out.read_text())
    assert peak >= 300 * 2**20  # at least the child's 300 MB were seen
    where = (out.parent / "peak.where").read_text().splitlines()
    gigabytes, test = where[0].split("  ", 1)
    assert test == "tests/test_x.py::test_holds_300_mb"
    # the named process's share includes its child's 300 MB, and is at most the whole tree's
    assert 0.29 <= float(gigabytes.split()[0]) <= peak / 2**30 + 0.05


# 300 MB written once, then shared by a forked child (copy-on-write): held once by the machine.
SHARED = """
import os, time
b = bytearray(300 * 2**20)
b[::4096] = b"x" * len(b[::4096])
pid = os.fork()
time.sleep(2)
if pid:
    os.waitpid(pid, 0)
"""


def test_pages_two_processes_share_are_counted_once(tmp_path):
    out = tmp_path / "peak"
    root = subprocess.Popen([sys.executable, "-c", SHARED])
    sampler = subprocess.Popen([sys.executable, SAMPLER, str(root.pid), str(out)])
    root.wait(timeout=60)
    assert sampler.wait(timeout=60) == 0
    peak, resident = int(out.read_text()), int((tmp_path / "peak.rss").read_text())
    assert resident >= 2 * 300 * 2**20  # each process's resident set holds the 300 MB
    assert 300 * 2**20 <= peak <= resident - 250 * 2**20  # the proportional sum, once


# A tier's root that starts three Python processes (one through another) and a stand-in for a
# pytest-xdist worker, started as execnet starts them: the worker is the tier, not one of them.
SUBPROCESSES = """
import subprocess, sys
hold = "import time; time.sleep(2)"
relay = "import subprocess, sys; subprocess.run(sys.argv[1:])"
started = [
    subprocess.Popen([sys.executable, "-c", hold]),
    subprocess.Popen([sys.executable, "-c", relay, sys.executable, "-c", hold]),
    subprocess.Popen([sys.executable, "-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"],
                     stdin=subprocess.PIPE),
]
started[2].stdin.write(repr(hold).encode() + b"\\n")
started[2].stdin.close()
for process in started:
    process.wait()
"""


def _sampled_processes(tmp_path, script):
    """The sampler's `peak.procs` lines for a root running `script`: `(first line, kinds)`."""
    out = tmp_path / "peak"
    root = subprocess.Popen([sys.executable, "-c", script])
    sampler = subprocess.run([sys.executable, SAMPLER, str(root.pid), str(out)], timeout=60)
    assert root.wait(timeout=60) == 0 and sampler.returncode == 0
    first, *kinds = (tmp_path / "peak.procs").read_text().splitlines()
    return first, kinds


def test_the_python_processes_the_tests_start_are_counted_with_their_run_times(tmp_path):
    first, kinds = _sampled_processes(tmp_path, SUBPROCESSES)
    count, seconds = first.split()
    assert int(count) == 3  # the two holders and the relay; not the worker, not the root
    assert 3 <= int(seconds) <= 60  # each ran its 2 s sleep (and its start): seen over a second
    # By kind: all three ran `python -c`; their seconds are the total's; they slept, so their
    # CPU seconds (their starts) are well under the seconds they ran.
    ((cpu, kind_seconds, kind_count, kind),) = [line.split(" ", 3) for line in kinds]
    assert (kind, int(kind_count), int(kind_seconds)) == ("python -c", 3, int(seconds))
    assert int(cpu) < int(seconds) / 2


# A root whose child waits between its fork and its exec: the child shows the root's command
# line meanwhile, and that line holds what marks a pytest-xdist worker (this comment, below).
FORK_THEN_EXEC = """
import os, sys, time
# exec(eval(sys.stdin.readline()))
pid = os.fork()
if pid == 0:
    time.sleep(1.2)
    os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(2)"])
os.waitpid(pid, 0)
"""


def test_a_process_seen_before_its_exec_is_counted_as_what_it_runs_after(tmp_path):
    first, kinds = _sampled_processes(tmp_path, FORK_THEN_EXEC)
    assert int(first.split()[0]) == 1  # the child, once it ran its own command
    assert [line.split(" ", 3)[2:] for line in kinds] == [["1", "python -c"]]


def _sampler_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("peak_memory", SAMPLER)
    sampler = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sampler)
    return sampler


def test_a_process_cpu_seconds_are_read_and_kept_once_it_has_gone():
    import time

    cpu_seconds = _sampler_module()._cpu_seconds
    before, start = cpu_seconds(os.getpid(), None), time.process_time()
    while time.process_time() - start < 0.3:  # busy for 0.3 CPU seconds
        pass
    assert cpu_seconds(os.getpid(), None) - before >= 0.2
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert cpu_seconds(gone.pid, 7.5) == 7.5  # no /proc entry: the last sampled value


def test_each_command_is_put_down_to_what_it_runs():
    kind = _sampler_module().command_kind
    venv = "/venv/bin"
    assert kind([f"{venv}/python", "-m", "keras_transformer.cli", "train", "--config", "c"]) == (
        "keras-transformer train"
    )
    assert kind([f"{venv}/python3.11", f"{venv}/keras-transformer", "--help"]) == (
        "keras-transformer"
    )
    assert kind([f"{venv}/python", f"{venv}/keras-transformer", "translate", "a"]) == (
        "keras-transformer translate"
    )
    assert kind(["python3", "-u", "tests/jax_runner.py", "quickstart_run", "600"]) == (
        "jax_runner.py quickstart_run"
    )
    runner = ["python", "tests/train_runner.py", "--logical-cpus", "2"]
    assert kind([*runner, "--", "train", "--config", "c"]) == "train_runner.py train"
    assert kind([*runner, "--call", "m:f", "1"]) == "train_runner.py m:f"
    assert kind(["python", "-X", "importtime", "-m", "pytest", "-q"]) == "pytest"
    assert kind(["python", "-m", "benchmarks.serve_compare"]) == "-m benchmarks.serve_compare"
    assert kind(["python", "-c", "print(1)"]) == "python -c"
    assert kind(["python", "benchmarks/export_cost.py", "a", "b"]) == "export_cost.py"
    assert kind(["python"]) == "python"


def test_proportional_sizes_are_read_only_where_the_resident_sum_could_make_a_peak():
    """A process's proportional size never exceeds its resident size: below the peak so far,
    the resident sum settles it without reading `smaps_rollup` (pss None); above, the sum and
    each labelled share are what a sample without the floor gives."""
    import time

    sampler = _sampler_module()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        labels = {child.pid: "the child"}  # a sleeping process: its memory holds still
        time.sleep(1)
        pss, rss, shares = sampler.tree_memory(child.pid, labels)
        assert 0 < pss <= rss and shares[child.pid][1] == "the child"
        skipped = sampler.tree_memory(child.pid, labels, floor=rss * 4)
        assert skipped[0] is None and skipped[2] == {} and skipped[1] > 0
        read_pss, read_rss, read_shares = sampler.tree_memory(child.pid, labels, floor=0)
        assert 0 < read_pss <= read_rss and set(read_shares) == {child.pid}
        assert abs(read_pss - pss) < 0.5 * pss  # the same process, sampled again
    finally:
        child.kill()
        child.wait()
