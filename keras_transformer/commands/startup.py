"""TensorFlow imported without its C++ start-up log (`import_tensorflow`): the commands that
need TensorFlow call it first, unless `--verbose` asks for the log."""

import os
import sys
import tempfile


def import_tensorflow(verbose=False):
    """Imports TensorFlow (and tensorflow-text) without its C++ start-up log, unless asked.

    TensorFlow's native libraries log to file descriptor 2 while they load and probe devices:
    oneDNN notices, "Could not find cuda drivers" and, on machines without a GPU, an alarming
    `E0000 ... failed call to cuInit` line. Some of them come from absl before its logging is
    initialised and ignore `TF_CPP_MIN_LOG_LEVEL`, so the only way to keep them off the user's
    terminal is to point descriptor 2 elsewhere while TensorFlow loads and finds its devices.
    Nothing is hidden when `verbose` is set or the user chose their own `TF_CPP_MIN_LOG_LEVEL`;
    if the import itself fails, what was logged is written out after all.

    Args:
        verbose: keep TensorFlow's logs (`--verbose`).

    Returns:
        The `tensorflow` module.
    """
    if verbose or "TF_CPP_MIN_LOG_LEVEL" in os.environ or "tensorflow" in sys.modules:
        import tensorflow as tf

        return tf
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # and later C++ messages below ERROR
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            import tensorflow as tf
            import tensorflow_text  # noqa: F401  (loads its kernels: more start-up lines)

            tf.config.list_logical_devices()  # device probing (the cuInit line) happens here
        except BaseException:
            os.dup2(saved, 2)
            log.seek(0)
            sys.stderr.write(log.read().decode("utf-8", errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    return tf
