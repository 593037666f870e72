"""The package's errors: one base class that the `keras-transformer` command reports as one line.

This module imports nothing from the package, so every module can raise these without import
circles. The command line catches `KerasTransformerError` (and `FileNotFoundError`, and any
error that `disk_full` recognises as a full disk), prints its first line and exits with code 2;
anything else is a bug and keeps its traceback.
"""


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


class DiskFullError(KerasTransformerError, OSError):
    """A write failed because the disk (or the user's quota) is full; the message names the path.

    Every writer keeps its output invisible until complete (written beside, then renamed), so
    after freeing space the same command continues from the last complete state.
    """


_NO_SPACE_TEXTS = ("no space left on device", "disk quota exceeded", "errno = 28")


def _no_space_path(error):
    """The path a no-space error names: `OSError.filename`, h5py's `filename = '...'`, or the
    `PATH; No space left on device` of TensorFlow's file systems; None when it names none."""
    import re

    filename = getattr(error, "filename", None)
    if filename:
        return str(filename)
    text = str(error)
    match = re.search(r"filename = '([^']+)'", text) or re.search(
        r"(\S+?)[;:,]? (?:No space left on device|Disk quota exceeded)", text
    )
    return match.group(1) if match else None


def disk_full(error):
    """A `DiskFullError` (one line naming the path) when `error`, or an error it was raised from,
    says the disk or quota is full; else None.

    The one place that recognises a full disk, whoever wrote: Python's `OSError(ENOSPC)`,
    h5py's `OSError` (Keras weight files), TensorFlow's `ResourceExhaustedError` from
    `tf.io.gfile`, `tf.train.Checkpoint` or `tf.saved_model.save`. `cli.main` turns it into
    exit code 2 instead of a traceback.
    """
    import errno

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, DiskFullError):
            return error
        text = str(error).lower()
        number = getattr(error, "errno", None)
        if number in (errno.ENOSPC, errno.EDQUOT) or any(t in text for t in _NO_SPACE_TEXTS):
            path = _no_space_path(error)
            where = f" writing {path}" if path else ""
            return DiskFullError(
                f"no space left on the device{where}: free some space and run the same "
                "command again (it continues from the last complete state; nothing "
                "incomplete is taken as done)"
            )
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
