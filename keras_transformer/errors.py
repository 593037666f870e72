"""The package's errors: one base class that the `keras-transformer` command reports as one line.

This module imports nothing from the package, so every module can raise these without import
circles. The command line catches `KerasTransformerError` (and `FileNotFoundError`, and any
error that `write_refused` recognises as a write the system refused: a full disk or quota, a
file-size limit, a read-only file system, a failing device), prints its first line and exits
with code 2; a signal at a safe point exits with `PREEMPTED_EXIT_CODE` (75); anything else is a
bug and keeps its traceback.
"""

import errno
import re


def first_line(error):
    """The first non-empty line of an error's message, or its type's name when it has none: what
    a one-line report quotes of an error from below (TensorFlow's, h5py's, TFDS's)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class KerasTransformerError(Exception):
    """A user error (bad config, corpus, workdir, model path or argument): one line, exit 2."""


class ConfigError(KerasTransformerError, ValueError):
    """A configuration problem: unknown key, wrong type, impossible value."""


class DataError(KerasTransformerError, ValueError):
    """A problem with a corpus, vocabulary or prepared dataset (missing file, misaligned files,
    bad spec, a prepared workdir that does not match the config)."""


class UsageError(KerasTransformerError):
    """A bad command-line argument or input (a missing model, unequal line counts, ...)."""


class DataWarning(UserWarning):
    """Pairs were skipped while reading a corpus (the message gives the counts)."""


class WorkerError(KerasTransformerError):
    """A multi-worker run cannot go on: a peer stopped answering, or the chief's files (the
    vocabulary, a prepared dataset) never appeared. Restarting every worker with the same command
    resumes from the last backup."""


class WorkdirInUseError(KerasTransformerError):
    """Another `train` or `prepare` holds the workdir's lock (the message names it)."""


class WriteRefusedError(KerasTransformerError, OSError):
    """The system refused a write: a full disk or quota (ENOSPC, EDQUOT), a file-size limit
    (EFBIG, e.g. `ulimit -f`), a read-only file system (EROFS) or a failing device (EIO). The one
    line names the cause, the path and what to do; `errno` is the refusal's.

    Every writer keeps its output invisible until complete (written beside, then renamed), so
    after the cause is fixed the same command continues from the last complete state.
    """


class DiskFullError(WriteRefusedError):
    """A write failed because the disk (or the user's quota) is full; the message names the path."""


# The refused writes `write_refused` recognises: (errno, its text in the C library's strerror,
# which TensorFlow's file systems and h5py repeat, the one line's cause, why it happens, what the
# user does). TensorFlow raises them as ResourceExhaustedError (ENOSPC, EDQUOT), OutOfRangeError
# (EFBIG), PermissionDeniedError (EROFS) or UnknownError (EIO), the text after `PATH; ` telling
# which.
_REFUSED_WRITES = (
    (errno.ENOSPC, "no space left on device", "no space left on the device", "", "free some space"),
    (
        errno.EDQUOT,
        "disk quota exceeded",
        "disk quota exceeded",
        "",
        "free some space or raise the quota",
    ),
    (
        errno.EFBIG,
        "file too large",
        "file too large",
        " (over a file-size limit such as `ulimit -f`, or the file system's largest file)",
        "raise the limit or write to another file system",
    ),
    (
        errno.EROFS,
        "read-only file system",
        "read-only file system",
        "",
        "write to a writable location (or remount it read-write)",
    ),
    (
        errno.EIO,
        "input/output error",
        "input/output error",
        " (the disk or network file system failed)",
        "check the device",
    ),
)
_STRERRORS = "|".join(re.escape(text) for _, text, *_ in _REFUSED_WRITES)


def _refused_errno(error):
    """The refused write's errno that `error` itself reports (its `errno`, h5py's
    `errno = N`, or the strerror text of TensorFlow's `PATH; TEXT`), else None."""
    known = {number for number, *_ in _REFUSED_WRITES}
    number = getattr(error, "errno", None)
    if number in known:
        return number
    text = str(error)
    match = re.search(r"\berrno = (\d+)\b", text)
    if match and int(match.group(1)) in known:
        return int(match.group(1))
    lowered = text.lower()
    for number, strerror, *_ in _REFUSED_WRITES:
        if strerror in lowered:
            return number
    return None


def _refused_path(error):
    """The path a refused write names: `OSError.filename`, h5py's `filename = '...'`, or the
    `PATH; File too large` of TensorFlow's file systems; None when it names none."""
    filename = getattr(error, "filename", None)
    if filename:
        return str(filename)
    text = str(error)
    match = re.search(r"filename = '([^']+)'", text) or re.search(
        rf"(\S+?)[;:,]? (?i:{_STRERRORS})", text
    )
    return match.group(1) if match else None


def write_refused(error):
    """A `WriteRefusedError` (one line naming the cause, the path and what to do) when `error`,
    or an error it was raised from, is a write the system refused; else None.

    The one place that recognises a refused write, whoever wrote: Python's `OSError` (ENOSPC,
    EDQUOT, EFBIG, EROFS, EIO), h5py's `OSError` (Keras weight files), TensorFlow's
    `ResourceExhaustedError`, `OutOfRangeError`, `PermissionDeniedError` or `UnknownError` from
    `tf.io.gfile`, `tf.io.TFRecordWriter`, `tf.train.Checkpoint` (SaveV2) or
    `tf.saved_model.save`. `cli.main` turns it into one line and exit code 2 instead of a
    traceback. Out of memory, a missing file or a permission denied are not refused writes.
    """
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, WriteRefusedError):
            return error
        number = _refused_errno(error)
        if number is not None:
            _, _, cause, why, remedy = next(r for r in _REFUSED_WRITES if r[0] == number)
            path = _refused_path(error)
            where = f" writing {path}" if path else ""
            kind = DiskFullError if number in (errno.ENOSPC, errno.EDQUOT) else WriteRefusedError
            refused = kind(
                f"{cause}{where}{why}: {remedy} and run the same command again (it continues from "
                "the last complete state; nothing incomplete is taken as done)"
            )
            refused.errno = number
            return refused
        error = error.__cause__ or error.__context__
    return None


# The exit code of a `keras-transformer` command stopped by SIGTERM or SIGINT at a safe point
# (training: after its step, with the resume state and a step checkpoint saved): sysexits.h's
# EX_TEMPFAIL ("a temporary failure; the user is invited to retry"). A job scheduler should run
# the same command again (which resumes), and not count it as a failure: it is neither 0 (done),
# 1 (a crash), 2 (bad input) nor 128+N (killed by signal N before anything was saved).
PREEMPTED_EXIT_CODE = 75


class Preempted(Exception):
    """A command stopped on a signal (SIGTERM or SIGINT; under several workers, to any of them)
    at a safe point of its phase, nothing half-written (training: after finishing its step and
    saving its resume state and a step checkpoint); running the same command again resumes.
    `keras-transformer` prints the message and exits with `PREEMPTED_EXIT_CODE`. Raised by
    `keras_transformer.stopping.check` and by training's `StopOnSignal`.

    Args:
        message: the one line to print.
        step: the optimizer step saved (training), else None.
    """

    def __init__(self, message, step=None):
        super().__init__(message)
        self.step = step
