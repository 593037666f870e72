"""The distribution strategy chosen by name (`runtime.strategy`), and the workers' coordination:
which one is the chief, its heartbeat while the others wait for its files, their temporary
directories. What the trainer does differently under each strategy is the strategy's input object
(`training.engines.strategies`)."""

import hashlib
import json
import os
import shutil
import tempfile
import time

import tensorflow as tf

from keras_transformer.errors import ConfigError, WorkerError


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


# The chief's heartbeat while it prepares: a beat every HEARTBEAT_SECONDS; a waiting worker that
# sees no new beat for HEARTBEAT_TIMEOUT seconds takes the chief for dead (within a minute).
HEARTBEAT_SECONDS = 5.0
HEARTBEAT_TIMEOUT = 45.0
# Seconds between a waiting worker's "still waiting" lines.
WAITING_LINE_SECONDS = 30.0


class Heartbeat:
    """A background thread that rewrites `path` (any filesystem) every `interval` seconds with
    a growing beat count while the block runs (the chief's `prepare`), then removes it: workers
    waiting for the chief's files see that it is alive (`wait_for_path(heartbeat=...)`). Beats
    are compared by content, not by clock, so machines' clocks need not agree.

    Example:
    ```python
    with Heartbeat(os.path.join(workdir, "prepare.heartbeat")):
        prepare(config)
    ```
    """

    def __init__(self, path, interval=HEARTBEAT_SECONDS):
        import threading

        self.path, self.interval = path, float(interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def _beat(self, count):
        record = {"beat": count, "pid": os.getpid(), "host": os.uname().nodename}
        with tf.io.gfile.GFile(self.path, "w") as f:
            f.write(json.dumps(record))

    def _run(self):
        count = 1
        while not self._stop.wait(self.interval):
            count += 1
            try:
                self._beat(count)
            except (OSError, tf.errors.OpError):
                pass  # a missed beat; the next one may pass

    def __enter__(self):
        self._beat(1)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        try:
            tf.io.gfile.remove(self.path)
        except tf.errors.OpError:
            pass
        return False


def _read_beat(path):
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            return f.read()
    except tf.errors.OpError:
        return None


def wait_for_path(
    path, seconds, what="file", poll=0.5, heartbeat=None, heartbeat_timeout=HEARTBEAT_TIMEOUT
):
    """Waits until `path` exists (the chief writes it atomically); bounded.

    Non-chief workers read what the chief makes (the vocabulary, a prepared dataset's manifest)
    instead of making it themselves. With `heartbeat` (the file of the chief's `Heartbeat`) it
    prints a line every 30 s saying how the chief is, and gives up as soon as no new beat came
    for `heartbeat_timeout` seconds (a dead chief fails the worker within a minute, not after
    `seconds`).

    Args:
        path: the file or directory to wait for.
        seconds: give up after this long.
        what: what the path is, for the error message.
        poll: seconds between looks.
        heartbeat: the chief's heartbeat file, or None.
        heartbeat_timeout: seconds without a new beat after which the chief is taken for dead.

    Returns:
        `path`.

    Raises:
        WorkerError: `path` did not appear within `seconds`, or the chief's heartbeat stopped
            (one line, naming it).

    Example:
    ```python
    wait_for_path(Workdir(root).spm, config.runtime.wait_seconds, "vocabulary")
    ```
    """
    started = last_line = last_change = time.monotonic()
    deadline, beat = started + float(seconds), None
    while not tf.io.gfile.exists(path):
        now = time.monotonic()
        if now >= deadline:
            raise WorkerError(
                f"waited {float(seconds):g} s for the chief's {what} {path}, which never came "
                "(is the chief running? runtime.wait_seconds sets the wait)"
            )
        if heartbeat is not None:
            current = _read_beat(heartbeat)
            if current != beat:
                beat, last_change = current, now
            if now - last_change >= heartbeat_timeout:
                raise WorkerError(
                    f"the chief stopped: no heartbeat in {heartbeat} for {heartbeat_timeout:g} s "
                    f"while waiting for its {what}; restart every worker with the same command"
                )
            if now - last_line >= WAITING_LINE_SECONDS:
                last_line = now
                print(
                    f"waiting for the chief's {what} ({now - started:.0f} s; chief alive, last "
                    f"heartbeat {now - last_change:.0f} s ago)",
                    flush=True,
                )
        time.sleep(poll)
    return path


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
