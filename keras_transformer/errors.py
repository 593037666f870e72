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
