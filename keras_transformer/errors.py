"""The package's errors: one base class that the `keras-transformer` command reports as one line.

This module imports nothing from the package, so every module can raise these without import
circles. The command line catches `KerasTransformerError` (and `FileNotFoundError`), prints its
first line and exits with code 2; anything else is a bug and keeps its traceback.
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


# The exit code of `keras-transformer train` stopped by SIGTERM or SIGINT after saving its resume
# state and a step checkpoint: sysexits.h's EX_TEMPFAIL ("a temporary failure; the user is
# invited to retry"). A job scheduler should run the same command again (which resumes exactly),
# and not count it as a failure: it is neither 0 (done), 1 (a crash), 2 (bad input) nor 128+N
# (killed by signal N before anything was saved).
PREEMPTED_EXIT_CODE = 75


class Preempted(Exception):
    """Training stopped on a signal (SIGTERM or SIGINT, to this process or, under several
    workers, to any of them) after finishing its step and saving its resume state and a step
    checkpoint; running the same command again resumes exactly. `keras-transformer train`
    prints the message and exits with `PREEMPTED_EXIT_CODE`.

    Args:
        message: the one line to print.
        step: the optimizer step saved.
    """

    def __init__(self, message, step):
        super().__init__(message)
        self.step = step
