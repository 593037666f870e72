"""Restart cost: the time a resumed `train` takes to its first step, at step 100 and at 100,000.

One prepared corpus (`prepare_scale.generate_corpus`: `--pairs` generated pairs, prepared once
with `--config`). For each position P (`--positions`, default 100 and 100000) a resume state is
written as the trainer writes it after P steps (the model's initial weights, the optimizer's
step set to P, the data position P and the `tf.data` iterator advanced by P batches: reading
P batches once, which is setup, not measured). Then, in a fresh child process per position and
way, the trainer's own restart path is timed from the process start to the end of the first
training step: build the model, restore the resume state (the iterator with it), one step of
`model.fit`. `--skip` also times the former way (no iterator in the state: `dataset.skip(P)`).
`--strategy mirrored --logical-cpus 2` does the same under MirroredStrategy over two logical
CPU devices (the trainer's `ReplicaBatches`). `--strategy multi_worker` runs every child as two
MultiWorkerMirroredStrategy workers on this machine (TF_CONFIG on 127.0.0.1): each worker's own
iterator (`WorkerBatches`, saved in `backup/data-worker-K`) advanced by P steps, the chief's
resume state; a restart's time is that of the slower worker (both start together), and the
line says whether both restored their iterators.

Prints one JSON line per figure, then the ratio (target: 100,000 within 1.2x of 100). Run alone,
from the repository root:

    BENCH_LABEL=restart_cost PYTHONPATH=$PWD TF_CPP_MIN_LOG_LEVEL=2 \\
        python benchmarks/restart_cost.py --skip

(`BENCH_LABEL` appends the lines to the ledger `benchmarks/results/restart_cost.jsonl`.)

Options: `--pairs N` (default 200000), `--positions P ...`, `--config FILE`
(default configs/quickstart.yaml, its data section with `text:` files of the generated corpus),
`--strategy default|mirrored|multi_worker` and `--logical-cpus N` (default: default, no split),
`--tmp DIR` (default: a new temporary directory, deleted at the end unless `--keep`).
"""

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, free_ports  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(args, workdir):
    from keras_transformer.config import load_config

    corpus = os.path.join(args.tmp, "corpus")
    overrides = [
        f"data.train=text:{corpus}.src,{corpus}.tgt",
        "data.dev=null",
        "data.test=null",
        f"runtime.workdir={workdir}",
        f"runtime.strategy={args.strategy}",
        "train.steps=1000000000",
    ]
    return load_config(args.config, overrides=overrides)


def _parts(args, config):
    """The trainer's pieces for `config`: (run, data, model)."""
    import keras

    from keras_transformer.training.engines.distribute import get_strategy
    from keras_transformer.training.engines.strategies import strategy_input
    from keras_transformer.training.run import setup
    from keras_transformer.workdir import Workdir

    if args.logical_cpus:
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus
        )
    strategy = get_strategy(config.runtime)
    run = setup.Run(config, Workdir.of(config), strategy_input(strategy), time.time())
    keras.utils.set_random_seed(config.train.seed)
    data = setup.prepare_data(run)
    model = setup.build_model(run, data.tokenizer.vocab_size, data.num_pairs)
    return run, data, model


def _with_backup(run, backup):
    """`run` with its resume state (and the workers' data iterators) in `backup`."""
    import dataclasses

    from keras_transformer.workdir import Workdir

    @dataclasses.dataclass(frozen=True)
    class Layout(Workdir):
        backup_directory: str = ""

        @property
        def backup(self):
            return self.backup_directory

    return dataclasses.replace(run, layout=Layout(run.layout.root, backup))


def setup_worker(args, position, backup, skip):
    """One of two workers: writes its part of the resume state of step `position` (the chief's
    state; each worker's data iterator, advanced by `position` steps, unless `skip`)."""
    from keras_transformer.training.engines.distribute import WorkerTempDir
    from keras_transformer.training.engines.tf_state import ResumeState
    from keras_transformer.training.engines.worker_batches import IteratorBackup
    from keras_transformer.training.run.run_state import RunState

    run, data, model = _parts(args, _config(args, os.path.join(args.tmp, "work")))
    run = _with_backup(run, backup)
    run_state = RunState()
    _, batches = run.engine.iterate(data, run_state)
    saves = []
    if not skip:
        for _ in range(position * batches.input.local_replicas):
            batches.iterator.get_next()
        directory = os.path.join(backup, f"data-worker-{batches.input.worker}")
        worker_input = functools.partial(run.engine.worker_input, data)
        saves.append(
            IteratorBackup(directory, batches, 1, lambda: run_state.batches, worker_input).save
        )
    with WorkerTempDir(run.chief, backup) as directory:
        state = ResumeState(
            model, backup, 1, 1, write_directory=directory, run_state=run_state, before_save=saves
        )
        state.batches = position
        model.optimizer.iterations.assign(position)
        state.save()


def setup(args, position, backup, skip):
    """Writes the resume state of step `position` into `backup`."""
    from keras_transformer.training.engines.tf_state import ResumeState

    if args.strategy == "multi_worker":
        return setup_worker(args, position, backup, skip)
    run, data, model = _parts(args, _config(args, os.path.join(args.tmp, "work")))
    dataset = run.engine.batches(data, 0)
    iterator = iter(dataset)
    state = ResumeState(model, backup, 1, 1, iterator=None if skip else iterator)
    if not skip:
        for _ in range(position):
            next(iterator)
    state.batches = position
    model.optimizer.iterations.assign(position)
    state.save()


def restart(args, backup, started):
    """Times the trainer's restart path (process start to the end of the first step)."""
    from keras_transformer.training.engines.replica_batches import ReplicaBatches
    from keras_transformer.training.engines.tf_state import ResumeState
    from keras_transformer.training.run.run_state import RunState

    run, data, model = _parts(args, _config(args, os.path.join(args.tmp, "work")))
    if args.strategy == "multi_worker":
        return restart_worker(run, data, model, backup, started)
    run_state = RunState()
    dataset, iterator = run.engine.iterate(data, run_state)
    saved = iterator.iterator if isinstance(iterator, ReplicaBatches) else iterator
    state = ResumeState(model, backup, 10**9, 1, iterator=saved, run_state=run_state)
    position = state.restore()
    batches = run.engine.resumed(data, dataset, iterator, position, state)
    model.fit(batches, steps_per_epoch=1, epochs=1, verbose=0)
    print(json.dumps({"seconds": time.time() - started, "position": position}), flush=True)


def restart_worker(run, data, model, backup, started):
    """One of two workers: the trainer's restart path (`MultiWorkerInput.restore`: the resume
    state and this worker's data iterator), then one step."""
    from keras_transformer.training.engines.distribute import WorkerTempDir
    from keras_transformer.training.run.run_state import RunState

    run = _with_backup(run, backup)
    with WorkerTempDir(run.chief, backup) as directory:
        t = run.config.train
        state, batches = run.engine.restore(
            model, data, RunState(), backup, t.checkpoint_every, t.keep_backups, directory
        )
        model.fit(batches, steps_per_epoch=1, epochs=1, verbose=0)
    seconds = time.time() - started
    restored = state.iterator_restored
    print(json.dumps({"seconds": seconds, "position": state.batches, "restored": restored}))


def _child(args, *rest):
    """Runs this script with `rest` in a child process (two workers under multi_worker);
    returns its JSON result line (the slower worker's time)."""
    command = [sys.executable, os.path.abspath(__file__), "--tmp", args.tmp, "--pairs"]
    command += [str(args.pairs), "--config", args.config, "--strategy", args.strategy]
    command += ["--logical-cpus", str(args.logical_cpus), *rest]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    envs = [env]
    if args.strategy == "multi_worker":
        cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
        tasks = [{"cluster": cluster, "task": {"type": "worker", "index": i}} for i in range(2)]
        envs = [dict(env, TF_CONFIG=json.dumps(task)) for task in tasks]
    # Outputs to files, not pipes: a worker blocked on a full pipe would stall its peer.
    outputs = [os.path.join(args.tmp, f"child{i}.{kind}") for i in range(2) for kind in "oe"]
    processes = []
    for index, child_env in enumerate(envs):
        with open(outputs[2 * index], "w") as out, open(outputs[2 * index + 1], "w") as err:
            processes.append(subprocess.Popen(command, env=child_env, stdout=out, stderr=err))
    results = []
    for index, process in enumerate(processes):
        process.wait()
        with open(outputs[2 * index]) as out, open(outputs[2 * index + 1]) as err:
            out, err = out.read(), err.read()
        if process.returncode:
            raise SystemExit(f"child failed: {' '.join(rest)}\n{err[-3000:]}")
        lines = [line for line in out.splitlines() if line.startswith('{"seconds"')]
        results.append(json.loads(lines[-1]) if lines else {})
    if not results[0]:
        return {}
    slowest = max(results, key=lambda result: result["seconds"])
    return dict(slowest, restored=all(result.get("restored", True) for result in results))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--positions", type=int, nargs="+", default=[100, 100_000])
    parser.add_argument("--config", default=os.path.join(REPO, "configs", "quickstart.yaml"))
    parser.add_argument("--skip", action="store_true", help="also time dataset.skip(P)")
    parser.add_argument(
        "--strategy", choices=["default", "mirrored", "multi_worker"], default="default"
    )
    parser.add_argument("--logical-cpus", type=int, default=0)
    parser.add_argument("--tmp")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, position, backup = args.child[0], int(args.child[1]), args.child[2]
        if kind == "restart":
            return restart(args, backup, float(args.child[3]))
        return setup(args, position, backup, skip=kind == "setup-skip")
    own_tmp = args.tmp is None
    args.tmp = args.tmp or tempfile.mkdtemp(prefix="restart_cost-")
    try:
        return _measure(args)
    finally:
        if own_tmp and not args.keep:
            shutil.rmtree(args.tmp, ignore_errors=True)


def _measure(args):
    from prepare_scale import generate_corpus

    from keras_transformer.data import prepare

    corpus = os.path.join(args.tmp, "corpus")
    if not os.path.exists(corpus + ".src"):
        generate_corpus(corpus, args.pairs, seed=1)
    prepare(_config(args, os.path.join(args.tmp, "work")), verbose=False)
    seconds = {}
    for way in ["iterator"] + (["skip"] if args.skip else []):
        for position in args.positions:
            backup = os.path.join(args.tmp, f"backup-{way}-{position}")
            kind = "setup" if way == "iterator" else "setup-skip"
            _child(args, "--child", kind, str(position), backup)
            result = _child(args, "--child", "restart", str(position), backup, repr(time.time()))
            seconds[way, position] = result["seconds"]
            if args.strategy == "multi_worker" and result["restored"] != (way == "iterator"):
                raise SystemExit(f"{way} at {position}: iterators restored {result['restored']}")
            emit(
                benchmark="restart_cost", way=way, position=position, pairs=args.pairs,
                strategy=args.strategy, restart_seconds=round(result["seconds"], 2),
            )  # fmt: skip
        first, last = args.positions[0], args.positions[-1]
        emit(
            benchmark="restart_cost", way=way, ratio=f"{last}/{first}", strategy=args.strategy,
            restart_ratio=round(seconds[way, last] / seconds[way, first], 3),
        )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
