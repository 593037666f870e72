"""Runs a `keras-transformer` command, or a test function, after test-only setup (a subprocess).

Usage:
    python train_runner.py [--logical-cpus N] [--dump-weights PATH] -- train --config ...
    python train_runner.py [--logical-cpus N] --call MODULE:FUNCTION [ARG ...]

`--logical-cpus N` splits the CPU into N logical devices before TensorFlow starts, so that
`runtime.strategy: mirrored` has N replicas. `--sigterm-at-step N` makes the process send
itself SIGTERM at the end of training step N (a preemption at a known step, without a test that
sleeps and polls); `--take-over-lock-at-step N` hands the workdir's lock to another run after
step N (as a run that found this one stalled takes it over) and waits until this run has seen
it; `--skip-export` leaves out the SavedModel export at the end of `train` (for tests about
training alone: the export takes seconds). `--wait-for PATH` imports everything,
then waits until PATH exists before it runs the command (a process started ahead, whose imports
overlap other work, that touches nothing until then). `--dump-weights PATH` writes, after the
command, the trained model's weights and whether every local replica holds the same copy (npz),
so that tests can compare workers (or JAX processes); it is the harness's file, not one the
product writes.
`--count-records PATH` counts the records that every `tf.data.TFRecordDataset` reads and writes
`{"records": N}` to PATH when the process ends (what a restart reads again). `--call`
imports MODULE from this directory and calls FUNCTION(*ARGS); its exit code is 0 on return.
"""

import argparse
import importlib
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _split_cpu(count):
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * count
    )


def _dump(model, strategy, path):
    import numpy as np

    arrays = {f"w{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}
    # TensorFlow: each local replica's copy; the JAX engine holds one (replicated) array.
    local_results = getattr(strategy, "experimental_local_results", lambda value: [value])
    copies = [[np.asarray(c) for c in local_results(v.value)] for v in model.trainable_variables]
    arrays["local_copies"] = np.asarray(len(copies[0]))
    arrays["local_copies_equal"] = np.asarray(
        all(np.array_equal(c[0], other) for c in copies for other in c[1:])
    )
    arrays["iterations"] = np.asarray(int(model.optimizer.iterations.numpy()))
    np.savez(path, **arrays)


def _sigterm_at_step(step):
    """Adds, first in `train`'s callbacks, one that sends this process SIGTERM after `step`."""
    import signal

    import keras

    from keras_transformer.training.run import fitting
    from keras_transformer.training.run.callbacks import optimizer_step

    class SigtermAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if optimizer_step(self.model) == step:
                os.kill(os.getpid(), signal.SIGTERM)

    original = fitting.make_callbacks

    def callbacks(*args):
        stopper, signals, found = original(*args)
        return stopper, signals, [SigtermAt(), *found]

    fitting.make_callbacks = callbacks


def _take_over_lock_at_step(step):
    """Adds, first in `train`'s callbacks, one that hands the workdir's lock to another run
    after `step`, as a run that found this one stalled would take it over: the other run's
    `lock.json` and a checkpoint of its own (`checkpoints/ckpt-1000000.weights.h5`), written in
    place; then it waits until this process's lock renewal has seen the takeover (the stop
    flag is up)."""
    import json

    import keras

    from keras_transformer import stopping
    from keras_transformer.training.run import fitting
    from keras_transformer.training.run.callbacks import optimizer_step

    class TakeOverAt(keras.callbacks.Callback):
        def __init__(self, root):
            super().__init__()
            self.root = root

        def on_train_batch_end(self, batch, logs=None):
            if optimizer_step(self.model) != step:
                return
            holder = dict(host="another-machine", pid=4242, command="train", started="now",
                          token="new", lease_seconds=600, renewed=time.time())  # fmt: skip
            with open(os.path.join(self.root, "lock.json"), "w") as f:
                json.dump(holder, f)
            with open(os.path.join(self.root, "checkpoints", "ckpt-1000000.weights.h5"), "w") as f:
                f.write("the new holder's")
            deadline = time.monotonic() + 120
            while stopping.received() is None and time.monotonic() < deadline:
                time.sleep(0.01)

    original = fitting.make_callbacks

    def callbacks(run, *args):
        os.makedirs(run.layout.checkpoints, exist_ok=True)
        stopper, signals, found = original(run, *args)
        return stopper, signals, [TakeOverAt(run.layout.root), *found]

    fitting.make_callbacks = callbacks


def _count_records(path):
    """Makes every `tf.data.TFRecordDataset` count the records it reads; the count goes to
    `path` (JSON) when the process exits."""
    import atexit
    import json
    import threading

    import tensorflow as tf

    real, lock, count = tf.data.TFRecordDataset, threading.Lock(), [0]

    def note(record):
        with lock:
            count[0] += 1
        return record

    def counted(filenames, **kwargs):
        def log(record):
            record = tf.py_function(note, [record], tf.string)
            record.set_shape([])
            return record

        return real(filenames, **kwargs).map(log)

    def write():
        with open(path, "w") as f:
            json.dump({"records": count[0]}, f)

    tf.data.TFRecordDataset = counted
    atexit.register(write)


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--logical-cpus", type=int, default=0)
    parser.add_argument("--dump-weights")
    parser.add_argument("--call")
    parser.add_argument("--sigterm-at-step", type=int)
    parser.add_argument("--take-over-lock-at-step", type=int)
    parser.add_argument("--skip-export", action="store_true")
    parser.add_argument("--wait-for")
    parser.add_argument("--count-records")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if args.logical_cpus:
        _split_cpu(args.logical_cpus)
    if args.count_records:
        _count_records(args.count_records)
    if args.call:
        sys.path.insert(0, HERE)
        module, function = args.call.split(":")
        getattr(importlib.import_module(module), function)(*rest)
        return 0

    from keras_transformer import cli
    from keras_transformer.training.run import finish, fitting

    captured = {}
    original_fit = fitting.fit

    def fit(run, model, data):
        captured.update(model=model, strategy=run.strategy)
        return original_fit(run, model, data)

    fitting.fit = fit
    if args.sigterm_at_step:
        _sigterm_at_step(args.sigterm_at_step)
    if args.take_over_lock_at_step:
        _take_over_lock_at_step(args.take_over_lock_at_step)
    if args.skip_export:
        finish.export = lambda *args, **kwargs: None
    while args.wait_for and not os.path.exists(args.wait_for):
        time.sleep(0.02)
    code = cli.main(rest)
    if args.dump_weights and "model" in captured and code == 0:
        _dump(captured["model"], captured["strategy"], args.dump_weights)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
