"""The peak memory of a process and all its descendants, sampled until it ends.

    python .ci/peak_memory.py PID OUT_FILE [TESTS_DIR]

Every half second it sums the memory of PID and every process below it (the pytest-xdist
workers and the subprocesses the tests start) and keeps the largest sum in OUT_FILE (a number of
bytes, rewritten at each new peak, so it holds even if this sampler is killed). `.ci/run` starts
one per tier and prints the figure; it needs nothing but Linux's `/proc`. The proportional sizes
below are read only when the resident sum could make a new peak (`tree_memory`'s `floor`), and
then at most every 2 seconds unless the resident sum grew by 256 MB: reading them for every
process twice a second took a fifth of a core in the scenario tier.

A process's memory is its proportional set size (`Pss` of `/proc/PID/smaps_rollup`): its own
pages, plus each page it shares with other processes divided by how many share it. Their sum is
what the processes hold together. A sum of resident sets (`VmRSS`) counts every process's
mapping of TensorFlow's shared libraries (about half a gigabyte each) again: with ten Python
processes that import TensorFlow it overstated the total by gigabytes. The largest such sum is
kept too, in OUT_FILE.rss; where `smaps_rollup` cannot be read, `VmRSS` stands in.

With TESTS_DIR (where each pytest process of the run names the test it is running, in a file
named by its pid: `KT_TESTS_CURRENT_DIR`, tests/conftest.py), OUT_FILE.where holds, for the
peak, what each of those processes and its children held and which test it ran: the line CI
prints to say where the peak came from.

OUT_FILE.procs counts the Python processes the tests started (`Subprocesses`): how many, and
the seconds they ran, summed (its first line), then the same by what each ran (`command_kind`:
`keras-transformer train`, `jax_runner.py quickstart_run`, `pytest`, ...), the costliest first;
rewritten every 5 seconds and when the tree has ended.
Each pays for its imports (TensorFlow's alone takes seconds).
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


def _field_bytes(path, name):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(name):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def resident_bytes(pid):
    """The resident set size of `pid` in bytes (0 once it has gone): cheap to read."""
    return _field_bytes(f"/proc/{pid}/status", "VmRSS:") or 0


def proportional_bytes(pid, rss):
    """The proportional set size of `pid` in bytes (`rss` where it cannot be read). Reading
    `smaps_rollup` walks the process's page tables: for a process holding TensorFlow, a few
    milliseconds of kernel time each."""
    pss = _field_bytes(f"/proc/{pid}/smaps_rollup", "Pss:")
    return rss if pss is None else pss


def tree_memory(root, labels=None, seen=None, floor=None):
    """`(pss, rss, shares)`: the summed proportional and resident memory of `root` and its
    descendants, in bytes, and with `labels` ({pid: test}) each labelled process's share: its
    own and its descendants' proportional memory, as {pid: [bytes, test]} (a labelled process
    below another is counted in its own only). `seen`, a set, gets every pid of the tree.

    With `floor` (the peak so far): where the resident sum is at most `floor`, the proportional
    sum is too (a process's proportional size never exceeds its resident one), so it is not read:
    `pss` is None and `shares` empty. A sampler keeps its true peak at a fraction of the cost."""
    rss_total, stack, tree = 0, [(root, None)], []
    seen = set() if seen is None else seen
    while stack:
        pid, owner = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        if labels and pid in labels:
            owner = pid
        rss = resident_bytes(pid)
        rss_total += rss
        tree.append((pid, owner, rss))
        stack.extend((child, owner) for child in _children(pid))
    if floor is not None and rss_total <= floor:
        return None, rss_total, {}
    pss_total, shares = 0, {}
    for pid, owner, rss in tree:
        pss = proportional_bytes(pid, rss)
        pss_total += pss
        if owner is not None:
            shares.setdefault(owner, [0, labels[owner]])[0] += pss
    return pss_total, rss_total, shares


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


def _stat_fields(pid):
    """The fields of `/proc/PID/stat` after the command's name (the state first), or None
    once `pid` has gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _alive(pid):
    """Whether `pid` still runs (a process that has ended but is not yet reaped is a zombie)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


# How pytest-xdist (execnet) starts its workers: they are the tier, not processes it starts.
_WORKER = b"exec(eval(sys.stdin.readline()))"


def _python_arguments(pid):
    """The arguments of `pid` where it runs a Python interpreter (its first argument's name
    starts so) and is no pytest-xdist worker; else None."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            arguments = f.read()
    except OSError:
        return None
    first = arguments.split(b"\0", 1)[0]
    if not os.path.basename(first).startswith(b"python") or _WORKER in arguments:
        return None
    return [a.decode("utf-8", "replace") for a in arguments.rstrip(b"\0").split(b"\0")]


def _first_word(arguments):
    return next((a for a in arguments if not a.startswith("-")), "")


def command_kind(arguments):
    """What a Python command line runs, in a few words: `keras-transformer SUBCOMMAND` (as a
    console script or `-m keras_transformer.cli`), `pytest`, `python -c`, `-m MODULE`, or a
    script's name and, for the test runners that take a function's name, that name."""
    rest = list(arguments[1:])
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
        option = rest.pop(0)  # the interpreter's own options (-u, -X ..., -W ...)
        if option in ("-X", "-W") and rest:
            rest.pop(0)  # and its value
    if not rest:
        return "python"
    if rest[0] == "-c":
        return "python -c"
    if rest[0] == "-m":
        module, rest = (rest[1] if len(rest) > 1 else ""), rest[2:]
        if module == "keras_transformer.cli":
            return f"keras-transformer {_first_word(rest)}".rstrip()
        return module if module == "pytest" else f"-m {module}"
    script, rest = os.path.basename(rest[0]), rest[1:]
    if script == "keras-transformer":
        return f"keras-transformer {_first_word(rest)}".rstrip()
    if script.endswith("_runner.py") and rest:  # tests/jax_runner.py FUNCTION ...; or
        for mark in ("--call", "--"):  # tests/train_runner.py [...] --call M:F | -- COMMAND
            if mark in rest[:-1]:
                return f"{script} {rest[rest.index(mark) + 1]}"
        return f"{script} {rest[0]}"
    return script


class Subprocesses:
    """The Python processes the tests start: every Python process of the tree but its root and
    the pytest-xdist workers, with the time each was seen running (between its first and last
    sample, plus one interval). Written to OUT_FILE.procs as `N SECONDS`."""

    def __init__(self, interval):
        self.interval = interval
        self.first, self.last, self.kind, self.cpu = {}, {}, {}, {}

    def sample(self, root, seen, now):
        for pid in seen:
            if pid == root:
                continue
            # Read at every sample, not once: a child caught between its fork and its exec
            # shows its parent's command line (a pytest-xdist worker's, say) until the exec.
            arguments = _python_arguments(pid)
            if arguments is None:
                continue
            self.first.setdefault(pid, now)
            self.kind[pid] = command_kind(arguments)
            self.last[pid] = now
            self.cpu[pid] = _cpu_seconds(pid, self.cpu.get(pid, 0.0))

    def summary(self):
        """`"N S"`: how many were seen and their summed seconds; then a line `C S N KIND` for
        each kind of command: its processes' CPU seconds (user and system, as last sampled:
        a process that waits, a lock holder say, runs long and costs nothing), their seconds
        run, their number; the most CPU seconds first."""
        ran = {p: self.last[p] - self.first[p] + self.interval for p in self.last}
        by_kind = {}
        for pid, seconds in ran.items():
            count, total, cpu = by_kind.get(self.kind[pid], (0, 0.0, 0.0))
            by_kind[self.kind[pid]] = (count + 1, total + seconds, cpu + self.cpu.get(pid, 0.0))
        lines = [f"{len(ran)} {sum(ran.values()):.0f}\n"]
        for kind, (count, total, cpu) in sorted(by_kind.items(), key=lambda item: -item[1][2]):
            lines.append(f"{cpu:.0f} {total:.0f} {count} {kind}\n")
        return "".join(lines)


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pid, last):
    """The user and system CPU seconds `pid` has used (`last` once it has gone)."""
    fields = _stat_fields(pid)
    if fields is None:
        return last
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (IndexError, ValueError):
        return last


def _write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


# Reading `smaps_rollup` takes about 15 ms for a process holding TensorFlow (2 cores, Zen 3):
# at every half-second sample of a tier's four or five such processes, a fifth of a core.
PSS_SECONDS, PSS_GROWTH = 2.0, 256 * 2**20


def main(argv):
    root, out = int(argv[1]), argv[2]
    tests_dir = argv[3] if len(argv) > 3 else None
    peak = rss_peak = 0
    interval, started = 0.5, time.monotonic()
    subprocesses = Subprocesses(interval)
    written = 0.0  # when OUT_FILE.procs was last written
    read_at, read_rss = -PSS_SECONDS, 0  # the last sample that read the proportional sizes
    while _alive(root):
        labels, seen = _labels(tests_dir) if tests_dir else {}, set()
        now = time.monotonic() - started
        # Proportional sizes where the resident sum could make a new peak, at most every
        # PSS_SECONDS unless the resident sum grew by PSS_GROWTH since they were last read.
        floor = peak if now - read_at >= PSS_SECONDS else max(peak, read_rss + PSS_GROWTH)
        pss, rss, shares = tree_memory(root, labels, seen, floor=floor)
        if pss is not None:
            read_at, read_rss = now, rss
        subprocesses.sample(root, seen, now)
        if now - written >= 5:
            _write(out + ".procs", subprocesses.summary())
            written = now
        if rss > rss_peak:
            rss_peak = rss
            _write(out + ".rss", f"{rss_peak}\n")
        if pss is not None and pss > peak:
            peak = pss
            _write(out, f"{peak}\n")
            if tests_dir:
                # A recycled worker not yet reaped (a zombie) holds nothing: left out.
                lines = sorted((s for s in shares.values() if s[0]), key=lambda share: -share[0])
                _write(out + ".where", "".join(f"{b / 2**30:.1f} GB  {t}\n" for b, t in lines))
        time.sleep(interval)
    _write(out + ".procs", subprocesses.summary())


if __name__ == "__main__":
    main(sys.argv)
