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
CPU devices (the trainer's `ReplicaBatches`).

Prints one JSON line per figure, then the ratio (target: 100,000 within 1.2x of 100). Run alone,
from the repository root:

    PYTHONPATH=$PWD TF_CPP_MIN_LOG_LEVEL=2 python benchmarks/restart_cost.py --skip \\
        | tee benchmarks/results/restart_cost_$(date -u +%Y-%m-%dT%H%MZ).jsonl

Options: `--pairs N` (default 200000), `--positions P ...`, `--config FILE`
(default configs/quickstart.yaml, its data section with `text:` files of the generated corpus),
`--strategy default|mirrored` and `--logical-cpus N` (default: default, no split),
`--tmp DIR` (default: a new temporary directory, deleted at the end unless `--keep`).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit  # noqa: E402

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

    from keras_transformer.training import trainer
    from keras_transformer.training.distribute import get_strategy
    from keras_transformer.workdir import Workdir

    if args.logical_cpus:
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus
        )
    strategy = get_strategy(config.runtime)
    run = trainer._Run(config, Workdir.of(config), strategy, True, time.time())
    keras.utils.set_random_seed(config.train.seed)
    data = trainer._prepare_data(run)
    model = trainer._build_model(run, data.tokenizer.vocab_size, data.num_pairs)
    return run, data, model


def setup(args, position, backup, skip):
    """Writes the resume state of step `position` into `backup`."""
    from keras_transformer.training.callbacks import ResumeState

    run, data, model = _parts(args, _config(args, os.path.join(args.tmp, "work")))
    dataset = data.batches(0)
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
    from keras_transformer.training import trainer
    from keras_transformer.training.callbacks import ResumeState
    from keras_transformer.training.replica_batches import ReplicaBatches
    from keras_transformer.training.run_state import RunState

    run, data, model = _parts(args, _config(args, os.path.join(args.tmp, "work")))
    run_state = RunState()
    dataset, iterator = trainer._iterated_data(run, data, run_state)
    saved = iterator.iterator if isinstance(iterator, ReplicaBatches) else iterator
    state = ResumeState(model, backup, 10**9, 1, iterator=saved, run_state=run_state)
    position = state.restore()
    batches = trainer._resumed_batches(data, dataset, iterator, position, state)
    model.fit(batches, steps_per_epoch=1, epochs=1, verbose=0)
    print(json.dumps({"seconds": time.time() - started, "position": position}), flush=True)


def _child(args, *rest):
    command = [sys.executable, os.path.abspath(__file__), "--tmp", args.tmp, "--pairs"]
    command += [str(args.pairs), "--config", args.config, "--strategy", args.strategy]
    command += ["--logical-cpus", str(args.logical_cpus), *rest]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"child failed: {' '.join(rest)}\n{done.stderr[-3000:]}")
    results = [line for line in done.stdout.splitlines() if line.startswith('{"seconds"')]
    return json.loads(results[-1]) if results else {}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--positions", type=int, nargs="+", default=[100, 100_000])
    parser.add_argument("--config", default=os.path.join(REPO, "configs", "quickstart.yaml"))
    parser.add_argument("--skip", action="store_true", help="also time dataset.skip(P)")
    parser.add_argument("--strategy", choices=["default", "mirrored"], default="default")
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
