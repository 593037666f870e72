"""The string-to-string Translator and its SavedModel in TF Serving's layout."""

import json
import os
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
from keras_transformer.export import Translator, export_saved_model
from keras_transformer.export.saved_model import list_versions, resolve_model_dir
from keras_transformer.models import Transformer
from keras_transformer.workdir import average_checkpoints

DECODE, DATA = fx.EXPORT_DECODE, fx.EXPORT_DATA

NORMAL = fx.NORMAL
HOSTILE = [*fx.HOSTILE, *fx.NORMAL]


def _as_strings(values):
    return [v.decode("utf-8") for v in np.asarray(values)]


def test_translator_matches_python_reference(exported_copy_model, copy_model):
    translator, _ = exported_copy_model
    out = translator(NORMAL)
    ids, scores, _ = translate_ids(
        copy_model,
        fx.encode_sources(NORMAL),
        beam_size=DECODE["beam_size"],
        alpha=DECODE["alpha"],
        max_extra_length=DECODE["max_extra_length"],
    )
    assert _as_strings(out["translation"]) == fx.decode_outputs(ids) == NORMAL
    np.testing.assert_allclose(out["score"], scores, rtol=1e-4, atol=1e-5)


def test_translator_answers_every_input(exported_copy_model):
    translator, _ = exported_copy_model
    out = translator(HOSTILE)
    assert out["translation"].shape == (len(HOSTILE),) and out["score"].shape == (len(HOSTILE),)
    assert out["translation"].dtype == tf.string and out["score"].dtype == tf.float32
    assert np.all(np.isfinite(out["score"]))
    # Batch composition (sorting, chunking, padding) does not change a sentence's translation.
    alone = [_as_strings(translator([t])["translation"])[0] for t in NORMAL]
    assert _as_strings(out["translation"])[-len(NORMAL) :] == alone
    empty = translator(tf.zeros([0], tf.string))
    assert empty["translation"].shape == (0,) and empty["score"].shape == (0,)


def test_long_inputs_are_truncated_to_the_max_source_length(exported_copy_model):
    translator, _ = exported_copy_model
    sp = fx.spm_processor()
    long_text = " ".join(["red green blue"] * 400)
    kept = sp.decode(sp.encode(long_text)[: fx.MAX_SOURCE_LENGTH - 1])
    out = translator([long_text, kept])
    translations = _as_strings(out["translation"])
    assert translations[0] == translations[1]
    np.testing.assert_allclose(out["score"][0], out["score"][1], rtol=1e-5)


_LOAD_SCRIPT = r"""
loaded = tf.saved_model.load(sys.argv[1])
serve = loaded.signatures["serving_default"]
inputs = json.loads(sys.argv[2])
batch = [s.encode("latin-1") for s in inputs]
out = serve(text=tf.constant(batch))
big = serve(text=tf.constant(batch * 40))
assert big["translation"].shape == (len(batch) * 40,), big["translation"].shape
assert big["score"].shape == (len(batch) * 40,)
one = serve(text=tf.constant(batch[-1:]))
forbidden = [m for m in sys.modules if m.split(".")[0] == "keras_transformer"]
print(json.dumps({
    "translation": [t.decode("utf-8") for t in out["translation"].numpy()],
    "score": out["score"].numpy().tolist(),
    "big": [t.decode("utf-8") for t in big["translation"].numpy()[: len(batch)]],
    "one": one["translation"].numpy()[0].decode("utf-8"),
    "forbidden": forbidden,
}))
"""


@pytest.mark.scenario
def test_saved_model_runs_in_a_fresh_process_with_only_tf_and_tf_text(
    exported_copy_model, tmp_path
):
    translator, path = exported_copy_model
    raw = [t if isinstance(t, bytes) else t.encode("utf-8") for t in HOSTILE]
    result = run_fresh(_LOAD_SCRIPT, path, latin1(raw), cwd=str(tmp_path))
    assert result["forbidden"] == []
    expected = translator(raw)
    assert result["translation"] == _as_strings(expected["translation"])
    np.testing.assert_allclose(result["score"], expected["score"], rtol=1e-4, atol=1e-5)
    assert result["big"] == result["translation"]
    assert result["one"] == result["translation"][-1]
    assert result["translation"][-len(NORMAL) :] == NORMAL


@pytest.mark.scenario
def test_saved_model_cli_shows_the_serving_signature(exported_copy_model):
    _, path = exported_copy_model
    cli = shutil.which("saved_model_cli") or os.path.join(
        os.path.dirname(sys.executable), "saved_model_cli"
    )
    if not os.path.exists(cli):
        pytest.skip("saved_model_cli not installed")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [cli, "show", "--dir", path, "--tag_set", "serve", "--signature_def", "serving_default"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    tensors = dict(
        (f"{kind}:{name}", (dtype, shape))
        for kind, name, dtype, shape in re.findall(
            r"(inputs|outputs)\['(\w+)'\] tensor_info:\s+dtype: (\w+)\s+shape: (\([^)]*\))",
            done.stdout,
        )
    )
    assert tensors == {
        "inputs:text": ("DT_STRING", "(-1)"),
        "outputs:translation": ("DT_STRING", "(-1)"),
        "outputs:score": ("DT_FLOAT", "(-1)"),
        "outputs:token_scores": ("DT_FLOAT", "(-1, -1)"),
        "outputs:confidence": ("DT_FLOAT", "(-1)"),
    }
    assert "tensorflow/serving/predict" in done.stdout


def _untrained_model():
    return Transformer(vocab_size=fx.spm_processor().get_piece_size(), **fx.MODEL_KWARGS)


@pytest.mark.scenario
def test_exports_take_the_next_version_and_never_overwrite(tmp_path, toy_spm_bytes):
    model = _untrained_model()
    os.makedirs(tmp_path / "m" / "not-a-version")
    first = export_saved_model(model, toy_spm_bytes, fx.export_plan(), str(tmp_path), "m")
    second = export_saved_model(model, toy_spm_bytes, fx.export_plan(), str(tmp_path), "m")
    assert first == str(tmp_path / "m" / "1") and second == str(tmp_path / "m" / "2")
    assert list_versions(str(tmp_path / "m")) == [1, 2]
    assert sorted(os.listdir(tmp_path / "m")) == ["1", "2", "not-a-version"]  # no temp dirs
    assert resolve_model_dir(str(tmp_path / "m")) == second
    assert resolve_model_dir(first) == first
    with open(os.path.join(first, "assets.extra", "keras_transformer.json")) as f:
        metadata = json.load(f)
    assert metadata["beam_size"] == DECODE["beam_size"] and metadata["alpha"] == DECODE["alpha"]


@pytest.mark.scenario
def test_a_failed_export_leaves_nothing(tmp_path, monkeypatch, toy_spm_bytes):
    model = _untrained_model()
    export_saved_model(model, toy_spm_bytes, fx.export_plan(), str(tmp_path), "m")

    def broken_save(obj, export_dir, signatures=None, **kwargs):
        with open(os.path.join(export_dir, "saved_model.pb"), "wb") as f:
            f.write(b"half written")
        raise OSError("disk full")

    monkeypatch.setattr(tf.saved_model, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        export_saved_model(model, toy_spm_bytes, fx.export_plan(), str(tmp_path), "m")
    assert os.listdir(tmp_path / "m") == ["1"]
    with pytest.raises(OSError):
        export_saved_model(model, toy_spm_bytes, fx.export_plan(), str(tmp_path), "fresh")
    assert sorted(os.listdir(tmp_path)) == ["m"]


def test_resolve_model_dir_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        resolve_model_dir(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError):
        resolve_model_dir(str(tmp_path))


def test_average_checkpoints_is_the_mean_of_the_weights(tmp_path):
    model = _untrained_model()
    paths, values = [], []
    for i in range(3):
        for w in model.weights:
            w.assign(np.random.default_rng(i).normal(size=w.shape).astype("float32"))
        values.append([w.numpy() for w in model.weights])
        paths.append(str(tmp_path / f"ckpt-{i}.weights.h5"))
        model.save_weights(paths[-1])
    average_checkpoints(model, paths[1:])
    for j, w in enumerate(model.weights):
        np.testing.assert_allclose(w.numpy(), (values[1][j] + values[2][j]) / 2, rtol=1e-6)
    with pytest.raises(ValueError):
        average_checkpoints(model, [])


def test_translator_accepts_the_data_tokenizer(exported_copy_model, copy_model, toy_spm_path):
    from keras_transformer.data import Tokenizer

    translator, _ = exported_copy_model
    with_tokenizer = Translator(
        copy_model,
        Tokenizer(toy_spm_path),
        beam_size=DECODE["beam_size"],
        alpha=DECODE["alpha"],
        max_extra_length=DECODE["max_extra_length"],
        max_source_length=DATA["max_source_length"],
        batch_size=DECODE["batch_size"],
    )
    assert _as_strings(with_tokenizer(HOSTILE)["translation"]) == _as_strings(
        translator(HOSTILE)["translation"]
    )


def test_translator_survives_eager_cache_clears(exported_copy_model):
    import keras

    translator, _ = exported_copy_model
    before = _as_strings(translator(NORMAL)["translation"])
    keras.utils.set_random_seed(7)  # clears TensorFlow's eager kernel cache
    assert _as_strings(translator(NORMAL)["translation"]) == before


@pytest.mark.scenario
def test_concurrent_requests_get_the_sequential_answers(exported_copy_model):
    """The loaded SavedModel's `serving_default` called from 8 threads at once, as TF Serving
    calls it (10 requests of 1 to 7 sentences each: 50, as the LiteRT runtime's test sends,
    took 30 s on 2 cores): every answer equals the one the request gets alone. The graph keeps
    no state between calls (its caches are tensors of the call), so nothing is shared; this
    test keeps it so."""
    serve = tf.saved_model.load(exported_copy_model[1]).signatures["serving_default"]
    requests = fx.concurrent_requests(threads=8, per_thread=10)

    def answer(request):
        out = serve(text=tf.constant(request, tf.string))
        return out["translation"].numpy().tolist(), out["score"].numpy()

    fx.assert_concurrent_answers_are_the_answers_alone(answer, requests)


def _xla_calls(concrete):
    """Nodes of `concrete`'s graph (and its library) that must be compiled by XLA."""
    graph_def = concrete.graph.as_graph_def()
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    return [n.name for n in nodes if n.attr["_XlaMustCompile"].b]


@pytest.mark.scenario(
    slow="two exports (graph and XLA), each tracing every signature, the XLA one compiling the "
    "search for each shape bucket it is called with, before and after a save/load"
)
def test_xla_compiled_search_answers_as_the_graph_search(tmp_path, copy_model, toy_spm_bytes):
    """`export.jit_compile`: the search compiled by XLA (string ops outside; chunks padded to
    shape buckets) gives the plain export's translations, n-best lists and prefixed translations
    (scores to 1e-4), before and after a save/load round trip; only the compiled export holds
    an XLA-compiled call."""
    texts = tf.constant(NORMAL)
    prefixes = tf.constant(["red", "", "", "plum"])
    outputs = {}
    for jit in (False, True):
        path = export_saved_model(
            copy_model, toy_spm_bytes, fx.export_plan(jit_compile=jit), str(tmp_path),
            f"m{int(jit)}",
        )  # fmt: skip
        loaded = tf.saved_model.load(path)
        signatures = loaded.signatures
        outputs[jit] = [
            signatures["serving_default"](text=texts),
            signatures["translate_nbest"](text=texts),
            signatures["translate_prefix"](text=texts, prefix=prefixes),
            signatures["serving_default"](text=texts[:3]),  # rows padded to 4 under XLA
        ]
        with open(os.path.join(path, "assets.extra", "keras_transformer.json")) as f:
            assert json.load(f)["jit_compile"] is jit
        translator = Translator(
            copy_model, toy_spm_bytes, max_source_length=DATA["max_source_length"],
            jit_compile=jit, **DECODE,
        )  # fmt: skip
        concrete = translator.serve.get_concrete_function()
        assert bool(_xla_calls(concrete)) is jit
        if jit:
            in_process = translator(texts)
            np.testing.assert_array_equal(
                in_process["translation"].numpy(), outputs[jit][0]["translation"].numpy()
            )
    for compiled, plain in zip(outputs[True], outputs[False]):
        fx.assert_same_answers(compiled, plain)


# The XLA export in a fresh process: the warmup file replayed (as TF Serving does at load), then
# one-sentence requests of every bucket length and of lengths between them, through every
# signature. XLA dumps each program it compiles: the count after the warmup must not grow.
_XLA_WARMUP_SCRIPT = r"""
import glob, os
from tensorflow_serving.apis import prediction_log_pb2

path = sys.argv[1]
loaded = tf.saved_model.load(path)
warmup = os.path.join(path, "assets.extra", "tf_serving_warmup_requests")
for record in tf.data.TFRecordDataset(warmup):
    request = prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
    inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
    loaded.signatures[request.model_spec.signature_name](**inputs)


def compiled():
    names = glob.glob(os.path.join(os.environ["XLA_DUMP"], "module_*"))
    return len({os.path.basename(n).split(".")[0] for n in names})


after_warmup = compiled()
for text in json.loads(sys.argv[2]):
    texts = tf.constant([text])
    loaded.signatures["serving_default"](text=texts)
    loaded.signatures["translate_nbest"](text=texts)
    loaded.signatures["translate_prefix"](text=texts, prefix=tf.constant(["red"]))
    loaded.signatures["score"](source=texts, target=texts)
print(json.dumps({"after_warmup": after_warmup, "after_requests": compiled()}))
"""


@pytest.mark.scenario(
    slow="an XLA export, then every warmup length compiled and every request length checked"
)
def test_the_warmup_compiles_every_program_the_xla_export_runs(tmp_path, copy_model, toy_spm_bytes):
    """The warmup file's lengths are the XLA export's own buckets, whatever the training data's
    `bucket_boundaries` (they used to come from there, so that a first short request compiled
    under TF Serving); after replaying it, no request of any length compiles again."""
    data = {**DATA, "bucket_boundaries": [10, 12]}  # training buckets: all pad to 16 in serving
    path = export_saved_model(
        copy_model,
        toy_spm_bytes,
        fx.export_plan(data=data, jit_compile=True),
        str(tmp_path),
        "xla",
    )
    translator = Translator(
        copy_model, toy_spm_bytes, max_source_length=DATA["max_source_length"], **DECODE
    )
    buckets = translator.length_buckets
    assert buckets == [8, 16]
    sp = fx.spm_processor()
    texts = []
    for length in sorted({n for b in buckets for n in (b, b - 3)}):  # tokens, EOS included
        words = [fx.WORDS[(5 * i + length) % len(fx.WORDS)] for i in range(length - 1)]
        texts.append(" ".join(words))  # one piece a word: length - 1 pieces, then EOS
        assert len(sp.encode(texts[-1])) + 1 == length
    dump = tmp_path / "xla_dump"
    env = {"XLA_FLAGS": f"--xla_dump_to={dump}", "XLA_DUMP": str(dump)}
    result = run_fresh(_XLA_WARMUP_SCRIPT, path, json.dumps(texts), env=env, timeout=600)
    assert result["after_warmup"] > 0  # the warmup compiled the programs
    assert result["after_requests"] == result["after_warmup"], result


def test_saving_traces_each_search_once_and_stores_it_once(tmp_path, monkeypatch, toy_spm_bytes):
    """Saving traces the search once per input structure that a signature feeds it (plain,
    shared by `serving_default` and `translate_nbest`; prefix; constraints) and nothing that
    no signature runs; the saved model answers as the translator does. (The search held as an
    object of its own was traced again per structure at save time and stored twice, and the
    sampling signature was traced without sampling: 40% of the export's time.)"""
    import keras_transformer.export.translator as translator_module

    traces = []
    traced = translator_module.translate_ids

    def counting(*args, **kwargs):
        traces.append((kwargs["prefix_ids"] is not None, kwargs["constraints"] is not None))
        return traced(*args, **kwargs)

    monkeypatch.setattr(translator_module, "translate_ids", counting)
    translator = Translator(
        _untrained_model(), toy_spm_bytes, max_source_length=DATA["max_source_length"], **DECODE
    )
    assert not translator.settings.sampling and not translator.reads_glossaries
    path = str(tmp_path / "m")
    tf.saved_model.save(translator, path, signatures=translator.signatures)
    assert sorted(traces) == [(False, False), (False, True), (True, False)]
    texts = tf.constant(NORMAL)
    fx.assert_same_answers(tf.saved_model.load(path).signatures["serving_default"](text=texts),
                           translator.serve(texts))  # fmt: skip
