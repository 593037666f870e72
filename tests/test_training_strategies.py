"""`train()` (through the CLI) and the paper's configs under MirroredStrategy over two logical
CPU devices, with gradient accumulation and mixed_bfloat16.

Each run happens in a fresh subprocess (`train_runner.py`): logical devices must be set up
before TensorFlow initialises.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from training_helpers import (
    RUNNER,
    assert_one_run_in_workdir,
    call_in_runner,
    load_npz_weights,
    subprocess_env,
    tiny_yaml,
    write_yaml,
)


@pytest.mark.scenario(
    slow="a `train` process on two logical CPUs under MirroredStrategy (bfloat16, accumulation, "
    "EMA) through the dev-set choice and its export"
)
def test_train_under_mirrored_strategy_with_accumulation_bfloat16_and_ema(tmp_path):
    workdir = tmp_path / "work"
    values = tiny_yaml(
        workdir,
        train=dict(
            steps=6,
            steps_per_epoch=3,
            checkpoint_every=3,
            gradient_accumulation_steps=2,
            ema_momentum=0.9,
        ),
        runtime=dict(strategy="mirrored", mixed_precision="mixed_bfloat16", jit_compile=False),
    )
    config = write_yaml(tmp_path / "tiny.yaml", values)
    dump = tmp_path / "weights.npz"
    run = subprocess.run(
        [sys.executable, RUNNER, "--logical-cpus", "2", "--dump-weights", str(dump), "--"]
        + ["train", "--config", config],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "MirroredStrategy (2 replicas)" in run.stdout, run.stdout[-2000:]
    assert "gradient accumulation 2" in run.stdout
    # The averages swapped in for the checkpoints and dev BLEU, and put into the model at the
    # end of fit, stay equal on both replicas (checked below).
    assert "weights averaged (EMA 0.9)" in run.stdout
    with open(workdir / "result.json") as f:
        assert json.load(f)["step"] == 6
    weights, data = load_npz_weights(dump)
    assert int(data["iterations"]) == 6
    assert int(data["local_copies"]) == 2 and bool(data["local_copies_equal"])
    assert all(np.isfinite(w).all() for w in weights)
    files = assert_one_run_in_workdir(workdir)
    assert {f for f in files if f.startswith("checkpoints")} == {
        os.path.join("checkpoints", "ckpt-3.weights.h5"),
        os.path.join("checkpoints", "ckpt-3.weights.h5.sha256"),
        os.path.join("checkpoints", "ckpt-6.weights.h5"),
        os.path.join("checkpoints", "ckpt-6.weights.h5.sha256"),
    }


def paper_config_two_steps(name, accumulation):
    """Run by `train_runner.py --logical-cpus 2`: the paper config `name` builds, compiles and
    makes two optimizer steps under MirroredStrategy with its own gradient accumulation and mixed
    precision, its layers' shapes kept (d_model, heads, d_ff, dropout); a 64-piece vocabulary,
    8-token sentences and 1 block per stack instead of 6, for a 2-core CPU (tracing the six-block
    stacks for two replicas took minutes there; `transformer_big` with 2 blocks peaked at 3.7 GB
    resident, with 1 at 2.3 GB)."""
    import keras
    import tensorflow as tf

    from keras_transformer.config import load_config
    from keras_transformer.models import build_transformer
    from keras_transformer.training import compile_model
    from keras_transformer.training.engines.distribute import get_strategy

    root = os.path.dirname(RUNNER)
    accumulation = int(accumulation)
    config = load_config(
        os.path.join(os.path.dirname(root), "configs", f"{name}.yaml"),
        overrides=[
            "runtime.strategy=mirrored",
            "runtime.jit_compile=false",
            "train.steps=2",
            "model.num_layers=1",
        ],
    )
    assert config.train.gradient_accumulation_steps == accumulation
    strategy = get_strategy(config.runtime)
    assert strategy.num_replicas_in_sync == 2
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = build_transformer(config.model, 64, dtype=config.runtime.mixed_precision)
        compile_model(model, config)
        # As train() does: created here, not while the first step is traced (which would
        # trace it twice).
        model.optimizer.build(model.trainable_variables)
    # One sentence per micro-batch and replica: 2 x accumulation rows per global batch.
    rows = 2 * accumulation
    rng = np.random.default_rng(0)
    source = rng.integers(4, 64, size=(rows, 8)).astype("int32")
    target = rng.integers(4, 64, size=(rows, 8)).astype("int32")
    labels = np.concatenate([target[:, 1:], np.zeros((rows, 1), "int32")], axis=1)
    dataset = tf.data.Dataset.from_tensors(
        ({"source_ids": source, "target_ids": target}, labels)
    ).repeat()
    history = model.fit(dataset, steps_per_epoch=2, epochs=1, verbose=0)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 2, name
    assert np.isfinite(history.history["loss"]).all(), (name, history.history)
    print(f"{name}: {model.count_params():,} parameters, 2 steps", flush=True)


@pytest.mark.scenario(
    slow="a paper config's layer shapes (transformer_big: d_model 1024, d_ff 4096) built, "
    "compiled and stepped twice for two replicas under MirroredStrategy, in a process of its own"
)
@pytest.mark.parametrize("name, accumulation", [("transformer_base", 4), ("transformer_big", 6)])
def test_paper_configs_run_two_steps_under_mirrored_strategy(name, accumulation):
    """Each config in its own process (both in one held both models' memory: 5.7 GB)."""
    run = call_in_runner(
        "test_training_strategies:paper_config_two_steps", name, accumulation, timeout=540
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"{name}: " in run.stdout
