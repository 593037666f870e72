"""What a LiteRT export costs on a device: its size on disk and the runtime's peak memory, for
the quickstart, small and base shapes, float32, float16 and dynamic_int8.

Usage (from the repository root, PYTHONPATH=$PWD):
    python benchmarks/litert_footprint.py                      # quickstart, small, base
    python benchmarks/litert_footprint.py --shapes small --quantizations dynamic_int8

Each shape's model (random weights; the quickstart's: `configs/quickstart.yaml`'s model with a
1,000-piece vocabulary) is exported with beam 4 and batch 32. A fresh process with TensorFlow
blocked loads the export with `keras_transformer.litert` and translates 32 sentences of `src`
random words in one request; its peak resident memory (`VmHWM`) is the figure, beside that
of a process that only imports the same modules (Python, numpy, SentencePiece, LiteRT). One
JSON line per shape and quantization (ledger `litert_footprint` with BENCH_LABEL set).
"""

import argparse
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import BASE, SMALL, emit  # noqa: E402
from benchmarks.serve_compare import build_model, word_vocabulary  # noqa: E402

QUICKSTART = {"vocab": 1000, "d": 128, "layers": 2, "heads": 4, "ff": 512, "src": 32, "tgt": 32}
SHAPES = {"quickstart": QUICKSTART, "small": SMALL, "base": BASE}

_CHILD = """
import sys
for name in ("tensorflow", "keras", "jax"):
    sys.modules[name] = None
from keras_transformer import litert
import numpy as np
if sys.argv[1] != "-":
    translator = litert.load(sys.argv[1], num_threads=2)
    rng = np.random.default_rng(1)
    vocab, length = int(sys.argv[2]), int(sys.argv[3])
    texts = [" ".join(f"t{i}" for i in rng.integers(4, vocab, length)) for _ in range(32)]
    translator.translate(texts)
with open("/proc/self/status") as f:  # VmHWM: this image's own peak (ru_maxrss keeps the
    print([int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM")][0])  # parent's)
"""


def peak_mb(path, cfg):
    """Peak RSS (MB) of a fresh process translating with the export at `path` ("-": imports
    only)."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, path, str(cfg["vocab"]), str(cfg["src"])],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": ROOT},
    )  # fmt: skip
    return float(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="quickstart,small,base")
    parser.add_argument("--quantizations", default="float32,float16,dynamic_int8")
    args = parser.parse_args()
    from keras_transformer.config import DecodingSettings
    from keras_transformer.export.litert import export_litert
    from keras_transformer.export.plan import ExportPlan

    baseline = peak_mb("-", QUICKSTART)
    for name in args.shapes.split(","):
        cfg = SHAPES[name]
        model = build_model(cfg)
        settings = DecodingSettings(
            beam_size=4, batch_size=32, max_extra_length=cfg["tgt"] - cfg["src"]
        )
        data = {"max_source_length": cfg["src"] + 1, "max_target_length": cfg["tgt"] + 1}
        with tempfile.TemporaryDirectory(prefix="kt-litert-footprint-") as work:
            for q in args.quantizations.split(","):
                plan = ExportPlan(quantization=q, settings=settings, data=data)
                vocabulary = word_vocabulary(cfg["vocab"])
                path = export_litert(model, vocabulary, os.path.join(work, q), plan)
                files = {f: os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)}
                emit(what="litert_footprint", shape=name, quantization=q,
                     parameters=model.count_params(),
                     disk_mb=round(sum(files.values()) / 1e6, 2),
                     encoder_mb=round(files["encoder.tflite"] / 1e6, 2),
                     decoder_step_mb=round(files["decoder_step.tflite"] / 1e6, 2),
                     peak_rss_mb=round(peak_mb(path, cfg), 1),
                     imports_only_rss_mb=round(baseline, 1),
                     request="32 sentences, beam 4")  # fmt: skip


if __name__ == "__main__":
    main()
