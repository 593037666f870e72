"""The vocabulary shortlist in the LiteRT export and runtime: the NumPy shortlist of a batch is
the graph's, the shortlist step never lets a piece outside the batch's shortlist out, a table
holding every piece answers as the runtime without a shortlist, EOS and the prefix pieces are
always in, lexical constraints are searched over a shortlist holding their pieces (as the
SavedModel searches them), and an export without a table refuses `shortlist=True`. Skipped only
when the
`litert` extra (ai-edge-litert) is missing."""

import json
import os
import shutil

import _inference_fixtures as fx
import numpy as np
import pytest
from _shortlist_tables import full_table as _full_table
from _shortlist_tables import identity_table as _identity_table
from _shortlist_tables import table as _table

from keras_transformer.data.shortlist import SPECIAL_IDS, batch_shortlist
from keras_transformer.decoding.shortlist import row_shortlists
from keras_transformer.errors import UsageError
from keras_transformer.export.litert import export_litert
from keras_transformer.export.plan import ExportPlan

pytest.importorskip("ai_edge_litert")

from keras_transformer import litert  # noqa: E402
from keras_transformer.litert import runtime  # noqa: E402

pytestmark = pytest.mark.numerics

REQUEST = fx.NORMAL + fx.toy_sentences(12, seed=13)


# --------------------------------------------------------------------------- the batch's shortlist


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_numpy_shortlist_is_the_graphs(seed):
    rng = np.random.default_rng(seed)
    translations = rng.integers(0, 300, size=(300, 5))
    frequent = rng.integers(0, 300, size=7)
    source = rng.integers(0, 300, size=(3, 9))
    source[:, 6:] = 0
    prefix = rng.integers(0, 300, size=(3, 2))
    for bucket in (8, 64):
        ours = batch_shortlist(translations, frequent, source, extra_ids=prefix, bucket=bucket)
        graph = row_shortlists(translations, frequent, source, extras=[prefix], bucket=bucket)
        for a, b in zip(ours, graph[:2]):
            np.testing.assert_array_equal(a, np.asarray(b))


def test_eos_and_prefix_pieces_are_always_in():
    empty = _table(np.zeros((50, 3)))
    ids, real = batch_shortlist(empty.translations, empty.frequent, [[7, 9, 3]], [[41, 0]], 16)
    assert ids[real].tolist() == sorted({*SPECIAL_IDS, 41})
    assert ids.shape == (16,) and not real[5:].any() and (ids[~real] == 0).all()


def _rows(vocab, d_model=4, seed=0):
    """Float32 projection rows as `shortlist_output.npz` holds them (random)."""
    return {"rows": np.random.default_rng(seed).normal(size=(vocab, d_model)).astype("float32")}


def test_the_chunks_shortlist_holds_eos_prefix_and_constraint_pieces():
    """The runtime's columns of a chunk: with a table that lists nothing, exactly the special
    ids (EOS among them), the prefix pieces and every constraint piece, padding masked."""
    empty = _table(np.zeros((50, 3)))
    rows = _rows(50)
    prefix = np.array([[41, 0], [7, 12]])
    constraints = np.array([[[30, 31], [0, 0]], [[44, 0], [0, 0]]])  # [c, C, P]
    columns = runtime._shortlist_columns(empty, rows, [[7, 9], [3, 0]], prefix, constraints)
    ids, real = columns["output_ids"], columns["output_bias"] == 0
    assert ids[real].tolist() == sorted({*SPECIAL_IDS, 41, 7, 12, 30, 31, 44})
    assert 3 in ids[real].tolist()  # EOS
    assert (columns["output_bias"][~real] < -1e8).all()
    without = runtime._shortlist_columns(empty, rows, [[7, 9], [3, 0]], None, constraints)
    assert without["output_ids"][without["output_bias"] == 0].tolist() == sorted(
        {*SPECIAL_IDS, 30, 31, 44}
    )


def test_the_chunks_mask_is_its_shortlist():
    """The masked step's `output_mask` of a chunk: 0 at exactly its shortlist's ids (the
    special ids, EOS among them, the table's pieces, the prefix and constraint pieces), NEG_INF
    at every other id of the vocabulary."""
    table = _table(np.array([[i % 9 + 20] for i in range(50)]), frequent=[11])
    prefix = np.array([[41, 0], [7, 12]])
    constraints = np.array([[[30, 31], [0, 0]], [[44, 0], [0, 0]]])
    source = np.array([[7, 9], [3, 0]])
    mask = runtime._shortlist_mask(table, 60, source, prefix, constraints)["output_mask"]
    assert mask.shape == (60,) and mask.dtype == np.float32
    ids, real = batch_shortlist(
        table.translations,
        table.frequent,
        source,
        extra_ids=np.concatenate([prefix.ravel(), constraints.ravel()]),
    )
    assert np.flatnonzero(mask == 0).tolist() == ids[real].tolist()
    assert {3, 11, 20, 23, 27, 41, 7, 12, 30, 31, 44} <= set(ids[real].tolist())
    assert (mask[mask != 0] <= -1e9).all()


def _masked_and_plain_steps(model, beams, mask, top_k=4, seed=0):
    """The LiteRT graphs' constrained step, masked by `mask` and not, run eagerly on random
    caches with every id of the vocabulary wanted: `(masked outputs, plain outputs)`."""
    from keras_transformer.export import litert_graphs

    rng = np.random.default_rng(seed)
    batch, heads, size, positions, source = 2, model.num_heads, model.head_dim, 3, 4
    caches = {}
    for i in range(len(model.decoder.blocks)):
        for kind in ("keys", "values"):
            shape = (batch, heads, beams * positions, size)
            caches[f"self_{kind}_{i}"] = rng.normal(size=shape).astype("float32")
            shape = (batch, heads, source, size)
            caches[f"cross_{kind}_{i}"] = rng.normal(size=shape).astype("float32")
    inputs = (
        rng.integers(4, model.vocab_size, batch * beams).astype("int32"),
        np.array([positions - 1], "int32"),
        np.zeros((batch, 1, beams, beams * positions), "float32"),
        np.zeros((batch, 1, 1, source), "float32"),
        caches,
    )
    wanted = np.tile(np.arange(model.vocab_size, dtype="int32"), (batch * beams, 1))
    out = []
    for masked in (True, False):
        step = litert_graphs.constrained_step_function(
            model, beams, top_k, banned_ids=(0, 2), eos_id=3, masked=masked
        )
        more = (mask, wanted) if masked else (wanted,)
        out.append({k: np.asarray(v) for k, v in step(*inputs, *more).items()})
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_the_masked_step_is_the_log_softmax_over_the_shortlist(copy_model, seed):
    """The masked step's log-probabilities are the plain step's renormalised over the mask's
    ids: the same differences between any two listed ids, probabilities summing to one over
    the listed ids (padding and BOS among them), every other id impossible, the top ones the
    best listed ids, EOS's its own; the new keys and values are the plain step's."""
    rng = np.random.default_rng(seed)
    vocab = copy_model.vocab_size
    listed = np.zeros(vocab, bool)
    listed[rng.choice(np.arange(4, vocab), vocab // 3, replace=False)] = True
    listed[:4] = True  # the special ids are in every shortlist
    mask = np.where(listed, 0.0, -1e9).astype("float32")
    masked, plain = _masked_and_plain_steps(copy_model, 2, mask, seed=seed)
    for name in plain:
        if name.startswith("new_"):
            np.testing.assert_array_equal(masked[name], plain[name])
    a, b = masked["wanted_log_probs"], plain["wanted_log_probs"]  # [rows, vocab]
    ok = listed.copy()
    ok[[0, 2]] = False  # padding and BOS: banned, though in the normaliser
    shift = a[:, ok] - b[:, ok]  # log of the listed ids' share of the probability
    np.testing.assert_allclose(shift, shift[:, :1] * np.ones_like(shift), atol=1e-4)
    assert (shift > -1e-5).all()
    assert (a[:, ~listed] < -1e8).all() and (a[:, [0, 2]] < -1e8).all()
    # renormalised over fewer ids: more probability each, never more than one in all
    assert (np.exp(a[:, ok]).sum(1) >= np.exp(b[:, ok]).sum(1) - 1e-6).all()
    assert (np.exp(a[:, ok]).sum(1) <= 1 + 1e-5).all()
    best = np.sort(np.where(ok, a, -np.inf), axis=1)[:, ::-1][:, :4]
    np.testing.assert_allclose(masked["top_log_probs"], best, atol=1e-5)
    assert listed[masked["top_ids"]].all()
    np.testing.assert_allclose(masked["eos_log_probs"], a[:, 3], atol=1e-5)
    # no mask at all: the plain step's answers (its normaliser summed in two parts: to
    # rounding); the same ids
    masked, plain = _masked_and_plain_steps(copy_model, 2, np.zeros(vocab, "float32"), seed=seed)
    for name in plain:
        if plain[name].dtype.kind == "f":
            np.testing.assert_allclose(masked[name], plain[name], atol=1e-5)
        else:
            np.testing.assert_array_equal(masked[name], plain[name])


def test_the_chunks_columns_are_padded_to_whole_blocks_of_at_least_k():
    """The step's blocked top-k needs the columns in whole blocks, at least K of them: a
    shortlist is padded with masked padding columns (id 0) to both, never cut."""
    table = _table(np.zeros((300, 3)))
    rows = _rows(300)
    for block, minimum, source in ((64, 576, [[7, 9]]), (64, 0, [[7, 9]]), (8, 16, [[5]])):
        columns = runtime._shortlist_columns(table, rows, source, block=block, minimum=minimum)
        ids, bias = columns["output_ids"], columns["output_bias"]
        n = len(ids)
        assert n % block == 0 and n >= minimum and columns["output_kernel"].shape == (4, n)
        plain, real = batch_shortlist(table.translations, table.frequent, source)
        assert ids[bias == 0].tolist() == plain[real].tolist()
        assert (ids[bias < -1e8] == 0).all() and (bias[len(plain[real]) :] < -1e8).all()


@pytest.mark.parametrize("kind", ["float32", "float16", "untied"])
def test_the_output_columns_are_the_projections_columns(kind):
    """`output_columns` gives, for each shortlist id, the projection's column as the export
    holds it: float32 rows exactly, float16 rows widened; an untied projection's biases at the
    real columns; NEG_INF at the padding."""
    rng = np.random.default_rng(3)
    matrix = rng.normal(size=(40, 6)).astype("float32")
    rows = {"rows": matrix.astype("float16" if kind == "float16" else "float32")}
    if kind == "untied":
        rows["bias"] = rng.normal(size=40).astype("float32")
    ids = np.array([0, 3, 5, 17, 39, 0, 0], "int32")
    real = np.array([True] * 5 + [False] * 2)
    kernel, bias = runtime.output_columns(rows, ids, real)
    assert kernel.shape == (6, 7) and kernel.dtype == np.float32 and kernel.flags.c_contiguous
    expected = matrix[ids].T
    if kind == "float16":
        expected = matrix[ids].astype("float16").astype("float32").T
    np.testing.assert_array_equal(kernel, expected)
    want = rows["bias"][ids[:5]] if kind == "untied" else np.zeros(5, "float32")
    np.testing.assert_array_equal(bias[:5], want)
    assert (bias[5:] < -1e8).all()


def test_export_refuses_a_table_of_another_vocabulary(copy_model, toy_spm_bytes, tmp_path):
    with pytest.raises(UsageError, match="source rows"):
        plan = ExportPlan(shortlist=_full_table(copy_model.vocab_size + 1))
        export_litert(copy_model, toy_spm_bytes, str(tmp_path / "x"), plan)
    assert not os.path.exists(tmp_path / "x")


# --------------------------------------------------------------------------- the runtime


@pytest.fixture(scope="module")
def listed_dirs(copy_model, toy_spm_bytes, _shared_root):
    """The copy model exported in float32 and int8 with a table of every piece (the tests
    give the runtime other tables) and its constrained steps."""
    return fx.litert_shortlist_exports(
        _shared_root, "litert_shortlist_copy_model", copy_model, toy_spm_bytes
    )


def _recording(monkeypatch):
    """The ids of every hypothesis the runtime's search returns, collected."""
    found = []
    search = runtime.search

    def recorded(*args, **kwargs):
        out = search(*args, **kwargs)
        found.append(np.asarray(out[0]))
        return out

    monkeypatch.setattr(runtime, "search", recorded)
    return found


@pytest.mark.scenario
def test_the_export_holds_the_table_and_both_steps(listed_dirs):
    for directory in listed_dirs.values():
        names = set(os.listdir(directory))
        assert {"decoder_step.tflite", "decoder_step_shortlist.tflite", "shortlist.npz"} <= names
        with open(os.path.join(directory, "keras_transformer.json")) as f:
            meta = json.load(f)
        assert meta["shortlist"]["table"] == "shortlist.npz"
        assert "decoder_step_shortlist_constrained.tflite" in names
        # int8: the stack alone, its output projected by the runtime's int8 model of the
        # columns; float: the step projects onto the columns, an input; both from their rows
        gathered = meta["quantization"] == "dynamic_int8"
        assert meta["shortlist"]["head"] == ("gathered" if gathered else "columns")
        assert "shortlist_output.npz" in names
        assert ("shortlist_head.tflite" in names) is gathered
        with np.load(os.path.join(directory, "shortlist_output.npz")) as rows:
            assert rows["rows"].dtype == (np.int8 if gathered else np.float32)
            assert ("scales" in rows.files) is gathered


@pytest.mark.scenario
@pytest.mark.parametrize("quantization", ["float32", "dynamic_int8"])
def test_a_table_of_every_piece_answers_as_without(listed_dirs, quantization):
    plain = litert.load(listed_dirs[quantization])
    listed = litert.load(listed_dirs[quantization], shortlist=True)
    assert plain.shortlist is None and listed.shortlist is not None
    a, b = plain.translate_nbest(REQUEST), listed.translate_nbest(REQUEST)
    assert a["translations"] == b["translations"]
    np.testing.assert_allclose(a["scores"], b["scores"], atol=1e-4)
    np.testing.assert_allclose(a["token_scores"], b["token_scores"], atol=1e-4)
    prefixes = ["red", "", "dog fish", ""] + [""] * (len(REQUEST) - 4)
    a, b = plain.translate_prefix(REQUEST, prefixes), listed.translate_prefix(REQUEST, prefixes)
    assert a["translation"] == b["translation"]


@pytest.mark.scenario
@pytest.mark.parametrize("quantization", ["float32", "dynamic_int8"])
def test_a_piece_outside_the_shortlist_never_occurs(listed_dirs, quantization, monkeypatch):
    """A table without one of the source's pieces: that piece, and every piece outside the
    batch's shortlist, never comes out of any hypothesis; without the table it does."""
    plain = litert.load(listed_dirs[quantization])
    listed = litert.load(listed_dirs[quantization], shortlist=True)
    texts = ["red apple cat", "dog dog fish bird", "blue"]
    source = fx.spm_processor().encode(texts[0])
    dropped = source[0]
    found = _recording(monkeypatch)
    plain.translate_nbest(texts)
    assert dropped in found[0]  # the copy model copies it
    vocab = listed.shortlist.vocab_size
    listed.shortlist = _identity_table(vocab, without=[dropped])
    found.clear()
    out = listed.translate_nbest(texts)
    sources = listed._source_ids(texts)
    matrix = np.zeros((len(texts), max(map(len, sources))), np.int32)
    for i, row in enumerate(sources):
        matrix[i, : len(row)] = row
    ids, real = batch_shortlist(listed.shortlist.translations, listed.shortlist.frequent, matrix)
    allowed = set(ids[real].tolist())
    assert dropped not in allowed
    produced = set(np.concatenate([x.ravel() for x in found]).tolist())
    assert produced <= allowed and dropped not in produced
    assert out["translations"][0][0] != plain.translate(texts)["translation"][0]


@pytest.mark.scenario
@pytest.mark.parametrize("quantization", ["float32", "dynamic_int8"])
def test_grown_and_compacted_caches_keep_the_shortlist(listed_dirs, quantization, monkeypatch):
    """Over a narrow shortlist (the int8 step's mask, the float step's columns), caches that
    start 2 positions long and grow, in batches compacted as their sentences settle, give the
    answers of caches sized for the whole output in batches never compacted: each resize sets
    the chunk's fixed inputs (cross-attention, shortlist) again, and only the caches and the
    cross-attention inputs follow the live sentences."""
    from keras_transformer.litert import graphs

    sentences = REQUEST[:8] + ["red apple cat dog fish plum pear white black green blue"]
    events = []
    for name in ("_grow", "_compact"):
        real = getattr(graphs.DecoderStep, name)

        def recorded(self, *args, real=real, name=name):
            events.append(name)
            return real(self, *args)

        monkeypatch.setattr(graphs.DecoderStep, name, recorded)
    answers = []
    for bucket in (2, 0):
        translator = litert.load(listed_dirs[quantization], shortlist=True, cache_bucket=bucket)
        translator.shortlist = _identity_table(translator.shortlist.vocab_size)
        translator.settings = {**translator.settings, "batch_size": 5}
        answers.append(translator.translate_nbest(sentences))
        if bucket == 2:
            assert {"_grow", "_compact"} <= set(events), events
            monkeypatch.delattr(graphs.DecoderStep, "keep")
    grown, whole = answers
    assert grown["translations"] == whole["translations"]
    np.testing.assert_allclose(grown["scores"], whole["scores"], atol=1e-5)
    np.testing.assert_allclose(grown["token_scores"], whole["token_scores"], atol=1e-5)


@pytest.mark.scenario
def test_an_int8_export_with_the_older_masked_step_still_answers(copy_model, listed_dirs, tmp_path):
    """An int8 export made before the gathered head (`"head": "mask"`: its shortlist step the
    plain step with an `output_mask` input) still decodes with `shortlist=True`, answering as
    the gathered head does (both the int8 step's scores over the shortlist)."""
    import tensorflow as tf

    from keras_transformer.export import litert as export
    from keras_transformer.export import litert_graphs

    directory = tmp_path / "masked"
    shutil.copytree(listed_dirs["dynamic_int8"], directory)
    with open(directory / "keras_transformer.json") as f:
        meta = json.load(f)
    beams, top_k = meta["decoding"]["beam_size"], meta["top_k"]
    quantized = litert_graphs.quantized_rows(copy_model.target_embedding.embeddings.numpy())
    step = litert_graphs.step_function(copy_model, beams, top_k, (0, 2), 3, quantized, masked=True)
    specs = export._specs(copy_model, beams, shortlist="mask")
    flatbuffer, names = export._convert(
        tf.function(step, input_signature=specs, autograph=False), "dynamic_int8"
    )
    (directory / "decoder_step_shortlist.tflite").write_bytes(flatbuffer)
    meta["outputs"]["decoder_step_shortlist"] = names
    meta["shortlist"]["head"] = "mask"
    for key in ("head_graph", "output", "column_block"):
        del meta["shortlist"][key]
    with open(directory / "keras_transformer.json", "w") as f:
        json.dump(meta, f)
    gathered = litert.load(listed_dirs["dynamic_int8"], shortlist=True)
    masked = litert.load(str(directory), shortlist=True)
    for translator in (gathered, masked):  # a narrow table: the shortlist matters
        translator.shortlist = _identity_table(translator.shortlist.vocab_size, without=[5, 6])
        # one sentence a chunk: the older step masks a chunk to its union of the rows'
        # shortlists, the gathered head each row to its own (they agree on a row alone)
        translator.settings = {**translator.settings, "batch_size": 1}
    a, b = gathered.translate_nbest(REQUEST), masked.translate_nbest(REQUEST)
    assert a["translations"] == b["translations"]
    np.testing.assert_allclose(a["scores"], b["scores"], atol=1e-4)


@pytest.mark.scenario
def test_prefix_pieces_are_in_a_shortlist_without_them(listed_dirs, monkeypatch):
    """A table that lists nothing: the answers hold only the special ids and the prefix's
    pieces, which are forced as without a shortlist."""
    listed = litert.load(listed_dirs["float32"], shortlist=True)
    listed.shortlist = _table(np.zeros((listed.shortlist.vocab_size, 1)))
    found = _recording(monkeypatch)
    out = listed.translate_prefix(["red apple cat"], ["dog fish"])
    prefix = fx.spm_processor().encode("dog fish")
    assert out["translation"][0].startswith("dog fish")
    produced = set(np.concatenate([x.ravel() for x in found]).tolist())
    assert produced <= {*SPECIAL_IDS, *prefix}
    assert 3 in produced  # EOS ends it


@pytest.mark.scenario
@pytest.mark.parametrize(
    "quantization, drop, message",
    [
        ("float32", ("shortlist",), "no vocabulary shortlist"),
        ("float32", ("shortlist", "column_block"), "export it again"),
        ("dynamic_int8", ("shortlist", "head"), "export it again"),
    ],
)
def test_an_export_without_a_table_refuses_shortlist(
    listed_dirs, tmp_path, quantization, drop, message
):
    """No table: refused. A table from before the step took its columns as an input (no
    `column_block`, no `shortlist_output.npz`), or an int8 export from before its step was
    masked (no `head`: its step took float32 columns): refused, saying to export it again."""
    directory = tmp_path / "plain"
    directory.mkdir()
    with open(os.path.join(listed_dirs[quantization], "keras_transformer.json")) as f:
        meta = json.load(f)
    owner = meta
    for key in drop[:-1]:
        owner = owner[key]
    del owner[drop[-1]]
    with open(directory / "keras_transformer.json", "w") as f:
        json.dump(meta, f)
    shutil.copy(os.path.join(listed_dirs[quantization], "spm.model"), directory / "spm.model")
    with pytest.raises(litert.LiteRTError, match=message):
        litert.load(str(directory), shortlist=True)


@pytest.mark.scenario
def test_an_untied_projection_gathers_its_own_columns(toy_spm_bytes, tmp_path, monkeypatch):
    """An untied projection (its own kernel and biases, int8 rows of its own in
    `dynamic_int8`): every piece listed answers as without; a table without a piece keeps it out."""
    import keras

    from keras_transformer.config import DecodingSettings
    from keras_transformer.models import Transformer

    keras.utils.set_random_seed(1)
    vocab = fx.spm_processor().get_piece_size()
    model = Transformer(
        vocab_size=vocab, num_layers=1, d_model=16, num_heads=2, d_ff=32, dropout=0.0,
        tie_output_projection=False,
    )  # fmt: skip
    model({"source_ids": np.ones((1, 2), "int32"), "target_ids": np.ones((1, 2), "int32")})
    bias = model.output_projection.bias
    bias.assign(np.random.default_rng(0).normal(size=vocab).astype("float32"))
    settings = DecodingSettings(**fx.EXPORT_DECODE)
    texts = fx.NORMAL
    for quantization in ("float32", "dynamic_int8"):
        path = str(tmp_path / quantization)
        plan = ExportPlan(
            quantization=quantization,
            settings=settings,
            data=fx.EXPORT_DATA,
            shortlist=_full_table(vocab),
        )
        export_litert(model, toy_spm_bytes, path, plan)
        plain, listed = litert.load(path), litert.load(path, shortlist=True)
        a, b = plain.translate_nbest(texts), listed.translate_nbest(texts)
        if quantization == "float32":
            assert a["translations"] == b["translations"]
            np.testing.assert_allclose(a["scores"], b["scores"], atol=1e-4)
        found = _recording(monkeypatch)
        plain.translate_nbest(texts)
        common = np.bincount(np.concatenate([x.ravel() for x in found]), minlength=vocab)
        dropped = int(np.argmax(common[4:])) + 4  # the piece it produces most
        listed.shortlist = _table(np.zeros((vocab, 1)), np.delete(np.arange(vocab), dropped))
        found.clear()
        listed.translate_nbest(texts)
        produced = set(np.concatenate([x.ravel() for x in found]).tolist())
        assert dropped not in produced and produced
        monkeypatch.undo()


# --------------------------------------------------------------------------- lexical constraints

CONSTRAINED_TEXTS = ["red apple cat", "blue", "dog fish", "plum pear"]
CONSTRAINTS = [["cat"], ["dog"], [], ["white", "bird"]]


def _string_rows(rows):
    import tensorflow as tf

    width = max(len(row) for row in rows)
    return tf.constant([[t.encode() for t in row] + [b""] * (width - len(row)) for row in rows])


@pytest.mark.scenario
@pytest.mark.parametrize("quantization", ["float32", "dynamic_int8"])
def test_constraints_are_searched_over_a_shortlist_without_their_pieces(
    listed_dirs, copy_model, toy_spm_bytes, monkeypatch, quantization
):
    """A table without the pieces of "cat", "dog", "white" and "bird": the constrained answers
    over the shortlist still hold them (their pieces join the chunk's shortlist, no other piece
    outside it comes out) and, in float32, equal the SavedModel's `translate_constrained` with
    the same table; the rows without constraints answer as the unconstrained shortlisted
    search."""
    import tensorflow as tf

    from keras_transformer.export import Translator

    spm = fx.spm_processor()
    terms = {piece for word in ("cat", "dog", "white", "bird") for piece in spm.encode(word)}
    table = _identity_table(copy_model.vocab_size, without=sorted(terms))
    listed = litert.load(listed_dirs[quantization], shortlist=True)
    listed.shortlist = table
    found = _recording(monkeypatch)
    got = listed.translate(CONSTRAINED_TEXTS, constraints=CONSTRAINTS)
    assert got["constraints_met"].tolist() == [True] * 4
    for text, row in zip(got["translation"], CONSTRAINTS):
        assert all(term in text.split() for term in row), (text, row)
    sources = listed._source_ids(CONSTRAINED_TEXTS)
    matrix = np.zeros((len(sources), max(map(len, sources))), np.int32)
    for i, row in enumerate(sources):
        matrix[i, : len(row)] = row
    ids, real = batch_shortlist(table.translations, table.frequent, matrix)
    allowed = set(ids[real].tolist())
    assert not terms & allowed  # the table alone leaves every term's pieces out
    produced = set(np.concatenate([x.ravel() for x in found]).tolist())
    assert terms <= produced <= allowed | terms
    alone = listed.translate_constrained(["dog fish"], [[]])  # no term: no piece added
    assert alone["translation"] == listed.translate(["dog fish"])["translation"]
    if quantization != "float32":
        return
    decode, data = fx.EXPORT_DECODE, fx.EXPORT_DATA
    reference = Translator(
        copy_model, toy_spm_bytes, max_source_length=data["max_source_length"], shortlist=table,
        **{key: decode[key] for key in ("beam_size", "alpha", "max_extra_length", "batch_size")},
    ).translate_constrained(tf.constant(CONSTRAINED_TEXTS), _string_rows(CONSTRAINTS))  # fmt: skip
    assert got["translation"] == [t.decode() for t in reference["translation"].numpy()]
    assert got["constraints_met"].tolist() == reference["constraints_met"].numpy().tolist()
    np.testing.assert_allclose(got["score"], reference["score"].numpy(), atol=1e-4)


@pytest.mark.scenario
def test_an_export_without_the_constrained_shortlist_step_refuses(listed_dirs, tmp_path):
    """An export with both made before the constrained shortlist step existed: loaded with
    `shortlist=True` it refuses constraints, saying how to export it again."""
    directory = tmp_path / "old"
    shutil.copytree(listed_dirs["float32"], directory)
    with open(directory / "keras_transformer.json") as f:
        meta = json.load(f)
    del meta["constraints"]["shortlist_step"]
    with open(directory / "keras_transformer.json", "w") as f:
        json.dump(meta, f)
    with pytest.raises(litert.LiteRTError, match="no constrained shortlist step"):
        litert.load(str(directory), shortlist=True).translate_constrained(["blue"], [["dog"]])
    out = litert.load(str(directory)).translate_constrained(["blue"], [["dog"]])
    assert out["constraints_met"].tolist() == [True]
