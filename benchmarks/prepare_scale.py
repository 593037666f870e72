"""`prepare` and `train` at WMT'14 size: wall time, peak memory, disk, time to the first step.

Generates two parallel corpora at run time in a temporary directory (nothing is committed or
downloaded): 4.5M pairs (WMT'14 en-de's size) and 30k pairs, of made-up words drawn from a
40,000-word Zipfian lexicon with a WMT-like sentence length distribution (log-normal, ~25 words
on average, up to 120). Then, each in its own child process (peak RSS from `os.wait4`):

1. `keras-transformer prepare` of the 4.5M pairs with `configs/small.yaml` (vocabulary included);
2. `keras-transformer train` of `configs/small.yaml` shapes for `--steps` steps on them (time
   from the start of the process to the first step, peak RSS, tokens/s);
3. the same `train` restarted with 10 more steps (it resumes from the backup);
4. `prepare` and `train` on the 30k pairs, for comparison;
5. on the 30k pairs, model.fit target tokens/s from the prepared shards and from the in-memory
   `make_dataset` path (after a warm-up batch of every bucket shape; per source and round, one
   fit of two epochs of `--fit-steps` batches, the second timed; `--rounds` alternating
   rounds), in one process, plus the input pipelines alone. `--compare-throughput WORKDIR
   CORPUS` runs this step alone on a prepared workdir and its corpus (`CORPUS.src/.tgt`).

Prints one JSON line per figure; with `BENCH_LABEL` set, also appends them to the ledger
`benchmarks/results/prepare_scale.jsonl` (`benchmarks/ledger.py`). Run from the repository root:

    BENCH_LABEL=wmt14_size PYTHONPATH=$PWD TF_CPP_MIN_LOG_LEVEL=2 \\
        python benchmarks/prepare_scale.py

Options: `--pairs N` (default 4500000), `--small-pairs N` (30000), `--steps N` (40),
`--fit-steps N` (20), `--rounds N` (2),
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

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "configs", "small.yaml")


def load():
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _lexicon(rng, size):
    """`size` distinct made-up words of 1-4 syllables."""
    onsets = list("bcdfghjklmnprstvwz") + ["ch", "sh", "st", "tr", "kr", "pl"]
    vowels = ["a", "e", "i", "o", "u", "au", "ei", "ie"]
    codas = ["", "", "", "n", "r", "s", "t", "ng", "ck"]
    words, seen = [], set()
    while len(words) < size:
        syllables = rng.integers(1, 5)
        word = "".join(
            onsets[rng.integers(len(onsets))]
            + vowels[rng.integers(len(vowels))]
            + codas[rng.integers(len(codas))]
            for _ in range(syllables)
        )
        if word not in seen:
            seen.add(word)
            words.append(word)
    return np.array(words, dtype=object)


def generate_corpus(prefix, pairs, seed):
    """Writes `prefix.src` and `prefix.tgt`; returns their total size in bytes."""
    rng = np.random.default_rng(seed)
    lexicon_rng = np.random.default_rng(0)  # the same language for every corpus
    source_words, target_words = _lexicon(lexicon_rng, 40_000), _lexicon(lexicon_rng, 40_000)
    ranks = np.arange(1, 40_001)
    probabilities = 1.0 / ranks**1.05
    probabilities /= probabilities.sum()
    # Target word i translates source word i; a permutation so frequencies differ by side.
    translation = lexicon_rng.permutation(40_000)
    with open(prefix + ".src", "w") as src, open(prefix + ".tgt", "w") as tgt:
        for start in range(0, pairs, 200_000):
            count = min(200_000, pairs - start)
            lengths = np.clip(rng.lognormal(np.log(22.0), 0.55, size=count), 1, 120).astype(int)
            total = int(lengths.sum())
            ids = rng.choice(40_000, size=total, p=probabilities)
            separators = np.full(total, " ", dtype=object)
            separators[np.cumsum(lengths) - 1] = "\n"
            for out, words in ((src, source_words[ids]), (tgt, target_words[translation[ids]])):
                text = np.empty(2 * total, dtype=object)
                text[0::2], text[1::2] = words, separators
                out.write("".join(text.tolist()))
    return os.path.getsize(prefix + ".src") + os.path.getsize(prefix + ".tgt")


def run_child(command, env, marker=None):
    """Runs `command`; returns (seconds, peak RSS MB, seconds to the first stdout line starting
    with `marker` (None if none), stdout lines)."""
    start = time.time()
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    first, lines = None, []
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if marker and first is None and line.startswith(marker):
            first = time.time() - start
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.time() - start
    if process.returncode != 0:
        sys.stderr.write("\n".join(lines[-40:]) + "\n")
        raise SystemExit(f"{' '.join(command)} failed with exit code {process.returncode}")
    return seconds, round(usage.ru_maxrss / 1024.0, 1), first, lines


def train_overrides(corpus, steps, saved_models):
    return [
        f"data.train=text:{corpus}.src,{corpus}.tgt",
        # The figures of benchmarks/README.md were taken with these (small.yaml's until #15).
        "data.vocab_size=8000",
        "train.schedule=rsqrt",
        "train.max_minutes=null",
        "data.dev=null",
        "data.test=null",
        f"train.steps={steps}",
        f"train.steps_per_epoch={steps}",
        f"train.checkpoint_every={steps}",
        "train.log_every=1",
        "export.average_checkpoints=1",
        f"export.base_dir={saved_models}",
    ]


def cli(subcommand, workdir, overrides):
    command = [sys.executable, "-m", "keras_transformer.cli", subcommand, "--config", CONFIG]
    command += ["--workdir", workdir]
    for override in overrides:
        command += ["--set", override]
    return command


def speeds(lines):
    """tokens/s of the `step N/M: ... T tokens/s` lines, after the first three steps."""
    values = []
    for line in lines:
        if line.startswith("step ") and "tokens/s" in line:
            values.append(float(line.rsplit(", ", 1)[1].split()[0].replace(",", "")))
    values = values[3:] or values
    return round(float(np.median(values)), 1) if values else None


def prepare_and_train(name, corpus, pairs, steps, tmp, env, restart):
    workdir = os.path.join(tmp, f"work_{name}")
    saved = os.path.join(tmp, "saved_models")
    overrides = train_overrides(corpus, steps, saved)
    seconds, rss, _, lines = run_child(cli("prepare", workdir, overrides), env)
    with open(os.path.join(workdir, "prepared", "manifest.json")) as f:
        manifest = json.load(f)
    shard_bytes = sum(s["bytes"] for s in manifest["shards"])
    emit(
        figure="prepare",
        corpus=name,
        pairs=pairs,
        seconds=round(seconds, 1),
        pairs_per_s=round(pairs / seconds, 1),
        max_rss_mb=rss,
        shard_bytes=shard_bytes,
        shards=len(manifest["shards"]),
        written=manifest["counts"]["written"],
        skipped=manifest["counts"]["skipped"],
        tokens=manifest["tokens"]["source"] + manifest["tokens"]["target"],
        vocabulary_sample=manifest["vocabulary"]["sample_sentences"],
        load_1min=load(),
        summary=lines[-1],
    )
    seconds, rss, first, lines = run_child(cli("train", workdir, overrides), env, "step ")
    emit(
        figure="train",
        corpus=name,
        pairs=pairs,
        steps=steps,
        seconds_to_first_step=round(first, 1),
        seconds=round(seconds, 1),
        max_rss_mb=rss,
        tokens_per_s=speeds(lines),
        load_1min=load(),
    )
    if restart:
        overrides = train_overrides(corpus, steps + 10, saved)
        seconds, rss, first, lines = run_child(cli("train", workdir, overrides), env, "step ")
        emit(
            figure="train_restarted",
            corpus=name,
            pairs=pairs,
            steps=10,
            resumed="resuming from step" in "\n".join(lines),
            seconds_to_first_step=round(first, 1),
            seconds=round(seconds, 1),
            max_rss_mb=rss,
            load_1min=load(),
        )
    return workdir


def compare_throughput(workdir, corpus, steps, rounds=2):
    """In one process: model.fit target tokens/s from the shards and from memory, alternately."""
    import keras

    from keras_transformer.config import load_config
    from keras_transformer.data import Tokenizer, make_dataset, prepared_dataset, read_pairs
    from keras_transformer.models import build_transformer
    from keras_transformer.training import compile_model

    config = load_config(
        CONFIG,
        overrides=[f"data.train=text:{corpus}.src,{corpus}.tgt", "data.vocab_size=8000"],
    )
    keras.utils.set_random_seed(1)
    tokenizer = Tokenizer(os.path.join(workdir, "spm.model"))
    pairs = read_pairs(config.data.train, verbose=False)
    builders = {
        "shards": lambda: prepared_dataset(
            os.path.join(workdir, "prepared"), config.data, verbose=False
        ),
        "memory": lambda: make_dataset(pairs, tokenizer, config.data, verbose=False),
    }
    # The input pipelines alone: target tokens/s of 300 batches (after 20).
    for name, build in builders.items():
        dataset = build()
        iterator = iter(dataset)
        for _ in range(20):
            next(iterator)
        start, tokens = time.perf_counter(), 0
        for _ in range(300):
            _, labels = next(iterator)
            tokens += int(np.count_nonzero(labels.numpy()))
        emit(
            figure="input_pipeline_tokens_per_s",
            source=name,
            corpus_pairs=len(pairs),
            tokens_per_s=round(tokens / (time.perf_counter() - start), 1),
        )
    model = build_transformer(config.model, tokenizer.vocab_size)
    compile_model(model, config)
    import tensorflow as tf

    # Warm-up: one batch of every bucket shape (XLA compiles once per shape), so that no
    # compilation falls into a measured round.
    by_shape = {}
    for name, build in builders.items():
        for features, labels in build().take(500):
            by_shape.setdefault(tuple(features["source_ids"].shape), (features, labels))
    for features, labels in by_shape.values():
        model.fit(tf.data.Dataset.from_tensors((features, labels)), verbose=0)

    class EpochTimes(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds = time.perf_counter() - self.start  # the last epoch's

    results = {name: [] for name in builders}
    padded_results = {name: [] for name in builders}
    for round_index in range(rounds):
        # Alternate, so load changes hit both alike, and swap which goes first every round
        # (A B, B A, ...): the first fit of a process runs slower, whatever its data.
        order = list(builders.items())
        for name, build in order if round_index % 2 == 0 else order[::-1]:
            # Two epochs of `steps` on one iterator; the second is timed, so neither the
            # shuffle buffer's filling nor the first tokenization counts.
            timer = EpochTimes()
            model.fit(build(), steps_per_epoch=steps, epochs=2, verbose=0, callbacks=[timer])
            measured = list(build().skip(steps).take(steps).as_numpy_iterator())
            tokens = sum(int(np.count_nonzero(y)) for _, y in measured)
            padded = sum(int(y.size) for _, y in measured)
            results[name].append(tokens / timer.seconds)
            padded_results[name].append(padded / timer.seconds)
    for name, values in results.items():
        emit(
            figure="fit_tokens_per_s",
            source=name,
            corpus_pairs=len(pairs),
            steps=steps,
            rounds=[round(v, 1) for v in values],
            tokens_per_s=round(float(np.median(values)), 1),
            # Batch x padded length: the work the model did, whatever the padding.
            padded_tokens_per_s=round(float(np.median(padded_results[name])), 1),
            load_1min=load(),
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4_500_000)
    parser.add_argument("--small-pairs", type=int, default=30_000)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--fit-steps", type=int, default=20)
    parser.add_argument("--tmp", default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the fit comparison")
    parser.add_argument("--compare-throughput", nargs=2, metavar=("WORKDIR", "CORPUS"))
    args = parser.parse_args()
    if args.compare_throughput:
        workdir, corpus = args.compare_throughput
        compare_throughput(workdir, corpus, args.fit_steps, args.rounds)
        return
    tmp = args.tmp or tempfile.mkdtemp(prefix="prepare_scale-")
    os.makedirs(tmp, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    emit(figure="machine", cpus=os.cpu_count(), load_1min=load(), tmp=tmp)
    try:
        corpora = {}
        for name, pairs, seed in (("wmt14_size", args.pairs, 1), ("30k", args.small_pairs, 2)):
            start = time.time()
            corpus = os.path.join(tmp, name)
            size = generate_corpus(corpus, pairs, seed)
            corpora[name] = (corpus, pairs)
            emit(
                figure="corpus",
                corpus=name,
                pairs=pairs,
                text_bytes=size,
                seconds=round(time.time() - start, 1),
            )
        big, pairs = corpora["wmt14_size"]
        prepare_and_train("wmt14_size", big, pairs, args.steps, tmp, env, restart=True)
        small, pairs = corpora["30k"]
        workdir = prepare_and_train("30k", small, pairs, args.steps, tmp, env, restart=False)
        command = [sys.executable, os.path.abspath(__file__), "--compare-throughput"]
        command += [workdir, small, "--fit-steps", str(args.fit_steps)]
        command += ["--rounds", str(args.rounds)]
        _, rss, _, lines = run_child(command, env)
        for line in lines:
            if line.startswith("{"):
                print(line, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
