"""Training where cluster users train: a workdir and an export on a filesystem that is not the
local disk (TensorFlow's `ram://`), with nothing written locally."""

import gc
import importlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from training_helpers import RUNNER, call_in_runner, files_under, subprocess_env


@pytest.mark.scenario(
    slow="a `train` and an `export` process under a RAM file system, each importing TensorFlow"
)
def test_train_and_export_on_ram_filesystem_write_nothing_locally(tmp_path):
    cwd, tmp, home = tmp_path / "cwd", tmp_path / "tmp", tmp_path / "home"
    for directory in (cwd, tmp, home):
        directory.mkdir()
    report = tmp_path / "report.json"
    command = [sys.executable, RUNNER, "--call", "cluster_runs:train_on_ram", str(report)]
    run = subprocess.run(
        command,
        cwd=cwd,
        env=subprocess_env(
            TMPDIR=str(tmp),
            HOME=str(home),
            # Caches of libraries (not ours) that would otherwise go under HOME.
            KERAS_HOME=str(tmp_path / "keras"),
            MPLCONFIGDIR=str(tmp_path / "matplotlib"),
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    with open(report) as f:
        found = json.load(f)
    result, written = found["result"], found["written"]
    assert result["step"] == 8 and result["saved_model"].startswith("ram://cluster/saved_models/")
    assert result["test"]["sentences"] == 4
    work = "ram://cluster/work"
    for name in ("config.yaml", "spm.model", "result.json", "prepared/manifest.json"):
        assert f"{work}/{name}" in written, written
    assert any(p.startswith(f"{work}/prepared/train-") for p in written), written
    assert f"{work}/checkpoints/ckpt-8.weights.h5" in written, written
    assert f"{work}/backup/checkpoint" in written, written
    assert any(p.startswith(f"{work}/logs/train/events.out.tfevents") for p in written), written
    assert f"{result['saved_model']}/saved_model.pb" in written, written
    assert isinstance(found["translation"], str)
    assert "ram://cluster/exports/tiny/1/saved_model.pb" in written, written
    assert "ram://cluster/ct2/model.bin" in written and "ram://cluster/ct2/spm.model" in written
    # Nothing on the local disk: the process's cwd, TMPDIR and HOME stay empty.
    assert files_under(cwd) == [] and files_under(tmp) == [] and files_under(home) == []


@pytest.fixture(scope="module")
def tiny_prepared(_shared_root):
    """A workdir prepared once with the tiny configs' data (`training_helpers.tiny_config` and
    `test_cli_train.TINY` share it): `_copy_prepared` puts it in the workdirs of the tests
    instead of each run preparing its own."""
    from shared_runs import shared_directory
    from training_helpers import tiny_config

    from keras_transformer.data.prepare import prepare

    # Prepared once per run, shared by the workers (the tests copy it).
    return shared_directory(_shared_root, "tiny_prepared",
                            lambda root: prepare(tiny_config(root), verbose=False))  # fmt: skip


def _copy_prepared(prepared_root, workdir):
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(prepared_root / "prepared", workdir / "prepared")
    shutil.copy(prepared_root / "spm.model", workdir / "spm.model")
    return workdir


def _resume_config(tmp_path):
    from test_cli_train import TINY, _write_config

    values = {
        **TINY,
        "model": {**TINY["model"], "dropout": 0.1},
        "train": dict(
            TINY["train"], steps=16, steps_per_epoch=10, checkpoint_every=4, keep_checkpoints=3
        ),
    }
    return _write_config(tmp_path / "tiny.yaml", values)


def _reference_run(config_path, workdir):
    """The uninterrupted run, in this process (without the export at its end)."""
    from keras_transformer.config import load_config
    from keras_transformer.training import train
    from keras_transformer.training.run import finish

    reference = load_config(str(config_path), overrides=[f"runtime.workdir={workdir}"])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(finish, "export", lambda *args, **kwargs: None)
        assert train(reference)["step"] == 16


def _assert_same_weights(path, reference_path):
    from test_cli_train import _h5_arrays

    final, expected = _h5_arrays(path), _h5_arrays(reference_path)
    assert final.keys() == expected.keys() and final
    for name, value in final.items():
        np.testing.assert_allclose(value, expected[name], atol=1e-4, err_msg=name)


def _runner_train(config, workdir, *harness):
    """`keras-transformer train` through the test harness (`harness`: its options), without
    the export at the end."""
    command = [sys.executable, RUNNER, "--skip-export", *harness, "--", "train"]
    return command + ["--config", str(config), "--workdir", str(workdir)]


def _stopped_step(code, output):
    """The step of the one `stopped by ... after step N` line of a process that exited 75."""
    from keras_transformer.errors import PREEMPTED_EXIT_CODE

    assert code == PREEMPTED_EXIT_CODE == 75, output[-3000:]
    lines = [line for line in output.splitlines() if "keras-transformer train: " in line]
    assert len(lines) == 1 and "Traceback" not in output, output[-3000:]
    assert "stopped by " in lines[0], lines
    return int(lines[0].split("after step ")[1].split(":")[0])


@pytest.mark.scenario
def test_sigterm_saves_exits_75_and_the_same_command_resumes_exactly(tmp_path, tiny_prepared):
    """SIGTERM mid-run (the process sends it itself at step 6, see `train_runner.py`): the step
    in progress ends, the resume state and a checkpoint of that step are saved, one line, exit
    code 75; the same command resumes to the uninterrupted run's losses and weights."""
    from test_cli_train import _losses_by_step

    config = _resume_config(tmp_path)
    workdir = _copy_prepared(tiny_prepared, tmp_path / "work")
    go = tmp_path / "go"
    pipes = dict(env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process = subprocess.Popen(_runner_train(config, workdir, "--sigterm-at-step", "6"), **pipes)
    # The same command again, started now: it imports meanwhile, then waits for `go`.
    resumed = subprocess.Popen(_runner_train(config, workdir, "--wait-for", str(go)), **pipes)
    try:
        # The uninterrupted run meanwhile, here.
        _reference_run(config, _copy_prepared(tiny_prepared, tmp_path / "reference"))
        out, err = process.communicate(timeout=300)
        step = _stopped_step(process.returncode, err)
        assert step == 6 and "stopped by SIGTERM after step 6" in err
        # The resume state and the checkpoint are those of the step it stopped at.
        assert tf.train.latest_checkpoint(str(workdir / "backup")).endswith(f"ckpt-{step}")
        assert (workdir / "checkpoints" / f"ckpt-{step}.weights.h5").exists()
        assert not (workdir / "result.json").exists()
        go.touch()
        out, err = resumed.communicate(timeout=300)
    finally:
        for started in (process, resumed):
            if started.poll() is None:
                started.kill()
    assert resumed.returncode == 0, err[-3000:]
    assert f"resuming from step {step} " in out, out[-2000:]
    expected = _losses_by_step(tmp_path / "reference" / "logs")
    got = {s: v for s, v in _losses_by_step(workdir / "logs").items() if s > step}
    assert sorted(got) == list(range(step + 1, 17))
    for s in got:
        np.testing.assert_allclose(got[s], expected[s], atol=1e-4, err_msg=f"step {s}")
    _assert_same_weights(
        workdir / "checkpoints" / "ckpt-16.weights.h5",
        tmp_path / "reference" / "checkpoints" / "ckpt-16.weights.h5",
    )
    # The preemption's off-schedule checkpoint went once training went on: the checkpoints kept
    # (and averaged into the export) are the uninterrupted run's.
    kept = sorted(p.name for p in (workdir / "checkpoints").iterdir())
    assert kept == sorted(p.name for p in (tmp_path / "reference" / "checkpoints").iterdir())


@pytest.mark.scenario(slow="two two-worker clusters: four TensorFlow processes")
def test_sigterm_to_one_of_two_workers_stops_both_after_one_step_and_they_resume_exactly(
    tmp_path, tiny_prepared
):
    """MultiWorkerMirroredStrategy: SIGTERM to the second worker only (it sends it itself at
    step 7); both save after that step (each its data iterator too) and exit 75 with one line
    each; the same two commands resume from that step to the weights of an uninterrupted pair,
    each worker restoring its iterator: it does not read the records before the position."""
    from test_training_multi_worker import Workers, _assert_finished_alike, _config
    from training_helpers import free_ports, load_npz_weights

    def counting(name, index):
        return ["--count-records", str(tmp_path / f"records-{name}{index}.json")]

    def records(name, index):
        with open(tmp_path / f"records-{name}{index}.json") as f:
            return json.load(f)["records"]

    # Four processes at once on a small machine: collectives may wait on a busy peer longer.
    runtime = dict(collective_timeout_seconds=120)
    reference_root = tmp_path / "reference"
    reference_root.mkdir()
    reference_work = _copy_prepared(tiny_prepared, reference_root / "work")
    reference_config = _config(reference_root, reference_work, False, runtime, steps=12)
    reference = Workers(reference_root, reference_config, reference_work)
    workdir = _copy_prepared(tiny_prepared, tmp_path / "work")
    workers = Workers(tmp_path, _config(tmp_path, workdir, False, runtime, steps=12), workdir)
    while set(workers.ports) & set(reference.ports):
        workers.ports = free_ports(2)
    go, interrupted, resumed = str(tmp_path / "go"), [], []
    try:
        # The uninterrupted pair and the interrupted one at the same time.
        reference.start(harness=[["--skip-export", *counting("reference", i)] for i in (0, 1)])
        # (Every run counts: the counting is part of the data pipeline an iterator state holds.)
        harness = [counting("interrupted", i) for i in (0, 1)]
        interrupted = workers.start(harness=(harness[0], ["--sigterm-at-step", "7", *harness[1]]))
        stopped = workers.wait(timeout=300)
        # The same two commands again, started now: they import meanwhile, then wait for `go`.
        waiting = [["--wait-for", go, *counting("resumed", i)] for i in (0, 1)]
        resumed = workers.start(harness=waiting)
        steps = [_stopped_step(code, output) for code, output in stopped]
        assert steps == [7, 7]
        assert "stopped by a signal to another worker after step 7" in stopped[0][1]
        assert "stopped by SIGTERM after step 7" in stopped[1][1]
        assert tf.train.latest_checkpoint(str(workdir / "backup")).endswith(f"ckpt-{steps[0]}")
        assert (workdir / "checkpoints" / f"ckpt-{steps[0]}.weights.h5").exists()
        for index in (0, 1):  # each worker's data iterator, beside the resume state
            assert (workdir / "backup" / f"data-worker-{index}" / "ckpt-7.json").exists()
        _assert_finished_alike(reference, reference.wait(), exported=False)

        open(go, "w").close()  # the resumed pair exports, as a real run does
        outputs = workers.wait()
    finally:
        reference.kill_all()
        for processes in (interrupted, resumed):
            workers.processes = processes
            workers.kill_all()
    assert _assert_finished_alike(workers, outputs) == 12
    assert f"resuming from step {steps[0]} " in outputs[0][1]
    got, _ = load_npz_weights(workers.dump(0))
    expected, _ = load_npz_weights(reference.dump(0))
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)
    for index, (_, output) in enumerate(outputs):
        assert f"worker {index}: data iterator restored at step 7 " in output, output[-3000:]
        # Restored, each worker reads the records of steps 8 to 12 (and refills its buffers):
        # well under the uninterrupted run's, which skipping to step 7 would read again (seen:
        # 162 records per worker resumed, 324 interrupted, 486 uninterrupted).
        read, whole = records("resumed", index), records("reference", index)
        assert read < 0.7 * whole, (index, read, whole)


def _counting_record_reads(read, monkeypatch=None):
    """Makes every `tf.data.TFRecordDataset` append `(shard, record index)` to `read` for each
    record it reads (records counted, not bytes: one-time reads of libraries, and how far
    tf.data's buffers happen to be filled in bytes, do not count)."""
    real = tf.data.TFRecordDataset

    def counted(path, **kwargs):
        def note(shard, index, record):
            read.append((shard.numpy(), int(index)))
            return record

        def log(index, record):
            record = tf.py_function(note, [path, index, record], tf.string)
            record.set_shape([])
            return record

        return real(path, **kwargs).enumerate().map(log)

    if monkeypatch is None:
        tf.data.TFRecordDataset = counted
    else:
        monkeypatch.setattr(tf.data, "TFRecordDataset", counted)


def _settled(read, quiet=0.3, limit=10.0):
    """`len(read)` once no record has been read for `quiet` seconds (tf.data's prefetching
    threads fill their bounded buffers in the background)."""
    last, since, deadline = len(read), time.monotonic(), time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if len(read) != last:
            last, since = len(read), time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return last


def _restart(config, model, backup, position, read, skip=False):
    """A fresh dataset and iterator positioned at `position` as a restart finds it: from the
    resume state (or by skipping); returns (records read until the first batch, next 3
    batches)."""
    from keras_transformer.data import prepared_dataset
    from keras_transformer.training.engines.tf_state import ResumeState
    from keras_transformer.workdir import Workdir

    dataset = prepared_dataset(Workdir.of(config).prepared, config.data, verbose=False)
    _settled(read)
    read.clear()
    if skip:
        iterator = iter(dataset.skip(position))
    else:
        iterator = iter(dataset)
        assert ResumeState(model, backup, 1, 1, iterator=iterator).restore() == position
    first = next(iterator)
    return _settled(read), [first, next(iterator), next(iterator)]


@pytest.mark.scenario
def test_resume_state_holds_the_data_iterator_restart_reads_do_not_grow(tmp_path, monkeypatch):
    """The data position restored from the resume state's iterator: the next batches are those
    of the uninterrupted iterator, and a restart at batch 600 reads as many records as one at
    batch 5 (skipping reads every batch before the position)."""
    import keras
    from training_helpers import tiny_config

    from keras_transformer.data import prepare, prepared_dataset
    from keras_transformer.models import build_transformer
    from keras_transformer.training import compile_model
    from keras_transformer.training.engines.tf_state import ResumeState
    from keras_transformer.workdir import Workdir

    read = []
    _counting_record_reads(read, monkeypatch)
    config = tiny_config(tmp_path / "work", data=dict(tokens_per_batch=96, shuffle_buffer=64))
    prepare(config, verbose=False)
    model = compile_model(build_transformer(config.model, 200), config)
    model.optimizer.build(model.trainable_variables)
    reads = {}
    for position in (5, 600):
        backup = str(tmp_path / f"backup{position}")
        dataset = prepared_dataset(Workdir.of(config).prepared, config.data, verbose=False)
        iterator = iter(dataset)
        state = ResumeState(model, backup, 1, 1, iterator=iterator)
        for _ in range(position):
            next(iterator)
        state.run_state.restored(0.0, position)  # the data position the save records
        model.optimizer.iterations.assign(position)
        state.save()
        expected = [next(iterator) for _ in range(3)]  # the uninterrupted run's next batches
        del iterator, dataset  # its prefetching threads would read during the measurement
        gc.collect()
        reads[position], got = _restart(config, model, backup, position, read)
        for a, b in zip(keras.tree.flatten(got), keras.tree.flatten(expected), strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    skipped, got = _restart(config, model, str(tmp_path / "backup600"), 600, read, skip=True)
    for a, b in zip(keras.tree.flatten(got), keras.tree.flatten(expected), strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())  # skipping finds the same place
    skipped_early, _ = _restart(config, model, str(tmp_path / "backup5"), 5, read, skip=True)
    # Skipping reads more the further it goes (the measure sees the reading) ...
    assert skipped - skipped_early > 2000, (skipped, skipped_early)
    # ... the resume state's iterator does not: the same records at batch 600 as at batch 5.
    assert abs(reads[600] - reads[5]) < 0.05 * (skipped - skipped_early), (reads, skipped)


def mirrored_restarts(report):
    """Run by `train_runner.py --logical-cpus 2`: under MirroredStrategy, the trainer's resume
    path (`MirroredInput.iterate`, `ResumeState`, `MirroredInput.resumed`: the strategy's input
    object, `training.engines.strategies`) at data positions 5 and 600.
    Checks that the batches after each restart are those of the uninterrupted iterator, and
    that `fit` trains on them (its symbolic build's batch is handed out again); writes the
    records read until the first batch after each restart, and after skipping instead."""
    import keras
    from training_helpers import tiny_config

    from keras_transformer.training.engines.distribute import get_strategy
    from keras_transformer.training.engines.replica_batches import ReplicaBatches
    from keras_transformer.training.engines.strategies import strategy_input
    from keras_transformer.training.engines.tf_state import ResumeState
    from keras_transformer.training.run import setup
    from keras_transformer.training.run.run_state import RunState
    from keras_transformer.workdir import Workdir

    read = []
    _counting_record_reads(read)
    root = os.path.dirname(report)
    config = tiny_config(
        os.path.join(root, "work"),
        data=dict(tokens_per_batch=96, shuffle_buffer=64),
        runtime=dict(strategy="mirrored", jit_compile=False),
    )
    strategy = get_strategy(config.runtime)
    assert strategy.num_replicas_in_sync == 2
    run = setup.Run(config, Workdir.of(config), strategy_input(strategy), time.time())
    keras.utils.set_random_seed(config.train.seed)
    data = setup.prepare_data(run)
    model = setup.build_model(run, data.tokenizer.vocab_size, data.num_pairs)

    def restart(backup):
        """As `fitting.fit` does: (resume state, ReplicaBatches, what `fit` takes)."""
        run_state = RunState()
        dataset, feeder = run.engine.iterate(data, run_state)
        assert isinstance(feeder, ReplicaBatches)
        state = ResumeState(model, backup, 1, 1, iterator=feeder.iterator, run_state=run_state)
        state.restore()
        return state, feeder, run.engine.resumed(data, dataset, feeder, state.batches, state)

    def arrays(batch):
        """The global batch: a per-replica batch's shares, concatenated."""
        return [
            np.concatenate([np.asarray(x) for x in strategy.experimental_local_results(v)])
            for v in tf.nest.flatten(batch)
        ]

    def assert_same(got, expected):
        for a, b in zip(arrays(got), arrays(expected), strict=True):
            np.testing.assert_array_equal(a, b)

    found = {}
    for position in (5, 600):
        backup = os.path.join(root, f"backup{position}")
        state, feeder, _ = restart(backup)
        for _ in range(position):  # the uninterrupted run
            next(feeder)
            state.run_state.restored(state.run_state.elapsed, state.run_state.batches + 1)
        model.optimizer.iterations.assign(position)
        state.save()
        expected = [next(feeder) for _ in range(3)]
        del state, feeder  # its prefetching threads would read during the measurement
        gc.collect()
        _settled(read)
        read.clear()
        state, feeder, batches = restart(backup)
        assert state.batches == position and state.iterator_restored
        first = next(iter(batches))
        found[f"restored{position}"] = _settled(read)
        assert_same(first, expected[0])
        skipped = iter(run.engine.batches(data, position))
        _settled(read)
        read.clear()
        for a, b in zip(tf.nest.flatten(next(skipped)), arrays(expected[0]), strict=True):
            np.testing.assert_array_equal(a.numpy(), b)  # skipping finds the same place
        found[f"skipped{position}"] = _settled(read)
        del skipped
    # `fit` makes its iterator twice (a batch for its symbolic build, then training): it trains
    # on the batches from the position on, and the next one is the third.
    model.fit(batches, steps_per_epoch=2, epochs=1, callbacks=[state], verbose=0)
    assert state.batches == 602
    assert_same(next(feeder), expected[2])
    with open(report, "w") as f:
        json.dump(found, f)


@pytest.mark.scenario
def test_mirrored_resume_state_holds_the_data_iterator_restart_reads_do_not_grow(tmp_path):
    """Under MirroredStrategy (two logical CPUs) the resume state holds the data iterator too:
    a restart at batch 600 reads as many records as one at batch 5, while skipping reads every
    batch before the position; the batches after the restart are the uninterrupted run's."""
    report = tmp_path / "report.json"
    run = call_in_runner("test_training_cluster:mirrored_restarts", report)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    with open(report) as f:
        found = json.load(f)
    skipping = found["skipped600"] - found["skipped5"]
    assert skipping > 2000, found  # skipping reads the records of the batches before
    # The restored iterator reads the records of its first batch and refills its buffers: the
    # same at any position (a margin for tf.data's autotuned buffers, far below the skipping).
    assert abs(found["restored600"] - found["restored5"]) < 0.05 * skipping, found


def worker_batches_as_tensorflow_hands_them(report):
    """Run by `train_runner.py --logical-cpus 2`: one input pipeline feeding two replicas
    (MirroredStrategy, as a worker with two GPUs). `WorkerBatches` gives each replica, step by
    step, the batches of TensorFlow's own iterator of `distribute_datasets_from_function`, in one
    trace of the function that draws them (whatever their shapes); `IteratorBackup` restores its
    place at a step, refuses a missing or torn state, and keeps the last `keep` states."""
    from keras_transformer.training.engines.worker_batches import (
        IteratorBackup,
        WorkerBatches,
        WorkerInput,
    )

    strategy = tf.distribute.MirroredStrategy(
        [d.name for d in tf.config.list_logical_devices("CPU")]
    )
    assert strategy.num_replicas_in_sync == 2
    contexts = []

    def per_pipeline(context):
        contexts.append(context)  # batches of 1 to 3 elements, as buckets differ in shape
        return tf.data.Dataset.range(1 << 30).map(lambda i: tf.fill([1 + i % 3], i))

    def worker_input(start):
        distributed = strategy.distribute_datasets_from_function(per_pipeline)
        dataset = per_pipeline(contexts[-1]).skip(2 * start)
        return WorkerInput(distributed, dataset, contexts[-1], start)

    theirs = iter(strategy.distribute_datasets_from_function(per_pipeline))
    expected = [
        [x.numpy().tolist() for x in strategy.experimental_local_results(next(theirs))]
        for _ in range(8)
    ]
    ours = WorkerBatches(strategy, worker_input(0))
    assert ours.input.local_replicas == 2

    @tf.function
    def take(iterator):  # as `fit` draws them: inside its train function
        return strategy.experimental_local_results(iterator.get_next())

    def draw(iterator):
        return [x.numpy().tolist() for x in take(iterator)]

    got = [draw(ours) for _ in range(5)]
    assert got == expected[:5], (got, expected[:5])
    assert take.experimental_get_tracing_count() == 1

    directory = os.path.join(os.path.dirname(report), "data-worker-0")
    position = [5]
    backup = IteratorBackup(directory, ours, 2, lambda: position[0], worker_input)
    backup.save(5)
    assert draw(ours) == expected[5]
    restarted = WorkerBatches(strategy, worker_input(0))
    again = IteratorBackup(directory, restarted, 2, lambda: position[0], worker_input)
    assert not again.restore(4, 4)  # none saved there
    assert again.restore(5, 5)
    assert [draw(restarted) for _ in range(3)] == expected[5:]
    # A state of another data position, or one without its marker (torn), is not used.
    assert not again.restore(5, 6)
    tf.io.gfile.remove(os.path.join(directory, "ckpt-5.json"))
    assert not again.restore(5, 5)
    for step in (6, 7, 8):
        position[0] = step
        backup.save(step)
    kept = sorted(os.listdir(directory))
    assert {name.split(".")[0] for name in kept} == {"ckpt-7", "ckpt-8"}, kept  # torn 5 too
    assert [name for name in kept if name.endswith(".json")] == ["ckpt-7.json", "ckpt-8.json"]
    position[0] = 7
    backup.save(7)  # a resumed run saves again where a killed one had gone further: 8 goes
    assert {name.split(".")[0] for name in os.listdir(directory)} == {"ckpt-7"}
    with open(report, "w") as f:
        json.dump({"ok": True}, f)


@pytest.mark.scenario
def test_worker_batches_hand_out_what_tensorflow_does_and_restore_their_place(tmp_path):
    """`WorkerBatches` (several workers' data, `train()` under MultiWorkerMirroredStrategy)
    with two replicas on one worker: TensorFlow's order, one trace, `IteratorBackup`."""
    report = tmp_path / "report.json"
    run = call_in_runner("test_training_cluster:worker_batches_as_tensorflow_hands_them", report)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert json.loads(report.read_text()) == {"ok": True}


def _shards(workdir):
    """`{file name: bytes}` of the shards of a prepared workdir (any filesystem)."""
    prepared = f"{workdir}/prepared"
    return {
        name: tf.io.gfile.GFile(f"{prepared}/{name}", "rb").read()
        for name in sorted(tf.io.gfile.listdir(prepared))
        if name.endswith(".tfrecord")
    }


# Not with data.subword_samples: SentencePiece's samples differ between processes, seeded or not.
# The two workers write into a ram:// workdir once: their segments go through local files.
@pytest.mark.scenario
@pytest.mark.parametrize(
    "data, where", [({}, "local"), (dict(both_directions=True), "local"), ({}, "ram")]
)
def test_prepare_with_two_workers_writes_the_same_shards_as_one(tmp_path, monkeypatch, data, where):
    from training_helpers import tiny_config

    # The module (the package's `prepare` is the function).
    prepare_module = importlib.import_module("keras_transformer.data.prepare")
    workers_module = importlib.import_module("keras_transformer.data.workers")
    # Several segments of chunks for each worker (the jobs carry these sizes to them).
    monkeypatch.setattr(workers_module, "_CHUNK", 64)
    monkeypatch.setattr(workers_module, "_SEGMENT_CHUNKS", 1)
    started = []
    original_start = workers_module.WorkerPool.start

    def start(pool, *args):
        original_start(pool, *args)
        started.append(pool.workers if pool.pool is not None else 0)

    monkeypatch.setattr(workers_module.WorkerPool, "start", start)
    workdirs = {1: str(tmp_path / "w1"), 2: str(tmp_path / "w2")}
    if where == "ram":
        workdirs[2] = f"ram://prepare_workers_{id(tmp_path)}/w2"
    manifests = {}
    for workers in (1, 2):
        config = tiny_config(
            workdirs[workers],
            data=dict(data, prepare_workers=workers, train="synthetic:split=train,size=700"),
        )
        manifests[workers] = prepare_module.prepare(config, verbose=False)
    assert started[-1] == 2 and not any(started[:-2])  # one process, then two
    for key in ("vocabulary", "counts", "shards", "tokens"):
        assert manifests[1][key] == manifests[2][key], key
    one, two = _shards(workdirs[1]), _shards(workdirs[2])
    assert one and one == two
    counts = manifests[1]["counts"]
    assert counts["written"] > 100 and counts["records"] == counts["written"] * (2 if data else 1)


@pytest.mark.scenario
def test_a_waiting_worker_sees_the_chief_alive_then_fails_soon_after_it_dies(
    tmp_path, monkeypatch, capsys
):
    from training_helpers import subprocess_env

    from keras_transformer.errors import WorkerError
    from keras_transformer.training.engines import distribute

    monkeypatch.setattr(distribute, "WAITING_LINE_SECONDS", 0.5)
    beat = tmp_path / "prepare.heartbeat"
    chief = subprocess.Popen(
        [
            sys.executable, "-c",
            "import sys, time\n"
            "from keras_transformer.training.engines.distribute import Heartbeat\n"
            "Heartbeat(sys.argv[1], interval=0.2).__enter__()\ntime.sleep(600)",
            str(beat),
        ],
        env=subprocess_env(),
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while not beat.exists():
            assert time.time() < deadline and chief.poll() is None
            time.sleep(0.05)
        killer = threading.Timer(2.0, chief.kill)
        killer.start()
        started = time.time()
        with pytest.raises(WorkerError) as error:
            distribute.wait_for_path(
                str(tmp_path / "prepared" / "manifest.json"), 600, "prepared data",
                heartbeat=str(beat), heartbeat_timeout=2.0,
            )  # fmt: skip
        waited = time.time() - started
    finally:
        chief.kill()
        chief.wait(timeout=30)
    assert 2.0 < waited < 15, waited  # not runtime.wait_seconds (600 here)
    message = str(error.value)
    assert "\n" not in message and "the chief stopped: no heartbeat" in message
    assert "chief alive, last heartbeat" in capsys.readouterr().out
