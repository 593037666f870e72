"""Helpers shared by the benchmark scripts (and the cluster tests): shapes, FLOP counting, JSON
output, peak memory, free local ports."""

import datetime
import json
import os
import resource
import sys
import time

try:
    from benchmarks import ledger
except ImportError:  # run as a script from benchmarks/ (sys.path holds it)
    import ledger

# The shapes of ../shared/bench/README.md ("small" is the default there).
SMALL = dict(vocab=8192, d=256, layers=3, heads=4, ff=1024, batch=64, src=32, tgt=32, steps=10)
BASE = dict(vocab=32000, d=512, layers=6, heads=8, ff=2048, batch=64, src=32, tgt=32, steps=3)


def parse_shapes(argv, defaults=None):
    """Shapes from the first command-line argument (a JSON object), over the small defaults."""
    cfg = dict(SMALL if defaults is None else defaults)
    if len(argv) > 1 and argv[1].strip():
        cfg.update(json.loads(argv[1]))
    return cfg


def alternate(calls, rounds):
    """Times `calls` (zero-argument functions, each returning the tokens it made) in turn,
    `rounds` times, so that drifts in the machine's load fall on all of them alike; returns
    each call's tokens/s, one list per call, in the order of `calls`."""
    rates = [[] for _ in calls]
    for _ in range(rounds):
        for call, times in zip(calls, rates):
            start = time.perf_counter()
            tokens = call()
            times.append(tokens / (time.perf_counter() - start))
    return rates


def train_flops_per_token(cfg):
    """Training FLOPs per target token (the formula of ../shared/bench/README.md).

    `6 * (N_enc*S/T + N_dec + d*V) + 12*d*L*(S*S/T + T + S)`, with
    `N_enc = L*(4*d*d + 2*d*ff)` and `N_dec = L*(8*d*d + 2*d*ff)`.
    """
    d, ff, L, V = cfg["d"], cfg["ff"], cfg["layers"], cfg["vocab"]
    S, T = cfg["src"], cfg["tgt"]
    n_enc = L * (4 * d * d + 2 * d * ff)
    n_dec = L * (8 * d * d + 2 * d * ff)
    return 6 * (n_enc * S / T + n_dec + d * V) + 12 * d * L * (S * S / T + T + S)


def bench_config(cfg, name="bench"):
    """The library's `ExperimentConfig` for these shapes: every other setting is the paper's
    (post-norm, residual dropout 0.1, one shared embedding, label smoothing 0.1, Adam(0.9, 0.98,
    1e-9)), as in the peers. `cfg["xla"]` (default "auto") is `runtime.jit_compile`."""
    from keras_transformer.config import from_dict

    return from_dict(
        {
            "model": dict(
                num_layers=cfg["layers"],
                d_model=cfg["d"],
                num_heads=cfg["heads"],
                d_ff=cfg["ff"],
                dropout=0.1,
                norm_first=False,
                share_embeddings=True,
            ),
            "train": dict(
                label_smoothing=0.1, adam_beta_1=0.9, adam_beta_2=0.98, adam_epsilon=1e-9
            ),
            "runtime": dict(jit_compile=cfg.get("xla", "auto")),
        },
        name=name,
    )


def max_rss_mb():
    """Peak resident memory of this process so far, in MB (ru_maxrss is in KiB on Linux)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def emit(**fields):
    """Prints one JSON line with a UTC timestamp and the process's peak memory, and appends it to
    the script's ledger, `results/<script>.jsonl`, when `BENCH_LABEL` names the run; returns
    the line's fields."""
    fields.setdefault("max_rss_mb", max_rss_mb())
    fields["timestamp"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    fields["threads"] = os.cpu_count()
    print(json.dumps(fields), flush=True)
    sys.stdout.flush()
    ledger.record(os.path.splitext(os.path.basename(sys.argv[0]))[0], fields)
    return fields


def free_ports(count):
    """`count` TCP ports on 127.0.0.1 that were free a moment ago (for a local `TF_CONFIG`)."""
    import socket

    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def train_system(config, work, name, settings=()):
    """`keras-transformer train --config CONFIG` of one benchmark system in `WORK/NAME` (the CLI
    skips a finished one), exported to `WORK/saved_models/NAME`, with each `KEY=VALUE` of
    `settings` set in order; its output goes to `WORK/NAME.log`. Returns the export's path."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = os.path.join(work, "saved_models")
    command = [
        sys.executable, "-m", "keras_transformer.cli", "train", "--config", config,
        "--workdir", os.path.join(work, name),
        "--set", f"export.base_dir={base}", "--set", f"export.name={name}",
    ]  # fmt: skip
    for setting in settings:
        command += ["--set", setting]
    print(f"[{time.strftime('%H:%M:%S')}] training {name} ...", file=sys.stderr, flush=True)
    with open(os.path.join(work, f"{name}.log"), "a") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    return os.path.join(base, name)


def demo_vocabulary(directory, size=2000):
    """A SentencePiece vocabulary of `size` pieces trained on 5,000 synthetic pairs, written to
    `directory/spm.model` (the untrained demo exports' tokenizer); returns its path."""
    from keras_transformer.data.synthetic import generate
    from keras_transformer.data.tokenizer import train_sentencepiece

    pairs = generate("train", size=5000, seed=1)
    path = os.path.join(directory, "spm.model")
    train_sentencepiece([s for pair in pairs for s in pair], path, size, verbose=False)
    return path
