"""Tiny configs and TensorBoard readers shared by the training tests."""

import glob
import os
import subprocess
import sys

import keras
import numpy as np
import tensorflow as tf

from benchmarks.common import free_ports  # noqa: F401 (the cluster tests take it from here)
from keras_transformer.config import from_dict


def tiny_config(workdir, **sections):
    """A seconds-long run on a few hundred synthetic pairs; `sections` override per key."""
    values = {
        "model": dict(num_layers=1, d_model=32, num_heads=2, d_ff=64, dropout=0.0),
        "data": dict(
            train="synthetic:split=train,size=300,max_words=8",
            dev="synthetic:split=dev,size=6,max_words=8",
            vocab_size=200,
            max_source_length=24,
            max_target_length=24,
            tokens_per_batch=384,
            bucket_boundaries=[12, 24],
        ),
        "train": dict(
            steps=8,
            warmup_steps=4,
            learning_rate_scale=3.0,
            steps_per_epoch=4,
            checkpoint_every=2,
            keep_checkpoints=2,
            log_every=1,
            eval_max_sentences=6,
        ),
        "decode": dict(beam_size=1, batch_size=8, max_extra_length=5),
        "runtime": dict(workdir=str(workdir), jit_compile=False),
        # Named: by default an export takes the workdir's name (a test's tmp_path).
        "export": dict(
            name="tiny",
            base_dir=os.path.join(str(workdir), "saved_models"),
            average_checkpoints=2,
        ),
    }
    for section, overrides in sections.items():
        values[section].update(overrides)
    return from_dict(values, name="tiny")


def read_scalars(logdir):
    """`{tag: [(step, value), ...]}` from every TensorBoard event file under `logdir`."""
    scalars = {}
    for path in sorted(
        glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True)
    ):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                plugin = value.metadata.plugin_data.plugin_name
                if plugin == "text":
                    scalars.setdefault(value.tag, []).append((event.step, None))
                    continue
                if plugin != "scalars":  # images, hparams
                    continue
                number = float(np.asarray(tf.make_ndarray(value.tensor)))
                scalars.setdefault(value.tag, []).append((event.step, number))
    for series in scalars.values():
        series.sort(key=lambda item: item[0])
    return scalars


# ------------------------------------------------------------------ subprocess runs of the CLI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RUNNER = os.path.join(HERE, "train_runner.py")


def tiny_yaml(workdir, **sections):
    """`tiny_config`'s values as a dict for a YAML file (for `keras-transformer train`)."""
    config = tiny_config(workdir, **sections)
    return config.to_dict()


def one_bucket_run_yaml(tmp_path, name, **train):
    """A seconds-long `keras-transformer train` run's YAML file, `(path, workdir)`: the tiny
    model, one length bucket (one step shape to compile), the final model the last checkpoint
    (`export.average_checkpoints=1`), and `train` as given."""
    workdir = tmp_path / name
    values = tiny_yaml(
        workdir, train=train, data=dict(bucket_boundaries=[24]), export=dict(average_checkpoints=1)
    )
    return write_yaml(tmp_path / f"{name}.yaml", values), workdir


def write_yaml(path, values):
    import yaml

    with open(path, "w") as f:
        yaml.safe_dump(values, f)
    return str(path)


def subprocess_env(**extra):
    """The environment of a test subprocess: this checkout first, quiet TensorFlow, no GPU."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra)
    return env


def cli_in_process(*argv, **environment):
    """`keras-transformer ARGV` run in this process, as `keras_transformer.cli.main` (no new
    TensorFlow import: a CLI subprocess spends seconds on it), with `environment` set in
    `os.environ` for the call only and no `KERAS_TRANSFORMER_SIGTERM_AT`: `(exit code, stdout,
    stderr)` of the call, what it printed to `sys.stdout` and `sys.stderr`. An argparse error
    (`SystemExit`) gives its exit code; Keras's dtype policy is restored after the call. For a
    command whose process boundary is not what the test checks (its signals, TensorFlow's C++
    log on descriptor 2, a variable read at import are: those stay subprocesses)."""
    import contextlib
    import io

    from keras_transformer import cli

    saved = {name: os.environ.get(name) for name in [*environment, "KERAS_TRANSFORMER_SIGTERM_AT"]}
    os.environ.pop("KERAS_TRANSFORMER_SIGTERM_AT", None)
    os.environ.update({name: str(value) for name, value in environment.items()})
    policy = keras.config.dtype_policy()
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main([str(arg) for arg in argv])
            except SystemExit as e:  # argparse: usage errors exit 2, --version/--help 0
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        keras.config.set_dtype_policy(policy)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return code, out.getvalue(), err.getvalue()


def call_in_runner(target, *args, logical_cpus=2, timeout=300):
    """Runs `module:function` of the tests in a fresh `train_runner.py` process with
    `logical_cpus` logical CPU devices (for MirroredStrategy on a CPU); returns the
    `subprocess.CompletedProcess` (stdout and stderr captured as text)."""
    command = [sys.executable, RUNNER, "--logical-cpus", str(logical_cpus), "--call", target]
    return subprocess.run(
        command + [str(arg) for arg in args],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class RecordRate(keras.callbacks.Callback):
    """Records the optimizer's learning rate at the start of every training batch."""

    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(self.model.optimizer.learning_rate))


def files_under(root):
    """Every file under `root`, as sorted paths relative to it."""
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            found.append(os.path.relpath(os.path.join(directory, name), root))
    return sorted(found)


def load_npz_weights(path):
    data = np.load(path)
    count = sum(key.startswith("w") for key in data.files)
    return [data[f"w{i}"] for i in range(count)], data


def assert_one_run_in_workdir(workdir, name="tiny", exported=True):
    """Exactly one vocabulary, one set of step checkpoints, one resume directory and one export
    (version 1; none when not `exported`); returns the file list."""
    files = files_under(workdir)
    # One vocabulary: WORKDIR/spm.model, and the prepared data's own copy of the same file.
    vocabularies = [f for f in files if f.endswith("spm.model")]
    assert sorted(vocabularies) == ["prepared/spm.model", "spm.model"], files
    contents = set()
    for f in vocabularies:
        with open(os.path.join(workdir, f), "rb") as handle:
            contents.add(handle.read())
    assert len(contents) == 1, "two different vocabularies"
    assert [f for f in files if f.endswith("manifest.json")] == ["prepared/manifest.json"], files
    assert [f for f in files if f.endswith("config.yaml")] == ["config.yaml"], files
    checkpoint_dirs = {os.path.dirname(f) for f in files if ".weights.h5" in f}
    assert checkpoint_dirs == {"checkpoints"}, files
    assert not [f for f in files if os.path.basename(f).startswith(".tmp")], files
    backups = {os.path.dirname(f) for f in files if os.path.basename(f) == "checkpoint"}
    assert backups == {"backup"}, files
    model_dir = os.path.join("saved_models", name)
    exports = {f.split(os.sep)[2] for f in files if f.startswith(model_dir)}
    assert exports == ({"1"} if exported else set()), files
    return files
