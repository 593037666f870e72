"""What the SavedModel offers beyond translations: target-prefix decoding (`translate_prefix`),
per-token scores and a calibrated confidence, the model card and TF Serving's warmup requests
(on the trained copy model; the fresh-process test loads it as TF Serving would)."""

import json
import os

import _inference_fixtures as fx
import numpy as np
import pytest
import tensorflow as tf
from _fresh_process import latin1, run_fresh

from keras_transformer.decoding.search import length_penalty
from keras_transformer.export import calibration as calib

# Numerically sensitive: CI runs this module again with oneDNN off and with one thread.
pytestmark = pytest.mark.numerics

DECODE = fx.EXPORT_DECODE
NORMAL = fx.NORMAL
HOSTILE = [*fx.HOSTILE, *fx.NORMAL]


def _strings(values):
    return [v.decode("utf-8") for v in np.asarray(values).reshape(-1)]


def _pieces(text):
    return fx.spm_processor().encode(text)


def test_a_forced_prefix_starts_every_translation(exported_copy_model):
    translator, _ = exported_copy_model
    # Prefixes the copy model would never choose (a wrong first word, words it must go on from).
    prefixes = ["cat", "fish white", "blue blue blue", "dog"]
    out = translator.translate_prefix(tf.constant(NORMAL), tf.constant(prefixes))
    translations = _strings(out["translation"])
    for prefix, translation in zip(prefixes, translations):
        assert _pieces(translation)[: len(_pieces(prefix))] == _pieces(prefix), translation
    # The search continues after the prefix: the copy model copies the rest of the sentence.
    assert translations[1].startswith("fish white") and translations[1] != "fish white"


def test_a_prefixed_score_is_its_continuations(exported_copy_model, copy_model):
    """The prefix is given: the score is the log-probability of what follows it (EOS included)
    over the whole output's length penalty, by a full forward pass; counting the prefix would
    make a costly prefix favour long outputs (the Intel Xeon failure against CTranslate2)."""
    translator, _ = exported_copy_model
    prefixes = ["cat", "fish white", "blue blue blue", "dog"]
    out = translator.translate_prefix(tf.constant(NORMAL), tf.constant(prefixes))
    for text, prefix, translation, score in zip(
        NORMAL, prefixes, _strings(out["translation"]), np.asarray(out["score"])
    ):
        target = [*_pieces(translation), fx.EOS]
        logits = copy_model(
            {
                "source_ids": fx.encode_sources([text]),
                "target_ids": np.array([[fx.BOS, *target[:-1]]], "int32"),
            }
        )
        logits = np.asarray(logits, "float64")[0]
        top = logits.max(-1, keepdims=True)
        log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        token_log_probs = log_probs[np.arange(len(target)), target]
        given = len(_pieces(prefix))
        penalty = float(length_penalty(len(target), DECODE["alpha"]))
        assert score == pytest.approx(token_log_probs[given:].sum() / penalty, abs=1e-4)
        # The prefix was not the model's choice: counting it would have cost more than 1 nat.
        assert token_log_probs[:given].sum() < -1.0


def test_an_empty_prefix_equals_serving_default(exported_copy_model):
    translator, _ = exported_copy_model
    texts = tf.constant(HOSTILE)
    plain = translator(texts)
    prefixed = translator.translate_prefix(texts, tf.constant([""] * len(HOSTILE)))
    assert _strings(prefixed["translation"]) == _strings(plain["translation"])
    np.testing.assert_allclose(prefixed["score"], plain["score"], rtol=1e-6)


def test_translate_prefix_answers_hostile_rows(exported_copy_model):
    translator, _ = exported_copy_model
    prefixes = HOSTILE[::-1]  # hostile prefixes too: empty, very long, invalid UTF-8
    out = translator.translate_prefix(tf.constant(HOSTILE * 2), tf.constant(prefixes * 2))
    assert out["translation"].shape == (len(HOSTILE) * 2,)
    assert np.all(np.isfinite(out["score"]))
    # A prefix longer than any output is cut to leave room for EOS, never a failure.
    longest = len(_pieces(_strings(out["translation"])[2 * len(HOSTILE) - 3]))
    assert longest <= DECODE["max_extra_length"]
    empty = translator.translate_prefix(tf.zeros([0], tf.string), tf.zeros([0], tf.string))
    assert empty["translation"].shape == (0,)
    with pytest.raises(tf.errors.InvalidArgumentError, match="text has"):
        translator.translate_prefix(tf.constant(["a", "b"]), tf.constant(["a"]))


def test_token_scores_sum_to_the_score_before_the_length_penalty(exported_copy_model):
    translator, _ = exported_copy_model
    out = translator(tf.constant(HOSTILE))
    token_scores = np.asarray(out["token_scores"])  # [n, longest output]
    lengths = np.array([len(_pieces(t)) + 1 for t in _strings(out["translation"])])  # + EOS
    assert token_scores.shape == (len(HOSTILE), lengths.max())
    assert np.all(token_scores <= 0)
    for row, length in zip(token_scores, lengths):
        assert np.all(row[:length] < 0) and np.all(row[length:] == 0)
    penalty = np.asarray(length_penalty(lengths, DECODE["alpha"]))
    np.testing.assert_allclose(token_scores.sum(1), np.asarray(out["score"]) * penalty, atol=1e-4)

    nbest = translator.translate_nbest(tf.constant(NORMAL))
    k = DECODE["beam_size"]
    lengths = np.array([[len(_pieces(t)) + 1 for t in row] for row in
                        np.asarray(nbest["translations"]).astype(str)])  # fmt: skip
    assert nbest["token_scores"].shape[:2] == (len(NORMAL), k)
    penalty = np.asarray(length_penalty(lengths, DECODE["alpha"]))
    np.testing.assert_allclose(
        np.sum(nbest["token_scores"], -1), np.asarray(nbest["scores"]) * penalty, atol=1e-4
    )


def test_confidence_is_in_0_1_and_never_rises_along_the_n_best_list(exported_copy_model):
    """The map is monotone in the score and the margin (weights >= 0), and both fall along an
    n-best list (best first), so the confidence cannot rise there: an invariant of the formula,
    whatever the CPU's rounding (the mean token log-probability, used before, is not: the best
    hypothesis by length-penalised score need not have the highest mean)."""
    translator, _ = exported_copy_model
    out = translator(tf.constant(HOSTILE))
    confidence = np.asarray(out["confidence"])
    assert confidence.shape == (len(HOSTILE),) and np.all((confidence > 0) & (confidence < 1))
    nbest = translator.translate_nbest(tf.constant(HOSTILE))
    np.testing.assert_allclose(nbest["confidence"][:, 0], confidence, rtol=1e-6)
    scores, nbest_confidence = np.asarray(nbest["scores"]), np.asarray(nbest["confidence"])
    assert np.all(np.diff(scores, axis=1) <= 1e-6)  # best first
    assert np.all(np.diff(nbest_confidence, axis=1) <= 1e-6), nbest_confidence


def test_the_exported_confidence_is_the_map_fitted_on_the_dev_set(exported_copy_model):
    """The SavedModel's `confidence` is the map the export fitted (the card's constants) on the
    search's score and n-best margin, and not the unfitted default map."""
    from keras_transformer.search_rules import DEFAULT_CALIBRATION

    _, path = exported_copy_model
    with open(os.path.join(path, "assets.extra", "model_card.json")) as f:
        fitted = json.load(f)["calibration"]
    assert fitted["fitted"]
    loaded = tf.saved_model.load(path)
    texts = tf.constant(HOSTILE)
    answer = loaded.signatures["serving_default"](text=texts)
    nbest = loaded.signatures["translate_nbest"](text=texts)
    scores = np.asarray(nbest["scores"], "float64")  # [n, K] best first
    np.testing.assert_allclose(answer["score"], scores[:, 0], rtol=1e-6)
    x = calib.features(scores[:, 0], scores[:, 0] - scores[:, 1])  # the best's margin
    expected = calib.apply_calibration(fitted, x)
    np.testing.assert_allclose(answer["confidence"], expected, atol=1e-5)
    default = calib.apply_calibration(DEFAULT_CALIBRATION, x)
    assert np.max(np.abs(default - expected)) > 0.05, (fitted, DEFAULT_CALIBRATION)


def test_calibration_fits_a_monotone_map_that_ranks_by_chrf():
    rng = np.random.default_rng(0)
    x = np.stack([rng.uniform(-3, 0, 400), rng.uniform(0, 5, 400)], axis=1)
    target = 1 / (1 + np.exp(-(1.5 * x[:, 0] + 0.5 * x[:, 1] + 1)))
    fitted = calib.fit_calibration(x, target)
    assert fitted["score_weight"] == pytest.approx(1.5, abs=0.1)
    assert fitted["margin_weight"] == pytest.approx(0.5, abs=0.1)
    assert calib.spearman(calib.apply_calibration(fitted, x), target) > 0.99
    # A feature that lowers quality gets weight 0, not a negative one: the map stays monotone.
    assert calib.fit_calibration(x, 1 - target)["score_weight"] == 0.0
    assert calib.spearman([1, 2, 3, 4], [10, 20, 30, 5]) == pytest.approx(-0.2)


def test_every_export_carries_a_model_card_that_info_prints(exported_copy_model, run_cli):
    _, path = exported_copy_model
    with open(os.path.join(path, "assets.extra", "model_card.json")) as f:
        card = json.load(f)
    assert card["decoding"]["beam_size"] == DECODE["beam_size"]
    assert card["vocabulary"]["size"] == fx.spm_processor().get_piece_size()
    assert card["package"]["name"] == "keras-transformer" and card["package"]["version"]
    calibration = card["calibration"]
    assert calibration["fitted"] and calibration["sentences"] == len(fx.dev_pairs())
    assert -1 <= calibration["spearman_chrf"] <= 1
    assert card["decoding_speed"]["sentences_per_second"] > 0
    assert sorted(card["signatures"]) == [
        "score", "serving_default", "translate_constrained", "translate_nbest",
        "translate_prefix",
    ]  # fmt: skip
    code, out, _ = run_cli("info", "--model", os.path.dirname(path))
    assert code == 0 and out.startswith("# Model card: toy")
    assert "spearman_chrf" in out and "translate_prefix" in out


def test_info_without_a_card_is_a_usage_error(exported_copy_model, tmp_path, run_cli):
    import shutil

    _, path = exported_copy_model
    copy = tmp_path / "1"
    shutil.copytree(path, copy)
    os.remove(copy / "assets.extra" / "model_card.md")
    code, _, err = run_cli("info", "--model", str(copy))
    assert code == 2 and "no model card" in err and len(err.strip().splitlines()) == 1


def test_translate_prefix_from_the_command_line(model_base_dir, run_cli):
    code, out, _ = run_cli("translate", "--model", model_base_dir, "--prefix", "fish", *NORMAL)
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == len(NORMAL) and all(line.startswith("fish") for line in lines)
    code, _, err = run_cli("translate", "--model", model_base_dir, "--prefix", "a", "--n-best",
                           "2", "x")  # fmt: skip
    assert code == 2 and "--prefix" in err


_WARMUP_SCRIPT = r"""
from tensorflow_serving.apis import prediction_log_pb2

loaded = tf.saved_model.load(sys.argv[1])
records = []
path = sys.argv[1] + "/assets.extra/tf_serving_warmup_requests"
for raw in tf.data.TFRecordDataset(path):
    log = prediction_log_pb2.PredictionLog.FromString(raw.numpy())
    request = log.predict_log.request
    signature = loaded.signatures[request.model_spec.signature_name]
    inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
    outputs = signature(**inputs)  # as TF Serving replays it at load
    records.append({
        "signature": request.model_spec.signature_name,
        "inputs": {k: [s.decode("utf-8") for s in v.numpy().ravel()]
                   for k, v in inputs.items()},
        "outputs": sorted(outputs),
    })
texts = [s.encode("latin-1") for s in json.loads(sys.argv[2])]
batch = tf.constant(texts)
answers = {
    "serving_default": loaded.signatures["serving_default"](text=batch),
    "translate_nbest": loaded.signatures["translate_nbest"](text=batch),
    "translate_prefix": loaded.signatures["translate_prefix"](text=batch, prefix=batch[::-1]),
}
print(json.dumps({
    "records": records,
    "rows": {k: int(v["confidence" if "confidence" in v else "score"].shape[0])
             for k, v in answers.items()},
    "confidence": answers["serving_default"]["confidence"].numpy().tolist(),
    "translation": [t.decode("utf-8") for t in answers["serving_default"]["translation"].numpy()],
}))
"""


@pytest.mark.scenario
def test_warmup_requests_cover_every_signature_and_bucket_and_replay(exported_copy_model, tmp_path):
    from keras_transformer.export.warmup import bucket_lengths

    translator, path = exported_copy_model
    result = run_fresh(_WARMUP_SCRIPT, path, latin1(HOSTILE), cwd=str(tmp_path))
    records = result["records"]
    signatures = [
        "score", "serving_default", "translate_constrained", "translate_nbest",
        "translate_prefix",
    ]  # fmt: skip
    assert sorted({r["signature"] for r in records}) == signatures
    buckets = bucket_lengths(fx.MAX_SOURCE_LENGTH)
    for signature in signatures:
        lengths = sorted(
            len(_pieces(r["inputs"]["text" if "text" in r["inputs"] else "source"][0])) + 1
            for r in records
            if r["signature"] == signature
        )
        assert lengths == buckets, (signature, lengths)
    assert {tuple(r["outputs"]) for r in records if r["signature"] == "serving_default"} == {
        ("confidence", "score", "token_scores", "translation")
    }
    # Hostile rows through the new outputs and signature of the loaded model.
    assert result["rows"] == {k: len(HOSTILE) for k in result["rows"]}
    assert all(0 < c < 1 for c in result["confidence"])
    assert result["translation"] == _strings(translator(HOSTILE)["translation"])
