"""One run per workdir: the lock that `keras-transformer train` and `prepare` hold.

Two runs writing one workdir (a job submitted twice) would interleave checkpoints, resume states
and shards. Like a database on its data directory, a run takes `WORKDIR/lock.json` first, naming
its holder (host, pid, command, start time); a second run exits with a one-line error naming
it. A lock left by a process that is gone on the same host (killed with SIGKILL, a crash) is
taken over with a line saying so; one held from another host is reported, with the file to
delete if that run is known to be gone. Under several workers only the chief takes it (the
workers of one job share its lock).

The file is written through `tf.io.gfile`, so the workdir may be on `gs://`. On a local disk it
is created exclusively (`os.link`, atomic); elsewhere it is written beside and renamed without
overwriting, then read back (two runs starting in the same instant on an object store may both
get through; a later one never does).
"""

import json
import os
import socket
import sys
import time
import uuid

from keras_transformer.errors import WorkdirInUseError

LOCK_FILE = "lock.json"


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


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


def _process_identity(pid):
    """`(boot id, start time in clock ticks since boot)` of process `pid` on Linux (so that a pid
    reused after the holder died, or after a reboot, is not taken for the holder); None
    elsewhere or when it cannot be read."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        with open(f"/proc/{int(pid)}/stat") as f:
            # The command name (field 2) may hold spaces: the fields after its ')' are fixed.
            start = f.read().rsplit(")", 1)[1].split()[19]
        return [boot, start]
    except (OSError, ValueError, IndexError):
        return None


def describe(holder):
    """`HOST pid PID (COMMAND, started TIME)` of a lock's contents."""
    return (
        f"{holder.get('host', '?')} pid {holder.get('pid', '?')} "
        f"({holder.get('command', '?')}, started {holder.get('started', '?')})"
    )


class WorkdirLock:
    """Holds `WORKDIR/lock.json` while a run writes the workdir (a context manager).

    Args:
        root: the workdir (created if missing).
        command: what the holder runs (shown to a second run), e.g. `train`.

    Example:
    ```python
    with WorkdirLock("workdirs/quickstart", "train"):
        train(config)
    ```
    """

    def __init__(self, root, command):
        self.root = os.fspath(root)
        self.path = os.path.join(self.root, LOCK_FILE)
        self.token = uuid.uuid4().hex
        self.holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "command": command,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "token": self.token,
            "process": _process_identity(os.getpid()),
        }

    def _create(self):
        """Creates the lock file unless one exists; True when this run now holds it."""
        gfile = _gfile()
        text = json.dumps(self.holder)
        temporary = os.path.join(self.root, f".{LOCK_FILE}.{self.token}")
        with gfile.GFile(temporary, "w") as f:
            f.write(text)
        try:
            if "://" not in self.path:
                os.link(temporary, self.path)  # atomic, fails when the lock exists
            else:
                gfile.rename(temporary, self.path, overwrite=False)
        except Exception as e:
            if not gfile.exists(self.path):
                raise e
            return False
        finally:
            if gfile.exists(temporary):
                gfile.remove(temporary)
        return (self._read() or {}).get("token") == self.token

    def _read(self):
        try:
            with _gfile().GFile(self.path, "r") as f:
                return json.loads(f.read())
        except Exception:  # gone meanwhile, or torn: treated as unreadable
            return None

    def _stale(self, holder):
        """True when `holder` was a process of this host that is gone (its pid is free, or now
        names another process: started later, or since a reboot)."""
        if holder.get("host") != self.holder["host"]:
            return False
        pid = holder.get("pid", -1)
        if not _alive(pid):
            return True
        recorded = holder.get("process")
        return bool(recorded) and _process_identity(pid) not in (None, recorded)

    def acquire(self):
        """Takes the lock, taking over a stale one; raises `WorkdirInUseError` naming the
        holder when another live run has it."""
        _gfile().makedirs(self.root)
        for _ in range(3):
            if self._create():
                return self
            holder = self._read()
            if holder is None or not self._stale(holder):
                break
            print(
                f"taking over the lock {self.path} of {describe(holder)}: that process is gone",
                file=sys.stderr,
                flush=True,
            )
            _gfile().remove(self.path)
        holder = self._read() or {}
        raise WorkdirInUseError(
            f"{self.root} is in use by {describe(holder)}: wait for it to finish, use another "
            f"--workdir, or delete {self.path} if that run is gone"
        )

    def release(self):
        """Removes the lock file if this run still holds it."""
        holder = self._read()
        if holder is not None and holder.get("token") == self.token:
            _gfile().remove(self.path)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
