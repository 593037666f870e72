"""Stopping on SIGTERM or SIGINT: one flag for the whole process, checked at safe points.

Spot and preemptible machines, TPU maintenance events and Kubernetes evictions send SIGTERM,
then SIGKILL after a grace period (30 seconds by default). `catching()` (entered once by the
`keras-transformer` command, and by `training.train`) turns SIGTERM and SIGINT into a flag
instead of an exit; each phase calls `check(phase)` at its safe points, places where stopping
leaves nothing half-written (between two segments of `prepare`'s shards, between two dev
batches of the final model's choice, before an export is renamed into place). There `check`
raises `errors.Preempted`: the temporary files are removed on the way out, the workdir lock is
released, and the command prints one line and exits with `errors.PREEMPTED_EXIT_CODE` (75).
Training reads the same flag after every step (`training.run.preemption.StopOnSignal`: it saves the
resume state first). Running the same command again resumes: a phase whose result was written
is not run again.

A second SIGINT (Ctrl-C twice) interrupts at once (`KeyboardInterrupt`).

The workdir lock stops its holder the same way when another run took the lock over (this run
stalled for longer than its lease, see `keras_transformer.lock`): `request(reason)` sets the
flag from its renewal thread, and the next safe point raises `Preempted` naming the reason. The
workdir then belongs to the new holder: training stops without saving (`lost_the_workdir`), and
the lock file, now the new holder's, is left alone.

A takeover overrides an earlier stop: a run stopping on SIGTERM when its lock is taken over no
longer saves its resume state, and the writers check the lock before each commit
(`lock.fence`), so a run that has lost its workdir commits nothing into it.

`KERAS_TRANSFORMER_SIGTERM_AT=WORD[:N]` (tests): the Nth `check` of the phase whose name holds
WORD sends this process a real SIGTERM, so that a test stops a phase at a known place without
sleeping and polling.
"""

import contextlib
import os
import signal
import threading
import time

from keras_transformer.errors import Preempted

SIGNALS = (signal.SIGTERM, signal.SIGINT)
TEST_HOOK = "KERAS_TRANSFORMER_SIGTERM_AT"


class _Flag:
    """The process's one stop flag and the handlers that set it."""

    def __init__(self):
        self.received = None  # the signal's number
        self.depth = 0  # nested `catching()` blocks
        self.previous = {}
        self.hooked = {}  # safe points met per phase (the test hook)
        self.reason = None  # why, when not a signal (`request`)
        self.lost = False  # another run took the workdir over (`request`)


_FLAG = _Flag()


def _handle(signum, frame):
    if signum == signal.SIGINT and _FLAG.received == signal.SIGINT:
        raise KeyboardInterrupt
    _FLAG.received = signum


def received():
    """The number of the signal received inside `catching()` (None when none was; SIGTERM's
    after a `request`)."""
    return _FLAG.received


def cause():
    """Why the process stops: the signal's name (`SIGTERM`), a `request`'s reason, or None."""
    if _FLAG.reason is not None:
        return _FLAG.reason
    return signal.Signals(_FLAG.received).name if _FLAG.received is not None else None


def request(reason, lost_the_workdir=False):
    """Asks the process to stop at its next safe point as SIGTERM would (from any thread);
    `reason` (e.g. "the takeover of the workdir lock by ...") names why in the stop's line;
    `lost_the_workdir`: another run now writes the workdir, so nothing more is saved.

    The first reason is kept (a second SIGTERM or request changes nothing), except that a lost
    workdir overrides an earlier one: a run stopping on SIGTERM whose lock is then taken over
    saves nothing more, and its stop's line names the takeover.

    Returns:
        True when it will stop (inside `catching()`); False outside it, where nothing reads
        the flag (and nothing is changed).
    """
    if not _FLAG.depth:
        return False
    if _FLAG.received is None or (lost_the_workdir and not _FLAG.lost):
        _FLAG.reason, _FLAG.lost = reason, lost_the_workdir
        if _FLAG.received is None:
            _FLAG.received = signal.SIGTERM
    return True


def lost_the_workdir():
    """True when the stop was requested because another run took the workdir over."""
    return _FLAG.lost and _FLAG.received is not None


@contextlib.contextmanager
def catching():
    """A block in which SIGTERM and SIGINT set the stop flag instead of ending the process.

    Nested blocks share the outermost one's handlers (installing them again where something
    replaced them meanwhile); the previous handlers come back, and the flag is cleared, when the
    outermost block ends. Outside the main thread (where Python cannot
    install handlers) it does nothing.

    Example:
    ```python
    with catching():
        for segment in segments:
            check("prepare")
            write(segment)
    ```
    """
    main = threading.current_thread() is threading.main_thread()
    if main:
        for signum in SIGNALS:
            # Installed again by each nested block: creating a multi-worker strategy installs
            # TensorFlow's own SIGTERM handler (its preemption notifier, in C++, where Python's
            # `getsignal` does not see it), which would swallow the signal.
            previous = signal.signal(signum, _handle)
            if _FLAG.depth == 0:
                _FLAG.previous[signum] = previous
    _FLAG.depth += main
    try:
        yield _FLAG
    finally:
        _FLAG.depth -= main
        if main and _FLAG.depth == 0:
            for signum, handler in _FLAG.previous.items():
                signal.signal(signum, handler)
            _FLAG.previous, _FLAG.received = {}, None
            _FLAG.reason, _FLAG.lost = None, False
            _FLAG.hooked.clear()


def _test_hook(phase):
    """`KERAS_TRANSFORMER_SIGTERM_AT=WORD[:N]`: a SIGTERM to this process at the Nth (default
    first) safe point of the phase whose name contains WORD."""
    word, _, nth = os.environ.get(TEST_HOOK, "").partition(":")
    if not word or word not in phase or not _FLAG.depth or _FLAG.received is not None:
        return
    _FLAG.hooked[phase] = _FLAG.hooked.get(phase, 0) + 1
    if _FLAG.hooked[phase] != int(nth or 1):
        return
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 60
    while _FLAG.received is None and time.monotonic() < deadline:
        time.sleep(0.01)  # the handler runs in the main thread, between two bytecodes


def check(phase, done="nothing half-written"):
    """A safe point of `phase` (e.g. "prepare", "the export"): raises `errors.Preempted` when a
    signal came, naming it, the phase and `done` (what was kept)."""
    _test_hook(phase)
    if _FLAG.received is None:
        return
    raise Preempted(
        f"stopped by {cause()} during {phase}: {done}; run the same command again to continue"
    )
