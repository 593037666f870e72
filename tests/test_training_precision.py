"""`runtime.mixed_precision: auto`: on a CPU it times float32 against mixed_bfloat16 on the run's
own model and batches, keeps the faster (bfloat16 only at 1.1x or more), records the choice in
the workdir, trains exactly as a run that named that precision, and never changes precision on
a resume. On accelerators it decides without timing."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the SavedModel's SentencePiece ops)
from training_helpers import tiny_config

from keras_transformer.config import ConfigError
from keras_transformer.data import read_pairs
from keras_transformer.models import build_transformer
from keras_transformer.training import compile_model, train
from keras_transformer.training.engines import precision
from keras_transformer.workdir import list_checkpoints


def _auto(workdir, **runtime):
    return tiny_config(
        workdir, train=dict(steps=4), runtime=dict(mixed_precision="auto", **runtime)
    )


def _last_weights(workdir):
    from keras_transformer.config import load_config

    config = load_config(os.path.join(workdir, "config.yaml"))
    model = build_transformer(config.model, 200)
    _, path = list_checkpoints(os.path.join(workdir, "checkpoints"))[-1]
    model.load_weights(path)
    return model.get_weights()


def test_choose_needs_the_margin():
    f32 = 1000.0
    assert precision.choose({"float32": f32, "mixed_bfloat16": 1.09 * f32}) == "float32"
    assert precision.choose({"float32": f32, "mixed_bfloat16": 1.1 * f32}) == "mixed_bfloat16"
    assert precision.choose({"float32": f32, "mixed_bfloat16": 0.68 * f32}) == "float32"


@pytest.mark.scenario
def test_measure_rates_times_real_train_steps_in_each_precision():
    config = tiny_config("/unused")
    rng = np.random.default_rng(0)
    batches = []
    for length in (6, 9):
        ids = rng.integers(4, 50, (8, length)).astype("int32")
        x = {"source_ids": ids, "target_ids": ids}
        batches.append((x, ids, (ids != 0).astype("float32")))
    built = {}

    def build(policy):
        dtype = None if policy == "float32" else policy
        built[policy] = compile_model(build_transformer(config.model, 50, dtype=dtype), config)
        return built[policy]

    rates = precision.measure_rates(build, batches, rounds=2)
    assert set(rates) == {"float32", "mixed_bfloat16"} and min(rates.values()) > 0
    # One untimed pass (tracing) and two timed ones over both batches, in each precision.
    for model in built.values():
        assert int(model.optimizer.iterations) == 3 * len(batches)
    assert built["mixed_bfloat16"].encoder.compute_dtype == "bfloat16"
    assert built["float32"].encoder.compute_dtype == "float32"


@pytest.mark.scenario
def test_auto_times_records_and_trains_as_the_chosen_precision(tmp_path, capsys):
    result = train(_auto(tmp_path / "auto"))
    out = capsys.readouterr().out
    with open(tmp_path / "auto" / precision.CHOICE_FILE) as f:
        record = json.load(f)
    rates = record["tokens_per_second"]
    assert record["precision"] == precision.choose(rates) == result["precision"]
    assert "precision auto: float32" in out and f"training in {record['precision']}" in out
    # The timing leaves no trace: the same weights as a run that named the precision itself.
    named = tiny_config(
        tmp_path / "named", train=dict(steps=4), runtime=dict(mixed_precision=record["precision"])
    )
    train(named)
    for a, b in zip(_last_weights(tmp_path / "auto"), _last_weights(tmp_path / "named")):
        np.testing.assert_array_equal(a, b)


@pytest.mark.scenario
def test_resume_keeps_the_recorded_choice_without_timing(tmp_path, monkeypatch, capsys):
    # A run that chose bfloat16 before (on whatever machine) stays in bfloat16 when resumed.
    os.makedirs(tmp_path, exist_ok=True)
    with open(tmp_path / precision.CHOICE_FILE, "w") as f:
        json.dump({"precision": "mixed_bfloat16", "reason": "timed before"}, f)

    def no_timing(*args, **kwargs):
        raise AssertionError("timed again on resume")

    monkeypatch.setattr(precision, "measure_rates", no_timing)
    result = train(_auto(tmp_path))
    assert result["precision"] == "mixed_bfloat16"
    assert "as chosen before" in capsys.readouterr().out


@pytest.mark.scenario(slow="times both precisions, then trains in the one chosen")
def test_a_faster_bfloat16_is_chosen_and_trained_in(tmp_path, monkeypatch):
    monkeypatch.setattr(
        precision,
        "measure_rates",
        lambda build, batches: {"float32": 100.0, "mixed_bfloat16": 150.0},
    )
    result = train(_auto(tmp_path))
    assert result["precision"] == "mixed_bfloat16"
    with open(tmp_path / precision.CHOICE_FILE) as f:
        assert json.load(f)["tokens_per_second"]["mixed_bfloat16"] == 150.0
    # The export's model card records the config the run trained with: the chosen precision,
    # not `auto` (train() once exported with the config it was given).
    with open(os.path.join(result["saved_model"], "assets.extra", "model_card.json")) as f:
        card = json.load(f)
    assert card["config"]["runtime"]["mixed_precision"] == "mixed_bfloat16"
    assert card["training"]["precision"] == "mixed_bfloat16"
    # Trained in bfloat16, exported in float32: the trainer's SavedModel answers exactly as a
    # re-export of the workdir by `keras-transformer export` (which builds float32).
    from keras_transformer import cli

    assert cli.main(["export", "--workdir", str(tmp_path), "--output", str(tmp_path / "re")]) == 0
    texts = tf.constant([s for s, _ in read_pairs(_auto(tmp_path).data.dev)])
    answers = [
        tf.saved_model.load(path).signatures["serving_default"](text=texts)
        for path in (result["saved_model"], str(tmp_path / "re" / "tiny" / "1"))
    ]
    assert answers[0]["translation"].numpy().tolist() == answers[1]["translation"].numpy().tolist()
    np.testing.assert_allclose(answers[0]["score"], answers[1]["score"], rtol=1e-6)


@pytest.mark.parametrize(
    "kind, capability, expected",
    [
        ("tpu", None, "mixed_bfloat16"),
        ("gpu", (8, 0), "mixed_bfloat16"),
        ("gpu", (7, 5), "mixed_float16"),
    ],
)
def test_accelerators_decide_without_timing(tmp_path, monkeypatch, kind, capability, expected):
    tf = pytest.importorskip("tensorflow")
    monkeypatch.setattr(precision, "device_kind", lambda strategy: kind)
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["GPU:0"])
    monkeypatch.setattr(
        tf.config.experimental,
        "get_device_details",
        lambda device: {"compute_capability": capability},
    )

    def no_timing(*args):
        raise AssertionError("timed on an accelerator")

    policy, record = precision.resolve_precision(str(tmp_path), None, no_timing, no_timing)
    assert policy == record["precision"] == expected
    with open(tmp_path / precision.CHOICE_FILE) as f:
        assert json.load(f)["precision"] == expected


def test_config_accepts_auto_and_names_it_in_errors(tmp_path):
    assert _auto(tmp_path).runtime.mixed_precision == "auto"
    with pytest.raises(ConfigError, match="or auto"):
        tiny_config(tmp_path, runtime=dict(mixed_precision="bf16"))
