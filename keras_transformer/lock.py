"""One run per workdir: the lock that `keras-transformer train` and `prepare` hold, as a lease.

Two runs writing one workdir (a job submitted twice) would interleave checkpoints, resume states
and shards. Like a database on its data directory, a run takes `WORKDIR/lock.json` first, naming
its holder (host, pid, command, start time); a second run exits with a one-line error naming
it. Under several workers only the chief takes it (the workers of one job share its lock).

The lock is a lease (`runtime.lock_lease_seconds`, 120 s by default): the holder renews it (the
time in the file) from a background thread every quarter of the lease while it runs, and removes
it when it ends, also when stopped by SIGTERM. A holder that finds its lock taken over (it
stalled, or lost the filesystem, for longer than its lease) stops at its next safe point as if
it had received SIGTERM (`stopping.request`: exit 75), saving nothing more and leaving the new
holder's lock in place. A lock that was not renewed for a whole lease is
stale on any host: a run rescheduled on another machine after its node was lost, its pod
evicted or OOM-killed finds the dead run's lock, waits until its lease has run out (at most one
lease), and takes it over with a line naming the old holder. A holder that renews is never
taken over: the waiting run exits 2 as soon as it sees a renewal. Where the holder's processes
are visible (the same host name, boot id and pid namespace: not another container sharing the
host's name, as two containers with host networking do) the holder's process is checked
directly: a lock of a process that is gone (its pid free, or reused since) is taken over at
once, a live one refused at once; elsewhere the lease decides. A lock without a lease (written
by an older version) from another host is never taken over. The clocks of the machines that
share a workdir must agree to well within a lease (NTP).

Takeover is atomic: a taker first creates a claim file named after the stale lock's token
exclusively (`.lock.json.takeover-TOKEN`), so of two runs that find the same stale lock at the
same instant exactly one replaces it; the other sees the new holder and exits 2. The claim
stays while the new holder holds the lock: it tells the old holder, should it wake, that it was
taken over.

Fencing: each lock has a generation, larger than that of the lock it took over (and, the clocks
agreeing, than any earlier lock of the workdir: it starts from the time). A holder never
overwrites a lock it does not hold: each renewal looks at the lock right before it renames its
own over it, and after, at the claim naming its token. A holder stalled exactly between that
look and the rename (the one window a rename-based lock cannot close) overwrites the new
holder's lock once: it finds the claim right after and stops, and the new holder, finding a
lock of a lower generation, puts its own back and goes on. Every commit into the workdir
(`fence`: a step checkpoint, a resume state, a prepared shard and the rename of `prepared/`,
every file written with `integrity.write_atomically`, an export version) first checks that this
process's lock is still the current one, and stops the run (`errors.Preempted`, exit 75) when
it is not.

The files go through `tf.io.gfile`, so the workdir may be on `gs://`. On a local disk a file is
created exclusively with `os.link` (atomic); elsewhere it is written beside and renamed without
overwriting, then read back (two runs starting in the same instant on an object store may both
get through; a later one never does). The fencing needs an atomic rename (a POSIX filesystem,
NFS included); on an object store (`gs://`, `s3://`) a rename is a copy and a delete, so a
renewal and a takeover may interleave there and the checks before each commit are what remains
(docs: "What survives what").
"""

import json
import os
import socket
import sys
import threading
import time
import uuid

from keras_transformer import local_files, stopping
from keras_transformer.errors import Preempted, WorkdirInUseError

LOCK_FILE = "lock.json"
DEFAULT_LEASE_SECONDS = 120.0
CLAIM_PREFIX = f".{LOCK_FILE}.takeover-"  # + the token of the lock taken over

_HELD = []  # the locks this process holds now (`fence` checks them)
# What a holder whose lock file is gone lost it to (`_loss` names it).
_REMOVED = {"removed": True}


def _gfile():
    return local_files.gfile()  # tf.io.gfile, or the local disk where TensorFlow is absent


def _alive(pid):
    """True when process `pid` exists on this host (or exists and is another user's)."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OSError, ValueError, OverflowError):
        return False
    return True


def _boot_id():
    """This machine's boot id (Linux; None elsewhere or when it cannot be read)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _pid_namespace():
    """This process's pid namespace (the inode of `/proc/self/ns/pid`, Linux): two containers
    on one node (one boot id, and with host networking one host name) see each other's
    processes only when they share it. None where it cannot be read."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def _process_identity(pid):
    """`(boot id, start time in clock ticks since boot)` of process `pid` on Linux (so that a pid
    reused after the holder died, or after a reboot, is not taken for the holder); None
    elsewhere or when it cannot be read."""
    boot = _boot_id()
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            # The command name (field 2) may hold spaces: the fields after its ')' are fixed.
            start = f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, ValueError, IndexError):
        return None
    return None if boot is None else [boot, start]


def describe(holder):
    """`HOST pid PID (COMMAND, started TIME)` of a lock's contents."""
    return (
        f"{holder.get('host', '?')} pid {holder.get('pid', '?')} "
        f"({holder.get('command', '?')}, started {holder.get('started', '?')})"
    )


def fence(path, what=None):
    """Before a commit into a workdir (the file or directory `path` appears; `what` names it,
    e.g. "the resume state"): returns when the lock this process holds on that workdir is
    still the current one (at once where it holds none); otherwise stops the run as a takeover
    does and raises `errors.Preempted`, so that a run whose lock was taken over writes nothing
    more into the new holder's workdir.

    The writers call it right before the rename (or upload) that makes their file seen:
    `integrity.write_atomically`, `workdir.copy_atomically` (step checkpoints), the resume
    state, each segment of the prepared shards and the rename of `prepared/`.
    """
    for lock in list(_HELD):
        if lock.holds(path):
            lock.confirm(what or os.fspath(path))


def _generation(at_least=0):
    """A new lock's generation: the time in milliseconds, and more than `at_least`."""
    return max(int(time.time() * 1000), int(at_least) + 1)


class WorkdirLock:
    """Holds `WORKDIR/lock.json` while a run writes the workdir (a context manager), renewing
    its lease from a background thread.

    Args:
        root: the workdir (created if missing).
        command: what the holder runs (shown to a second run), e.g. `train`.
        lease_seconds: the lease (`runtime.lock_lease_seconds`): renewed every quarter of it;
            a lock not renewed for this long is taken over.

    Example:
    ```python
    with WorkdirLock("workdirs/quickstart", "train"):
        train(config)
    ```
    """

    def __init__(self, root, command, lease_seconds=DEFAULT_LEASE_SECONDS):
        self.root = os.fspath(root)
        self.path = os.path.join(self.root, LOCK_FILE)
        self.token = uuid.uuid4().hex
        self.lease = float(lease_seconds)
        self.holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "command": command,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "token": self.token,
            "process": _process_identity(os.getpid()),
            "boot_id": _boot_id(),
            "pid_namespace": _pid_namespace(),
            "lease_seconds": self.lease,
            "renewed": time.time(),
            "generation": _generation(),
            "superseded": [],  # the tokens of the locks this one took over (their claims)
        }
        self._stop = threading.Event()
        self._thread = None
        self.lost_to = None  # the holder that took the lock over, if one did

    @property
    def generation(self):
        """The fencing number: larger than that of the lock this one took over."""
        return self.holder["generation"]

    def _claim(self, token):
        return os.path.join(self.root, f"{CLAIM_PREFIX}{token}")

    def _exclusive(self, path, text):
        """Creates `path` holding `text` unless it exists; True when this call created it."""
        gfile = _gfile()
        temporary = os.path.join(self.root, f".{LOCK_FILE}.{self.token}")
        with gfile.GFile(temporary, "w") as f:
            f.write(text)
        try:
            if "://" not in path:
                os.link(temporary, path)  # atomic, fails when the file exists
            else:
                gfile.rename(temporary, path, overwrite=False)
        except Exception as e:
            # It existed (and may be gone again already: a claim released meanwhile).
            if isinstance(e, FileExistsError) or "exist" in str(e).lower():
                return False
            if not gfile.exists(path):
                raise e
            return False
        finally:
            if gfile.exists(temporary):
                gfile.remove(temporary)
        return True

    def _create(self):
        """Creates the lock file unless one exists; True when this run now holds it."""
        self.holder["renewed"] = time.time()
        if not self._exclusive(self.path, json.dumps(self.holder)):
            return False
        return (self._read() or {}).get("token") == self.token

    def _read(self, path=None):
        try:
            with _gfile().GFile(path or self.path, "r") as f:
                return json.loads(f.read())
        except Exception:  # gone meanwhile, or torn: treated as unreadable
            return None

    def _standing(self):
        """Whether this run still holds the lock: `(standing, holder)`, standing one of `held`,
        `overwritten` (the file names a holder this one took over, which overwrote it after
        stalling: still this run's, to be put back), `lost` (taken over: `holder` names the
        new holder where known) and `unknown` (the file could not be read)."""
        gfile = _gfile()
        current = self._read()
        if current is None:
            try:
                if gfile.exists(self.path):
                    return "unknown", None
            except Exception:
                return "unknown", None
        if gfile.exists(self._claim(self.token)):  # a taker's claim on this lock: taken over
            return "lost", self._read(self._claim(self.token)) or current or _REMOVED
        if current is None:  # removed by hand (or by a taker): never written again
            return "lost", _REMOVED
        if current.get("token") == self.token:
            return "held", current
        taken = current.get("token") in self.holder["superseded"]
        generation = current.get("generation")
        if taken or (isinstance(generation, int) and generation < self.generation):
            return "overwritten", current
        return "lost", current

    def _verdict(self, holder):
        """`("stale", why)`, `("live", None)` or `("wait", None)` (another host's lease runs)."""
        renewed, lease = holder.get("renewed"), holder.get("lease_seconds")
        leased = isinstance(renewed, (int, float)) and isinstance(lease, (int, float))
        if holder.get("host") == self.holder["host"] and (self._sees(holder) or not leased):
            pid = holder.get("pid", -1)
            recorded = holder.get("process")
            gone = not _alive(pid) or (
                bool(recorded) and _process_identity(pid) not in (None, recorded)
            )
            return ("stale", "that process is gone") if gone else ("live", None)
        if not leased:
            return "live", None  # an older version's lock: no lease to run out
        age = time.time() - renewed
        if age > lease:
            return "stale", f"its lease ({lease:g} s) ran out {age - lease:.0f} s ago"
        return "wait", None

    def _sees(self, holder):
        """True when the holder's pid means a process this one can check: the same boot and
        pid namespace (both unreadable, off Linux, counts as the same); a lock that does not
        record them (an older version's) is judged by its lease."""
        if "pid_namespace" not in holder:
            return False
        mine = (self.holder["boot_id"], self.holder["pid_namespace"])
        return (holder.get("boot_id"), holder.get("pid_namespace")) == mine

    def _take_over(self, holder, why):
        """Replaces the stale lock `holder`; False when another run took it over first. The
        claim stays while this run holds the lock (the old holder's sign that it was taken
        over); the new lock's generation is above the old one's."""
        token = holder.get("token", "none")
        claim = self._claim(token)
        if not self._exclusive(claim, json.dumps(self.holder)):
            return False
        held, before = False, dict(self.holder)
        try:
            if (self._read() or {}).get("token") != holder.get("token"):
                return False  # replaced meanwhile (its holder came back, or another taker)
            print(
                f"taking over the lock {self.path} of {describe(holder)}: {why}",
                file=sys.stderr,
                flush=True,
            )
            old = holder.get("generation")
            self.holder["generation"] = _generation(old if isinstance(old, int) else 0)
            self.holder["superseded"] = [*holder.get("superseded", []), token]
            _gfile().remove(self.path)
            held = self._create()
            return held
        finally:
            if not held:
                self.holder = before
                _remove_quietly(claim)

    def acquire(self):
        """Takes the lock, taking over a stale one (waiting up to its lease for one of another
        host); raises `WorkdirInUseError` naming the holder when another live run has it."""
        _gfile().makedirs(self.root)
        watched, unreadable, held = None, 0, self._create()
        while not held:
            holder = self._read()
            if holder is None:  # removed or replaced meanwhile: look again
                unreadable += 1
                if unreadable > 20:
                    break
                time.sleep(0.05)
                held = self._create()
                continue
            verdict, why = self._verdict(holder)
            if verdict == "stale":
                held = self._take_over(holder, why)
                if not held:
                    unreadable += 1  # another run is taking it over: look again
                    if unreadable > 200:  # a claim left by a taker killed midway
                        raise WorkdirInUseError(
                            f"{self.path} is being taken over by another run: delete "
                            f"{self.root}/.{LOCK_FILE}.takeover-* if no run is starting"
                        )
                    time.sleep(0.05)
                continue
            if verdict == "live" or _renewed(watched, holder):
                break
            if watched is None:
                watched = holder
                where = (
                    "another host"
                    if holder.get("host") != self.holder["host"]
                    else "another container or boot of this host (its processes are not seen)"
                )
                print(
                    f"{self.path} is held by {describe(holder)} from {where}: waiting up "
                    f"to its lease ({holder['lease_seconds']:g} s) for it to be renewed or to "
                    "run out",
                    file=sys.stderr,
                    flush=True,
                )
            stopping.check("the wait for the workdir lock")
            time.sleep(min(1.0, holder["lease_seconds"] / 10))
            held = self._create()
        if held:
            self._start_renewing()
            _HELD.append(self)
            return self
        holder = self._read() or {}
        raise WorkdirInUseError(
            f"{self.root} is in use by {describe(holder)}: wait for it to finish, use another "
            f"--workdir, or delete {self.path} if that run is gone"
        )

    def _start_renewing(self):
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew, name="workdir-lock", daemon=True)
        self._thread.start()

    def _renew(self):
        """The heartbeat: rewrites the lock with the time every quarter of the lease, until the
        lock is released or found taken over."""
        while not self._stop.wait(self.lease / 4):
            try:
                if not self._renew_once():
                    return
            except Exception:  # a missed renewal (a network hiccup): the next one may pass
                pass

    def _renew_once(self):
        """One renewal; False when the lock was found taken over (this run then stops)."""
        standing, current = self._standing()
        if standing == "unknown":
            return True  # not read: renewed next time
        if standing == "lost":
            self._taken_over(current)
            return False
        self.holder["renewed"] = time.time()
        temporary = os.path.join(self.root, f".{LOCK_FILE}.{self.token}")
        with _gfile().GFile(temporary, "w") as f:
            f.write(json.dumps(self.holder))
        # The last look before the rename, so that a holder that stalled since the look above
        # (for longer than its lease) does not overwrite the lock of the run that took it over.
        standing, current = self._standing()
        if standing in ("unknown", "lost"):
            _remove_quietly(temporary)
            if standing == "lost":
                self._taken_over(current)
            return standing == "unknown"
        _gfile().rename(temporary, self.path, overwrite=True)  # whole, never torn
        if standing == "overwritten":
            print(
                f"the lock {self.path} was overwritten by {describe(current)}, a holder this "
                "run took it over from: put back",
                file=sys.stderr,
                flush=True,
            )
        # A stall between the look and the rename: the claim naming this lock's token says
        # that it overwrote its taker's lock (which the taker puts back); this run stops.
        standing, current = self._standing()
        if standing == "lost":
            self._taken_over(current)
            return False
        return True

    def confirm(self, what="a file"):
        """Returns when this run still holds the lock; else stops the run as a takeover does
        (`stopping.request`) and raises `errors.Preempted` naming `what` was not written."""
        standing, current = "unknown", None
        for attempt in range(3):  # a read that failed (a network hiccup) is tried again
            if self.lost_to is not None:
                break
            standing, current = self._standing()
            if standing != "unknown":
                break
            time.sleep(0.2 * (attempt + 1))
        if self.lost_to is None and standing in ("held", "overwritten"):
            return
        if self.lost_to is None and standing == "lost":
            self._taken_over(current)
        if self.lost_to is None:
            raise Preempted(
                f"stopped before writing {what}: the workdir lock {self.path} could not be "
                "read; run the same command again to continue"
            )
        raise Preempted(
            f"stopped by {_loss(self.lost_to)}: {what} not written (the workdir is the new "
            "holder's)"
        )

    def holds(self, path):
        """True when `path` is in this lock's workdir."""
        return _inside(os.fspath(path), self.root)

    def _taken_over(self, holder):
        """Another run took the lock over (this one stalled for longer than its lease), or its
        file was removed: this run stops at its next safe point, exit 75, leaving the workdir
        and its lock to the new holder."""
        if self.lost_to is not None:
            return  # said once
        self.lost_to = holder
        stops = stopping.request(_loss(holder), lost_the_workdir=True)
        what = (
            "was removed while this run held it"
            if holder.get("removed")
            else f"was taken over by {describe(holder)} (this run did not renew it within its "
            "lease)"
        )
        print(
            f"{'' if stops else 'warning: '}the lock {self.path} {what}"
            + ("; stopping at the next safe point" if stops else ""),
            file=sys.stderr,
            flush=True,
        )

    def release(self):
        """Stops renewing and removes the lock file (and the claims of the locks it took
        over) if this run still holds it; a lock taken over is left to its new holder."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None
        if self in _HELD:
            _HELD.remove(self)
        if self.lost_to is not None:
            return
        standing, _ = self._standing()
        if standing not in ("held", "overwritten"):
            return
        _remove_quietly(self.path)
        for token in self.holder["superseded"]:
            _remove_quietly(self._claim(token))

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def _loss(holder):
    """Why a holder that lost its lock stops (the line `stopping` prints)."""
    if holder.get("removed"):
        return f"the removal of the workdir lock ({LOCK_FILE})"
    return f"the takeover of the workdir lock by {describe(holder)}"


def _remove_quietly(path):
    """Removes `path` if it is there (a file another run may have removed already)."""
    try:
        _gfile().remove(path)
    except Exception:
        pass


def _inside(path, root):
    """True when `path` is `root` or under it (local paths made absolute; URLs as strings)."""
    if "://" not in root:
        path, root = os.path.abspath(path), os.path.abspath(root)
        return path == root or path.startswith(root.rstrip(os.sep) + os.sep)
    return path == root or path.startswith(root.rstrip("/") + "/")


def _renewed(watched, holder):
    """True when the lock watched since `watched` was renewed or changed hands: a live holder."""
    if watched is None:
        return False
    return (holder.get("token"), holder.get("renewed")) != (
        watched.get("token"),
        watched.get("renewed"),
    )
