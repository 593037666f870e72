"""The SavedModel's other signatures: `translate_nbest` (n-best lists) and `score` (forced
decoding), on the trained copy model, in this process and in a fresh one."""

import json
import os
import random
import re
import shutil
import subprocess
import sys

import _inference_fixtures as fx
import numpy as np
import pytest
import tensorflow as tf
from _fresh_process import latin1, run_fresh

from keras_transformer.decoding import translate_ids

DECODE, DATA = fx.EXPORT_DECODE, fx.EXPORT_DATA
K = DECODE["beam_size"]  # the fixture exports n_best = beam size

NORMAL = fx.NORMAL
HOSTILE = fx.HOSTILE


def _strings(values):
    return [[v.decode("utf-8") for v in row] for row in np.asarray(values).reshape(-1, K)]


def test_translate_nbest_is_the_beam_searchs_nbest_list(exported_copy_model, copy_model):
    translator, _ = exported_copy_model
    out = translator.translate_nbest(tf.constant(NORMAL))
    assert out["translations"].shape == (len(NORMAL), K) and out["scores"].shape == (len(NORMAL), K)
    ids, scores, _ = translate_ids(
        copy_model,
        fx.encode_sources(NORMAL),
        beam_size=DECODE["beam_size"],
        alpha=DECODE["alpha"],
        max_extra_length=DECODE["max_extra_length"],
        return_all=True,
    )
    np.testing.assert_allclose(out["scores"], scores, rtol=1e-4, atol=1e-5)
    expected = [fx.decode_outputs(row) for row in np.asarray(ids)]
    hypotheses = _strings(out["translations"])
    assert hypotheses == expected
    best = [t.decode("utf-8") for t in translator(NORMAL)["translation"].numpy()]
    assert [row[0] for row in hypotheses] == best == NORMAL
    for row, row_scores in zip(hypotheses, np.asarray(out["scores"])):
        assert len(set(row)) == K  # distinct hypotheses
        assert np.all(np.diff(row_scores) <= 0)  # best first


def test_translate_nbest_answers_every_input(exported_copy_model):
    translator, _ = exported_copy_model
    out = translator.translate_nbest(tf.constant(HOSTILE + NORMAL))
    assert out["translations"].shape == (len(HOSTILE) + len(NORMAL), K)
    assert np.all(np.isfinite(out["scores"]))
    # Empty and whitespace-only inputs are the empty sentence: its best translation is empty.
    assert _strings(out["translations"])[0][0] == "" == _strings(out["translations"])[1][0]
    empty = translator.translate_nbest(tf.zeros([0], tf.string))
    assert empty["translations"].shape == (0, K) and empty["scores"].shape == (0, K)


def _reference_log_probabilities(model, sources, targets):
    """numpy: the sum of log p(label) over target tokens + EOS from one full forward pass."""
    sp = fx.spm_processor()
    pieces = [sp.encode(t) for t in targets]
    width = max(len(p) for p in pieces) + 1
    decoder_input = np.array([[fx.BOS] + p + [fx.PAD] * (width - len(p) - 1) for p in pieces])
    labels = [p + [fx.EOS] for p in pieces]
    logits = model(
        {"source_ids": fx.encode_sources(sources), "target_ids": decoder_input.astype("int32")},
        training=False,
    )
    logits = np.asarray(logits, dtype="float64")
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    sums = [sum(log_probs[i, j, t] for j, t in enumerate(row)) for i, row in enumerate(labels)]
    return np.array(sums), np.array([len(row) for row in labels])


def test_score_is_the_forward_pass_log_probability(exported_copy_model, copy_model):
    translator, _ = exported_copy_model
    sources = NORMAL + ["cat", "red red red"]
    targets = NORMAL[::-1] + ["cat", ""]
    out = translator.score(tf.constant(sources), tf.constant(targets))
    expected, lengths = _reference_log_probabilities(copy_model, sources, targets)
    np.testing.assert_allclose(out["log_probability"], expected, atol=1e-4, rtol=1e-5)
    assert out["length"].dtype == tf.int32
    assert np.asarray(out["length"]).tolist() == lengths.tolist()


def test_score_prefers_the_models_translation_to_a_shuffled_one(exported_copy_model):
    translator, _ = exported_copy_model
    rng = random.Random(0)
    sources = [s for s in fx.toy_sentences(40, seed=5) if len(set(s.split())) > 2][:10]
    best = [t.decode("utf-8") for t in translator(sources)["translation"].numpy()]
    shuffled = []
    for text in best:
        words = text.split()
        while " ".join(words) == text:
            rng.shuffle(words)
        shuffled.append(" ".join(words))
    good = translator.score(tf.constant(sources), tf.constant(best))["log_probability"]
    bad = translator.score(tf.constant(sources), tf.constant(shuffled))["log_probability"]
    assert np.all(np.asarray(good) > np.asarray(bad))


def test_score_answers_hostile_inputs_and_refuses_unequal_sizes(exported_copy_model):
    translator, _ = exported_copy_model
    batch = tf.constant(HOSTILE * 3)
    out = translator.score(batch, tf.constant(HOSTILE[::-1] * 3))
    assert out["log_probability"].shape == (len(HOSTILE) * 3,)
    assert np.all(np.isfinite(out["log_probability"]))
    # Long targets are cut to the longest output the model could produce (EOS included).
    assert int(np.max(out["length"])) <= translator.max_target_length
    empty = translator.score(tf.zeros([0], tf.string), tf.zeros([0], tf.string))
    assert empty["log_probability"].shape == (0,) and empty["length"].shape == (0,)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"source has\] \[3\] \[strings but target has\] \[2\]"
    ):
        translator.score(tf.constant(["a", "b", "c"]), tf.constant(["a", "b"]))


_LOAD_SCRIPT = r"""
loaded = tf.saved_model.load(sys.argv[1])
texts = json.loads(sys.argv[2])
batch = tf.constant([s.encode("latin-1") for s in texts])
nbest = loaded.signatures["translate_nbest"](text=batch)
big = loaded.signatures["translate_nbest"](text=tf.concat([batch] * 20, 0))
score = loaded.signatures["score"](source=batch, target=batch)
try:
    loaded.signatures["score"](source=batch, target=batch[:1])
    unequal = "no error"
except tf.errors.InvalidArgumentError as e:
    unequal = e.message
print(json.dumps({
    "signatures": sorted(loaded.signatures.keys()),
    "translations": [[t.decode("utf-8") for t in row] for row in nbest["translations"].numpy()],
    "scores": nbest["scores"].numpy().tolist(),
    "big": big["translations"].shape.as_list(),
    "log_probability": score["log_probability"].numpy().tolist(),
    "length": score["length"].numpy().tolist(),
    "unequal": unequal,
}))
"""


@pytest.mark.scenario
def test_all_signatures_run_in_a_fresh_process_with_only_tf_and_tf_text(
    exported_copy_model, tmp_path
):
    translator, path = exported_copy_model
    texts = [t if isinstance(t, bytes) else t.encode("utf-8") for t in HOSTILE + NORMAL]
    result = run_fresh(_LOAD_SCRIPT, path, latin1(texts), cwd=str(tmp_path))
    assert result["signatures"] == [
        "score",
        "serving_default",
        "translate_nbest",
        "translate_prefix",
    ]
    expected = translator.translate_nbest(tf.constant(texts))
    assert result["translations"] == _strings(expected["translations"])
    np.testing.assert_allclose(result["scores"], expected["scores"], rtol=1e-4, atol=1e-5)
    assert result["big"] == [len(texts) * 20, K]
    expected = translator.score(tf.constant(texts), tf.constant(texts))
    np.testing.assert_allclose(result["log_probability"], expected["log_probability"], atol=1e-4)
    assert result["length"] == np.asarray(expected["length"]).tolist()
    assert f"source has] [{len(texts)}] [strings but target has] [1]" in result["unequal"]


@pytest.mark.scenario
def test_saved_model_cli_lists_all_signatures(exported_copy_model):
    _, path = exported_copy_model
    cli = shutil.which("saved_model_cli") or os.path.join(
        os.path.dirname(sys.executable), "saved_model_cli"
    )
    if not os.path.exists(cli):
        pytest.skip("saved_model_cli not installed")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [cli, "show", "--dir", path, "--all"], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    signatures = {}
    for block in re.split(r"signature_def\['", done.stdout)[1:]:
        key = block.split("'", 1)[0]
        signatures[key] = set(
            re.findall(
                r"(inputs|outputs)\['(\w+)'\] tensor_info:\s+dtype: (\w+)\s+shape: (\([^)]*\))",
                block,
            )
        )
    assert signatures["serving_default"] == {
        ("inputs", "text", "DT_STRING", "(-1)"),
        ("outputs", "translation", "DT_STRING", "(-1)"),
        ("outputs", "score", "DT_FLOAT", "(-1)"),
        ("outputs", "token_scores", "DT_FLOAT", "(-1, -1)"),
        ("outputs", "confidence", "DT_FLOAT", "(-1)"),
    }
    assert signatures["translate_nbest"] == {
        ("inputs", "text", "DT_STRING", "(-1)"),
        ("outputs", "translations", "DT_STRING", f"(-1, {K})"),
        ("outputs", "scores", "DT_FLOAT", f"(-1, {K})"),
        ("outputs", "token_scores", "DT_FLOAT", f"(-1, {K}, -1)"),
        ("outputs", "confidence", "DT_FLOAT", f"(-1, {K})"),
    }
    assert signatures["translate_prefix"] == {
        ("inputs", "text", "DT_STRING", "(-1)"),
        ("inputs", "prefix", "DT_STRING", "(-1)"),
        ("outputs", "translation", "DT_STRING", "(-1)"),
        ("outputs", "score", "DT_FLOAT", "(-1)"),
    }
    assert signatures["score"] == {
        ("inputs", "source", "DT_STRING", "(-1)"),
        ("inputs", "target", "DT_STRING", "(-1)"),
        ("outputs", "log_probability", "DT_FLOAT", "(-1)"),
        ("outputs", "length", "DT_INT32", "(-1)"),
    }


def test_metadata_lists_the_signatures_and_settings(exported_copy_model):
    _, path = exported_copy_model
    with open(os.path.join(path, "assets.extra", "keras_transformer.json")) as f:
        metadata = json.load(f)
    assert sorted(metadata["signatures"]) == [
        "score",
        "serving_default",
        "translate_nbest",
        "translate_prefix",
    ]
    assert metadata["n_best"] == K and metadata["beam_size"] == DECODE["beam_size"]
    assert metadata["max_extra_length"] == DECODE["max_extra_length"]
