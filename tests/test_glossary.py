"""Soft glossaries (`keras_transformer.glossary`, `data.terminology`, `translate_glossary`):
the annotation on hand examples, its graph twin, the training annotation of `prepare` and the
refusals of hostile glossaries."""

import os
import random

import pytest

from keras_transformer import glossary as g

NY = {"New York": "Nueva York", "York": "Yorkshire"}


def _annotation(source, target):
    return f"<term> {source} <trans> {target} </term>"


@pytest.mark.parametrize(
    ("text", "terms", "expected"),
    [
        # Longest first, every occurrence, no nested annotation of "York" inside "New York".
        (
            "the New York office, York and New York.",
            NY,
            f"the {_annotation('New York', 'Nueva York')} office, "
            f"{_annotation('York', 'Yorkshire')} and {_annotation('New York', 'Nueva York')}.",
        ),
        # Word boundaries: no match inside a word or next to `_` or a digit; case-sensitive.
        ("cat concatenate Cat cat_ cat2 (cat)", {"cat": "gato"},
         f"{_annotation('cat', 'gato')} concatenate Cat cat_ cat2 ({_annotation('cat', 'gato')})"),
        # Adjacent occurrences (a match's boundary is the next one's).
        ("a a a b", {"a": "x"}, " ".join([_annotation("a", "x")] * 3) + " b"),
        # Overlapping terms: the longest wins over the whole sentence, even when it starts later.
        ("A B C D", {"A B": "ab", "B C D": "bcd"}, f"A {_annotation('B C D', 'bcd')}"),
        # Regex characters are literal, in terms and in targets.
        ("C++ at 1.5x or 105", {"C++": r"c\1 $1", "1.5": "uno"},
         _annotation("C++", r"c\1 $1") + " at 1.5x or 105"),
        ("café in 東京 and 東京都", {"café": "Kaffee", "東京": "Tokyo"},
         f"{_annotation('café', 'Kaffee')} in {_annotation('東京', 'Tokyo')} and 東京都"),
        ("no term here", NY, "no term here"),
    ],
)  # fmt: skip
def test_annotate_hand_examples(text, terms, expected):
    assert g.annotate(text, terms) == expected


def test_an_empty_glossary_returns_the_text_itself():
    text = "tabs\tand \x01 marks stay"
    assert g.annotate(text, {}) == text
    assert g.annotate(text, []) == text
    assert g.annotate("a \x01 b", {"zzz": "y"}) == "a   b"  # the marks become spaces


@pytest.mark.parametrize(
    "terms",
    [{"<term> x": "y"}, {"x": "a </term>"}, {"x": "<trans>"}, {"a\x01b": "y"}, {"": "y"},
     {"x": " "}],
)  # fmt: skip
def test_a_term_with_a_tag_a_control_character_or_nothing_is_refused(terms):
    with pytest.raises(g.GlossaryError):
        g.annotate("x a\x01b", terms)


def test_load_glossary_reads_tsv_and_refuses_bad_files_in_one_line(tmp_path):
    good = tmp_path / "good.tsv"
    good.write_bytes("# comment\nNew York\tNueva York\r\n\ncafé\tKaffee\n".encode())
    assert g.load_glossary(str(good)) == [("New York", "Nueva York"), ("café", "Kaffee")]
    for name, data, words in [
        ("utf8.tsv", b"ok\tbien\n\xff\xfe\tx\n", "2: invalid UTF-8"),
        ("fields.tsv", b"one\ttwo\tthree\n", "1: expected"),
        ("tag.tsv", b"a <term>\tb\n", "annotation tag"),
    ]:
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(g.GlossaryError) as e:
            g.load_glossary(str(path))
        assert words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(g.GlossaryError, match="cannot read"):
        g.load_glossary(str(tmp_path / "missing.tsv"))


def _pairs(n=400, seed=0):
    rng = random.Random(seed)
    words = "ben sees the big ship and karl likes red apples".split()
    pairs = []
    for _ in range(n):
        source = " ".join(rng.choice(words) for _ in range(6))
        # The target holds the term's translation only for some of the pairs.
        target = source.replace("ship", "barco" if rng.random() < 0.5 else "nave")
        pairs.append((source, target))
    return pairs


def test_term_annotator_needs_both_sides_and_annotates_a_seeded_fraction():
    annotator = g.TermAnnotator([("ship", "barco"), ("ben", "ben")], fraction=0.5)
    pairs = _pairs()
    out, annotated = annotator(pairs, "seed-1")
    assert out == annotator(pairs, "seed-1")[0]  # the same seed, the same annotation
    assert out != annotator(pairs, "seed-2")[0]
    holding = [p for p in pairs if annotator.found(*p)]
    changed = [(a, b) for a, b in zip(pairs, out) if a != b]
    assert annotated == len(changed) and 0.35 * len(holding) < annotated < 0.65 * len(holding)
    for (source, target), (new_source, new_target) in changed:
        assert new_target == target  # only the source is annotated
        assert new_source == g.annotate(source, annotator.found(source, target))
        # "ship" only where the target says "barco".
        assert ("<term> ship" in new_source) == ("barco" in target)
    assert g.TermAnnotator([("ship", "barco")], 0.0)(pairs, "s")[1] == 0
    everything, count = g.TermAnnotator([("ship", "barco")], 1.0)(pairs, "s")
    assert count == sum(1 for s, t in pairs if " ship" in f" {s}" and "barco" in t)


GRAPH_CASES = [
    ("the New York office, York and New York.", NY),
    ("a a a b", {"a": "x"}),
    ("A B C D", {"A B": "ab", "B C D": "bcd"}),
    ("C++ at 1.5x (C++)", {"C++": r"c\1 $1 \\", "1.5": "uno"}),
    ("café in 東京 and 東京都 \x01", {"café": "Kaffee", "東京": "Tokyo"}),
    ("cat concatenate Cat cat_", {"cat": "gato"}),
    ("nothing \x02 here", {}),
    ("a\x04cat\x05cat \x05 cat_cat-cat", {"cat": "gato", "t-c": "x"}),
    # Terms that start or end with a character that is not a word character.
    ("a-x b -x (C++) x- x-y ..", {"-x": "m", "x-": "n", "(C++)": "c", ".": "p"}),
]


def test_graph_annotation_equals_the_python_one():
    import tensorflow as tf

    texts = [t for t, _ in GRAPH_CASES]
    sources, targets = g.padded([terms for _, terms in GRAPH_CASES])
    got = g.annotate_graph(tf.constant(texts), tf.constant(sources), tf.constant(targets))
    expected = [g.annotate(t, terms) for t, terms in GRAPH_CASES]
    assert [x.decode() for x in got.numpy()] == expected
    # A glossary of no columns, and no rows.
    empty = tf.zeros([2, 0], tf.string)
    assert g.annotate_graph(tf.constant(["a", "b"]), empty, empty).numpy().tolist() == [b"a", b"b"]
    none = tf.zeros([0, 3], tf.string)
    assert g.annotate_graph(tf.zeros([0], tf.string), none, none).shape == [0]
    with pytest.raises(tf.errors.InvalidArgumentError, match="annotation tag"):
        g.annotate_graph(tf.constant(["x"]), tf.constant([["x"]]), tf.constant([["<term>"]]))


@pytest.mark.parametrize(
    "source, target",
    [("x", ""), ("x", " "), ("x", "\u200b\u3000"), ("", "y"), (" ", "y"), ("x", "a\x01")],
)
def test_the_graph_refuses_the_terms_python_refuses(source, target):
    """An empty target term (or one of nothing but SentencePiece's whitespace), an empty
    source term with a target (not padding): refused by `annotate` and by the graph alike."""
    import tensorflow as tf

    with pytest.raises(g.GlossaryError, match="is empty|control"):
        g.annotate("x y", {source: target})
    with pytest.raises(tf.errors.InvalidArgumentError, match="is empty"):
        g.annotate_graph(tf.constant(["x y"]), tf.constant([[source]]), tf.constant([[target]]))
    # Padding (both terms "") is no entry.
    pad = tf.constant([["x", ""]]), tf.constant([["X", ""]])
    assert g.annotate_graph(tf.constant(["x y"]), *pad).numpy().tolist() == [
        g.annotate("x y", {"x": "X"}).encode()
    ]


def test_graph_annotation_equals_the_python_one_on_random_texts():
    """Random texts over letters, digits, `_`, spaces and punctuation, each with terms cut from
    it (touching, overlapping, starting or ending with punctuation): the graph's word
    boundaries are the Python ones."""
    import tensorflow as tf

    rng = random.Random(7)
    alphabet = "ab1_ .-(é"
    texts, glossaries = [], []
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        terms = {}
        for _ in range(rng.randint(0, 3)):
            start = rng.randint(0, max(len(text) - 1, 0))
            term = text[start : start + rng.randint(1, 4)]
            if term and term == term.strip():
                terms[term] = f"t{len(terms)}"
        texts.append(text)
        glossaries.append(terms)
    sources, targets = g.padded(glossaries)
    annotate = tf.function(g.annotate_graph)  # as the signature runs it (eager map_fn is slow)
    got = annotate(tf.constant(texts), tf.constant(sources), tf.constant(targets))
    expected = [g.annotate(t, terms) for t, terms in zip(texts, glossaries)]
    assert [x.decode() for x in got.numpy()] == expected


# ---------------------------------------------------------------- prepare


@pytest.mark.scenario
def test_prepare_annotates_the_requested_fraction_with_tags_kept_whole(tmp_path):
    import sentencepiece as spm
    from training_helpers import tiny_config

    from keras_transformer.data import prepare, read_pairs
    from keras_transformer.data.prepared import prepared_examples
    from keras_transformer.workdir import Workdir

    terms = tmp_path / "terms.tsv"
    names = ["ben", "oscar", "karl", "hugo", "tom", "jonas", "felix", "clara", "paul", "emma"]
    terms.write_text("".join(f"{n}\t{n}\n" for n in names))
    train = "synthetic:split=train,size=3000,max_words=8"
    config = tiny_config(
        tmp_path / "work",
        data=dict(
            train=train, vocab_size=300, max_source_length=60, max_target_length=60,
            terminology=str(terms), terminology_fraction=0.5, prepare_workers=1,
            both_directions=True,  # the reversed records' targets: the sources unannotated
        ),
    )  # fmt: skip
    manifest = prepare(config, verbose=False)
    record = manifest["terminology"]
    assert record["entries"] == len(names) and record["tags"] == list(g.TAGS)
    assert manifest["settings"]["data.terminology"] == str(terms)
    annotator = g.TermAnnotator(g.load_glossary(str(terms)), 1.0)
    holding = sum(1 for p in read_pairs(train, verbose=False) if annotator.found(*p))
    assert holding > 100  # enough pairs for the fraction to mean something
    assert 0.4 * holding < record["annotated"] < 0.6 * holding
    processor = spm.SentencePieceProcessor(model_file=Workdir.of(config).spm)
    tag_ids = [processor.piece_to_id(tag) for tag in g.TAGS]
    assert processor.unk_id() not in tag_ids
    # The tags are single pieces of the vocabulary, and they are in the shards' sources: as
    # many opening tags as annotations (every name at most once per synthetic pair or more).
    examples = list(prepared_examples(Workdir.of(config).prepared, training=False))
    sources = [s.numpy().tolist() for s, _ in examples]
    annotated = [s for s in sources if tag_ids[0] in s]
    assert len(annotated) == record["annotated"]
    for s in annotated:
        assert s.count(tag_ids[0]) == s.count(tag_ids[1]) == s.count(tag_ids[2])
    assert not any(tag in t.numpy().tolist() for _, t in examples for tag in tag_ids)
    encoded = processor.encode("<term> ben <trans> ben </term>")
    assert [encoded.count(i) for i in tag_ids] == [1, 1, 1]


def test_terminology_needs_a_vocabulary_with_the_tags(toy_spm_bytes, tmp_path):
    from keras_transformer.data.encoding import terminology_entries
    from keras_transformer.errors import DataError

    terms = tmp_path / "terms.tsv"
    terms.write_text("red\trot\n")
    assert terminology_entries(toy_spm_bytes, None) == ()
    with pytest.raises(DataError, match="no <term> <trans> </term> piece"):
        terminology_entries(toy_spm_bytes, str(terms))
    terms.write_bytes(b"\xff\tx\n")
    with pytest.raises(DataError, match="invalid UTF-8"):
        terminology_entries(toy_spm_bytes, str(terms))


# ---------------------------------------------------------------- inference


@pytest.fixture(scope="module")
def glossary_translator(tmp_path_factory):
    """An untrained tiny Transformer whose vocabulary keeps the glossary tags (its answers are
    arbitrary but deterministic: enough to compare the signatures)."""
    import _inference_fixtures as fx
    import keras
    import numpy as np

    from keras_transformer.export import Translator
    from keras_transformer.models import Transformer

    keras.utils.set_random_seed(7)  # the same model on every run (seed 31 chose EOS first)
    proto = fx.glossary_spm_proto(str(tmp_path_factory.mktemp("glossary_spm") / "spm"))
    model = Transformer(vocab_size=40, num_layers=1, d_model=16, num_heads=2, d_ff=32)
    model({"source_ids": np.ones((1, 2), "int32"), "target_ids": np.ones((1, 2), "int32")})
    translator = Translator(model, proto, **GLOSSARY_DECODE, max_source_length=24)
    translator.parts = (model, proto)  # for the export test
    return translator


GLOSSARY_DECODE = {"beam_size": 2, "max_extra_length": 6}


@pytest.mark.scenario
def test_translate_glossary_is_serve_of_the_annotated_text(glossary_translator):
    import tensorflow as tf

    translator = glossary_translator
    assert "translate_glossary" in translator.signatures
    texts = ["red apple", "the cat and the dog", "blue fish"]
    terms = {"cat": "dog", "red apple": "plum"}
    plain = translator.translate(texts)
    # No glossary, an empty one: exactly today's answer.
    for empty in ({}, []):
        out = translator.translate(texts, glossary=empty)
        assert out["translation"] == plain["translation"]
        assert out["score"] == pytest.approx(plain["score"], abs=1e-6)
        assert out["annotated"] == [False] * 3
    out = translator.translate(texts, glossary=terms)
    reference = translator.translate([g.annotate(t, terms) for t in texts])
    assert out["translation"] == reference["translation"]
    assert out["score"] == pytest.approx(reference["score"], abs=1e-5)
    assert out["annotated"] == [True, True, False]
    # One glossary per text.
    out = translator.translate(texts[:2], glossary=[{}, {"cat": "dog"}])
    assert out["annotated"] == [False, True]
    # An annotation the length limit would cut: the text as it is, flagged.
    long_target = " ".join(["green"] * 40)
    with pytest.warns(UserWarning, match="1 sentence"):
        out = translator.translate(["red apple", "blue"], glossary={"apple": long_target})
    assert out["annotated"] == [False, False]
    assert out["translation"][0] == plain["translation"][0]
    # Invalid UTF-8 in a glossary given to the signature: replaced, never a failure.
    raw = translator.translate_glossary(
        tf.constant([b"red apple"]), tf.constant([[b"red \xff"]]), tf.constant([[b"\xc3("]])
    )
    assert raw["annotated"].numpy().tolist() == [False]
    # Refusals: a term holding a tag; a model without the tags (see the CLI test).
    with pytest.raises(g.GlossaryError):
        translator.translate(texts, glossary={"cat": "<term>"})


@pytest.mark.scenario
def test_cli_glossary_errors_are_one_line_with_exit_2(exported_copy_model, tmp_path, capsys):
    from keras_transformer import cli

    _, path = exported_copy_model
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"red\trot\n\xc3\x28\tx\n")
    good = tmp_path / "good.tsv"
    good.write_text("red\trot\n")
    for args, words in [
        (["--glossary", str(bad), "red"], "bad.tsv:2: invalid UTF-8"),
        (["--glossary", str(good), "--n-best", "2", "red"], "cannot be combined"),
        # The copy model's vocabulary has no tags: no translate_glossary signature.
        (["--glossary", str(good), "red"], "not prepared with data.terminology"),
    ]:
        assert cli.main(["translate", "--model", path, *args]) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err
    assert os.path.exists(path)


@pytest.mark.scenario
def test_exported_translate_glossary_through_the_cli(glossary_translator, tmp_path, capsys):
    import json

    from keras_transformer import cli
    from keras_transformer.config import DecodingSettings
    from keras_transformer.export import ExportPlan, export_saved_model

    model, proto = glossary_translator.parts
    path = export_saved_model(
        model,
        proto,
        ExportPlan(settings=DecodingSettings(**GLOSSARY_DECODE), data={"max_source_length": 24}),
        str(tmp_path),
        "gloss",
    )
    with open(os.path.join(path, "assets.extra", "keras_transformer.json")) as f:
        metadata = json.load(f)
    assert metadata["glossary_tags"] == list(g.TAGS)
    assert set(metadata["signatures"]["translate_glossary"]["inputs"]) == {
        "text", "glossary_source", "glossary_target",
    }  # fmt: skip
    terms = tmp_path / "terms.tsv"
    terms.write_text("cat\tdog\nred apple\tplum\n")
    texts = ["red apple", "the cat and the dog", "blue fish"]
    assert cli.main(["translate", "--model", path, "--glossary", str(terms), *texts]) == 0
    expected = glossary_translator.translate(texts, glossary=g.load_glossary(str(terms)))
    assert capsys.readouterr().out.splitlines() == expected["translation"]
    # A term whose annotation would pass the length limit: translated as it is, one warning.
    terms.write_text("apple\t" + " ".join(["green"] * 40) + "\n")
    assert cli.main(["translate", "--model", path, "--glossary", str(terms), "red apple"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == glossary_translator.translate(["red apple"])["translation"]
    assert "1 sentence(s) translated without their glossary annotation" in captured.err
    # The warmup requests TF Serving replays at load hold the glossary signature, with a
    # [1, 1] glossary, and run.
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    from keras_transformer.export.warmup import WARMUP_FILE

    loaded, replayed = tf.saved_model.load(path), 0
    for raw in tf.data.TFRecordDataset(os.path.join(path, "assets.extra", WARMUP_FILE)):
        request = prediction_log_pb2.PredictionLog.FromString(raw.numpy()).predict_log.request
        if request.model_spec.signature_name == "translate_glossary":
            inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
            assert inputs["glossary_source"].shape == [1, 1]
            assert loaded.signatures["translate_glossary"](**inputs)["translation"].shape == [1]
            replayed += 1
    assert replayed == len(glossary_translator.length_buckets)


@pytest.mark.scenario
def test_ctranslate2_reads_the_annotated_text(glossary_translator, tmp_path):
    """CTranslate2 takes pieces: `annotate`'s text tokenized as usual (the tags single pieces)
    decodes as `translate_glossary` does (greedy, the same untrained model)."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    import _inference_fixtures as fx
    import sentencepiece as spm

    from keras_transformer.export import Translator
    from keras_transformer.export.ct2 import export_ctranslate2

    model, proto = glossary_translator.parts
    greedy = Translator(model, proto, beam_size=1, max_extra_length=6, max_source_length=24)
    output = str(tmp_path / "ct2")
    export_ctranslate2(model, proto, output, "float32", {"max_source_length": 24})
    sp = spm.SentencePieceProcessor(model_proto=proto)
    translator = ctranslate2.Translator(output, device="cpu", intra_threads=1)
    texts = fx.toy_sentences(30, seed=5)
    terms = {"red": "green", "cat": "dog fish", "blue apple": "plum"}
    ours = greedy.translate(texts, glossary=terms)["translation"]
    theirs = []
    for text in texts:
        pieces = sp.encode(g.annotate(text, terms), out_type=str)
        assert pieces.count("<term>") == g.annotate(text, terms).count("<term>")
        # min_decoding_length=0: CTranslate2 refuses EOS at the first step by default, and an
        # untrained model may choose it there (then every answer of ours is empty).
        (result,) = translator.translate_batch(
            [pieces], beam_size=1, max_decoding_length=len(pieces) + 6, min_decoding_length=0
        )
        theirs.append(sp.decode(result.hypotheses[0]))
    assert sum(a == b for a, b in zip(ours, theirs)) >= 28, list(zip(ours, theirs))
    assert sum("<term>" in g.annotate(t, terms) for t in texts) >= 10  # glossaries were used
