"""Faults a long run meets, each through the `keras-transformer` command: a full disk at every
writer, a torn or corrupted newest checkpoint or resume state, a corrupted prepared shard, and
two runs on one workdir. Each fault ends in one line (exit 2) or is survived from the last
complete state, and nothing torn is ever taken as complete."""

import errno
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf
from training_helpers import cli_in_process, subprocess_env, tiny_yaml, write_yaml

from keras_transformer import cli
from keras_transformer.workdir import Workdir, list_checkpoints

NO_SPACE = "No space left on device"


def _error_lines(err):
    return [line for line in err.splitlines() if ": error: " in line]


def _yaml(directory, **train):
    values = tiny_yaml(directory, train=dict(steps=4, **train), data=dict(dev=None))
    return write_yaml(os.path.join(directory, "tiny.yaml"), values)


def _train_argv(config, workdir, *extra):
    workdir = str(workdir)
    return (
        ["train", "--config", config, "--workdir", workdir, "--set"]
        + [f"export.base_dir={os.path.join(workdir, 'saved_models')}"]
        + list(extra)
    )


@pytest.fixture(scope="module")
def trained(_shared_root):
    """A finished 4-step run: checkpoints and resume states at steps 2 and 4 (trained once per
    run, shared by the workers; the tests copy it before they change it)."""
    from shared_runs import shared_directory

    def run(root):
        assert cli.main(_train_argv(_yaml(str(root)), root / "workdir")) == 0

    # Not registered as provided: the refused-write tests train its config again, each with a
    # write failing midway (the subject of the test).
    root = shared_directory(_shared_root, "faults_trained", run)
    return os.path.join(str(root), "tiny.yaml"), root / "workdir"


@pytest.fixture
def copy_of(trained, tmp_path):
    """A copy of the trained workdir (without its result: `train` continues it)."""
    config, workdir = trained
    copy = tmp_path / "workdir"
    shutil.copytree(workdir, copy)
    os.remove(copy / "result.json")
    return config, copy


def _flip_middle_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _leftovers(root):
    """Hidden temporary files or directories that a failed write must not leave behind."""
    return [
        p
        for p in glob.glob(os.path.join(str(root), "**", "*"), recursive=True)
        if os.path.basename(p).startswith(
            (".tmp-", ".export-", ".ct2-", "prepared.tmp-", "prepared.partial")
        )
    ]


# -------------------------------------------------------------- a refused write, at every writer

# Each way the system refuses a write: (errno, the TensorFlow error its file systems raise for it
# (`PATH; STRERROR`), the start of the one line `keras-transformer` prints).
REFUSALS = {
    "ENOSPC": (errno.ENOSPC, tf.errors.ResourceExhaustedError, "no space left on the device"),
    "EDQUOT": (errno.EDQUOT, tf.errors.ResourceExhaustedError, "disk quota exceeded"),
    "EFBIG": (errno.EFBIG, tf.errors.OutOfRangeError, "file too large"),
    "EROFS": (errno.EROFS, tf.errors.PermissionDeniedError, "read-only file system"),
    "EIO": (errno.EIO, tf.errors.UnknownError, "input/output error"),
}


def _no_space_os_error(path):
    return OSError(errno.ENOSPC, NO_SPACE, str(path))


def _no_space_tf_error(path):
    # What tf.io.gfile and TensorFlow's file systems raise for ENOSPC.
    return tf.errors.ResourceExhaustedError(None, None, f"{path}; {NO_SPACE}")


class _Injector:
    """Makes the `nth` matching write fail as `refusal` (a key of REFUSALS) does, after writing
    part of the data."""

    def __init__(self, nth=1, refusal="ENOSPC"):
        self.nth, self.calls, self.failed_path = nth, 0, None
        self.errno, self.tf_error_class, _ = REFUSALS[refusal]

    def hit(self, path):
        self.calls += 1
        if self.calls == self.nth:
            self.failed_path = str(path)
            return True
        return False

    def os_error(self, path):
        """What Python's `open(...).write` (and h5py) raise."""
        return OSError(self.errno, os.strerror(self.errno), str(path))

    def tf_error(self, path):
        """What tf.io.gfile, TFRecordWriter, SaveV2 and TensorFlow's file systems raise."""
        return self.tf_error_class(None, None, f"{path}; {os.strerror(self.errno)}")


def _inject_step_checkpoint(monkeypatch, injector):
    from keras.src.saving import saving_lib

    real = saving_lib.save_weights_only

    def save_weights_only(model, filepath, *args, **kwargs):
        if injector.hit(filepath):
            with open(filepath, "wb") as f:
                f.write(b"\x89HDF\r\n\x1a\n partial")
            raise injector.os_error(filepath)
        return real(model, filepath, *args, **kwargs)

    monkeypatch.setattr(saving_lib, "save_weights_only", save_weights_only)


def _inject_resume_state(monkeypatch, injector):
    real = tf.train.Checkpoint._write

    def write(self, file_prefix, *args, **kwargs):
        if injector.hit(file_prefix):
            data = f"{file_prefix}.data-00000-of-00001"
            with open(data, "wb") as f:
                f.write(b"partial")
            raise injector.tf_error(data)
        return real(self, file_prefix, *args, **kwargs)

    monkeypatch.setattr(tf.train.Checkpoint, "_write", write)


def _inject_gfile_write(monkeypatch, injector, name):
    real = tf.io.gfile.GFile.write

    def write(self, data):
        if os.path.basename(self.name).endswith(name) and injector.hit(self.name):
            real(self, data[: len(data) // 2])
            raise injector.tf_error(self.name)
        return real(self, data)

    monkeypatch.setattr(tf.io.gfile.GFile, "write", write)


def _inject_shards(monkeypatch, injector):
    real = tf.io.TFRecordWriter

    class Writer:
        def __init__(self, path, *args):
            self.path, self.writer = path, real(path, *args)

        def write(self, record):
            if injector.hit(self.path):
                raise injector.tf_error(self.path)
            self.writer.write(record)

        def close(self):
            self.writer.close()

    monkeypatch.setattr(tf.io, "TFRecordWriter", Writer)


def _inject_saved_model(monkeypatch, injector):
    real = tf.saved_model.save

    def save(obj, export_dir, *args, **kwargs):
        if injector.hit(export_dir):
            path = os.path.join(export_dir, "saved_model.pb")
            with open(path, "wb") as f:
                f.write(b"partial")
            raise injector.tf_error(path)
        return real(obj, export_dir, *args, **kwargs)

    monkeypatch.setattr(tf.saved_model, "save", save)


def _inject_ctranslate2(monkeypatch, injector):
    from ctranslate2.specs import model_spec

    real = model_spec.ModelSpec.save

    def save(self, output_dir):
        if injector.hit(output_dir):
            path = os.path.join(output_dir, "model.bin")
            with open(path, "wb") as f:
                f.write(b"partial")
            raise injector.os_error(path)
        return real(self, output_dir)

    monkeypatch.setattr(model_spec.ModelSpec, "save", save)


def _train_case(inject, nth, fragment, check_after, trained=False):
    """`trained`: the write comes after training and the export (result.json): the case starts
    from a copy of the trained workdir without its result, whose `train` resumes at the last step
    and goes straight to that write, instead of training the same steps from scratch."""
    return dict(
        kind="train", inject=inject, nth=nth, fragment=fragment, check=check_after, trained=trained
    )


def _check_no_step_4_checkpoint(workdir):
    assert [s for s, _ in list_checkpoints(os.path.join(workdir, "checkpoints"))] == [2]


def _check_no_step_4_state(workdir):
    assert tf.train.latest_checkpoint(os.path.join(workdir, "backup")).endswith("ckpt-2")


def _check_no_result(workdir):
    assert not os.path.exists(os.path.join(workdir, "result.json"))


def _check_not_prepared(workdir):
    assert not os.path.exists(os.path.join(workdir, "prepared", "manifest.json"))


WRITERS = {
    # writer: (how the write is made to fail, which call, the path named, the state after)
    "step_checkpoint": _train_case(
        _inject_step_checkpoint, 2, "ckpt-4.weights.h5", _check_no_step_4_checkpoint
    ),
    "resume_state": _train_case(_inject_resume_state, 2, "ckpt-4.data", _check_no_step_4_state),
    "result_json": _train_case(
        lambda m, i: _inject_gfile_write(m, i, "result.json"),
        1,
        "result.json",
        _check_no_result,
        trained=True,
    ),
    "shards": dict(kind="prepare", inject=_inject_shards, nth=40, fragment=".tfrecord"),
    "manifest": dict(
        kind="prepare",
        inject=lambda m, i: _inject_gfile_write(m, i, "manifest.json"),
        nth=1,
        fragment="manifest.json",
    ),
    "saved_model": dict(kind="export", inject=_inject_saved_model, nth=1, fragment="saved_model"),
    "ctranslate2": dict(kind="ctranslate2", inject=_inject_ctranslate2, nth=1, fragment="model"),
}


def _full_disk_command(case, tmp_path, trained):
    """The command of a writer's case, and its workdir."""
    config, trained_workdir = trained
    if case.get("trained"):  # training done, result.json not yet written
        workdir = tmp_path / "workdir"
        shutil.copytree(trained_workdir, workdir)
        os.remove(workdir / "result.json")
        return _train_argv(config, workdir), workdir
    if case["kind"] in ("train", "prepare"):
        workdir = tmp_path / "workdir"
        argv = _train_argv(config, workdir)
        if case["kind"] == "prepare":
            argv = ["prepare", "--config", config, "--workdir", str(workdir)]
        return argv, workdir
    workdir = tmp_path / "workdir"
    shutil.copytree(trained_workdir, workdir)
    argv = ["export", "--workdir", workdir, "--output", tmp_path / "exports"]
    if case["kind"] == "ctranslate2":
        argv += ["--format", "ctranslate2"]
    return argv, workdir


@pytest.mark.scenario(slow="a train or an export and, for a full disk, the same command again")
@pytest.mark.parametrize("refusal", sorted(REFUSALS))
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_refused_write_is_one_line_and_the_same_command_continues(
    writer, refusal, trained, tmp_path, monkeypatch
):
    """Each refused write (a full disk or quota, a file-size limit, a read-only file system, a
    failing device) at each writer, raised as that writer's library raises it: one line naming
    the cause and the path, exit 2, nothing half-written; then the same command completes from
    the last complete state."""
    case = WRITERS[writer]
    argv, workdir = _full_disk_command(case, tmp_path, trained)
    injector = _Injector(case["nth"], refusal)
    with monkeypatch.context() as patch:
        case["inject"](patch, injector)
        code, out, err = cli_in_process(*argv)
    assert injector.failed_path, f"the {writer} write was never reached"
    errors = _error_lines(err)
    assert code == 2, err
    assert len(errors) == 1 and f"error: {REFUSALS[refusal][2]}" in errors[0], err
    assert injector.failed_path in errors[0] and case["fragment"] in errors[0]
    assert "Traceback" not in err
    # Nothing torn that a later run would take as complete, no temporary leftovers.
    assert _leftovers(tmp_path) == []
    if "check" in case:
        case["check"](str(workdir))
    if case["kind"] == "prepare":
        _check_not_prepared(str(workdir))
    if case["kind"] == "export":
        assert glob.glob(str(tmp_path / "exports" / "*" / "*")) == []
    if case["kind"] == "ctranslate2":
        assert not os.path.exists(tmp_path / "exports")
    # The cause is fixed: the same command completes, from the last complete state. The writers
    # clean up whatever the errno (the assertions above, for each), so the retry runs for a full
    # disk only: the other four would add train and export runs for no other code path (a real
    # EFBIG's retry: test_export_under_a_real_file_size_limit_...).
    if refusal != "ENOSPC":
        return
    code, out, err = cli_in_process(*argv)
    assert code == 0, err
    if case["kind"] == "train":
        assert "resuming from step" in out
        assert json.loads((workdir / "result.json").read_text())["step"] == 4
        from keras_transformer.workdir import complete_checkpoints

        assert [s for s, _ in complete_checkpoints(str(workdir / "checkpoints"))] == [2, 4]


def _file_size_limit(limit):
    """A `preexec_fn`: writes past `limit` bytes fail with EFBIG ("File too large"), as under
    `ulimit -f`; SIGXFSZ ignored, as Python does, so write() returns the error."""
    import resource
    import signal

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.scenario(
    slow="two exports of the trained run, each tracing every signature: one in a process of its "
    "own (a file-size limit is per process), the retry in this one"
)
def test_export_under_a_real_file_size_limit_is_one_line_and_the_retry_gets_version_1(
    trained, tmp_path
):
    """`export` in a process whose files may not grow past 64 KiB (`ulimit -f 64`): TensorFlow's
    SaveV2 or file system refuses with EFBIG. One line naming the cause, exit 2, no traceback,
    nothing half-written; without the limit the same command writes version 1 (run in this
    process: only the limited run needs a process of its own)."""
    _, trained_workdir = trained
    workdir = tmp_path / "workdir"
    shutil.copytree(trained_workdir, workdir)
    exports = tmp_path / "exports"
    argv = [sys.executable, "-m", "keras_transformer.cli", "export", "--workdir", str(workdir),
            "--output", str(exports)]  # fmt: skip
    # Not measured by coverage (CI_COVERAGE=1): its data file could not grow past the limit.
    limited = {k: v for k, v in subprocess_env().items() if k != "COVERAGE_PROCESS_CONFIG"}
    done = subprocess.run(
        argv, env=limited, capture_output=True, text=True, timeout=300,
        preexec_fn=_file_size_limit(64 * 1024),
    )  # fmt: skip
    errors = _error_lines(done.stderr)
    assert done.returncode == 2, done.stderr[-3000:]
    assert len(errors) == 1 and "error: file too large" in errors[0], done.stderr[-3000:]
    assert "ulimit -f" in errors[0] and str(tmp_path) in errors[0]
    assert "Traceback" not in done.stderr
    assert _leftovers(tmp_path) == [] and glob.glob(str(exports / "*" / "*")) == []
    code, _, err = cli_in_process(*argv[3:])
    assert code == 0, err[-3000:]
    assert [os.path.basename(p) for p in glob.glob(str(exports / "*" / "*"))] == ["1"]


def test_write_refused_recognises_each_writers_full_disk():
    from keras_transformer.errors import DiskFullError, write_refused

    h5py_message = (
        "Unable to synchronously create file (file write failed: time = Wed, filename = "
        "'/w/checkpoints/.tmp-ckpt-4.weights.h5', file descriptor = 5, errno = 28, error "
        "message = 'No space left on device')"
    )
    for error in (
        _no_space_os_error("/w/result.json"),
        _no_space_tf_error("/w/backup/ckpt-4.data-00000-of-00001"),
        OSError(h5py_message),
    ):
        found = write_refused(error)
        assert isinstance(found, DiskFullError) and "/w/" in str(found)
    try:
        try:
            raise _no_space_os_error("/w/prepared/manifest.json")
        except OSError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert "manifest.json" in str(write_refused(outer))
    # Out of memory is not a full disk; neither is another OSError.
    out_of_memory = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating")
    assert write_refused(out_of_memory) is None
    assert write_refused(OSError(errno.EACCES, "Permission denied", "/w/x")) is None


@pytest.mark.scenario
def test_write_refused_recognises_each_refusal_as_tensorflow_h5py_and_python_say_it():
    """The messages seen under a real `ulimit -f` (SaveV2's OutOfRangeError, h5py's errno 27),
    TensorFlow's `PATH; STRERROR` for EROFS and EIO, Python's OSErrors: each one line with its
    cause, the path and the errno; what is not a refused write stays unrecognised."""
    from keras_transformer.errors import DiskFullError, WriteRefusedError, write_refused

    save_v2 = (
        "{{function_node __wrapped__SaveV2_dtypes_2_device_/job:localhost/replica:0/task:0/"
        "device:CPU:0}} /w/backup/ckpt_temp/part-00000-of-00001.data-00000-of-00001.tempstate1; "
        "File too large [Op:SaveV2]"
    )
    h5py_efbig = (
        "[Errno 27] Can't synchronously write data (file write failed: time = Thu, filename = "
        "'/w/checkpoints/.tmp-ckpt-4.weights.h5', file descriptor = 3, errno = 27, error message "
        "= 'File too large', buf = 0x5, total write size = 736512)"
    )
    cases = [
        (tf.errors.OutOfRangeError(None, None, save_v2), errno.EFBIG, "file too large",
         "/w/backup/ckpt_temp/part-00000-of-00001.data-00000-of-00001.tempstate1"),
        (OSError(h5py_efbig), errno.EFBIG, "file too large",
         "/w/checkpoints/.tmp-ckpt-4.weights.h5"),
        (tf.errors.PermissionDeniedError(None, None, "/w/result.json; Read-only file system"),
         errno.EROFS, "read-only file system", "/w/result.json"),
        (tf.errors.UnknownError(None, None, "/w/prepared/s-0.tfrecord; Input/output error"),
         errno.EIO, "input/output error", "/w/prepared/s-0.tfrecord"),
        (OSError(errno.EROFS, os.strerror(errno.EROFS), "/w/lock.json"), errno.EROFS,
         "read-only file system", "/w/lock.json"),
        (OSError(errno.EIO, os.strerror(errno.EIO), "/w/model.bin"), errno.EIO,
         "input/output error", "/w/model.bin"),
        (OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/w/x"), errno.EDQUOT,
         "disk quota exceeded", "/w/x"),
        (_no_space_tf_error("/w/y"), errno.ENOSPC, "no space left on the device", "/w/y"),
    ]  # fmt: skip
    for error, number, cause, path in cases:
        found = write_refused(error)
        assert isinstance(found, WriteRefusedError), error
        assert found.errno == number and isinstance(found, DiskFullError) == (
            number in (errno.ENOSPC, errno.EDQUOT)
        )
        line = str(found)
        assert line.startswith(f"{cause} writing {path}") and "\n" not in line, line
        assert line[len(f"{cause} writing {path}")] in ": (", line  # the whole path
        assert "run the same command again" in line
    assert write_refused(OSError(errno.EFBIG, "File too large")).errno == errno.EFBIG  # no path
    # Not refused writes: the end of a dataset, a permission, out of memory, a missing file.
    for error in (
        tf.errors.OutOfRangeError(None, None, "End of sequence"),
        tf.errors.PermissionDeniedError(None, None, "/w/x; Permission denied"),
        tf.errors.UnknownError(None, None, "something else"),
        OSError(errno.ENOENT, "No such file or directory", "/w/x"),
        OSError("errno = 270"),
    ):
        assert write_refused(error) is None, error


# ------------------------------------------------------------------ torn or corrupted checkpoints


@pytest.mark.scenario(slow="an export refused, then a SavedModel exported from the older step")
@pytest.mark.parametrize("damage", ["truncate", "flip", "truncate_without_checksum"])
def test_export_skips_a_torn_newest_checkpoint(damage, copy_of, tmp_path):
    _, workdir = copy_of
    newest = Workdir(str(workdir)).checkpoint(4)
    if damage.startswith("truncate"):
        _truncate(newest)
    else:
        _flip_middle_byte(newest)
    if damage.endswith("without_checksum"):
        os.remove(newest + ".sha256")
    output = tmp_path / "exports"
    # --average 2 would need the torn file: refused, never averaged.
    code, _, err = cli_in_process(
        "export", "--workdir", workdir, "--average", 2, "--output", output
    )
    assert code == 2 and "cannot average 2 checkpoints" in err and "1 complete" in err, err
    assert f"skipping the torn or corrupted checkpoint {newest}" in err
    code, out, err = cli_in_process(
        "export", "--workdir", workdir, "--average", 1, "--output", output
    )
    assert code == 0, err
    assert "exported step 2" in out
    assert err.count("skipping the torn or corrupted checkpoint") == 1


def test_averaging_skips_a_torn_checkpoint_and_says_so(copy_of, capsys):
    from keras_transformer.config import load_config
    from keras_transformer.models import build_transformer
    from keras_transformer.workdir import average_checkpoints, complete_checkpoints

    _, workdir = copy_of
    layout = Workdir(str(workdir))
    _flip_middle_byte(layout.checkpoint(4))
    model = build_transformer(load_config(layout.config).model, 200)
    chosen = complete_checkpoints(layout.checkpoints, 2)
    assert [step for step, _ in chosen] == [2]
    average_checkpoints(model, [path for _, path in chosen])
    assert "skipping the torn or corrupted checkpoint" in capsys.readouterr().err


@pytest.mark.scenario
@pytest.mark.parametrize("damage", ["flip_data", "truncate_data", "truncate_index"])
def test_train_resumes_from_the_newest_complete_state(damage, copy_of):
    config, workdir = copy_of
    prefix = os.path.join(workdir, "backup", "ckpt-4")
    kind, part = damage.split("_")
    path = prefix + (".index" if part == "index" else ".data-00000-of-00001")
    (_flip_middle_byte if kind == "flip" else _truncate)(path)
    code, out, err = cli_in_process(*_train_argv(config, workdir))
    assert code == 0, err
    assert f"skipping the torn or unreadable resume state {prefix}" in out
    assert "resuming from step 2" in out
    assert json.loads((workdir / "result.json").read_text())["step"] == 4


def test_train_refuses_when_every_resume_state_is_torn(copy_of):
    config, workdir = copy_of
    for path in glob.glob(os.path.join(workdir, "backup", "ckpt-*.index")):
        _truncate(path)
    code, out, err = cli_in_process(*_train_argv(config, workdir))
    assert code == 2 and len(_error_lines(err)) == 1
    assert "no readable resume state" in err and "to train from step 0" in err


# ------------------------------------------------------------------ corrupted prepared data


@pytest.mark.parametrize("damage", ["flip", "truncate"])
@pytest.mark.parametrize("command", ["train", "prepare"])
def test_a_corrupted_shard_stops_before_training(command, damage, copy_of):
    config, workdir = copy_of
    shard = sorted(glob.glob(os.path.join(workdir, "prepared", "*.tfrecord")))[3]
    (_flip_middle_byte if damage == "flip" else _truncate)(shard)
    argv = _train_argv(config, workdir)
    if command == "prepare":
        argv = ["prepare", "--config", config, "--workdir", str(workdir)]
    code, out, err = cli_in_process(*argv)
    assert code == 2, err
    (line,) = _error_lines(err)
    assert f"prepared shard {shard} is corrupted" in line
    assert ("bytes" if damage == "truncate" else "sha256") in line
    assert "run keras-transformer prepare" in line
    assert "Training tiny" not in out


def test_the_manifest_records_each_shards_size_and_checksum(trained):
    from keras_transformer.integrity import file_digest

    _, workdir = trained
    manifest = json.loads((workdir / "prepared" / "manifest.json").read_text())
    for shard in manifest["shards"]:
        size, sha256 = file_digest(workdir / "prepared" / shard["file"])
        assert (shard["bytes"], shard["sha256"]) == (size, sha256)


# ------------------------------------------------------------------ one run per workdir

_HOLDER = """
import sys, time
from keras_transformer.lock import WorkdirLock
WorkdirLock(sys.argv[1], "train").acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_run_exits_naming_the_holder_and_a_stale_lock_is_taken_over(trained, tmp_path):
    config, _ = trained
    workdir = tmp_path / "workdir"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(workdir)],
        stdout=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        for argv in (
            _train_argv(config, workdir),
            ["prepare", "--config", config, "--workdir", workdir],
        ):
            code, out, err = cli_in_process(*argv)
            assert code == 2, err
            (line,) = _error_lines(err)
            assert f"is in use by {os.uname().nodename} pid {holder.pid} (train" in line
            assert "lock.json" in line
    finally:
        holder.kill()
        holder.wait()
    # The holder is gone (as after SIGKILL): its lock is taken over, then released.
    assert os.path.exists(workdir / "lock.json")
    code, out, err = cli_in_process("prepare", "--config", config, "--workdir", workdir)
    assert code == 0, err
    assert f"taking over the lock {workdir / 'lock.json'}" in err and str(holder.pid) in err
    assert not os.path.exists(workdir / "lock.json")


def test_workers_of_one_job_share_the_chiefs_lock(trained, tmp_path, monkeypatch):
    from keras_transformer import training
    from keras_transformer.lock import WorkdirLock

    config, _ = trained
    workdir = tmp_path / "workdir"
    ran = []
    monkeypatch.setattr(training, "train", lambda config: ran.append(config.name))
    cluster = {"worker": ["localhost:1", "localhost:2"]}
    with WorkdirLock(workdir, "train"):  # the chief's
        worker = {"cluster": cluster, "task": {"type": "worker", "index": 1}}
        monkeypatch.setenv("TF_CONFIG", json.dumps(worker))
        assert cli_in_process(*_train_argv(config, workdir))[0] == 0  # a worker: no lock of its own
        chief = {"cluster": cluster, "task": {"type": "worker", "index": 0}}
        monkeypatch.setenv("TF_CONFIG", json.dumps(chief))
        code, _, err = cli_in_process(*_train_argv(config, workdir))  # a second chief
        assert code == 2 and "is in use by" in err
    assert ran == ["tiny"]


def _write_lock(workdir, **holder):
    os.makedirs(workdir, exist_ok=True)
    values = dict(host=os.uname().nodename, pid=1, command="train", started="then", token="x")
    values.update(holder)
    with open(os.path.join(workdir, "lock.json"), "w") as f:
        json.dump(values, f)


def test_a_reused_pid_or_a_reboot_does_not_keep_a_stale_lock(tmp_path, capsys):
    from keras_transformer.lock import WorkdirLock

    # pid 1 is alive, but it is not the process that took the lock (another boot).
    _write_lock(tmp_path, pid=1, process=["an-earlier-boot", "12345"])
    with WorkdirLock(tmp_path, "prepare"):
        assert json.loads((tmp_path / "lock.json").read_text())["pid"] == os.getpid()
    assert "taking over the lock" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "lock.json")


@pytest.mark.scenario
def test_a_lock_from_another_host_is_never_taken_over(tmp_path):
    from keras_transformer.errors import WorkdirInUseError
    from keras_transformer.lock import WorkdirLock

    _write_lock(tmp_path, host="another-machine", pid=99999999)
    with pytest.raises(WorkdirInUseError, match="in use by another-machine pid 99999999"):
        WorkdirLock(tmp_path, "train").acquire()
    assert json.loads((tmp_path / "lock.json").read_text())["host"] == "another-machine"
