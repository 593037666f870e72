"""The workdir lock's fencing: a holder that stalled for longer than its lease never overwrites
the lock of the run that took it over, and commits nothing into the workdir once its lock is
no longer the current one; a lost workdir wins over an earlier SIGTERM; a lock held from
another pid namespace on this host (a container sharing the host's name) is judged by its
lease, not by a pid this process cannot see. In-process, with seconds-long leases."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from test_stopping import _write_lock  # another run's lock, as its holder writes it
from training_helpers import subprocess_env, tiny_yaml, write_yaml

from keras_transformer import stopping
from keras_transformer.errors import PREEMPTED_EXIT_CODE, Preempted
from keras_transformer.lock import WorkdirLock


def _lock_file(root):
    return json.loads((root / "lock.json").read_text())


def _wait_for(condition, seconds=20):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


class _Stall:
    """`tf.io.gfile` (or the local one) through which the lock's writes go, where the stalled
    holder's renewal stalls once, at `where` ("write": after it read its lock, before it
    writes its renewal; "rename": inside the rename that commits it), while `taker` takes the
    lock over (the stalled holder's lease has run out meanwhile)."""

    def __init__(self, real, stalled, taker, where):
        self.real, self.stalled, self.taker, self.where = real, stalled, taker, where
        self.armed, self.stalls = False, 0

    def __getattr__(self, name):
        return getattr(self.real, name)

    def _stall(self):
        self.armed, self.stalls = False, self.stalls + 1
        time.sleep(self.stalled.lease * 1.5)  # frozen for longer than the lease
        self.taker.acquire()

    def _ours(self, path):
        return os.path.basename(os.fspath(path)) == f".lock.json.{self.stalled.token}"

    def GFile(self, path, mode="r"):
        if self.armed and self.where == "write" and mode == "w" and self._ours(path):
            self._stall()
        return self.real.GFile(path, mode)

    def rename(self, source, destination, overwrite=False):
        if self.armed and self.where == "rename" and self._ours(source):
            self._stall()
        return self.real.rename(source, destination, overwrite=overwrite)


def _stalled_and_taker(tmp_path, monkeypatch, where, taker_lease=60):
    from keras_transformer import lock as lock_module

    stalled = WorkdirLock(tmp_path, "train", lease_seconds=0.4)
    stalled.holder["host"] = "a-frozen-vm"  # another host: its lease decides, not its pid
    taker = WorkdirLock(tmp_path, "train", lease_seconds=taker_lease)
    stall = _Stall(lock_module._gfile(), stalled, taker, where)
    monkeypatch.setattr(lock_module, "_gfile", lambda: stall)
    return stalled, taker, stall


def test_a_holder_stalled_after_reading_its_lock_does_not_overwrite_the_new_holders(
    tmp_path, monkeypatch, capsys
):
    """The renewal reads its lock, then stalls for longer than its lease while another host
    takes the lock over: it looks again right before its rename, so the new holder's lock
    stays; the stalled run stops (exit 75 at its next safe point) and commits nothing more."""
    from keras_transformer.workdir import write_atomically

    stalled, taker, stall = _stalled_and_taker(tmp_path, monkeypatch, "write")
    with stopping.catching():
        stalled.acquire()
        stall.armed = True
        try:
            assert _wait_for(lambda: taker.lost_to is not None or taker._thread is not None)
            time.sleep(0.5)  # the stalled renewal goes on (five of its renewal periods)
            assert stall.stalls == 1
            assert _lock_file(tmp_path)["token"] == taker.token  # not overwritten
            assert _wait_for(lambda: stalled.lost_to is not None)
            assert stalled.lost_to["token"] == taker.token and stopping.lost_the_workdir()
            with pytest.raises(Preempted, match="takeover of the workdir lock by .* not written"):
                write_atomically(tmp_path / "result.json", "{}")
            assert not (tmp_path / "result.json").exists()
            taker.confirm("a checkpoint")  # the new holder's commits go on
            assert taker.generation > stalled.generation
        finally:
            stalled.release()
            assert _lock_file(tmp_path)["token"] == taker.token  # left to the new holder
            taker.release()
    assert not os.listdir(tmp_path)  # the claim goes with the new holder's lock
    assert "was taken over by" in capsys.readouterr().err


def test_a_holder_stalled_inside_its_rename_stops_and_the_new_holder_keeps_the_lock(
    tmp_path, monkeypatch, capsys
):
    """The one window a rename cannot close: the renewal stalls between its last look and its
    rename, and overwrites the lock the new holder took meanwhile. It finds the taker's claim
    right after and stops; the new holder, finding a lock of the holder it took over (a lower
    generation), puts its own back and goes on (it does not stop as if taken over)."""
    stalled, taker, stall = _stalled_and_taker(tmp_path, monkeypatch, "rename", taker_lease=1)
    with stopping.catching():
        stalled.acquire()
        stall.armed = True
        try:
            assert _wait_for(lambda: stalled.lost_to is not None)
            assert stalled.lost_to["token"] == taker.token
            with pytest.raises(Preempted):
                stalled.confirm("the resume state")
            assert _wait_for(lambda: _lock_file(tmp_path)["token"] == taker.token)
            time.sleep(0.6)  # two more renewals of the new holder
            assert taker.lost_to is None and _lock_file(tmp_path)["token"] == taker.token
            taker.confirm("a checkpoint")
        finally:
            stalled.release()
            taker.release()
    assert not os.listdir(tmp_path)
    assert "a holder this run took it over from: put back" in capsys.readouterr().err


def test_commits_into_the_workdir_are_refused_once_its_lock_is_taken_over(tmp_path):
    """The lock changed hands and the renewal thread has not looked yet (a long lease): every
    commit into the workdir is refused, a step checkpoint's, a resume state's, an atomic
    file's, and the run is asked to stop as lost; files outside the workdir are not fenced."""
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_transformer.training.engines.tf_state import ResumeState
    from keras_transformer.workdir import save_model_weights, write_atomically

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    workdir, elsewhere = tmp_path / "workdir", tmp_path / "elsewhere"
    resume = ResumeState(model, str(workdir / "backup"), every=1000, keep=1)
    model.fit(np.ones((4, 3), "float32"), np.ones((4, 1), "float32"), batch_size=4, verbose=0)
    os.makedirs(workdir / "checkpoints")
    with stopping.catching():
        with WorkdirLock(workdir, "train", lease_seconds=60):
            write_atomically(workdir / "config.yaml", "{}")  # held: written
            _write_lock(workdir, token="new", lease_seconds=60, renewed=time.time())  # a taker's
            for commit in (
                lambda: save_model_weights(model, workdir / "checkpoints" / "ckpt-1.weights.h5"),
                resume.save,
                lambda: write_atomically(workdir / "result.json", "{}"),
            ):
                with pytest.raises(Preempted, match="takeover of the workdir lock by another-m"):
                    commit()
            assert stopping.lost_the_workdir()
            write_atomically(elsewhere / "out.json", "{}")  # not the workdir's
        assert _lock_file(workdir)["token"] == "new"  # left to the new holder
    assert tf.train.latest_checkpoint(str(workdir / "backup")) is None
    assert not (workdir / "result.json").exists()
    assert not os.listdir(workdir / "checkpoints")  # nothing left half-written either
    assert (elsewhere / "out.json").exists() and (workdir / "config.yaml").exists()


def test_prepare_whose_lock_changes_hands_commits_no_further_segment(tmp_path, monkeypatch, capsys):
    """`keras-transformer prepare` (a lease of 60 s: the renewal thread does not look again in
    time) whose lock changes hands while it writes its first segment: the next segment is not
    written (exit 75), nothing is renamed to `prepared/`, the new holder's lock stays."""
    import importlib

    from keras_transformer import cli

    workers_module = importlib.import_module("keras_transformer.data.workers")
    monkeypatch.setenv("KERAS_TRANSFORMER_PREPARE_SEGMENT", "64")
    real = workers_module._write_segment_file
    workdir = tmp_path / "workdir"

    def taken_meanwhile(path, groups):
        if not (workdir / "lock.json").read_text().count('"new"'):
            _write_lock(workdir, token="new", lease_seconds=60, renewed=time.time())
        return real(path, groups)

    monkeypatch.setattr(workers_module, "_write_segment_file", taken_meanwhile)
    config = write_yaml(tmp_path / "tiny.yaml", tiny_yaml(workdir))
    code = cli.main(["prepare", "--config", config, "--set", "runtime.lock_lease_seconds=60"])
    err = capsys.readouterr().err
    assert code == PREEMPTED_EXIT_CODE, err
    line = [x for x in err.splitlines() if x.startswith("keras-transformer prepare: stopped")]
    assert len(line) == 1 and "the takeover of the workdir lock by another-machine" in line[0]
    assert "a segment of the prepared shards not written" in line[0]
    assert _lock_file(workdir)["token"] == "new"
    assert not (workdir / "prepared").exists()


# ------------------------------------------------------------------ a lost workdir wins


def test_a_takeover_after_a_sigterm_marks_the_workdir_lost():
    """SIGTERM first, then the lock's renewal thread finds it taken over: the stop is the
    takeover's (nothing more is saved), not the signal's."""
    with stopping.catching():
        os.kill(os.getpid(), signal.SIGTERM)
        assert _wait_for(lambda: stopping.received() is not None)
        assert not stopping.lost_the_workdir()
        assert stopping.request("the takeover of the workdir lock by X", lost_the_workdir=True)
        assert stopping.lost_the_workdir()
        assert stopping.received() == signal.SIGTERM
        with pytest.raises(Preempted, match="stopped by the takeover of the workdir lock by X"):
            stopping.check("a phase")
        # A later request without a lost workdir changes nothing.
        assert stopping.request("something else")
        assert stopping.lost_the_workdir() and "takeover" in stopping.cause()
    assert stopping.received() is None and not stopping.lost_the_workdir()


@pytest.mark.parametrize("noticed", [True, False], ids=["by_the_renewal", "at_the_commit"])
def test_training_stopping_on_sigterm_saves_nothing_once_its_lock_is_taken_over(tmp_path, noticed):
    """SIGTERM, and in the same step the workdir's lock changes hands: `StopOnSignal` saves no
    resume state and no checkpoint, whether the renewal thread noticed the takeover (the stop
    flag says the workdir is lost) or not yet (the commit's fence finds it)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_transformer.training.engines.tf_state import ResumeState
    from keras_transformer.training.run.callbacks import StepCheckpoint
    from keras_transformer.training.run.preemption import CatchSignals, StopOnSignal
    from keras_transformer.training.run.run_state import RunState

    workdir = tmp_path / "workdir"

    class SigtermThenTakeover(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                os.kill(os.getpid(), signal.SIGTERM)
                assert _wait_for(lambda: stopping.received() is not None)
                _write_lock(workdir, token="new", lease_seconds=60, renewed=time.time())
                if noticed:  # what the renewal thread does when it looks
                    assert stopping.request("the takeover of the workdir lock by X", True)

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    backup, checkpoints = workdir / "backup", workdir / "checkpoints"
    resume = ResumeState(model, str(backup), every=1000, keep=1, run_state=RunState())
    checkpoint = StepCheckpoint(str(checkpoints), every=1000, keep=1)
    x, y = np.ones((20, 3), "float32"), np.ones((20, 1), "float32")
    with CatchSignals() as signals, WorkdirLock(workdir, "train", lease_seconds=60):
        with pytest.raises(Preempted) as stopped:
            model.fit(x, y, batch_size=1, epochs=1, verbose=0, callbacks=[
                SigtermThenTakeover(), checkpoint, StopOnSignal(signals, resume, checkpoint)
            ])  # fmt: skip
    assert "takeover of the workdir lock" in str(stopped.value), stopped.value
    assert "saved the resume state" not in str(stopped.value)
    assert tf.train.latest_checkpoint(str(backup)) is None
    assert not checkpoints.exists() or not os.listdir(checkpoints)
    assert _lock_file(workdir)["token"] == "new"


# ------------------------------------------------------------------ other containers, boots


def test_a_lock_of_another_pid_namespace_on_this_host_is_judged_by_its_lease(tmp_path, capsys):
    """A lock of this host name from another pid namespace (another container with host
    networking): its pid means nothing here, so it is not taken over as a gone process; it is
    taken over once its lease has run out."""
    from keras_transformer import lock as lock_module

    with open("/proc/sys/kernel/random/boot_id") as f:
        boot_id = f.read().strip()
    namespace = os.stat("/proc/self/ns/pid").st_ino
    mine = WorkdirLock(tmp_path, "train")
    _write_lock(
        tmp_path, token="new", host=mine.holder["host"], pid=2**22 + 17, boot_id=boot_id,
        pid_namespace=namespace + 1, lease_seconds=1, renewed=time.time(), process=None,
    )  # fmt: skip
    assert not lock_module._alive(2**22 + 17)
    with mine:
        assert _lock_file(tmp_path)["token"] == mine.token
    err = capsys.readouterr().err
    assert "from another container or boot of this host" in err
    assert "its lease (1 s) ran out" in err and "that process is gone" not in err


_OTHER_CONTAINER = """
import sys
sys.modules["tensorflow"] = None  # the lock needs no TensorFlow: a quick start
from keras_transformer.errors import WorkdirInUseError
from keras_transformer.lock import WorkdirLock
try:
    WorkdirLock(sys.argv[1], "train", lease_seconds=60).acquire()
except WorkdirInUseError as e:
    print("refused:", e, flush=True)
    sys.exit(2)
print("took the lock over", flush=True)
"""


def test_a_run_in_another_pid_namespace_does_not_take_over_a_live_lock(tmp_path):
    """A second run on this host in its own pid namespace (`unshare --pid`, as a second
    container with host networking: the same host name and boot id, other pids) tries to take
    the lock this process holds and renews: it does not take the holder for gone (its pid is
    not among the namespace's), it waits for the lease, sees the renewal and refuses, naming
    the holder."""
    if shutil.which("unshare") is None:
        pytest.skip("`unshare` (util-linux) is not installed")
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(f"unshare --pid is not permitted here: {probe.stderr.strip()}")
    with WorkdirLock(tmp_path, "train", lease_seconds=2) as lock:
        done = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
             _OTHER_CONTAINER, str(tmp_path)],
            capture_output=True, text=True, timeout=300, env=subprocess_env(),
        )  # fmt: skip
        assert done.returncode == 2, done.stdout + done.stderr[-3000:]
        assert f"is in use by {lock.holder['host']} pid {os.getpid()} (train" in done.stdout
        assert "from another container or boot of this host" in done.stderr
        assert _lock_file(tmp_path)["token"] == lock.token
    assert not os.listdir(tmp_path)
