"""The peak resident memory of a process and all its descendants, sampled until it ends.

    python .ci/peak_memory.py PID OUT_FILE [TESTS_DIR]

Every half second it sums `VmRSS` over PID and every process below it (the pytest-xdist
workers and the subprocesses the tests start) and keeps the largest sum in OUT_FILE (a number of
bytes, rewritten at each new peak, so it holds even if this sampler is killed). `.ci/run` starts
one per tier and prints the figure; it needs nothing but Linux's `/proc`.

With TESTS_DIR (where each pytest process of the run names the test it is running, in a file
named by its pid: `KT_TESTS_CURRENT_DIR`, tests/conftest.py), OUT_FILE.where holds, for the
peak, what each of those processes and its children held and which test it ran: the line CI
prints to say where the peak came from.

A sum of resident sets counts a page shared by two processes twice: an upper bound, which is
what a machine's memory must hold.
"""

import os
import sys
import time


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss(root, labels=None):
    """The summed resident memory of `root` and its descendants, in bytes. With `labels`
    ({pid: test}), also each labelled process's share: its own and its descendants' memory,
    as {pid: [bytes, test]} (a labelled process below another is counted in its own only)."""
    total, stack, seen, shares = 0, [(root, None)], set(), {}
    while stack:
        pid, owner = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        if labels and pid in labels:
            owner = pid
            shares[pid] = [0, labels[pid]]
        rss = _rss_bytes(pid)
        total += rss
        if owner is not None:
            shares[owner][0] += rss
        stack.extend((child, owner) for child in _children(pid))
    return (total, shares) if labels is not None else total


def _labels(directory):
    """{pid: the test it runs} from the files pytest processes keep in `directory`."""
    found = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        if name.isdigit():
            try:
                with open(os.path.join(directory, name)) as f:
                    found[int(name)] = f.read().strip()
            except OSError:
                pass
    return found


def _alive(pid):
    """Whether `pid` still runs (a process that has ended but is not yet reaped is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def main(argv):
    root, out = int(argv[1]), argv[2]
    tests_dir = argv[3] if len(argv) > 3 else None
    peak = 0
    while _alive(root):
        if tests_dir:
            rss, shares = tree_rss(root, _labels(tests_dir))
        else:
            rss, shares = tree_rss(root), {}
        if rss > peak:
            peak = rss
            _write(out, f"{peak}\n")
            if tests_dir:
                lines = sorted(shares.values(), key=lambda share: -share[0])
                _write(out + ".where", "".join(f"{b / 2**30:.1f} GB  {t}\n" for b, t in lines))
        time.sleep(0.5)


if __name__ == "__main__":
    main(sys.argv)
