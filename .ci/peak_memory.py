"""The peak resident memory of a process and all its descendants, sampled until it ends.

    python .ci/peak_memory.py PID OUT_FILE

Every half second it sums `VmRSS` over PID and every process below it (the pytest-xdist
workers and the subprocesses the tests start) and keeps the largest sum in OUT_FILE (a number of
bytes, rewritten at each new peak, so it holds even if this sampler is killed). `.ci/run` starts
one per tier and prints the figure; it needs nothing but Linux's `/proc`.

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


def tree_rss(root):
    """The summed resident memory of `root` and its descendants, in bytes."""
    total, stack, seen = 0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _rss_bytes(pid)
        stack.extend(_children(pid))
    return total


def main(argv):
    root, out = int(argv[1]), argv[2]
    peak = 0
    while os.path.exists(f"/proc/{root}"):
        rss = tree_rss(root)
        if rss > peak:
            peak = rss
            with open(out + ".tmp", "w") as f:
                f.write(f"{peak}\n")
            os.replace(out + ".tmp", out)
        time.sleep(0.5)


if __name__ == "__main__":
    main(sys.argv)
