"""Distribution strategies chosen by name, XLA and mixed-precision settings of `runtime`."""

import hashlib
import json
import os
import shutil
import tempfile
import time

import tensorflow as tf

from keras_transformer.errors import ConfigError, WorkerError
from keras_transformer.models._train_step import _is_multi_worker


def _tf_config_workers():
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    except ValueError:
        raise ConfigError("TF_CONFIG is not valid JSON") from None
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def get_strategy(runtime_config):
    """Returns the `tf.distribute.Strategy` named by `runtime.strategy`.

    - `default`: the no-op default strategy (one device).
    - `mirrored`: `MirroredStrategy` over all local GPUs (or the logical CPUs when there are
      none).
    - `multi_worker`: `MultiWorkerMirroredStrategy`; the cluster comes from `TF_CONFIG`.
    - `tpu`: `TPUStrategy` on `runtime.tpu` ('' = the local TPU / the one the environment names).
    - `auto`: multi_worker when `TF_CONFIG` lists several workers, else tpu when a TPU is found,
      else mirrored with several GPUs, else default.

    Must be called before TensorFlow initialises its devices in some cases (multi-worker, TPU);
    the trainer calls it first.
    """
    name = runtime_config.strategy
    if name == "auto":
        if _tf_config_workers() > 1:
            name = "multi_worker"
        elif runtime_config.tpu or os.environ.get("TPU_NAME") or _has_local_tpu():
            name = "tpu"
        elif len(tf.config.list_logical_devices("GPU")) > 1:
            name = "mirrored"
        else:
            name = "default"
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        # All local GPUs; without GPUs, every logical CPU device (one unless the process split
        # its CPU into several with tf.config.set_logical_device_configuration, as tests do).
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        return tf.distribute.MirroredStrategy([device.name for device in devices])
    if name == "multi_worker":
        timeout = getattr(runtime_config, "collective_timeout_seconds", None)
        # A bounded collective: when a peer dies, the others fail within `timeout` seconds
        # instead of waiting in the all-reduce forever.
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=float(timeout) if timeout else None
        )
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if name == "tpu":
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=runtime_config.tpu)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, tf.errors.NotFoundError) as e:
            raise ConfigError(f"runtime.strategy=tpu: no TPU found ({e})") from None
        return tf.distribute.TPUStrategy(resolver)
    raise ConfigError(f"runtime.strategy: unknown strategy {name!r}")


def _has_local_tpu():
    return bool(tf.config.list_logical_devices("TPU"))


def device_kind(strategy=None):
    """'tpu', 'gpu' or 'cpu': the kind of device the replicas run on."""
    if strategy is not None and type(strategy).__name__.startswith("TPUStrategy"):
        return "tpu"
    if tf.config.list_logical_devices("TPU"):
        return "tpu"
    if tf.config.list_logical_devices("GPU"):
        return "gpu"
    return "cpu"


def resolve_jit_compile(value, strategy=None):
    """`runtime.jit_compile` as a bool: `auto` compiles with XLA on GPUs and TPUs only.

    On CPUs XLA does not pay: measured on a 2-core CPU with the quickstart model, steps were
    slower with XLA than without, after a long compile of each bucket shape (the figures are in
    docs/guides/performance.md); so `auto` leaves it off there.
    """
    if value == "auto":
        return device_kind(strategy) in ("gpu", "tpu")
    return bool(value)


def is_chief(strategy=None):
    """True in the process that writes checkpoints, logs and exports (worker 0 or the chief)."""
    try:
        config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    except ValueError:
        return True
    task = config.get("task") or {}
    cluster = config.get("cluster") or {}
    if not task or not cluster:
        return True
    if "chief" in cluster:
        return task.get("type") == "chief"
    return task.get("type") == "worker" and int(task.get("index", 0)) == 0


def task_index():
    """This worker's index among the workers of `TF_CONFIG` (0 without a cluster)."""
    try:
        config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    except ValueError:
        return 0
    return int((config.get("task") or {}).get("index", 0))


def is_multi_worker(strategy):
    """True for a `MultiWorkerMirroredStrategy` spanning several workers (processes)."""
    return _is_multi_worker(strategy)


def wait_for_path(path, seconds, what="file", poll=0.5):
    """Waits until `path` exists (the chief writes it atomically); bounded.

    Non-chief workers read what the chief makes (the vocabulary, a prepared dataset's manifest)
    instead of making it themselves.

    Args:
        path: the file or directory to wait for.
        seconds: give up after this long.
        what: what the path is, for the error message.
        poll: seconds between looks.

    Returns:
        `path`.

    Raises:
        WorkerError: `path` did not appear within `seconds` (one line, naming it).

    Example:
    ```python
    wait_for_path(Workdir(root).spm, config.runtime.wait_seconds, "vocabulary")
    ```
    """
    deadline = time.monotonic() + float(seconds)
    while not tf.io.gfile.exists(path):
        if time.monotonic() >= deadline:
            raise WorkerError(
                f"waited {float(seconds):g} s for the chief's {what} {path}, which never came "
                "(is the chief running? runtime.wait_seconds sets the wait)"
            )
        time.sleep(poll)
    return path


def make_agreement(strategy):
    """A function `value -> float` that every worker calls at the same point and that returns the
    same answer everywhere: the value the chief passed (an all-reduce in which only the first
    replica, the chief's, contributes).

    Under one process (default, mirrored, TPU) it returns the value itself at no cost. The
    trainer uses it for the time budget: only the chief's clock counts, so every worker stops
    after the same step, instead of at its own moment (which would leave the others waiting in
    the next all-reduce), and uses the same budget-aware learning rate.
    """
    if not is_multi_worker(strategy):
        return float

    @tf.function
    def chief_value(value):
        def replica_fn():
            context = tf.distribute.get_replica_context()
            first = tf.equal(context.replica_id_in_sync_group, 0)
            # A copy on this replica's device (the collective needs one to reduce onto).
            local = tf.where(first, tf.identity(value), tf.zeros_like(value))
            return context.all_reduce(tf.distribute.ReduceOp.SUM, local)

        return strategy.run(replica_fn)

    def agree(value):
        total = chief_value(tf.constant(float(value), tf.float64))
        return float(strategy.experimental_local_results(total)[0])

    return agree


class WorkerTempDir:
    """A directory of this worker's own for files that TensorFlow's multi-worker guide has
    every worker write (checkpoints), which only the chief keeps: a non-chief worker writes into
    a temporary directory and deletes it when done. Its name is fixed per workdir and worker
    index, so a worker restarted after being killed (which could not clean up) reclaims it.

    Args:
        chief: True in the chief, which writes to `directory` itself.
        directory: the chief's directory (e.g. `WORKDIR/backup`).

    Example:
    ```python
    with WorkerTempDir(chief=False, directory=Workdir(root).backup) as directory:
        manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=1)
    ```
    """

    def __init__(self, chief, directory):
        self.chief = chief
        self.directory = directory
        self._temp = None

    def __enter__(self):
        if self.chief:
            return self.directory
        key = hashlib.sha1(os.path.abspath(self.directory).encode("utf-8")).hexdigest()[:12]
        self._temp = os.path.join(
            tempfile.gettempdir(), f"keras-transformer-{key}-worker{task_index()}"
        )
        shutil.rmtree(self._temp, ignore_errors=True)  # a killed predecessor's
        os.makedirs(self._temp)
        return self._temp

    def __exit__(self, *exc):
        if self._temp:
            shutil.rmtree(self._temp, ignore_errors=True)
        return False
