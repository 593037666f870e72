"""Serving fuzz: thousands of random byte strings to every signature of an exported model, in a
process with only `tensorflow` and `tensorflow_text` (serving_fuzz_worker.py): every row answered,
no crash, memory bounded."""

import json
import os
import subprocess
import sys

import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serving_fuzz_worker.py")
ROWS = 1500  # per signature: a few thousand strings in all, some 100 kB (about 1 MB per signature)
MAX_BYTES = 100_000
# Resident memory may grow as TensorFlow's oneDNN kernels cache primitives for new shapes (an
# LRU cache of bounded size; flat with TF_ENABLE_ONEDNN_OPTS=0): about 150 MiB after the warm-up
# here, some 30 MiB of it while the same requests are sent again. An input that is not truncated
# (a 100 kB string is ~50k tokens) needs gigabytes at once.
MEMORY_GROWTH_MB = 512
REPEAT_GROWTH_MB = 128


@pytest.mark.scenario(
    slow="a serving process answering random bytes in every signature, batch after batch"
)
def test_every_signature_answers_every_row_of_random_bytes(exported_copy_model, tmp_path):
    _, path = exported_copy_model
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONPATH", None)  # no keras_transformer in the serving process
    done = subprocess.run(
        [sys.executable, WORKER, path, "35", str(ROWS), str(MAX_BYTES)],
        capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["modules"] == []  # keras_transformer was never imported
    assert {"serving_default", "translate_nbest", "score"} <= set(report["signatures"])
    assert report["failures"] == [], report["failures"][:5]
    assert report["largest"] == MAX_BYTES, report["largest"]
    for name in report["signatures"]:
        assert report["rows"][name] >= ROWS, report["rows"]
    memory = report["memory"]
    assert memory["peak_mb"] - memory["after_warmup_mb"] < MEMORY_GROWTH_MB, memory
    assert memory["after_second_pass_mb"] - memory["after_first_pass_mb"] < REPEAT_GROWTH_MB, memory
