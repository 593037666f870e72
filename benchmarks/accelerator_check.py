"""The accelerator check: the project's figures on whatever JAX device is at hand, in one command
that needs no TensorFlow (see ../shared/GPU.md for running it on a GPU machine).

Usage (from the repository root):
    KERAS_BACKEND=jax PYTHONPATH=$PWD python benchmarks/accelerator_check.py [--tiny]
        [--out FILE] [--budget-s 450] [--skip torch,decode,...]

Needs Python, numpy, JAX, Keras 3 and its small pure-Python dependencies (`namex`, `optree`),
sentencepiece and sacrebleu (for the synthetic corpus's BLEU), and this project; PyTorch where
it is installed (the peer). Nothing else: it imports no TensorFlow (a test runs it with
`tensorflow` made unimportable, at `--tiny` shapes, in seconds on the CPU).

One JSON line per figure (stdout, and appended to `--out` when given; to the ledger
`results/accelerator_check.jsonl` when `BENCH_LABEL` names the run), in this order:

- `device`: the device's kind and count, JAX and Keras versions, the nominal bf16 peak;
- `peak_matmul`: the best bf16 (and float32) matrix-product TFLOP/s measured here;
- `torch_train`: PyTorch `nn.Transformer` at the same shapes under `torch.autocast(bfloat16)`
  (a subprocess, before JAX takes the device; skipped without PyTorch or a CUDA device);
- `train`: our `model.fit` at the base shapes of `../shared/bench` (batch 64, and batch 512),
  float32 and `mixed_bfloat16`: target tokens/s, MFU against the measured bf16 peak and
  against the nominal one;
- `decode`: cached beam-4 decoding at base (32 sources of 32 tokens, at most 32 output tokens,
  random weights), output tokens/s;
- `quickstart`: the quickstart's synthetic corpus (its vocabulary, model and 600 steps)
  trained with `model.fit`, then its dev BLEU (greedy and beam 4).

Counting as in `../shared/bench/README.md`: training tokens/s = batch * tgt * steps / seconds from
the end of a warm-up step; training FLOPs per target token by its formula. Each section checks
the time left of `--budget-s` first and is skipped (a line says so) when it would not fit; a
section that fails prints an `error` line and the others still run.
"""

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import BASE, emit, train_flops_per_token  # noqa: E402

# Nominal dense bf16 peaks (TFLOP/s, no sparsity) of the devices this may meet.
NOMINAL_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L4": 121.0, "V100": 125.0}
TINY = dict(vocab=64, d=16, layers=1, heads=2, ff=32, batch=8, src=8, tgt=8, steps=2)
# Seconds each section is expected to need on one H100/H200 (skipped when less is left).
EXPECTED_S = {"torch_train": 60, "train": 50, "decode": 40, "quickstart": 90}


class Check:
    def __init__(self, args):
        self.args, self.started = args, time.perf_counter()
        self.tiny = args.tiny
        self.base = dict(TINY if self.tiny else BASE, steps=2 if self.tiny else 50)

    def left(self):
        return self.args.budget_s - (time.perf_counter() - self.started)

    def emit(self, **fields):
        fields["elapsed_s"] = round(time.perf_counter() - self.started, 1)
        fields["tiny"] = self.tiny
        fields = emit(**fields)
        if self.args.out:
            with open(self.args.out, "a") as f:
                f.write(json.dumps(fields) + "\n")

    def section(self, name, function):
        if name in self.args.skip:
            return None
        need = 0 if self.tiny else EXPECTED_S.get(name, 0)
        if self.left() < need:
            self.emit(what=name, skipped=f"{self.left():.0f} s left of --budget-s, {need} needed")
            return None
        try:
            return function()
        except Exception as error:  # one section's failure must not cost the others' figures
            self.emit(what=name, error=f"{type(error).__name__}: {error}"[:500])
            return None


def device_info(check):
    import jax
    import keras

    devices = jax.devices()
    kind = devices[0].device_kind
    nominal = next((v for k, v in NOMINAL_BF16_TFLOPS.items() if k in kind), None)
    check.emit(
        what="device", platform=devices[0].platform, device_kind=kind, devices=len(devices),
        jax=jax.__version__, keras=keras.__version__, nominal_bf16_tflops=nominal,
        # None: the backend's default (TF32 for float32 products on NVIDIA GPUs since Ampere)
        float32_matmul_precision=jax.config.jax_default_matmul_precision,
    )  # fmt: skip
    return devices[0].platform, nominal


def peak_matmul(check):
    """Best bf16 and float32 (the backend's default precision) n^3 products, TFLOP/s."""
    import jax
    import jax.numpy as jnp

    sizes = (128, 256) if check.tiny else (4096, 8192)
    peaks = {}
    for dtype in ("bfloat16", "float32"):
        best = 0.0
        for n in sizes:
            a = jax.random.normal(jax.random.key(0), (n, n), dtype)
            b = jax.random.normal(jax.random.key(1), (n, n), dtype)
            product = jax.jit(jnp.matmul)
            product(a, b).block_until_ready()
            repeats = max(2, int(5e13 / (2 * n**3))) if not check.tiny else 2
            for _ in range(3):
                start = time.perf_counter()
                for _ in range(repeats):
                    c = product(a, b)
                c.block_until_ready()
                best = max(best, 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12)
        peaks[dtype] = round(best, 2)
    check.emit(what="peak_matmul", bf16_tflops=peaks["bfloat16"], fp32_tflops=peaks["float32"],
               sizes=list(sizes))  # fmt: skip
    return peaks["bfloat16"]


def train(check, cfg, dtype, peak, nominal):
    """`train_throughput.py`'s measurement (its model, compile, data and timer) in this
    process, with MFU against the peaks."""
    from benchmarks.train_throughput import _StepTimer, build_and_compile, make_dataset

    model, _ = build_and_compile(dict(cfg, dtype=None if dtype == "float32" else dtype))
    x, y = make_dataset(cfg)  # numpy arrays on this backend
    timer = _StepTimer()
    start = time.perf_counter()
    model.fit(x, y, batch_size=cfg["batch"], epochs=1, verbose=0, shuffle=False,
              callbacks=[timer])  # fmt: skip
    warmup = timer.start - start
    tokens_per_s = cfg["batch"] * cfg["tgt"] * cfg["steps"] / (timer.end - timer.start)
    flops = train_flops_per_token(cfg) * tokens_per_s
    check.emit(
        what="train", impl="keras_transformer", dtype=dtype, tokens_per_s=round(tokens_per_s, 1),
        model_tflops_per_s=round(flops / 1e12, 3),
        mfu_measured_bf16=round(flops / (peak * 1e12), 4) if peak else None,
        mfu_nominal_bf16=round(flops / (nominal * 1e12), 4) if nominal else None,
        warmup_s=round(warmup, 1), params=model.count_params(), cfg=cfg,
    )  # fmt: skip
    return tokens_per_s


def decode(check):
    """Cached beam-4 search at base in one jitted function of the variables' values (as Keras
    runs its own steps on JAX), 32 sources, at most `tgt` output tokens."""
    import keras
    import numpy as np

    from benchmarks.common import bench_config
    from benchmarks.train_throughput import make_dataset
    from keras_transformer.config import DecodingSettings
    from keras_transformer.evaluation import compiled_search
    from keras_transformer.models import build_transformer

    cfg = check.base
    keras.utils.set_random_seed(0)
    model = build_transformer(bench_config(cfg).model, cfg["vocab"])
    sources = make_dataset(cfg)[0]["source_ids"][:32]
    sources[:, -1] = 3  # EOS, as in training
    # At most `tgt` output tokens: the search's limit is the source length plus this.
    settings = DecodingSettings(beam_size=4, alpha=0.6, max_extra_length=cfg["tgt"] - cfg["src"])
    search = compiled_search(model, settings)
    start = time.perf_counter()
    ids = search(sources)
    warmup = time.perf_counter() - start
    runs = 1 if check.tiny else 10
    start = time.perf_counter()
    for _ in range(runs):
        ids = search(sources)
    seconds = time.perf_counter() - start
    tokens = int(np.sum(np.cumsum(ids == 3, axis=1) - (ids == 3) == 0)) * runs  # through EOS
    check.emit(
        what="decode", impl="keras_transformer", search="beam4",
        tokens_per_s=round(tokens / seconds, 1),
        sentences=len(sources), runs=runs, warmup_s=round(warmup, 1), cfg=cfg,
    )  # fmt: skip


def quickstart_data(config, train_size=None, dev_size=200, threads=None):
    """The quickstart's data without TensorFlow: `(pairs, dev pairs, sentencepiece processor)`,
    the synthetic corpus (`train_size` pairs, default all), a vocabulary trained on it as
    `prepare` trains one, and the training pairs as int32 piece arrays (no BOS/EOS), as
    `data.records.prepared_pairs` reads them."""
    import numpy as np
    import sentencepiece as spm

    from keras_transformer.data import synthetic
    from keras_transformer.data.tokenizer import _spm_train

    d = config.data
    train_pairs = synthetic.generate("train", size=train_size)
    dev_pairs = synthetic.generate("dev", size=dev_size)
    sentences = [s for pair in train_pairs for s in pair]
    proto = _spm_train(sentences, d.vocab_size, d.spm_model_type, d.spm_character_coverage, 1234,
                       threads or os.cpu_count() or 1)  # fmt: skip
    processor = spm.SentencePieceProcessor(model_proto=proto)
    pairs = [(np.asarray(processor.encode(s), np.int32), np.asarray(processor.encode(t), np.int32))
             for s, t in train_pairs]  # fmt: skip
    return pairs, dev_pairs, processor


def quickstart(check):
    """The quickstart (configs/quickstart.yaml: its synthetic corpus, vocabulary, model and
    steps) trained with `model.fit` on numpy batches, then its dev BLEU."""
    import dataclasses

    import keras

    from benchmarks.train_throughput import _StepTimer
    from keras_transformer.config import decoding_settings, load_config
    from keras_transformer.data.records import numpy_batches
    from keras_transformer.evaluation import evaluate_bleu
    from keras_transformer.models import build_transformer
    from keras_transformer.training.recipe import compile_model

    tiny = ["model.num_layers=1", "model.d_model=16", "model.d_ff=32", "model.num_heads=2",
            "train.steps=4", "data.vocab_size=100", "data.tokens_per_batch=256"]  # fmt: skip
    config = load_config(os.path.join(ROOT, "configs", "quickstart.yaml"),
                         overrides=tiny if check.tiny else None)  # fmt: skip
    start = time.perf_counter()
    pairs, dev_pairs, processor = quickstart_data(
        config, 500 if check.tiny else None, 20 if check.tiny else 200
    )
    prepared = time.perf_counter() - start
    keras.utils.set_random_seed(config.train.seed)
    model = build_transformer(config.model, processor.get_piece_size())
    compile_model(model, config, jit_compile=True)
    batches = numpy_batches(pairs, config.data, seed=config.train.seed)
    timer = _StepTimer()
    start = time.perf_counter()
    model.fit(batches, steps_per_epoch=config.train.steps, epochs=1, verbose=0, callbacks=[timer])
    trained = time.perf_counter() - start
    settings = decoding_settings(config).without_sampling()
    start = time.perf_counter()
    greedy, _ = evaluate_bleu(
        model, processor, dev_pairs, config.data, dataclasses.replace(settings, beam_size=1)
    )
    beam, _ = evaluate_bleu(model, processor, dev_pairs, config.data, settings)
    check.emit(
        what="quickstart", steps=config.train.steps, dev_bleu_greedy=greedy["bleu"],
        dev_bleu_beam=beam["bleu"], beam_size=settings.beam_size, dev_sentences=len(dev_pairs),
        prepare_s=round(prepared, 1), train_s=round(trained, 1),
        steady_steps_per_s=round((config.train.steps - 1) / (timer.end - timer.start), 1),
        bleu_s=round(time.perf_counter() - start, 1),
    )  # fmt: skip


def torch_train(check, cfgs):
    """PyTorch's `nn.Transformer` in a subprocess (PyTorch and JAX must not share the device's
    memory), under `torch.autocast(bfloat16)`; None where PyTorch or CUDA is missing."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        check.emit(what="torch_train", skipped="torch is not installed")
        return
    for cfg in cfgs:
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--torch-peer", json.dumps(cfg)],
            capture_output=True, text=True, timeout=max(30, check.left()),
        )  # fmt: skip
        if done.returncode != 0:
            check.emit(what="torch_train", error=done.stderr.strip()[-500:], cfg=cfg)
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if "skipped" not in result:
            flops = train_flops_per_token(cfg) * result["tokens_per_s"]
            result["model_tflops_per_s"] = round(flops / 1e12, 3)
        check.emit(what="torch_train", **result)


def torch_peer(cfg):
    """The peer: post-norm `nn.Transformer` with one embedding shared by source, target and
    output, fixed sinusoid-free zero positions (their cost is negligible), label smoothing 0.1,
    Adam(0.9, 0.98, 1e-9), every step under `torch.autocast("cuda", torch.bfloat16)`."""
    import torch
    from torch import nn

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device for PyTorch"}
    device = "cuda"
    torch.manual_seed(0)

    class Peer(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(cfg["vocab"], cfg["d"])
            self.core = nn.Transformer(cfg["d"], cfg["heads"], cfg["layers"], cfg["layers"],
                                       cfg["ff"], 0.1, batch_first=True)  # fmt: skip

        def forward(self, source, target):
            scale = cfg["d"] ** 0.5
            mask = nn.Transformer.generate_square_subsequent_mask(target.shape[1], device=device)
            hidden = self.core(self.embedding(source) * scale, self.embedding(target) * scale,
                               tgt_mask=mask, tgt_is_causal=True)  # fmt: skip
            return hidden @ self.embedding.weight.T

    model = Peer().to(device)
    optimizer = torch.optim.Adam(model.parameters(), 1e-4, betas=(0.9, 0.98), eps=1e-9)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    generator = torch.Generator(device="cpu").manual_seed(0)
    source = torch.randint(3, cfg["vocab"], (cfg["batch"], cfg["src"]), generator=generator)
    target = torch.randint(3, cfg["vocab"], (cfg["batch"], cfg["tgt"] + 1), generator=generator)
    source, target = source.to(device), target.to(device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", torch.bfloat16):
            logits = model(source, target[:, :-1])
            loss = loss_fn(logits.float().reshape(-1, cfg["vocab"]), target[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        return loss

    step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(cfg["steps"]):
        step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens_per_s = cfg["batch"] * cfg["tgt"] * cfg["steps"] / seconds
    return {
        "impl": "torch.nn.Transformer",
        "dtype": "autocast_bfloat16",
        "torch": torch.__version__,
        "tokens_per_s": round(tokens_per_s, 1),
        "cfg": cfg,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes: seconds on a CPU")
    parser.add_argument("--out", help="also append the JSON lines to this file")
    parser.add_argument("--budget-s", type=float, default=450.0, help="the whole check's time")
    parser.add_argument("--skip", default="", help="sections to skip, comma-separated")
    parser.add_argument("--torch-peer", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torch_peer:
        print(json.dumps(torch_peer(json.loads(args.torch_peer))), flush=True)
        return 0
    args.skip = set(filter(None, args.skip.split(",")))
    check = Check(args)
    big = dict(check.base, batch=8 if check.tiny else 512, steps=2 if check.tiny else 20)
    shapes = [check.base] if check.tiny else [check.base, big]
    if not check.tiny:  # before JAX takes the device's memory
        check.section("torch_train", lambda: torch_train(check, shapes))
    import keras

    if keras.backend.backend() != "jax":
        raise SystemExit("run with KERAS_BACKEND=jax")
    platform, nominal = device_info(check)
    peak = check.section("peak_matmul", lambda: peak_matmul(check))
    for cfg in shapes:
        for dtype in ("float32", "mixed_bfloat16"):
            check.section("train", lambda: train(check, cfg, dtype, peak, nominal))
    check.section("decode", lambda: decode(check))
    check.section("quickstart", lambda: quickstart(check))
    check.emit(what="done", seconds=round(time.perf_counter() - check.started, 1),
               platform=platform)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
