"""Exports are readable by the users the umask lets read them: TF Serving, a container or a web
server running under another uid loads what `export` wrote. Each export is written in a hidden
directory and renamed into place (`workdir.staging_directory`); that directory once came from
`tempfile.mkdtemp`, mode 0700, and the rename kept it: only its owner could read the export."""

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile

import _inference_fixtures as fx
import pytest

OTHER_USER = 65534  # nobody


@contextlib.contextmanager
def _umask(mask):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o027, 0o077], ids=oct)
def test_a_staging_directory_gets_what_the_umask_gives_any_new_directory(tmp_path, mask):
    from keras_transformer.workdir import staging_directory

    with _umask(mask):
        staged = staging_directory(str(tmp_path / "new" / "parent"), ".export-")
        os.mkdir(tmp_path / "plain")
    assert os.path.dirname(staged) == str(tmp_path / "new" / "parent")
    assert os.path.basename(staged).startswith(".export-") and not os.listdir(staged)
    assert _mode(staged) == 0o777 & ~mask == _mode(tmp_path / "plain")
    assert staging_directory(os.path.dirname(staged), ".export-") != staged


def _unreadable_by_others(root):
    """The paths under `root` (itself included) that other users may not read (a directory:
    list and enter), by their mode bits."""
    bad = []
    for directory, _, files in os.walk(root):
        if _mode(directory) & 0o005 != 0o005:
            bad.append(directory)
        bad += [f for f in (os.path.join(directory, f) for f in files) if not _mode(f) & 0o004]
    return bad


def _read_as_another_user(root):
    """`(exit code, stderr)` of listing every directory and reading every file under `root` as
    uid and gid 65534 with no supplementary groups (this process must be root)."""
    script = (
        'find "$1" -type d -exec ls {} + >/dev/null && find "$1" -type f -exec cat {} + >/dev/null'
    )
    done = subprocess.run(
        ["/bin/sh", "-c", script, "sh", root], capture_output=True, text=True,
        user=OTHER_USER, group=OTHER_USER, extra_groups=[],
    )  # fmt: skip
    return done.returncode, done.stderr


@pytest.fixture
def shared_directory():
    """A directory every user may enter (pytest's own temporary directories are 0700)."""
    path = tempfile.mkdtemp(prefix="kt-permissions-")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_another_user_reads_a_litert_export(copy_model, toy_spm_bytes, shared_directory):
    """A real export (LiteRT float32: the quickest; the SavedModel and CTranslate2 exports use
    the same `staging_directory`, checked by their mode bits below and in test_export_ct2.py)
    under umask 022: another user lists and reads all of it. As root, read as uid 65534;
    otherwise, by the mode bits."""
    from keras_transformer.export.litert import export_litert

    output = os.path.join(shared_directory, "litert")
    with _umask(0o022):
        export_litert(copy_model, toy_spm_bytes, output, fx.export_plan(format="litert"))
    if os.geteuid() == 0:
        code, err = _read_as_another_user(shared_directory)
        assert code == 0, f"uid {OTHER_USER} cannot read the export: {err}"
    assert not _unreadable_by_others(output)
    assert _mode(output) == 0o755


def test_a_saved_model_version_gets_what_the_umask_gives(exported_copy_model):
    """The SavedModel exported by the session's fixture (under this process's umask): its
    version directory has the umask's mode, and others may read all of it when the umask lets
    them."""
    _, path = exported_copy_model
    mask = _current_umask()
    assert _mode(path) == 0o777 & ~mask, oct(_mode(path))
    if mask & 0o005 == 0:
        assert not _unreadable_by_others(path)
