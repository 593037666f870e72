"""`tf.io.gfile` where TensorFlow is installed, else the same calls on the local disk only.

The workdir's helpers (`workdir`, `integrity`) go through `gfile()`: with TensorFlow every
TensorFlow filesystem (`gs://...`) works, as before; without it (a JAX machine) local paths do,
so the JAX engine writes the same checkpoints, checksums and results as the TensorFlow one.
"""

import os
import shutil


class LocalGfile:
    """The subset of `tf.io.gfile` the package uses, on local paths."""

    GFile = staticmethod(open)
    exists = staticmethod(os.path.exists)
    isdir = staticmethod(os.path.isdir)
    listdir = staticmethod(os.listdir)
    walk = staticmethod(os.walk)
    remove = staticmethod(os.remove)
    rmtree = staticmethod(shutil.rmtree)
    glob = staticmethod(lambda pattern: __import__("glob").glob(pattern))

    @staticmethod
    def stat(path):
        """`tf.io.gfile.stat`'s fields: `length` (bytes), `mtime_nsec`, `is_directory`."""
        import types

        found = os.stat(path)
        return types.SimpleNamespace(
            length=found.st_size, mtime_nsec=found.st_mtime_ns, is_directory=os.path.isdir(path)
        )

    @staticmethod
    def makedirs(path):
        os.makedirs(path, exist_ok=True)

    @staticmethod
    def copy(source, destination, overwrite=False):
        if not overwrite and os.path.exists(destination):
            raise FileExistsError(destination)
        shutil.copyfile(source, destination)

    @staticmethod
    def rename(source, destination, overwrite=False):
        if not overwrite and os.path.exists(destination):
            raise FileExistsError(destination)
        os.replace(source, destination)


def gfile():
    """`tf.io.gfile`, or `LocalGfile` where TensorFlow cannot be imported."""
    try:
        import tensorflow as tf
    except ImportError:
        return LocalGfile
    return tf.io.gfile


def not_found_errors():
    """The errors a missing or unreadable file raises through `gfile()`."""
    try:
        import tensorflow as tf
    except ImportError:
        return (FileNotFoundError, PermissionError)
    return (tf.errors.NotFoundError, tf.errors.PermissionDeniedError)
