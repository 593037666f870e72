"""The README's main job, measured: `keras-transformer train --config configs/quickstart.yaml` in
a fresh temporary directory, then one JSON line with its dev and test sacreBLEU / chrF (beam 4),
steps, training minutes and precision, from the run's `result.json`.

    BENCH_LABEL=quickstart PYTHONPATH=$PWD TF_CPP_MIN_LOG_LEVEL=2 python benchmarks/quickstart.py

(`BENCH_LABEL` appends the line to `benchmarks/results/quickstart.jsonl`.) Extra arguments are
passed to `train`, e.g. `--set train.steps=20` for a smoke test. Takes about 3 minutes on 2 cores.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv):
    work = tempfile.mkdtemp(prefix="quickstart_")
    try:
        config = os.path.join(ROOT, "configs", "quickstart.yaml")
        command = [sys.executable, "-m", "keras_transformer.cli", "train", "--config", config,
                   "--workdir", os.path.join(work, "workdir"), *argv[1:]]
        env = dict(os.environ, PYTHONPATH=ROOT)
        subprocess.run(command, cwd=work, env=env, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(work, "workdir", "result.json"), encoding="utf-8") as f:
            result = json.load(f)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit(
        figure="quickstart",
        dev_bleu=result["dev"]["bleu"],
        dev_chrf=result["dev"]["chrf"],
        test_bleu=result["test"]["bleu"],
        test_chrf=result["test"]["chrf"],
        steps=result["step"],
        train_min=round(result["training_seconds"] / 60, 2),
        precision=result.get("precision"),
        max_rss_mb=None,  # the training ran in a child process; this one's peak says nothing
    )


if __name__ == "__main__":
    main(sys.argv)
