"""TensorFlow's C++ start-up log kept off the terminal: `quiet_tensorflow_import`, which the CLI
calls once before a command runs, makes the process's first import of TensorFlow a quiet one,
whichever module imports it (Keras's TensorFlow backend, the export package, the evaluation);
`import_tensorflow` is that import for the commands that need TensorFlow."""

import importlib.abc
import os
import sys
import tempfile

# What logs to file descriptor 2 while it loads (TensorFlow's native libraries, twice: two of
# them initialise absl's logging); tensorflow-text's kernels are loaded by its import.
_NOISY_MODULES = ("tensorflow", "tensorflow_text")


def quiet_tensorflow_import(verbose=False):
    """Keeps TensorFlow's C++ start-up log off the terminal, whoever imports TensorFlow.

    TensorFlow's native libraries log to file descriptor 2 while they load: oneDNN notices,
    "Could not find cuda drivers", CPU instruction notes, absl's "All log messages before
    absl::InitializeLog() is called are written to STDERR". They come from absl before its
    logging is initialised and ignore `TF_CPP_MIN_LOG_LEVEL`, so the only way to keep them off
    the user's terminal is to point descriptor 2 elsewhere while the module loads. This installs
    an import hook that does so for the first import of `tensorflow` (and of `tensorflow_text`),
    wherever it happens, and sets `TF_CPP_MIN_LOG_LEVEL=3` for what TensorFlow logs afterwards
    (the ERROR-level `failed call to cuInit` line of a machine without a GPU, which a level of 2
    or less still prints; the runtime's notes). Nothing is imported here: a command that never
    needs TensorFlow (a LiteRT export, the JAX backend) does not load it. If the import fails,
    what was logged is written out after all.

    The user's own `TF_CPP_MIN_LOG_LEVEL` does not turn this off: the usual way to quiet
    TensorFlow (`TF_CPP_MIN_LOG_LEVEL=2`) would otherwise let the start-up log through. Nothing
    is hidden, and the user's level is left as it is, when `verbose` is set (`--verbose`);
    nothing is hidden either when TensorFlow is already loaded.

    Args:
        verbose: keep TensorFlow's logs.

    Returns:
        True when the import hook was installed.
    """
    if verbose or "tensorflow" in sys.modules:
        return False
    # Later C++ messages below FATAL, whatever level the user chose (theirs shows through
    # --verbose).
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if not any(isinstance(finder, _QuietFirstImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietFirstImport())
    return True


def import_tensorflow(verbose=False):
    """Imports TensorFlow (and tensorflow-text) without its C++ start-up log, unless asked
    (`quiet_tensorflow_import`).

    Args:
        verbose: keep TensorFlow's logs (`--verbose`).

    Returns:
        The `tensorflow` module.
    """
    quiet_tensorflow_import(verbose)
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the ops the SavedModels use)

    return tf


class _QuietFirstImport(importlib.abc.MetaPathFinder):
    """Finds `_NOISY_MODULES` as the other finders do, with a loader that runs them quietly;
    it leaves `sys.meta_path` once each was found."""

    def __init__(self):
        self.pending = set(_NOISY_MODULES)

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending:
            return None
        self.pending.discard(name)
        others = [finder for finder in sys.meta_path if finder is not self]
        if not self.pending:
            sys.meta_path.remove(self)
        for finder in others:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _QuietLoader(spec.loader)
                return spec
        return None


class _QuietLoader(importlib.abc.Loader):
    """A module's own loader, its `exec_module` run with descriptor 2 pointed at a file."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):  # resource readers and the like: the module's own loader
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile() as log:
            os.dup2(log.fileno(), 2)
            try:
                self.loader.exec_module(module)
            except BaseException:
                os.dup2(saved, 2)
                log.seek(0)
                sys.stderr.write(log.read().decode("utf-8", errors="replace"))
                raise
            finally:
                os.dup2(saved, 2)
                os.close(saved)
