"""SIGTERM in every phase (exit 75, nothing half-written, the same command goes on) and the
workdir lock's lease (renewed; taken over on any host once it runs out; atomically).

The phases are stopped with a real SIGTERM that the process sends itself at a safe point of a
named phase (`KERAS_TRANSFORMER_SIGTERM_AT`, see `keras_transformer.stopping`): no sleeping
and polling. The stopped commands run in subprocesses (`_cli`); the same command going on
afterwards, and the uninterrupted reference runs, run in this process (`cli_in_process`), but
where the continuation is itself several processes."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
from training_helpers import cli_in_process, files_under, subprocess_env, tiny_yaml, write_yaml

from keras_transformer.errors import PREEMPTED_EXIT_CODE

TIMEOUT = 600  # seconds a CLI subprocess may take on a slow, busy machine


def _cli(*argv, sigterm_at=None, **environment):
    """`keras-transformer ARGV` in a fresh process (with `environment` added): `(exit code,
    stdout, stderr)`."""
    extra = {"KERAS_TRANSFORMER_SIGTERM_AT": sigterm_at} if sigterm_at else {}
    env = subprocess_env(**extra, **environment)
    if not sigterm_at:
        env.pop("KERAS_TRANSFORMER_SIGTERM_AT", None)
    done = subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli", *map(str, argv)],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    return done.returncode, done.stdout, done.stderr


def _stopped(code, err, phase):
    assert code == PREEMPTED_EXIT_CODE == 75, err[-3000:]
    lines = [line for line in err.splitlines() if "stopped by SIGTERM" in line]
    assert len(lines) == 1 and f"during {phase}" in lines[0], err[-3000:]
    assert "run the same command again" in lines[0]


def _read_bytes(root):
    out = {}
    for name in files_under(root):
        with open(os.path.join(root, name), "rb") as f:
            out[name] = f.read()
    return out


# ------------------------------------------------------------------ prepare


# Pairs per segment of prepare's shards (65,536 outside tests): the tiny corpus's 300 pairs
# make 5 segments, so that a preparation stops with some complete and some not.
SEGMENT = {"KERAS_TRANSFORMER_PREPARE_SEGMENT": "64"}


def _prepare_uninterrupted(config, workdir, *sets):
    """An uninterrupted `keras-transformer prepare` into `workdir` (the reference), in this
    process: `(exit code, stdout, stderr)`."""
    return cli_in_process("prepare", "--config", config, "--workdir", workdir, *sets, **SEGMENT)


def _same_preparations(ours, theirs):
    """The same shards byte for byte, the same files, the same manifest but its timings."""
    ours, theirs = _read_bytes(ours / "prepared"), _read_bytes(theirs / "prepared")
    shards = [name for name in theirs if name.endswith(".tfrecord")]
    assert len(shards) == 16 and all(ours[name] == theirs[name] for name in shards)
    assert sorted(ours) == sorted(theirs)
    timings = ("seconds", "phase_seconds", "created")
    manifests = [json.loads(files["manifest.json"]) for files in (ours, theirs)]
    assert [{k: v for k, v in m.items() if k not in timings} for m in manifests] == [
        {k: v for k, v in manifests[1].items() if k not in timings}
    ] * 2


def _nothing_of_prepare_left(workdir):
    left = files_under(workdir)
    assert "lock.json" not in left, left
    assert not [f for f in left if f.startswith(("prepare.", "prepared.partial"))], left


@pytest.mark.scenario
def test_sigterm_during_prepare_keeps_the_complete_segments_and_the_same_command_continues(
    tmp_path,
):
    """SIGTERM after the shards' second segment: exit 75, no lock, no prepared data taken as
    done, the vocabulary and the two complete segments kept (with a torn third one, as a
    SIGKILL midway would leave: cut off); the same command then encodes only the other three
    segments and writes the shards of an uninterrupted preparation, byte for byte (and the
    same manifest but its timings)."""
    stopped, whole = tmp_path / "stopped", tmp_path / "whole"
    config = write_yaml(tmp_path / "tiny.yaml", tiny_yaml(stopped))
    code, _, err = _cli("prepare", "--config", config, sigterm_at="shards:3", **SEGMENT)
    _stopped(code, err, "prepare (writing the shards)")
    assert "2 complete segments of the shards are kept" in err
    left = files_under(stopped)
    assert "lock.json" not in left and "spm.model" not in left, left
    assert not [f for f in left if f.startswith("prepared/")], left
    assert "prepare.vocabulary.json" in left and "prepare.vocabulary.model" in left
    progress = json.loads((stopped / "prepare.progress.json").read_text())
    assert progress["segments"] == 2
    shard = stopped / "prepared.partial" / "train-00003-of-00016.tfrecord"
    assert shard.stat().st_size == progress["shards"][3]["bytes"] > 0
    with open(shard, "ab") as f:
        f.write(b"half a segment")  # past the recorded size: cut off

    code, _, err = cli_in_process("prepare", "--config", config, **SEGMENT)
    assert code == 0, err[-3000:]
    assert "the vocabulary a stopped preparation trained" in err
    assert "sampling sentences for the vocabulary" not in err  # not trained again
    assert "2 of 5 segments kept" in err
    assert "3 segments encoded, 2 kept from the stopped one" in err
    code, _, reference_err = _prepare_uninterrupted(config, whole)
    assert code == 0, reference_err[-3000:]
    assert "segments kept" not in reference_err
    _same_preparations(stopped, whole)
    _nothing_of_prepare_left(stopped)


@pytest.mark.scenario
def test_a_kept_segment_that_changed_is_not_trusted_the_shards_are_written_again(tmp_path):
    """A kept shard whose bytes differ from the recorded sha256 (changed or damaged while
    stopped): the same command writes every segment again, and the shards are still those of
    an uninterrupted preparation."""
    stopped, whole = tmp_path / "stopped", tmp_path / "whole"
    config = write_yaml(tmp_path / "tiny.yaml", tiny_yaml(stopped))
    code, _, err = _cli("prepare", "--config", config, sigterm_at="shards:3", **SEGMENT)
    _stopped(code, err, "prepare (writing the shards)")
    shard = stopped / "prepared.partial" / "train-00000-of-00016.tfrecord"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))

    code, _, err = cli_in_process("prepare", "--config", config, **SEGMENT)
    assert code == 0, err[-3000:]
    assert "segments kept" not in err and "the vocabulary a stopped preparation" in err
    code, _, reference_err = _prepare_uninterrupted(config, whole)
    assert code == 0, reference_err[-3000:]
    _same_preparations(stopped, whole)
    _nothing_of_prepare_left(stopped)


# ------------------------------------------------------------------ the end phases


def _result(workdir):
    result = json.loads((workdir / "result.json").read_text())
    for key in (
        "wall_seconds",
        "training_seconds",
        "end_seconds",
        "logs",
        "checkpoints",
        "saved_model",
    ):
        result.pop(key, None)
    result.get("selection", {}).pop("seconds", None)  # a choice among candidates only
    return result


def _export(workdir):
    """What an export holds, comparable between two workdirs: its files byte for byte but
    the graph, the model card without its timings and paths, the warmup requests and the
    signatures as parsed protos. (TensorFlow numbers a graph's functions in the order the
    process traced them, and writes maps in no fixed order: `saved_model.pb`,
    `fingerprint.pb` and the warmup file's bytes differ between two processes exporting the
    same model.)"""
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow_serving.apis import prediction_log_pb2

    version = workdir / "saved_models" / "tiny" / "1"
    files = _read_bytes(version)
    extra = "assets.extra/"
    card = json.loads(files.pop(extra + "model_card.json").decode().replace(str(workdir), "W"))
    files.pop(extra + "model_card.md")  # the same card, in Markdown
    for key in ("created", "decoding_speed"):
        card.pop(key)
    card["training"].get("selection", {}).pop("seconds", None)
    card["training"].pop("training_seconds")
    graph = saved_model_pb2.SavedModel.FromString(files.pop("saved_model.pb"))
    files.pop("fingerprint.pb")  # of the graph
    signatures = dict(graph.meta_graphs[0].signature_def)
    warmup = files.pop(extra + "tf_serving_warmup_requests")
    requests = [
        prediction_log_pb2.PredictionLog.FromString(record.numpy())
        for record in tf.data.TFRecordDataset(str(version / extra / "tf_serving_warmup_requests"))
    ]
    assert warmup and requests
    return files, card, signatures, requests


def _train_argv(config, workdir, *extra):
    return ["train", "--config", config, "--workdir", workdir, "--set",
            f"export.base_dir={workdir / 'saved_models'}", *extra]  # fmt: skip


def _nothing_of_the_end_left(workdir):
    """No lock, no result, no export version and no temporary export directory."""
    left = files_under(workdir)
    assert "lock.json" not in left and "result.json" not in left, left
    assert not [f for f in left if f.startswith("saved_models/")], left  # no version, no .export-*


@pytest.fixture(scope="module")
def end_runs(_shared_root):
    """The end phases' SIGTERM scenarios share one tiny training (the phases follow each
    other), once per test run whatever the number of workers (`shared_runs`): `train` is
    stopped in the final model's choice on dev after its first candidate (exit 75, no lock, no
    result, no export, the candidate's dev BLEU kept), then its workdir is copied: `whole` goes
    on uninterrupted (the reference), `stopped` is where the chain of stops goes on (a test
    copies it first). The config chooses the final model on dev (several candidates) and has
    a test set, so that scoring always decodes something (where the choice decoded the dev set
    with the scoring's settings in the same process, scoring reuses those dev figures).
    `(config, whole, stopped)`."""
    from shared_runs import shared_directory

    def build(root):
        whole = root / "whole"
        values = tiny_yaml(
            whole,
            data=dict(test="synthetic:split=test,size=6,max_words=8"),
            export=dict(average_checkpoints="auto"),
        )
        config = write_yaml(root / "tiny.yaml", values)
        code, _, err = _cli(*_train_argv(config, whole), sigterm_at="choice:2")
        _stopped(code, err, "the final model's choice on the dev set")
        _nothing_of_the_end_left(whole)
        kept = json.loads((whole / "final.partial.json").read_text())["choice"]["figures"]
        assert len(kept) == 1  # the first candidate's dev BLEU
        shutil.copytree(whole, root / "stopped")

        code, _, err = cli_in_process(*_train_argv(config, whole))  # goes on, uninterrupted
        assert code == 0, err[-3000:]
        left = files_under(whole)
        assert "lock.json" not in left and "final.partial.json" not in left, left

    root = shared_directory(_shared_root, "sigterm_end_runs", build)
    return str(root / "tiny.yaml"), root / "whole", root / "stopped"


@pytest.mark.scenario(
    slow="two `train` processes stopped by SIGTERM (in the scoring, in the export: the signal "
    "and exit 75 are what is tested), then the continuation through the export"
)
def test_sigterm_during_the_dev_choice_the_scoring_and_the_export_exits_75_and_the_same_command_finishes(  # noqa: E501
    end_runs, tmp_path
):
    """`train` stopped in the final model's choice on dev (`end_runs`), then, on the same
    workdir, stopped again in the final model's scoring, then at the export's last safe point
    (before the version is renamed into place): each exits 75 with no lock, no result, no
    export version, no temporary directory left; the same command then finishes, without
    deciding a scored candidate again, with the result and the export files of the workdir
    that went on uninterrupted."""
    config, whole, shared = end_runs
    stopped = tmp_path / "stopped"
    shutil.copytree(shared, stopped)

    code, _, err = _cli(*_train_argv(config, stopped), sigterm_at="scoring")
    _stopped(code, err, "the final model's scoring")
    _nothing_of_the_end_left(stopped)
    code, _, err = _cli(*_train_argv(config, stopped), sigterm_at="export:3")
    _stopped(code, err, "the export")
    _nothing_of_the_end_left(stopped)
    code, _, err = cli_in_process(*_train_argv(config, stopped))
    assert code == 0, err[-3000:]

    assert _result(stopped) == _result(whole)
    assert _export(stopped) == _export(whole)
    left = files_under(stopped)
    assert "lock.json" not in left and "final.partial.json" not in left, left


@pytest.mark.scenario
def test_sigterm_during_the_ctranslate2_conversion_exits_75_and_the_same_command_finishes(
    end_runs, tmp_path
):
    """`export --format ctranslate2` of a trained workdir (`end_runs`'s, copied) stopped in
    its conversion: exit 75, no lock, no output directory and no temporary one; the same
    command then writes the files of an uninterrupted conversion, byte for byte."""
    pytest.importorskip("ctranslate2")
    whole = tmp_path / "whole"
    shutil.copytree(end_runs[1], whole)

    def convert(output, run=cli_in_process, **stop):
        return run("export", "--workdir", whole, "--output", output,
                   "--format", "ctranslate2", **stop)  # fmt: skip

    code, _, err = convert(tmp_path / "ct2-whole")
    assert code == 0, err[-3000:]
    code, _, err = convert(tmp_path / "ct2-stopped", run=_cli, sigterm_at="CTranslate2")
    _stopped(code, err, "the CTranslate2 conversion")
    assert sorted(os.listdir(tmp_path)) == ["ct2-whole", "whole"]  # no output, no .ct2-*
    assert "lock.json" not in files_under(whole)
    code, _, err = convert(tmp_path / "ct2-stopped")
    assert code == 0, err[-3000:]
    ours, theirs = _read_bytes(tmp_path / "ct2-stopped"), _read_bytes(tmp_path / "ct2-whole")
    assert "model.bin" in theirs and ours == theirs
    assert sorted(os.listdir(tmp_path)) == ["ct2-stopped", "ct2-whole", "whole"]


# ------------------------------------------------------------------ the lock's lease


def _write_lock(workdir, **holder):
    os.makedirs(workdir, exist_ok=True)
    values = dict(host="another-machine", pid=4242, command="train", started="then", token="old")
    values.update(holder)
    with open(os.path.join(workdir, "lock.json"), "w") as f:
        json.dump(values, f)


def test_an_expired_lease_of_another_host_is_taken_over_naming_the_old_holder(tmp_path, capsys):
    from keras_transformer.lock import WorkdirLock

    _write_lock(tmp_path, lease_seconds=60, renewed=time.time() - 600)
    with WorkdirLock(tmp_path, "train", lease_seconds=60):
        holder = json.loads((tmp_path / "lock.json").read_text())
        assert holder["pid"] == os.getpid() and holder["lease_seconds"] == 60
    err = capsys.readouterr().err
    assert f"taking over the lock {tmp_path / 'lock.json'} of another-machine pid 4242" in err
    assert "lease (60 s) ran out" in err
    assert not os.listdir(tmp_path)  # released; no claim file left


def test_a_live_holder_of_another_host_is_refused_with_exit_2(tmp_path, capsys):
    """A lock of another host within its lease: `prepare` waits, sees it renewed, exits 2."""
    from keras_transformer import cli

    workdir = tmp_path / "workdir"
    _write_lock(workdir, lease_seconds=5, renewed=time.time())
    stop = threading.Event()

    def renew():  # the other host's heartbeat
        while not stop.wait(0.5):
            _write_lock(workdir, lease_seconds=5, renewed=time.time())

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    config = write_yaml(tmp_path / "tiny.yaml", tiny_yaml(workdir))
    try:
        code = cli.main(["prepare", "--config", config])
    finally:
        stop.set()
        renewer.join()
    err = capsys.readouterr().err
    assert code == 2, err
    assert "waiting up to its lease (5 s)" in err
    assert "is in use by another-machine pid 4242 (train, started then)" in err
    assert json.loads((workdir / "lock.json").read_text())["token"] == "old"  # untouched
    assert not (workdir / "prepared").exists()


def test_the_holder_renews_its_lease_while_it_runs(tmp_path):
    from keras_transformer.lock import WorkdirLock

    with WorkdirLock(tmp_path, "train", lease_seconds=1) as lock:
        first = json.loads((tmp_path / "lock.json").read_text())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = json.loads((tmp_path / "lock.json").read_text())
            if now["renewed"] != first["renewed"]:
                break
            time.sleep(0.05)
        assert now["renewed"] > first["renewed"] and now["token"] == lock.token
    assert not (tmp_path / "lock.json").exists()


def test_threads_taking_over_one_expired_lock_at_once_exactly_one_wins(tmp_path):
    from keras_transformer.errors import WorkdirInUseError
    from keras_transformer.lock import WorkdirLock

    for round in range(10):
        _write_lock(tmp_path, token=f"old-{round}", lease_seconds=1, renewed=0.0)
        start = threading.Barrier(6)
        won, lost = [], []

        def take():
            lock = WorkdirLock(tmp_path, "train", lease_seconds=60)
            start.wait()
            try:
                won.append(lock.acquire())
            except WorkdirInUseError:
                lost.append(lock)

        takers = [threading.Thread(target=take) for _ in range(6)]
        for taker in takers:
            taker.start()
        for taker in takers:
            taker.join()
        assert len(won) == 1 and len(lost) == 5, (round, len(won))
        assert json.loads((tmp_path / "lock.json").read_text())["token"] == won[0].token
        won[0].release()
        assert not os.listdir(tmp_path)


_TAKER = """
import os, sys, time
import tensorflow  # imported before the start: the two takers try at the same instant
from keras_transformer.errors import WorkdirInUseError
from keras_transformer.lock import WorkdirLock
lock = WorkdirLock(sys.argv[1], "train", lease_seconds=60)
go, done = sys.argv[2], sys.argv[3]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
try:
    lock.acquire()
except WorkdirInUseError:
    print("refused", flush=True)
    sys.exit(2)
print("runs", flush=True)
while not os.path.exists(done):
    time.sleep(0.01)
lock.release()
"""


@pytest.mark.scenario
def test_two_processes_started_together_on_an_expired_lock_exactly_one_runs(tmp_path):
    workdir = tmp_path / "workdir"
    _write_lock(workdir, lease_seconds=30, renewed=time.time() - 3600)
    go, done = tmp_path / "go", tmp_path / "done"
    takers = [
        subprocess.Popen(
            [sys.executable, "-c", _TAKER, str(workdir), str(go), str(done)],
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        assert [taker.stdout.readline().strip() for taker in takers] == ["ready", "ready"]
        go.touch()
        answers = sorted(taker.stdout.readline().strip() for taker in takers)
        assert answers == ["refused", "runs"], [t.stderr.read() for t in takers if t.poll()]
    finally:
        done.touch()
        outputs = [taker.communicate(timeout=TIMEOUT) for taker in takers]
    assert sorted(taker.returncode for taker in takers) == [0, 2]
    assert sum("taking over the lock" in err for _, err in outputs) == 1
    assert not os.listdir(workdir)


def test_a_holder_whose_lock_was_taken_over_stops_at_its_next_safe_point(tmp_path):
    """The renewal thread finds another run's lock (this one stalled for longer than its
    lease): the next safe point raises `Preempted` naming the new holder, and leaving the block
    does not remove the new holder's lock."""
    from keras_transformer import stopping
    from keras_transformer.errors import Preempted
    from keras_transformer.lock import WorkdirLock

    with stopping.catching():
        with pytest.raises(Preempted) as stopped:
            with WorkdirLock(tmp_path, "prepare", lease_seconds=0.4) as lock:
                _write_lock(tmp_path, lease_seconds=60, renewed=time.time())  # the taker's
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:  # the work, with its safe points
                    stopping.check("a phase")
                    time.sleep(0.01)
        assert stopping.lost_the_workdir()
    message = str(stopped.value)
    assert message.startswith("stopped by the takeover of the workdir lock by another-machine")
    assert "during a phase" in message
    assert lock.lost_to["token"] == "old"
    assert json.loads((tmp_path / "lock.json").read_text())["token"] == "old"  # kept
    assert stopping.received() is None and not stopping.lost_the_workdir()  # cleared after


def test_outside_a_stopping_block_a_takeover_only_warns(tmp_path, capsys):
    from keras_transformer import stopping
    from keras_transformer.lock import WorkdirLock

    with WorkdirLock(tmp_path, "prepare", lease_seconds=0.4) as lock:
        _write_lock(tmp_path, lease_seconds=60, renewed=time.time())
        deadline = time.monotonic() + 120
        while lock.lost_to is None and time.monotonic() < deadline:
            time.sleep(0.01)
        stopping.check("a phase")  # nothing to stop: no flag was set
    assert "warning: the lock" in capsys.readouterr().err
    assert json.loads((tmp_path / "lock.json").read_text())["token"] == "old"


def test_prepare_whose_lock_is_taken_over_midway_exits_75_and_leaves_the_lock(
    tmp_path, monkeypatch, capsys
):
    """`keras-transformer prepare` stalls in its first segment for longer than its lease while
    another run takes the lock over: it stops with exit 75 before the segment goes into the
    shards (the commit's fence: `lock.fence`), names the new holder, keeps what was complete
    and leaves the new holder's lock in place."""
    import importlib

    from keras_transformer import cli, stopping

    workers_module = importlib.import_module("keras_transformer.data.workers")
    monkeypatch.setenv("KERAS_TRANSFORMER_PREPARE_SEGMENT", "64")
    real = workers_module._write_segment_file
    workdir = tmp_path / "workdir"

    taken = []

    def stall(path, groups):  # the first segment: the lock changes hands meanwhile
        if not taken:
            taken.append(path)
            _write_lock(workdir, lease_seconds=60, renewed=time.time())
            deadline = time.monotonic() + 120
            while stopping.received() is None and time.monotonic() < deadline:
                time.sleep(0.01)
        return real(path, groups)

    monkeypatch.setattr(workers_module, "_write_segment_file", stall)
    config = write_yaml(tmp_path / "tiny.yaml", tiny_yaml(workdir))
    code = cli.main(["prepare", "--config", config, "--set", "runtime.lock_lease_seconds=1"])
    err = capsys.readouterr().err
    assert code == PREEMPTED_EXIT_CODE == 75, err
    assert "was taken over by another-machine pid 4242" in err
    line = [x for x in err.splitlines() if x.startswith("keras-transformer prepare: stopped")]
    assert len(line) == 1 and "the takeover of the workdir lock by another-machine" in line[0]
    assert "a segment of the prepared shards not written" in line[0]
    assert json.loads((workdir / "lock.json").read_text())["token"] == "old"
    assert not (workdir / "prepared").exists()


# ------------------------------------------------------------------ the precision timing


@pytest.mark.scenario(
    slow="two `train` processes, the first timing both precisions before its SIGTERM"
)
def test_sigterm_during_the_precision_timing_exits_75_and_the_same_command_finishes(tmp_path):
    """`train` with `runtime.mixed_precision: auto` stopped while it times the precisions (on a
    CPU): exit 75, no lock, no precision chosen, no checkpoint; the same command then times,
    trains and finishes with the result of an uninterrupted run that named the chosen
    precision itself."""
    stopped, whole = tmp_path / "stopped", tmp_path / "whole"
    config = write_yaml(tmp_path / "tiny.yaml", tiny_yaml(stopped))
    auto = ("--set", "runtime.mixed_precision=auto")

    code, _, err = _cli(*_train_argv(config, stopped, *auto), sigterm_at="precision:2")
    _stopped(code, err, "the precision timing (runtime.mixed_precision: auto)")
    left = files_under(stopped)
    assert "lock.json" not in left and "precision.json" not in left, left
    assert not [f for f in left if f.startswith(("checkpoints/", "backup/"))], left
    assert "prepared/manifest.json" in left  # the phase before it is done, and kept

    code, _, err = cli_in_process(*_train_argv(config, stopped, *auto))
    assert code == 0, err[-3000:]
    assert "using the prepared data" in err  # not prepared again
    chosen = json.loads((stopped / "precision.json").read_text())["precision"]
    code, _, err = cli_in_process(
        *_train_argv(config, whole, "--set", f"runtime.mixed_precision={chosen}")
    )
    assert code == 0, err[-3000:]
    ours, theirs = _result(stopped), _result(whole)
    assert ours.pop("precision", chosen) == theirs.pop("precision", chosen) == chosen
    ours.pop("precision_choice", None)
    assert ours == theirs
    assert "lock.json" not in files_under(stopped)


@pytest.mark.scenario
def test_a_stopped_preparation_continues_in_worker_processes_to_the_same_shards(tmp_path):
    """Stopped in one process after two of eleven segments, the same command with two worker
    processes continues from there (each encodes only its segments after the kept ones) and
    writes the shards of an uninterrupted preparation in one process, byte for byte."""
    stopped, whole = tmp_path / "stopped", tmp_path / "whole"
    values = tiny_yaml(stopped, data=dict(train="synthetic:split=train,size=700"))
    config = write_yaml(tmp_path / "tiny.yaml", values)
    one, two = ("--set", "data.prepare_workers=1"), ("--set", "data.prepare_workers=2")
    code, _, err = _cli("prepare", "--config", config, *one, sigterm_at="shards:3", **SEGMENT)
    _stopped(code, err, "prepare (writing the shards)")
    # The continuation with its worker processes stays a subprocess of its own.
    code, _, err = _cli("prepare", "--config", config, *two, **SEGMENT)
    assert code == 0, err[-3000:]
    assert "tokenizing 700 pairs into shards (2 workers)" in err
    assert "2 of 11 segments kept" in err
    assert "9 segments encoded, 2 kept from the stopped one" in err
    code, _, reference_err = _prepare_uninterrupted(config, whole, *one)
    assert code == 0, reference_err[-3000:]
    _same_preparations(stopped, whole)
    _nothing_of_prepare_left(stopped)


@pytest.mark.scenario
def test_training_whose_lock_was_taken_over_stops_after_the_step_and_saves_nothing(tmp_path):
    """`StopOnSignal` after a takeover (`stopping.request(..., lost_the_workdir=True)`, as the
    lock's renewal thread calls it): `Preempted` after the step, and no resume state written
    (the workdir is the new holder's)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_transformer import stopping
    from keras_transformer.errors import Preempted
    from keras_transformer.training.engines.tf_state import ResumeState
    from keras_transformer.training.run.preemption import CatchSignals, StopOnSignal
    from keras_transformer.training.run.run_state import RunState

    class TakeOverAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                assert stopping.request("the takeover of the workdir lock by X", True)

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    resume = ResumeState(model, str(tmp_path), every=1000, keep=1, run_state=RunState())
    x, y = np.ones((20, 3), "float32"), np.ones((20, 1), "float32")
    with CatchSignals() as signals:
        with pytest.raises(Preempted) as stopped:
            model.fit(x, y, batch_size=1, epochs=1, verbose=0,
                      callbacks=[TakeOverAt(), StopOnSignal(signals, resume)])  # fmt: skip
    assert "stopped by the takeover of the workdir lock by X after step 3" in str(stopped.value)
    assert "nothing saved" in str(stopped.value)
    assert tf.train.latest_checkpoint(str(tmp_path)) is None
