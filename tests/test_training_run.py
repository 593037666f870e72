"""End-to-end training on the synthetic corpus: loss, TensorBoard, checkpoints, resume."""

import json
import os

import keras
import numpy as np
import pytest
from training_helpers import read_scalars, tiny_config

from keras_transformer.config import from_dict
from keras_transformer.data.shortlist import DEFAULT_K
from keras_transformer.models import build_transformer
from keras_transformer.training import compile_model, train
from keras_transformer.workdir import list_checkpoints


@pytest.mark.scenario(
    slow="a whole `train` and its resumption: steps, the dev-set choice, checkpoint averaging, "
    "the shortlist and a SavedModel export tracing every signature"
)
def test_short_run_learns_logs_checkpoints_and_resumes(tmp_path, capsys):
    config = tiny_config(tmp_path, train=dict(steps=8))
    result = train(config)
    assert result["step"] == 8
    assert 0.0 <= result["dev"]["bleu"] <= 100.0
    assert result["averaged_checkpoints"] == 2
    # The SavedModel: version 1 of export.base_dir/<name>.
    assert result["saved_model"] == str(tmp_path / "saved_models" / "tiny" / "1")
    assert os.path.exists(os.path.join(result["saved_model"], "saved_model.pb"))
    # By default (export.shortlist null) the export decodes over the workdir's vocabulary
    # shortlist, built from the prepared pairs with the default sizes, and says so.
    assert f"built the vocabulary shortlist {tmp_path / 'shortlist.npz'}" in capsys.readouterr().out
    assert _export_metadata(result)["shortlist"]["k"] == DEFAULT_K

    # The workdir layout.
    for name in ("config.yaml", "spm.model", "result.json", "backup"):
        assert os.path.exists(tmp_path / name), name
    with open(tmp_path / "result.json") as f:
        assert json.load(f)["step"] == 8
    # Checkpoints every 2 steps, the last 2 kept.
    assert [step for step, _ in list_checkpoints(tmp_path / "checkpoints")] == [6, 8]

    scalars = read_scalars(tmp_path / "logs")
    for tag in ("loss", "accuracy", "perplexity", "learning_rate", "tokens_per_second"):
        assert tag in scalars, (tag, sorted(scalars))
    assert "dev_bleu" in scalars and "sample_translations" in scalars
    assert [step for step, _ in scalars["loss"]] == list(range(1, 9))
    # The loss goes down (first step of epoch 1 vs the last step of epoch 2).
    assert scalars["loss"][-1][1] < scalars["loss"][0][1] - 0.2, scalars["loss"]

    # Asking for more steps resumes from the backup at step 8, not from step 0.
    capsys.readouterr()
    more = train(tiny_config(tmp_path, train=dict(steps=12), export=dict(shortlist=False)))
    assert "resuming from step 8" in capsys.readouterr().out
    assert more["step"] == 12
    new_steps = [step for step, _ in read_scalars(tmp_path / "logs")["learning_rate"]]
    assert new_steps == list(range(1, 13))  # steps 9..12 added, none repeated
    assert "shortlist" not in _export_metadata(more)  # export.shortlist: false

    # A finished run is not retrained.
    capsys.readouterr()
    again = train(tiny_config(tmp_path, train=dict(steps=12)))
    assert again["step"] == 12
    assert "already holds a finished run" in capsys.readouterr().out


def _export_metadata(result):
    with open(os.path.join(result["saved_model"], "assets.extra", "keras_transformer.json")) as f:
        return json.load(f)


def _batches(vocab=50, batch=4, seed=0):
    rng = np.random.default_rng(seed)
    source = rng.integers(4, vocab, size=(batch, 7)).astype("int32")
    target = rng.integers(4, vocab, size=(batch, 6)).astype("int32")
    target[:, 4:] = 0
    labels = np.concatenate([target[:, 1:], np.zeros((batch, 1), "int32")], axis=1)
    return {"source_ids": source, "target_ids": target}, labels


def _fit_one_step(config, jit_compile):
    keras.utils.set_random_seed(0)
    dtype = config.runtime.mixed_precision
    model = build_transformer(config.model, vocab_size=50, dtype=dtype)
    compile_model(model, config, jit_compile=jit_compile)
    x, y = _batches()
    before = [np.array(w) for w in model.get_weights()]
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    after = model.get_weights()
    assert np.isfinite(history.history["loss"][0])
    assert int(model.optimizer.iterations) == 1
    assert any(not np.array_equal(b, a) for b, a in zip(before, after))
    return model


def _small_config(**runtime):
    return from_dict(
        {
            "model": dict(num_layers=1, d_model=16, num_heads=2, d_ff=32, dropout=0.1),
            "train": dict(warmup_steps=10, clip_norm=1.0),
            "runtime": runtime,
        }
    )


@pytest.mark.scenario
def test_one_step_with_jit_compile():
    _fit_one_step(_small_config(jit_compile=True), jit_compile=True)


@pytest.mark.scenario
def test_one_step_with_mixed_bfloat16():
    model = _fit_one_step(_small_config(mixed_precision="mixed_bfloat16"), jit_compile=False)
    assert model.encoder.compute_dtype == "bfloat16"
    assert model.encoder.variable_dtype == "float32"
    x, _ = _batches()
    assert model(x).dtype == "float32"  # logits stay float32 for the loss


def test_mixed_float16_uses_loss_scaling():
    config = _small_config(mixed_precision="mixed_float16")
    model = build_transformer(config.model, vocab_size=50, dtype="mixed_float16")
    compile_model(model, config)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)


@pytest.mark.parametrize("precision", [None, "mixed_float16"])
def test_compile_model_creates_the_optimizer_moments_before_the_first_step(precision):
    config = _small_config(mixed_precision=precision)
    model = build_transformer(config.model, vocab_size=50, dtype=precision)
    compile_model(model, config)
    optimizer = model.optimizer
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    # One momentum and one velocity per trainable variable, zero until the first update.
    assert len(inner._momentums) == len(inner._velocities) == len(model.trainable_variables)
    for moment, weight in zip(inner._momentums, model.trainable_variables):
        assert tuple(moment.shape) == tuple(weight.shape)
        assert not np.any(np.asarray(moment))
    count = len(optimizer.variables)
    x, y = _batches()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert len(optimizer.variables) == count  # nothing created inside the step
    assert any(np.any(np.asarray(m)) for m in inner._momentums)


@pytest.mark.scenario
def test_gradient_accumulation_counts_optimizer_updates():
    config = from_dict(
        {
            "model": dict(num_layers=1, d_model=16, num_heads=2, d_ff=32),
            "train": dict(gradient_accumulation_steps=2),
        }
    )
    model = build_transformer(config.model, vocab_size=50)
    compile_model(model, config)
    x, y = _batches(batch=8)
    # Each batch of 4 rows holds the 2 micro-batches of one update.
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert int(model.optimizer.iterations) == 2
