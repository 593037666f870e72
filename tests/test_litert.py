"""The LiteRT export and its TensorFlow-free runtime (`keras_transformer.export.litert`,
`keras_transformer.litert`): the float32 export answers every signature it has as the SavedModel
does (translations, scores, token scores, confidence; n-best; prefixes; hostile inputs; empty and
large requests), the int8 export is smaller and stays close, the runtime runs where TensorFlow
cannot be imported, and `export --format litert` / `translate --model DIR` work from the CLI.
Skipped only when the `litert` extra (ai-edge-litert) is missing."""

import json
import os
import subprocess
import sys

import _inference_fixtures as fx
import numpy as np
import pytest
import tensorflow as tf
from test_cli_inference import _write_workdir

from keras_transformer import stopping
from keras_transformer.errors import Preempted, UsageError
from keras_transformer.export.litert import export_litert
from keras_transformer.export.plan import ExportPlan

pytest.importorskip("ai_edge_litert")

from keras_transformer import litert  # noqa: E402

# Numerically sensitive: CI runs this module again with oneDNN off and with one thread.
pytestmark = pytest.mark.numerics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _calibration(saved_model_path):
    with open(os.path.join(saved_model_path, "assets.extra", "model_card.json")) as f:
        return json.load(f)["calibration"]


@pytest.fixture(scope="module")
def saved_model(exported_copy_model):
    _, path = exported_copy_model
    loaded = tf.saved_model.load(path)
    return loaded, path


@pytest.fixture(scope="module")
def litert_dirs(copy_model, toy_spm_bytes, _shared_root):
    """The copy model exported with the SavedModel's settings, its confidence fitted on the same
    dev pairs (by the export translating them itself), the float32 one with its constrained
    step and its alignment graph: once per run, shared by the workers (the tests only read
    it)."""
    from shared_runs import shared_directory

    from keras_transformer.config import DecodingSettings

    settings = DecodingSettings(**fx.EXPORT_DECODE)
    quantizations = ("float32", "dynamic_int8")

    def export(base):
        for q in quantizations:
            plan = ExportPlan(
                quantization=q,
                settings=settings,
                data=fx.EXPORT_DATA,
                constraints=q == "float32",
                alignments=q == "float32",
            )
            export_litert(copy_model, toy_spm_bytes, str(base / q), plan, dev_pairs=fx.dev_pairs())

    base = shared_directory(_shared_root, "litert_copy_model", export)
    return {q: str(base / q) for q in quantizations}


def _texts(outputs):
    return [x.decode("utf-8", errors="replace") for x in np.asarray(outputs).reshape(-1)]


REQUEST = fx.NORMAL + fx.HOSTILE + fx.toy_sentences(40, seed=11)


@pytest.mark.scenario
def test_the_confidence_is_fitted_on_dev_as_the_saved_models(saved_model, litert_dirs):
    with open(os.path.join(litert_dirs["float32"], "model_card.json")) as f:
        ours = json.load(f)["calibration"]
    reference = _calibration(saved_model[1])
    assert ours["fitted"] and reference["fitted"]
    for key in ("score_weight", "margin_weight", "bias"):
        assert ours[key] == pytest.approx(reference[key], abs=1e-3), key


def test_float32_answers_every_input_as_the_saved_model(saved_model, litert_dirs):
    loaded, _ = saved_model
    ours = litert.load(litert_dirs["float32"])
    reference = loaded.signatures["serving_default"](text=tf.constant(REQUEST))
    got = ours.translate(REQUEST)
    assert got["translation"] == _texts(reference["translation"])
    for key in ("score", "token_scores", "confidence"):
        np.testing.assert_allclose(got[key], reference[key].numpy(), atol=1e-4, err_msg=key)


def test_float32_n_best_and_prefix_answer_as_the_saved_model(saved_model, litert_dirs):
    loaded, _ = saved_model
    ours = litert.load(litert_dirs["float32"])
    reference = loaded.signatures["translate_nbest"](text=tf.constant(REQUEST))
    got = ours.translate_nbest(REQUEST)
    k = reference["translations"].shape[1]
    assert [row for row in got["translations"]] == [
        _texts(row) for row in reference["translations"].numpy()
    ]
    assert np.shape(got["scores"]) == (len(REQUEST), k)
    for key in ("scores", "token_scores", "confidence"):
        np.testing.assert_allclose(got[key], reference[key].numpy(), atol=1e-4, err_msg=key)
    prefixes = ["red", "", "blue blue blue blue blue blue blue blue blue blue", "cat dog"]
    prefixes = (prefixes * len(REQUEST))[: len(REQUEST)]
    reference = loaded.signatures["translate_prefix"](
        text=tf.constant(REQUEST), prefix=tf.constant(prefixes)
    )
    got = ours.translate_prefix(REQUEST, prefixes)
    assert got["translation"] == _texts(reference["translation"])
    np.testing.assert_allclose(got["score"], reference["score"].numpy(), atol=1e-4)
    with pytest.raises(ValueError, match="must be the same"):
        ours.translate_prefix(REQUEST, prefixes[:1])


CONSTRAINED_TEXTS = fx.NORMAL + fx.HOSTILE + ["red apple cat", "blue", "blue"]
CONSTRAINTS = [
    ["dog"],
    [],
    ["fish", "white"],
    ["", "plum"],  # "" is no term
    ["cat", "cat bird"],  # overlapping: one the other's prefix
    [" ".join(["green"] * 40)],  # more pieces than any output holds: unmeetable
    [b"\xff\xfe"],  # invalid UTF-8: U+FFFD
    [b"pear \xff"],
    ["\u00e9t\u00e9"],  # pieces the vocabulary lacks: unmeetable
    ["red", "apple"],
    ["cat dog"],
    ["blue", "blue"],
]


def _string_rows(rows):
    """Rows of terms as the signature's tf.string `[n, C]`, padded with ""."""
    width = max([1] + [len(row) for row in rows])
    rows = [[t if isinstance(t, bytes) else t.encode() for t in row] for row in rows]
    return tf.constant([row + [b""] * (width - len(row)) for row in rows], tf.string)


def test_float32_constrained_answers_equal_the_saved_models(saved_model, litert_dirs):
    """`translate(texts, constraints=...)` (the constrained step, `constraint_rules` on numpy)
    answers as the SavedModel's `translate_constrained`: rows without constraints, overlapping
    terms, unmeetable ones (answered unconstrained, flagged), invalid UTF-8; each met output
    holds its terms."""
    from keras_transformer.litert.runtime import _as_text

    loaded, _ = saved_model
    reference = loaded.signatures["translate_constrained"](
        text=tf.constant(CONSTRAINED_TEXTS), constraints=_string_rows(CONSTRAINTS)
    )
    ours = litert.load(litert_dirs["float32"])
    got = ours.translate(CONSTRAINED_TEXTS, constraints=CONSTRAINTS)
    assert set(got) == {"translation", "score", "constraints_met"}
    assert got["translation"] == _texts(reference["translation"])
    assert got["constraints_met"].tolist() == reference["constraints_met"].numpy().tolist()
    np.testing.assert_allclose(got["score"], reference["score"].numpy(), atol=1e-4)
    assert got["constraints_met"].tolist()[5:9] == [False, True, True, False]
    plain = ours.translate(CONSTRAINED_TEXTS)
    for row in (1, 5, 8):  # none, or unmeetable: the unconstrained answer
        assert got["translation"][row] == plain["translation"][row]
    for terms, text, met in zip(CONSTRAINTS, got["translation"], got["constraints_met"]):
        for term in terms if met else ():
            words = " ".join(_as_text(term).replace("\ufffd", " ").split())
            assert not words or f" {words} " in f" {' '.join(text.split())} ", (term, text)


def test_constrained_requests_hostile_and_refused(litert_dirs):
    ours = litert.load(litert_dirs["float32"])
    empty = ours.translate_constrained([], [])
    assert empty["translation"] == [] and empty["score"].shape == (0,)
    assert empty["constraints_met"].shape == (0,)
    with pytest.raises(ValueError, match="must be the same"):
        ours.translate_constrained(["blue"], [["a"], ["b"]])
    without = litert.load(litert_dirs["dynamic_int8"])  # exported without the constrained step
    with pytest.raises(litert.LiteRTError, match="constrained step"):
        without.translate(["blue"], constraints=[["blue"]])


@pytest.fixture(scope="module")
def aligning_translator(copy_model, toy_spm_bytes):
    """The SavedModel's graph with its alignment output (what `export --alignments` serves),
    for the LiteRT export's settings."""
    from keras_transformer.export import Translator

    return Translator(copy_model, toy_spm_bytes, max_source_length=fx.MAX_SOURCE_LENGTH,
                      alignments=True, **fx.EXPORT_DECODE)  # fmt: skip


@pytest.mark.scenario  # the alignment graph's tracing in the Translator: about 10 s
def test_float32_alignments_equal_the_saved_models(aligning_translator, litert_dirs):
    """`translate(texts, alignments=True)` (the alignment graph, `alignment_rules.word_alignment` on
    numpy) answers as the SavedModel's `alignment` output, in `Translator.translate(texts,
    alignments=True)`'s form (`export.texts`): several chunks, hostile inputs, an empty line;
    the other outputs are the plain `translate`'s."""
    request = [*REQUEST, "", "bluegreen applepear"]
    reference = aligning_translator(tf.constant(request))  # serving_default's outputs
    ours = litert.load(litert_dirs["float32"])
    got = ours.translate(request, alignments=True)
    assert got["translation"] == _texts(reference["translation"])
    rows = reference["alignment"].numpy().tolist()
    assert got["alignment"] == [[(i, j) for j, i in enumerate(row) if i >= 0] for row in rows]
    assert got["alignment"][request.index("")] == []
    assert got["alignment"][0] == [(0, 0), (1, 1), (2, 2)]  # the copy model copies
    plain = ours.translate(request)
    assert set(got) - set(plain) == {"alignment"}
    for key in plain:
        np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(plain[key]), err_msg=key)


@pytest.mark.parametrize("flag", [["--alignments"], ["--markup", "xml"]])
def test_cli_alignments_of_an_export_without_the_graph_is_a_usage_error(litert_dirs, run_cli, flag):
    code, out, err = run_cli("translate", "--model", litert_dirs["dynamic_int8"], *flag, "red")
    assert code == 2 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert "exported without word alignments" in err and "export it with --alignments" in err


def test_alignments_refused_without_the_alignment_graph(litert_dirs):
    without = litert.load(litert_dirs["dynamic_int8"])  # exported without alignments
    with pytest.raises(litert.LiteRTError, match="without word alignments.*--alignments"):
        without.translate(["blue"], alignments=True)
    assert "alignment" not in without.translate(["blue"])
    with pytest.raises(ValueError, match="not with constraints"):
        litert.load(litert_dirs["float32"]).translate(["b"], [["b"]], alignments=True)


# Markup the copy model carries through: nested tags, a void tag, an entity, a comment, XML-style
# case, malformed markup (an element never closed), an empty line.
MARKUP = [
    "red <b>apple <i>cat</i></b> dog",
    "blue<br>green <img src='x.png'> fish",
    'red &amp; <a href="#">blue</a> &eacute;',
    "<!-- note --><p>dog</p> cat",
    "dog <i>fish",
    "",
]


def test_markup_from_the_litert_runtime(litert_dirs):
    """`translate(texts, markup=...)`: `Translator.translate(markup=...)`'s keys and types, the
    tags put back by the runtime's own alignments (`markup.transfer_tags` on
    `translate(plain texts, alignments=True)`), a malformed text translated as plain text with
    one `MarkupWarning`; the refusals: an export without the alignment graph (the
    `alignments=True` error), an unknown kind (the SavedModel path's error), constraints."""
    from keras_transformer import markup

    ours = litert.load(litert_dirs["float32"])
    with pytest.warns(markup.MarkupWarning) as caught:
        got = ours.translate(MARKUP, alignments=True, markup="html")
    assert [str(w.message) for w in caught] == [
        "malformed markup translated as plain text: <i> is never closed"
    ]
    assert set(got) == {"translation", "score", "alignment"}
    assert all(isinstance(v, list) for v in got.values())
    assert all(isinstance(x, float) for x in got["score"])
    plain = [markup.plain_text(text) for text in MARKUP[:4]] + ["dog fish", ""]
    reference = ours.translate(plain, alignments=True)
    assert got["alignment"] == reference["alignment"]
    np.testing.assert_allclose(got["score"], reference["score"], atol=1e-6)
    expected = [
        markup.transfer_tags(text, translation, pairs)
        for text, translation, pairs in zip(
            MARKUP[:4], reference["translation"], reference["alignment"]
        )
    ]
    assert got["translation"] == expected + [
        reference["translation"][4],
        reference["translation"][5],
    ]
    assert got["translation"][0] == "red <b>apple <i>cat</i></b> dog"  # the copy model copies
    assert got["translation"][-1] == "" and got["alignment"][-1] == []
    assert set(ours.translate(MARKUP[:1], markup="xml")) == {"translation", "score"}
    without = litert.load(litert_dirs["dynamic_int8"])  # exported without alignments
    with pytest.raises(litert.LiteRTError, match="without word alignments.*--alignments"):
        without.translate(["blue"], markup="html")
    with pytest.raises(ValueError, match="markup kind must be one of"):
        ours.translate(["blue"], markup="svg")
    with pytest.raises(ValueError, match="not with constraints"):
        ours.translate(["b"], [["b"]], markup="html")


@pytest.mark.scenario  # the alignment graph's tracing in the Translator: about 10 s
def test_litert_markup_equals_the_saved_models(aligning_translator, litert_dirs):
    """`translate(texts, markup=...)` answers as the SavedModel's `Translator.translate(texts,
    markup=...)` on the same model: the same translations with their tags, alignments, warning
    for the malformed text, and scores within float tolerance."""
    ours = litert.load(litert_dirs["float32"])
    for kind in ("html", "xml"):
        texts = MARKUP if kind == "html" else MARKUP[2:]  # XML has no void <br>
        with pytest.warns(UserWarning) as caught:
            want = aligning_translator.translate(texts, alignments=True, markup=kind)
        with pytest.warns(UserWarning) as ours_caught:
            got = ours.translate(texts, alignments=True, markup=kind)
        assert [str(w.message) for w in ours_caught] == [str(w.message) for w in caught]
        assert got["translation"] == want["translation"], kind
        assert got["alignment"] == want["alignment"], kind
        np.testing.assert_allclose(got["score"], want["score"], atol=1e-4)


@pytest.mark.parametrize("rows", [0, 1, 513])
def test_requests_of_any_size_are_answered_as_the_saved_model(saved_model, litert_dirs, rows):
    """Empty requests, one row, and more rows than several chunks (with a 100 kB string and a NUL
    among them), in the request's order."""
    loaded, _ = saved_model
    request = (fx.toy_sentences(rows, seed=3) + ["red \x00 cat", "dog " * 25_000])[:rows]
    reference = loaded.signatures["serving_default"](text=tf.constant(request, tf.string))
    got = litert.load(litert_dirs["float32"]).translate(request)
    assert got["translation"] == _texts(reference["translation"])
    assert got["token_scores"].shape == tuple(reference["token_scores"].shape)
    np.testing.assert_allclose(got["score"], reference["score"].numpy(), atol=1e-4)


def test_smuggled_bytes_get_the_answer_of_their_bytes(litert_dirs):
    """A `str` with lone surrogates (bytes Python could not decode, `surrogateescape`) is
    answered as those bytes are, U+FFFD for each invalid sequence."""
    translator = litert.load(litert_dirs["float32"])
    raw = [b"red \xff\xfe apple \xc3", b"a\xed\xa0\x80b cat"]
    smuggled = [x.decode("utf-8", errors="surrogateescape") for x in raw] + ["dog \ud800 red"]
    expected = translator.translate(raw + [b"dog \xed\xa0\x80 red"])
    from keras_transformer.litert.runtime import _as_text

    assert [_as_text(x) for x in smuggled[:2]] == [x.decode("utf-8", "replace") for x in raw]
    assert translator.translate(smuggled)["translation"] == expected["translation"]


def test_settled_sentences_leave_the_batch_without_changing_answers(litert_dirs, monkeypatch):
    """Sentences of very different lengths in one chunk: the short ones settle first and the
    batch is compacted (`DecoderStep.keep`); the answers equal those of a runtime that never
    drops."""
    from keras_transformer.litert import graphs

    sentences = ["red", "blue", "cat", "dog", "red apple cat dog fish", "plum pear", "a", "b"]
    translator = litert.load(litert_dirs["float32"])
    translator.settings = {**translator.settings, "batch_size": len(sentences)}
    compacted = []
    real = graphs.DecoderStep._compact
    monkeypatch.setattr(
        graphs.DecoderStep, "_compact", lambda self: compacted.append(len(self.live)) or real(self)
    )
    dropping = translator.translate_nbest(sentences)
    assert compacted, "no chunk was compacted: the test does not exercise keep()"
    monkeypatch.delattr(graphs.DecoderStep, "keep")
    kept = translator.translate_nbest(sentences)
    assert dropping["translations"] == kept["translations"]
    np.testing.assert_allclose(dropping["scores"], kept["scores"], atol=1e-5)


def test_caches_grown_bucket_by_bucket_give_the_unbucketed_answers(litert_dirs, monkeypatch):
    """Caches that start 2 positions long and grow at each boundary (2 -> 4 -> 8 -> ...), with
    the batch compacted between growths, give the answers of caches sized for the whole output
    at once: n-best, prefixes, and the constrained step. A growth that lost or misplaced a
    slot's keys would change them."""
    from keras_transformer.litert import graphs

    sentences = REQUEST[:8] + ["red apple cat dog fish plum pear white black green blue"]
    grown = []
    real = graphs.DecoderStep._grow
    monkeypatch.setattr(
        graphs.DecoderStep,
        "_grow",
        lambda self, index: grown.append(self.positions) or real(self, index),
    )
    prefixes = (["red", "", "cat dog", "blue blue blue"] * 3)[: len(sentences)]
    rows = (CONSTRAINTS * 2)[: len(sentences)]
    answers = {}
    for bucket in (0, 2):
        translator = litert.load(litert_dirs["float32"], cache_bucket=bucket)
        translator.settings = {**translator.settings, "batch_size": 5}
        answers[bucket] = (
            translator.translate_nbest(sentences),
            translator.translate_prefix(sentences, prefixes),
            translator.translate_constrained(sentences, rows),
        )
        if bucket == 0:
            assert not grown
    assert {2, 4, 8} <= set(grown), grown  # each chunk's caches crossed several boundaries
    (nbest, prefix, constrained), (nbest2, prefix2, constrained2) = answers[0], answers[2]
    assert nbest2["translations"] == nbest["translations"]
    np.testing.assert_allclose(nbest2["scores"], nbest["scores"], atol=1e-5)
    np.testing.assert_allclose(nbest2["token_scores"], nbest["token_scores"], atol=1e-5)
    assert prefix2["translation"] == prefix["translation"]
    np.testing.assert_allclose(prefix2["score"], prefix["score"], atol=1e-5)
    assert constrained2["translation"] == constrained["translation"]
    assert list(constrained2["constraints_met"]) == list(constrained["constraints_met"])
    np.testing.assert_allclose(constrained2["score"], constrained["score"], atol=1e-5)
    with pytest.raises(ValueError, match="at least 0"):
        litert.load(litert_dirs["float32"], cache_bucket=-1)


def test_growing_caches_reuse_their_buffers_from_request_to_request(litert_dirs, monkeypatch):
    """The written positions of growing caches are read out into buffers the step keeps: the
    same request twice grows through the buffers the first one left (no fresh array of cache
    size per growth, whose pages the system would fault in anew) and answers alike."""
    from keras_transformer.litert import graphs

    buffers = []
    real = graphs.DecoderStep._grow

    def grow(self, index):
        real(self, index)
        buffers[-1].extend(self.scratch.values())  # held here: no address is reused

    monkeypatch.setattr(graphs.DecoderStep, "_grow", grow)
    translator = litert.load(litert_dirs["float32"], cache_bucket=2)
    answers = []
    for _ in range(2):
        buffers.append([])
        answers.append(translator.translate_nbest(REQUEST[:6]))
    assert buffers[0] and buffers[1], "no cache grew: the test does not exercise _grow()"
    assert all(any(b is a for a in buffers[0]) for b in buffers[1])
    assert answers[1]["translations"] == answers[0]["translations"]
    np.testing.assert_array_equal(answers[1]["scores"], answers[0]["scores"])


def test_concurrent_requests_get_the_sequential_answers(litert_dirs):
    """8 threads each sending 50 requests of 1 to 7 sentences to one translator at once (a
    server's worker threads): every answer equals the one the request gets alone. With one
    interpreter pair serving them all, the requests crashed (`RuntimeError: There is at least 1
    reference to internal data`, `ValueError: ... shape mismatch`) or mixed their caches. With
    at most `min(4, CPUs)` interpreter sets, at least half the threads wait for one."""
    translator = litert.load(litert_dirs["float32"])
    requests = fx.concurrent_requests(threads=8, per_thread=50)

    def answer(request):
        out = translator.translate(request)
        return out["translation"], out["score"]

    fx.assert_concurrent_answers_are_the_answers_alone(answer, requests)
    assert 1 <= translator._made <= translator.interpreters <= 4
    with pytest.raises(ValueError, match="at least 1"):
        litert.load(litert_dirs["float32"], interpreters=0)


def test_int8_is_smaller_and_stays_close(litert_dirs):
    from ai_edge_litert.interpreter import Interpreter

    def weights(quantization):  # {dtype: elements} of the step's constant tensors of 1,024+
        counts = {}
        path = os.path.join(litert_dirs[quantization], "decoder_step.tflite")
        interpreter = Interpreter(model_path=path)
        for t in interpreter.get_tensor_details():
            size = int(np.prod(t["shape"]))
            if size >= 1024 and t["name"] and "serving" not in t["name"]:
                counts[t["dtype"]] = counts.get(t["dtype"], 0) + size
        return counts

    # The converter quantizes tensors of 1,024 elements and more: those are int8 now.
    float32, int8 = weights("float32"), weights("dynamic_int8")
    assert int8.get(np.int8, 0) >= 0.9 * float32[np.float32], (float32, int8)
    sentences = fx.toy_sentences(100, seed=11)
    out = {q: litert.load(path).translate(sentences) for q, path in litert_dirs.items()}
    same = sum(
        a == b for a, b in zip(out["float32"]["translation"], out["dynamic_int8"]["translation"])
    )
    assert same >= 95, same  # the copy model's answers are clear: int8 rounding rarely flips one


def _spread_embedding_model(vocab=2048, spread=100.0):
    """A tiny untrained Transformer whose embedding rows' norms spread `spread` times, largest
    first: `(model, the embedding table)`. Its vocabulary is over the converter's 1,024 elements
    (the size from which it quantizes a float constant)."""
    from keras_transformer.models import Transformer

    model = Transformer(vocab_size=vocab, **fx.MODEL_KWARGS)
    model({"source_ids": np.ones((1, 3), "int32"), "target_ids": np.ones((1, 3), "int32")})
    rng = np.random.default_rng(61)
    rows = rng.uniform(-1.0, 1.0, (vocab, model.d_model)).astype("float32")
    rows *= (np.geomspace(1.0, 1.0 / spread, vocab) / np.linalg.norm(rows, axis=1))[:, None]
    model.target_embedding.embeddings.assign(rows * 0.05)
    return model, rows * 0.05


def test_int8_embedding_rows_keep_their_own_scales():
    """The `dynamic_int8` step's embedding rows are int8 with one scale per row; the converter
    quantizes float32 constants of 1,024 elements and more to int8 with one scale for the whole
    tensor, which left the `[vocab]` scale vector 127 levels: rows 100 times smaller than the
    largest came back up to a third off. The scales stay exact now, and every row of a table
    whose row norms spread 100x comes back within 1% of its norm."""
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter

    from keras_transformer.config import DecodingSettings
    from keras_transformer.export import litert as litert_export
    from keras_transformer.export import litert_graphs

    model, table = _spread_embedding_model()
    vocab = len(table)
    graphs, _ = litert_export.convert_graphs(model, DecodingSettings(beam_size=2), "dynamic_int8")
    step = Interpreter(model_content=graphs["decoder_step"][0])
    tensors = {t["index"]: t for t in step.get_tensor_details()}
    looked_up = [  # what the step's GATHERs read from: the rows, the per-row scales
        tensors[op["inputs"][0]] for op in step._get_ops_details() if op["op_name"] == "GATHER"
    ]
    scales = [t for t in looked_up if list(t["shape"]) == [vocab]]
    assert scales and all(t["dtype"] != np.int8 for t in scales), scales
    assert [list(t["shape"]) for t in looked_up if t["dtype"] == np.int8] == [[vocab, 32]]

    # The embedding itself through the same conversion: every row against the float table and
    # against its int8 values times its own scale (float32's rounding apart).
    quantized = litert_graphs.quantized_rows(table)
    embed = litert_graphs._embedding(model, quantized)
    function = tf.function(
        lambda ids: {"x": embed(ids, tf.constant([0]))},
        input_signature=[tf.TensorSpec([None], tf.int32)],
        autograph=False,
    )
    flatbuffer, _ = litert_export._convert(function, "dynamic_int8")
    interpreter = Interpreter(model_content=flatbuffer)
    index = interpreter.get_input_details()[0]["index"]
    interpreter.resize_tensor_input(index, [vocab])
    interpreter.allocate_tensors()
    interpreter.set_tensor(index, np.arange(vocab, dtype="int32"))
    interpreter.invoke()
    got = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])  # [vocab, d]
    ids = np.arange(vocab, dtype="int32")[:, None]
    expected = np.asarray(model.embed_target(ids, False)).reshape(vocab, -1)  # float32 + position
    factor = np.sqrt(model.d_model) if model.target_embedding.scale else 1.0
    norms = np.linalg.norm(table * factor, axis=1)
    error = np.linalg.norm(got - expected, axis=1) / norms
    assert error.max() < 0.01, (error.max(), int(error.argmax()))
    positions = expected.astype("float64") - table * factor  # the encoding of position 0
    rows = quantized[0].astype("float64") * quantized[1][:, None] * factor
    np.testing.assert_allclose(got, positions + rows, rtol=0, atol=1e-6)  # float32's rounding


@pytest.mark.parametrize("vocab", [40, 4096, 8192, 8193, 32000])
def test_blocked_top_k_equals_top_k(vocab):
    """The step's two-pass top-k (the fast path) against `ops.top_k` (its plain form)."""
    from keras import ops

    from keras_transformer.export.litert_graphs import blocked_top_k

    x = np.random.default_rng(vocab).standard_normal((6, vocab)).astype("float32")
    x[0, ::7] = -1e9  # banned entries
    for k in (1, 2, 8):
        for got, expected in zip(blocked_top_k(x, k), ops.top_k(x, k)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_the_graphs_hold_only_builtin_ops(litert_dirs):
    from ai_edge_litert.interpreter import Interpreter

    for path in litert_dirs.values():
        names = {"encoder.tflite", "decoder_step.tflite", "decoder_step_constrained.tflite",
                 "alignment.tflite"}  # fmt: skip
        for name in names & set(os.listdir(path)):
            ops = {o["op_name"] for o in Interpreter(os.path.join(path, name))._get_ops_details()}
            assert not {op for op in ops if op.startswith("Flex") or op == "CUSTOM"}, ops


def test_the_runtime_translates_where_tensorflow_cannot_be_imported(litert_dirs):
    script = (
        "import sys\n"
        "for name in ('tensorflow', 'keras', 'jax', 'tensorflow_text'):\n"
        "    sys.modules[name] = None\n"
        "from keras_transformer import litert\n"
        "t = litert.load(sys.argv[1])\n"
        "print(t.translate(['red apple cat', 'dog'])['translation'])\n"
        "print(t.translate(['red apple cat'], alignments=True)['alignment'])\n"
        "print(t.translate(['red <b>apple</b> cat'], markup='html')['translation'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, litert_dirs["float32"]],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    expected = litert.load(litert_dirs["float32"]).translate(["red apple cat", "dog"])
    assert done.stdout.splitlines() == [
        str(expected["translation"]), "[[(0, 0), (1, 1), (2, 2)]]", "['red <b>apple</b> cat']",
    ]  # fmt: skip


def test_an_export_appears_whole_or_not_at_all(copy_model, toy_spm_bytes, tmp_path, monkeypatch):
    output = tmp_path / "model"
    os.makedirs(output)
    (output / "kept.txt").write_text("mine")
    with pytest.raises(UsageError, match="already exists"):
        export_litert(copy_model, toy_spm_bytes, str(output))
    assert os.listdir(output) == ["kept.txt"]
    fresh = tmp_path / "fresh"

    def preempted(phase):
        raise Preempted(f"stopped during {phase}")

    monkeypatch.setattr(stopping, "check", preempted)
    with pytest.raises(Preempted):
        export_litert(copy_model, toy_spm_bytes, str(fresh))
    assert sorted(os.listdir(tmp_path)) == ["model"]  # no directory, no temporary left
    with pytest.raises(UsageError, match="float32, float16, dynamic_int8"):
        export_litert(copy_model, toy_spm_bytes, str(fresh), ExportPlan(quantization="int4"))


@pytest.mark.scenario
def test_export_and_translate_commands(tmp_path, copy_model, toy_spm_path, run_cli):
    workdir = _write_workdir(tmp_path, copy_model, toy_spm_path, steps=(100,))
    output = tmp_path / "litert"
    code, out, err = run_cli(
        "export", "--workdir", str(workdir), "--format", "litert", "--quantization",
        "dynamic_int8", "--output", str(output), "--constraints", "--alignments",
    )  # fmt: skip
    assert code == 0, err
    assert str(output) in out
    assert {"encoder.tflite", "decoder_step.tflite", "spm.model", "keras_transformer.json"} <= set(
        os.listdir(output)
    )
    code, out, err = run_cli("translate", "--model", str(output), "red apple cat", "dog")
    assert code == 0, err
    assert (
        out.splitlines()
        == litert.load(str(output)).translate(["red apple cat", "dog"])["translation"]
    )
    terms = tmp_path / "terms.tsv"
    terms.write_text("dog\n\n")
    code, out, err = run_cli(
        "translate", "--model", str(output), "--constraints", str(terms), "red apple cat", "blue"
    )
    assert code == 0, err
    expected = litert.load(str(output)).translate(
        ["red apple cat", "blue"], constraints=[["dog"], []]
    )
    assert out.splitlines() == expected["translation"] and "dog" in out.splitlines()[0]
    code, out, err = run_cli(
        "translate", "--model", str(output), "--alignments", "red apple cat", "blue"
    )
    assert code == 0, err
    assert out.splitlines() == ["red apple cat\t0-0 1-1 2-2", "blue\t0-0"]
    code, out, err = run_cli("translate", "--model", str(output), "--markup", "html",
                             "red <b>apple</b> cat", "dog <i>fish")  # fmt: skip
    assert code == 0, err
    assert out.splitlines() == ["red <b>apple</b> cat", "dog fish"]
    assert err.strip().splitlines() == ["warning: malformed markup translated as plain text: "
                                        "<i> is never closed"]  # fmt: skip
    code, out, err = run_cli("translate", "--model", str(output), "--n-best", "2", "red apple")
    assert code == 0, err
    assert len(out.splitlines()) == 2 and all("\t" in line for line in out.splitlines())
    code, _, err = run_cli("translate", "--model", str(output), "--n-best", "5", "red")
    assert code == 2 and "exported with 2 hypotheses" in err
    code, _, err = run_cli("translate", "--model", str(output), "--sampling-topk", "5", "red")
    assert code == 2 and "cannot sample" in err
    for flags, message in (
        (["--quantization", "int8"], "--format litert takes"),
        (["--sampling-topk", "5"], "no sampling flags"),
        (["--format", "saved_model", "--constraints"], "--constraints applies to --format litert"),
    ):
        code, _, err = run_cli(
            "export", "--workdir", str(workdir), "--format", "litert", "--output",
            str(tmp_path / "other"), *flags,
        )  # fmt: skip
        assert code == 2 and message in err, err


# ------------------------------------------------------------------ one translator interface


def _requests(texts):
    """Each request of `TranslatorInterface` with small arguments (`translate` by keyword)."""
    n = len(texts)
    return {
        "translate": (texts,),
        "translate_nbest": (texts,),
        "translate_prefix": (texts, ["red"] * n),
        "translate_constrained": (texts, [["red"]] * n),
        "translate_glossary": (texts, [["rot"]] * n, [["red"]] * n),
        "translate_sample": (texts, [1] * n),
        "score": (texts, texts),
    }


@pytest.mark.parametrize("export", ["saved_model", "litert"])
def test_both_translators_answer_or_refuse_every_request(
    export, copy_model, toy_spm_bytes, litert_dirs
):
    """Both translators implement `TranslatorInterface`: each request answers every text, or is
    refused in one line naming the export that serves it (a SavedModel: the LiteRT export has
    no glossary, sampling or score; a SavedModel built without sampling or glossary tags, as
    this toy one, refuses those two)."""
    from keras_transformer.export import Translator
    from keras_transformer.translating import TranslatorInterface

    if export == "litert":
        translator = litert.load(litert_dirs["float32"])
        refused = {"translate_glossary", "translate_sample", "score"}
    else:
        translator = Translator(copy_model, toy_spm_bytes, max_source_length=fx.MAX_SOURCE_LENGTH,
                                **fx.EXPORT_DECODE)  # fmt: skip
        refused = {"translate_glossary", "translate_sample"}
    assert isinstance(translator, TranslatorInterface)
    texts = ["red cat", "blue"]
    requests = _requests(texts)
    assert set(requests) | {"max_target_length"} == TranslatorInterface.__abstractmethods__
    assert (
        translator.max_target_length == fx.MAX_SOURCE_LENGTH + fx.EXPORT_DECODE["max_extra_length"]
    )
    said = {}
    for name, args in requests.items():
        try:
            answer = getattr(translator, name)(*args)
        except ValueError as e:
            said[name] = str(e)
            continue
        assert len(next(iter(answer.values()))) == len(texts), name
    assert set(said) == refused
    for name, message in said.items():
        assert (
            "\n" not in message
            and "export a SavedModel" in message
            or ("SavedModel; export one with" in message)
        ), (name, message)
    if export == "litert":
        assert all("by the LiteRT export" in message for message in said.values())
        with pytest.raises(ValueError, match="^soft glossaries are not served by the LiteRT"):
            translator.translate(texts, glossary={"rot": "red"})
