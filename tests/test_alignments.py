"""Word alignments (`Translator`'s `alignment` output, `Translator.translate(alignments=True)`,
`keras_transformer.alignment`) and markup carried through translation
(`keras_transformer.markup`)."""

import warnings

import _inference_fixtures as fx
import numpy as np
import pytest

from keras_transformer.alignment import (
    alignment_error_rate,
    format_pairs,
    synthetic_alignment_set,
    true_alignment,
)
from keras_transformer.alignment_rules import word_pairs
from keras_transformer.markup import (
    MarkupWarning,
    plain_text,
    strip_markup,
    transfer_tags,
    translate_markup,
)

MARKER = "\u2581"


# ------------------------------------------------------------------ references


def _reference_words(pieces):
    """Python reference of the piece -> word map: a piece starting with the word marker begins
    a word (as does the first one, and one after a lone marker); a lone marker belongs to the
    word after it (-1: none follows)."""
    words, index, after_lone = [], -1, True
    for piece in pieces:
        if piece == MARKER:
            words.append(index + 1)
            after_lone = True
            continue
        if index < 0 or piece.startswith(MARKER) or after_lone:
            index += 1
        words.append(index)
        after_lone = False
    return [w if w <= index else -1 for w in words]


def _reference_alignment(model, source_text, output_ids, layer):
    """The alignment of one translation computed step by step through the decoder step
    protocol, the cross-attention scores caught as the layers return them."""
    import tensorflow as tf

    sp = fx.spm_processor()
    source = fx.encode_sources([source_text])  # [1, S], EOS last
    memory, mask = model.encode(tf.constant(source))
    cache = model.init_cache(memory, max_length=len(output_ids) + 1)
    previous, rows = fx.BOS, []
    for index, token in enumerate(output_ids):
        self_attentions, cross_attentions = model.decoder.attentions(
            encoder_padding_mask=mask,
            self_attention_cache=cache["self_attention"],
            cache_update_index=index,
            cross_attention_cache=cache["cross_attention"],
        )
        caught = {}

        def catching(attend, i):
            def cross(h):
                output, scores = attend(h)
                caught[i] = scores
                return output, scores

            return cross

        y = model.embed_target(tf.constant([[previous]]), start_index=index)
        _, cache["self_attention"] = model.decoder_step(
            y, self_attentions, [catching(a, i) for i, a in enumerate(cross_attentions)],
            cache.get("output_kernel"),
        )  # fmt: skip
        rows.append(np.asarray(caught[layer], "float32")[0, :, 0].mean(axis=0))  # [S]
        previous = token
    text_pieces = int(np.sum(source[0] != fx.PAD)) - 1  # EOS excluded
    source_words = _reference_words(sp.id_to_piece(source[0, :text_pieces].tolist()))
    target_words = _reference_words(sp.id_to_piece(list(output_ids)))
    votes = {}
    for j, row in zip(target_words, rows):
        votes.setdefault(j, []).append(source_words[int(np.argmax(row[:text_pieces]))])
    # Most pieces' source word; a tie goes to the first piece's.
    return [max(v, key=lambda w: (v.count(w), w == v[0])) for _, v in sorted(votes.items())]


# ------------------------------------------------------------------ word map


class _Pieces:
    """A stand-in tokenizer: `id_to_string` over a fixed piece list."""

    def __init__(self, pieces):
        self.pieces = pieces

    def id_to_string(self, ids):
        import tensorflow as tf

        return tf.gather(tf.constant(self.pieces), ids)


@pytest.mark.parametrize(
    "pieces, expected",
    [
        (["▁red", "▁app", "le", "▁cat"], [0, 1, 1, 2]),
        (["▁", "(", "x", "▁y"], [0, 0, 0, 1]),  # a lone marker starts the word after it
        (["a", "b", "▁c"], [0, 0, 1]),  # no marker on the first piece
        (["▁a", "▁", "▁b"], [0, 1, 1]),  # a lone marker inside belongs to the word after
    ],
)
def test_pieces_map_to_the_words_of_the_detokenized_text(pieces, expected):
    import tensorflow as tf

    from keras_transformer.export.alignment_graph import word_indices

    ids = tf.constant([list(range(len(pieces))) + [0]])  # a padding position at the end
    is_text = tf.constant([[True] * len(pieces) + [False]])
    words, starts = word_indices(_Pieces(pieces + ["<pad>"]), ids, is_text)
    assert words.numpy().tolist() == [expected + [-1]]
    assert _reference_words(pieces) == expected
    assert int(tf.reduce_sum(tf.cast(starts, tf.int32))) == max(expected) + 1


@pytest.mark.parametrize(
    "pieces, expected",
    [
        (["▁red", "▁app", "le", "▁cat"], [0, 1, 1, 2]),
        (["▁", "(", "x", "▁y"], [0, 0, 0, 1]),
        (["a", "b", "▁c"], [0, 0, 1]),
        (["▁a", "▁", "▁b"], [0, 1, 1]),
    ],
)
def test_the_litert_runtimes_numpy_rules_map_pieces_as_the_graph(pieces, expected):
    """`alignment_rules.numpy_word_alignment` (the LiteRT runtime's road): the graph's words on both
    sides, and each target word the source word most of its pieces attend to (a tie: the first
    piece's), -1 past the words and for a word aligned to no source text."""
    from keras_transformer.alignment_rules import numpy_word_alignment, piece_flags

    vocab = ["<pad>", "</s>", *pieces]
    ids = np.array([list(range(2, len(vocab))) + [1, 0]])  # the pieces, EOS, padding
    flags = piece_flags(vocab)
    # The target is the source, each piece attending to itself: word j -> word j.
    piece = np.arange(ids.shape[1])[None]
    alignment, words = numpy_word_alignment(piece, ids, ids, flags, (0, 1), 8, 8)
    n = max(expected) + 1
    assert words.tolist() == [n]
    assert alignment.tolist() == [list(range(n)) + [-1] * (8 - n)]
    # Every piece attending to the last source text piece: every word aligned to its word.
    last = np.full_like(ids, len(pieces) - 1)
    alignment, _ = numpy_word_alignment(last, ids, ids, flags, (0, 1), 8, 8)
    assert alignment.tolist() == [[expected[-1]] * n + [-1] * (8 - n)]


def test_the_numpy_rules_break_ties_to_the_first_piece_and_skip_no_text():
    from keras_transformer.alignment_rules import numpy_word_alignment, piece_flags

    flags = piece_flags(["<pad>", "</s>", "▁red", "▁app", "le", "▁cat"])
    ids = np.array([[2, 3, 4, 5, 1, 0]])  # red app|le cat EOS pad
    # red -> cat; app -> red, le -> cat (a tie: the first piece's); cat -> EOS (no text).
    piece = np.array([[3, 0, 3, 4, 4, 4]])
    alignment, words = numpy_word_alignment(piece, ids, ids, flags, (0, 1), 5, 5)
    assert words.tolist() == [3] and alignment.tolist() == [[2, 0, -1, -1, -1]]


@pytest.mark.parametrize(
    "pieces",
    [
        ["▁a", "▁", "x", "▁b"],  # a lone marker before a piece with no marked form
        ["▁", "(", "▁a", "▁", "▁b", "c"],
        ["▁a", "▁", "x", "▁", "y", "▁"],
    ],
)
def test_a_lone_marker_is_in_the_same_word_for_training_and_the_export(pieces):
    """Guided-alignment training (`data.alignments.word_of_pieces`, the links it teaches) and
    the export's alignments (the graph's `word_indices`, the LiteRT runtime's numpy rules) put
    every piece, a lone "▁" included, in the same word: the word after a lone "▁"."""
    import tensorflow as tf

    from keras_transformer.alignment_rules import numpy_word_alignment, piece_flags
    from keras_transformer.data.alignments import word_of_pieces
    from keras_transformer.export.alignment_graph import word_indices

    training = word_of_pieces(pieces)
    ids = tf.constant([list(range(len(pieces)))])
    graph, _ = word_indices(_Pieces(pieces), ids, tf.ones_like(ids, tf.bool))
    assert graph.numpy().tolist() == [training]
    # The runtime's road: every piece attending to one source piece gets that piece's word.
    vocab = ["<pad>", "</s>", *pieces]
    source = np.array([list(range(2, len(vocab))) + [1]])
    content = next(k for k, p in enumerate(pieces) if p != MARKER)
    target = np.array([[2 + content, 1]])  # one target word
    for k, word in enumerate(training):
        piece = np.array([[k, k]])
        flags = piece_flags(vocab)
        alignment, _ = numpy_word_alignment(piece, source, target, flags, (0, 1), 2, 8)
        assert alignment.tolist() == [[word, -1]]


def test_an_unknown_piece_of_the_translation_is_a_word_of_its_own():
    """A translation's `<unk>` is detokenized " ⁇ ", a word of the translation: the words
    after it keep their indices (in the graph and in the LiteRT runtime's numpy rules), while
    in a source unknown characters belong to the word they are in."""
    import tensorflow as tf

    from keras_transformer.alignment_rules import numpy_word_alignment, piece_flags
    from keras_transformer.export.alignment_graph import word_indices

    vocab = ["<pad>", "</s>", "<unk>", "▁cat", "▁dog", "s"]
    sp = fx.spm_processor()
    assert sp.decode([sp.piece_to_id("▁cat"), 1, sp.piece_to_id("▁dog")]).split() == [
        "cat", "\u2047", "dog"
    ]  # fmt: skip
    # Source "cat€ dogs" (€ unknown: 2 words); translation "cat ⁇ dogs" (3 words).
    ids = np.array([[3, 2, 4, 5, 1]])
    identity = np.arange(5)[None]
    alignment, words = numpy_word_alignment(identity, ids, ids, piece_flags(vocab), (0, 1), 4, 4)
    assert words.tolist() == [3] and alignment.tolist() == [[0, 0, 1, -1]]
    is_text = tf.constant([[True] * 4 + [False]])
    target, starts = word_indices(_Pieces(vocab), tf.constant(ids), is_text, translation=True)
    assert target.numpy().tolist() == [[0, 1, 2, 2, -1]]
    source, _ = word_indices(_Pieces(vocab), tf.constant(ids), is_text)
    assert source.numpy().tolist() == [[0, 0, 1, 1, -1]]


# ------------------------------------------------------------------ the model's alignments


@pytest.fixture(scope="module")
def translator(copy_model, toy_spm_bytes):
    from keras_transformer.export import Translator

    return Translator(
        copy_model,
        toy_spm_bytes,
        max_source_length=fx.MAX_SOURCE_LENGTH,
        alignments=True,
        **fx.EXPORT_DECODE,
    )


@pytest.mark.scenario
@pytest.mark.numerics
def test_alignment_is_the_argmax_of_the_models_cross_attention(translator, copy_model):
    import tensorflow as tf

    texts = [*fx.NORMAL, "fish", "bluegreen applepear"]
    out = translator(tf.constant(texts))
    alignment = out["alignment"].numpy()
    assert out["alignment"].dtype == tf.int32
    sp = fx.spm_processor()
    most = 0
    for k, text in enumerate(texts):
        translation = out["translation"][k].numpy().decode()
        ids = sp.encode(translation) + [fx.EOS]
        expected = _reference_alignment(copy_model, text, ids, translator.alignment_layer)
        words = len(translation.split())
        assert len(expected) == words
        assert alignment[k, :words].tolist() == expected, (text, translation)
        assert (alignment[k, words:] == -1).all()
        most = max(most, words)
    assert alignment.shape == (len(texts), most)


def test_a_copy_model_aligns_each_word_to_itself(translator):
    texts = ["red apple cat", "dog fish bird blue"]
    out = translator.translate(texts, alignments=True)
    for text, translation, pairs in zip(texts, out["translation"], out["alignment"]):
        assert translation == text
        assert pairs == [(i, i) for i in range(len(text.split()))]


def test_hostile_inputs_get_an_alignment_row_each(translator):
    import tensorflow as tf

    out = translator(tf.constant(fx.HOSTILE + [""]))
    alignment = out["alignment"].numpy()
    for k, translation in enumerate(out["translation"].numpy()):
        words = len(translation.decode("utf-8", "replace").split())
        assert (alignment[k, words:] == -1).all()
        assert (alignment[k, :words] < fx.MAX_SOURCE_LENGTH).all()
    assert (alignment[0] == -1).all()  # empty input: nothing to align


def test_alignment_layer_is_checked(copy_model, toy_spm_bytes):
    from keras_transformer.export import Translator

    assert Translator(copy_model, toy_spm_bytes).alignment_layer == 0  # one layer: -2 -> 0
    with pytest.raises(ValueError, match="alignment_layer 3"):
        Translator(copy_model, toy_spm_bytes, alignment_layer=3)


@pytest.mark.parametrize("asked", [{"alignments": True}, {"markup": "html"}])
def test_translate_without_alignments_names_the_export_option(copy_model, toy_spm_bytes, asked):
    from keras_transformer.export import Translator

    translator = Translator(copy_model, toy_spm_bytes, max_source_length=fx.MAX_SOURCE_LENGTH)
    assert not translator.alignments  # off by default
    with pytest.raises(ValueError, match=r"alignments=True .*export --alignments"):
        translator.translate(["red apple"], **asked)


# ------------------------------------------------------------------ AER and the synthetic set


def test_aer_against_a_hand_computation():
    predicted = [[(0, 0), (1, 1), (2, 1)], [(0, 1)]]
    sure = [[(0, 0), (1, 1), (2, 2)], [(0, 0)]]
    # |A| = 4, |S| = 4, |A & S| = 2 -> 1 - (2 + 2) / 8
    assert alignment_error_rate(predicted, sure) == pytest.approx(0.5)
    possible = [[(0, 0), (1, 1), (2, 2), (2, 1)], [(0, 0)]]  # (2, 1) possible: |A & P| = 3
    assert alignment_error_rate(predicted, sure, possible) == pytest.approx(1 - 5 / 8)
    assert alignment_error_rate(sure, sure) == 0.0
    assert alignment_error_rate([[(5, 5)]], [[(0, 0)]]) == 1.0
    assert alignment_error_rate([], []) == 0.0


def test_moses_pairs():
    assert format_pairs([(0, 1), (2, 0)]) == "0-1 2-0"
    assert format_pairs([]) == ""


def test_synthetic_alignments_are_known_by_construction():
    # Hand-checked: S V O in the source, S O V in the target, the adjective after its noun.
    assert true_alignment(
        "max hates my new kind horse", "max trole pliner feplutu viburu plotretet"
    ) == [(0, 0), (2, 1), (5, 2), (3, 3), (4, 4), (1, 5)]
    assert true_alignment("a b", "x y") is None  # not of the synthetic language
    data = synthetic_alignment_set(50, seed=3)
    assert len(data) == 50
    for source, target, pairs in data:
        n = len(source.split())
        assert len(target.split()) == n
        assert sorted(i for i, _ in pairs) == list(range(n))
        assert sorted(j for _, j in pairs) == list(range(n))


# ------------------------------------------------------------------ markup


def _identity(text, kind="html"):
    """`transfer_tags` with a copy 'translation' aligned word to word."""
    plain = strip_markup(text, kind)
    return transfer_tags(text, plain, list(range(len(plain.split()))), kind)


@pytest.mark.parametrize(
    "text",
    [
        "a <b>c d</b> e",
        "<p>Hello <i>big</i> <a href='x?y=1&amp;z=2'>world</a></p>",
        "<b>a <i>b</i> c</b> d",
        "x &amp; y &lt;z&gt;",
        "a <img src='x.png' alt=\"\"/>b",
        "<!-- note -->a b",
    ],
)
def test_tags_round_trip_through_a_word_for_word_translation(text):
    assert _identity(text) == text


def test_xml_names_keep_their_case_and_only_slashes_make_void_tags():
    assert _identity("<Term id='1'>red</Term> <x/>cat", "xml") == "<Term id='1'>red</Term> <x/>cat"
    assert strip_markup("<img>red</img>", "xml") == "red"
    with pytest.raises(ValueError, match="markup kind"):
        strip_markup("a", "sgml")


def test_tags_follow_the_alignment():
    # Reordered: the tag moves with its word; nested elements stay nested.
    assert transfer_tags("a <b>red</b> cat", "un chat rouge", [0, 2, 1]) == "un chat <b>rouge</b>"
    assert transfer_tags("<b>a <i>b</i> c</b>", "C B A", [2, 1, 0]) == "<b>C <i>B</i> A</b>"
    # Siblings whose target spans would overlap are cut apart, each tag kept once.
    out = transfer_tags("<b>a b</b> <i>c</i>", "X Y Z", [0, 2, 1])
    assert out == "<b>X</b> <i>Y</i> Z"
    # Alignment pairs work as the per-word list does.
    assert transfer_tags("a <b>red</b> cat", "un chat rouge", [(0, 0), (2, 1), (1, 2)]) == (
        "un chat <b>rouge</b>"
    )


def _source_words(plain):
    """The words SentencePiece's pieces of `plain` hold (the alignments' source words)."""
    from keras_transformer.data.alignments import word_of_pieces

    return max(word_of_pieces(fx.spm_processor().encode(plain, out_type=str)), default=-1) + 1


def test_a_zero_width_space_separates_words_as_for_sentencepiece():
    """A zero-width space (U+200B, common in HTML) is a space to SentencePiece: the words the
    tags wrap are the alignments' words, so `<b>` and `<i>` stay on their own words."""
    source = "<b>a</b>\u200bb <i>c</i>"
    plain = strip_markup(source)
    assert plain == "a b c" and _source_words(plain) == 3
    assert transfer_tags(source, "A B C", [0, 1, 2]) == "<b>A</b> B <i>C</i>"
    assert transfer_tags(source, "C\u200bB A", [2, 1, 0]) == "<i>C</i> B <b>A</b>"


@pytest.mark.parametrize("character", ["\x1c", "\x0b", "\x85"])
def test_characters_python_splits_at_but_sentencepiece_does_not_join_words(character):
    """U+001C and U+000B (deleted by SentencePiece's normaliser) and U+0085 (kept as text)
    are whitespace to Python's `str.split` but join the letters around them into one word of
    the pieces, so they do in markup too."""
    source = f"<b>a</b>{character}b <i>c</i>"
    plain = strip_markup(source)
    assert plain.split(" ") == [f"a{character}b", "c"] and _source_words(plain) == 2
    assert transfer_tags(source, "AB C", [0, 1]) == "<b>AB</b> <i>C</i>"
    assert transfer_tags(source, f"C A{character}B", [1, 0]) == f"<i>C</i> <b>A{character}B</b>"


def test_an_unknown_piece_of_the_translation_keeps_the_later_tags_on_their_words():
    """The translation's `<unk>` (" ⁇ ") is a word, in the alignment as in markup: the tags
    after it land on the words aligned to their source words."""
    translation = "A \u2047  B C"  # as SentencePiece detokenizes [▁A, <unk>, ▁B, ▁C]
    out = transfer_tags("a <b>b</b> <i>c</i>", translation, [0, -1, 1, 2])
    assert out == "A \u2047 <b>B</b> <i>C</i>"


def test_self_closing_tags_go_before_the_word_aligned_to_the_word_after_them():
    assert transfer_tags("one<br/>two three", "drei zwei eins", [2, 1, 0]) == (
        "drei <br/>zwei eins"
    )
    assert transfer_tags("a <img src=x> b", "B A", [1, 0]) == "<img src=x>B A"
    assert transfer_tags("a b <br>", "A B", [0, 1]) == "A B<br>"  # nothing after: at the end


def test_an_element_aligned_to_nothing_is_kept_empty():
    out = transfer_tags("a <b>b</b> c", "A C", [0, 2])
    assert out == "A <b></b>C"


def test_entities_are_decoded_for_the_model_and_escaped_in_the_output():
    assert strip_markup("fish &amp; chips &eacute;t&eacute; &lt;3") == "fish & chips été <3"
    out = transfer_tags("fish &amp; <b>chips</b>", "chips & fish", [2, 1, 0])
    assert out == "<b>chips</b> &amp; fish"


@pytest.mark.parametrize(
    "text, plain",
    [
        ("a <b>c", "a c"),  # never closed
        ("a </b> c", "a c"),  # closes nothing
        ("<b><i>x</b></i> y", "x y"),  # crossed
    ],
)
def test_malformed_markup_is_translated_as_plain_text_with_a_warning(text, plain):
    def copy(texts):
        return texts, [list(range(len(t.split()))) for t in texts]

    with pytest.warns(MarkupWarning, match="malformed markup"):
        assert plain_text(text) == plain
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, alignments = translate_markup(copy, [text, "<b>ok</b> & more"])
    assert out == [plain, "<b>ok</b> &amp; more"]
    assert [type(w.message) for w in caught] == [MarkupWarning]  # one warning, one line
    with pytest.warns(MarkupWarning):
        assert transfer_tags(text, plain, alignments[0]) == plain


def test_translator_carries_markup_through_a_copy_model(translator):
    texts = ["red <b>apple</b> cat", "<i>dog<br/> fish</i> bird", "blue <u>green"]
    with pytest.warns(MarkupWarning):
        out = translator.translate(texts, markup="html")
    assert out["translation"] == ["red <b>apple</b> cat", "<i>dog <br/>fish</i> bird", "blue green"]
    assert len(out["score"]) == 3
    out = translator.translate("red <b>apple</b>", alignments=True, markup="html")
    assert out["translation"] == ["red <b>apple</b>"] and out["alignment"] == [[(0, 0), (1, 1)]]


MARKED = [
    "red <b>apple</b> cat",
    "<i>dog<br/> fish</i> bird",
    "blue <u>green",  # never closed
    "<p>fish &amp; <a href='x?y=1&amp;z=2'>chips</a></p> &eacute;",
    "a <b>b <i>c</i></b> <img src=x> d",
    "",
    "<Term id='1'>red</Term> <x/>cat",
]


@pytest.mark.parametrize("kind", ["html", "xml"])
def test_translate_markup_signature_gives_the_python_answer(translator, kind):
    """The graph's `translate_markup` equals `markup.markup_answer` on `serving_default`'s
    alignments (the Python road, as the LiteRT runtime runs it)."""
    import tensorflow as tf

    from keras_transformer.markup import markup_answer

    def plain(texts):
        out = translator(tf.constant(texts))
        return {
            "translation": [t.decode() for t in out["translation"].numpy()],
            "score": out["score"].numpy().tolist(),
            "alignment": [word_pairs(row) for row in out["alignment"].numpy().tolist()],
        }

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = markup_answer(plain, MARKED, kind, alignments=True)
    out = translator.translate_markup(tf.constant(MARKED), tf.constant([kind] * len(MARKED)))
    assert [t.decode() for t in out["translation"].numpy()] == expected["translation"]
    np.testing.assert_allclose(out["score"].numpy(), expected["score"], atol=1e-6)
    pairs = [word_pairs(row) for row in out["alignment"].numpy().tolist()]
    assert pairs == expected["alignment"]
    # Malformed: the unclosed <u>, and in XML the <img> with no end tag.
    malformed = {"blue <u>green"} | ({MARKED[4]} if kind == "xml" else set())
    assert out["markup_valid"].numpy().tolist() == [t not in malformed for t in MARKED]


def test_translate_markup_signature_answers_hostile_requests(translator):
    import tensorflow as tf

    texts = tf.constant([b"caf\xe9 <b>na\xefve", b"<b>\xff</b>", b""])  # invalid UTF-8
    out = translator.translate_markup(texts, tf.constant(["html", "xml", "html"]))
    assert out["markup_valid"].numpy().tolist() == [False, True, True]
    assert all(
        t.decode("utf-8") == t.decode("utf-8", "replace") for t in out["translation"].numpy()
    )
    empty = translator.translate_markup(tf.constant([], tf.string), tf.constant([], tf.string))
    assert empty["translation"].shape == (0,) and empty["alignment"].shape[0] == 0
    with pytest.raises(tf.errors.InvalidArgumentError, match="html"):
        translator.translate_markup(tf.constant(["a"]), tf.constant(["sgml"]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="same"):
        translator.translate_markup(tf.constant(["a", "b"]), tf.constant(["html"]))
    with pytest.raises(ValueError, match="markup kind"):
        translator.translate(["a"], markup="sgml")
    assert translator.translate([], markup="html") == {"translation": [], "score": []}


# ------------------------------------------------------------------ SavedModel and CLI


@pytest.fixture(scope="module")
def aligned_export(copy_model, toy_spm_bytes, tmp_path_factory):
    """The path of `copy_model` exported with `alignments=True` (`saved_models/toy/1`, the
    decoding settings of the default export `exported_copy_model`; confidence uncalibrated)."""
    from keras_transformer.export import export_saved_model

    base_dir = str(tmp_path_factory.mktemp("aligned") / "saved_models")
    return export_saved_model(
        copy_model, toy_spm_bytes, fx.export_plan(alignments=True), base_dir, "toy",
    )  # fmt: skip


@pytest.mark.scenario
def test_serving_default_serves_the_alignment_and_keeps_its_other_outputs(
    aligned_export, translator
):
    import json
    import os

    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    serve = tf.saved_model.load(aligned_export).signatures["serving_default"]
    texts = tf.constant([*fx.NORMAL, *fx.HOSTILE[:2]])
    out = serve(text=texts)
    assert out["alignment"].dtype == tf.int32
    reference = translator(texts)
    assert set(out) == set(reference)
    for key in ("translation", "alignment"):
        np.testing.assert_array_equal(out[key].numpy(), reference[key].numpy())
    # The other outputs are those of the search alone (the alignment pass adds, changes nothing).
    plain = translator._hypotheses(texts, 1)
    np.testing.assert_array_equal(out["translation"].numpy(), plain["text"][:, 0].numpy())
    np.testing.assert_array_equal(out["score"].numpy(), plain["score"][:, 0].numpy())
    np.testing.assert_array_equal(out["token_scores"].numpy(), plain["token_scores"][:, 0].numpy())
    for k, text in enumerate(fx.NORMAL):  # the copy model copies, word for word
        n = len(text.split())
        assert out["alignment"][k, :n].numpy().tolist() == list(range(n))
    with open(os.path.join(aligned_export, "assets.extra", "keras_transformer.json")) as f:
        metadata = json.load(f)
    assert metadata["alignments"] is True
    assert metadata["signatures"]["serving_default"]["outputs"]["alignment"].startswith("int32")


@pytest.mark.scenario
def test_default_export_has_no_alignment_and_the_same_other_outputs(
    exported_copy_model, aligned_export
):
    import json
    import os

    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    _, path = exported_copy_model  # exported with the defaults: no alignments
    serve = tf.saved_model.load(path).signatures["serving_default"]
    assert set(serve.structured_outputs) == {"translation", "score", "token_scores", "confidence"}
    aligned = tf.saved_model.load(aligned_export).signatures["serving_default"]
    texts = tf.constant([*fx.NORMAL, *fx.HOSTILE])
    out, with_alignment = serve(text=texts), aligned(text=texts)
    assert set(with_alignment) - set(out) == {"alignment"}
    np.testing.assert_array_equal(out["translation"].numpy(), with_alignment["translation"].numpy())
    for key in ("score", "token_scores"):
        np.testing.assert_allclose(out[key].numpy(), with_alignment[key].numpy(), atol=1e-6)
    with open(os.path.join(path, "assets.extra", "keras_transformer.json")) as f:
        metadata = json.load(f)
    assert metadata["alignments"] is False
    assert "alignment" not in metadata["signatures"]["serving_default"]["outputs"]


@pytest.mark.scenario
@pytest.mark.parametrize("flag", [["--alignments"], ["--markup", "xml"]])
def test_cli_alignments_of_a_model_exported_without_them_is_a_usage_error(
    model_base_dir, run_cli, flag
):
    code, out, err = run_cli("translate", "--model", model_base_dir, *flag, "red apple")
    assert code == 2 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert "exported without word alignments" in err and "export it with --alignments" in err
    assert "export.alignments: true" in err


@pytest.mark.scenario
def test_cli_prints_moses_alignments_and_carries_markup(aligned_export, run_cli, tmp_path):
    import os

    model_base_dir = os.path.dirname(aligned_export)
    code, out, err = run_cli(
        "translate", "--model", model_base_dir, "--alignments", "red apple cat", "blue"
    )
    assert code == 0, err
    assert out.splitlines() == ["red apple cat\t0-0 1-1 2-2", "blue\t0-0"]
    code, out, err = run_cli(
        "translate", "--model", model_base_dir, "--markup", "html",
        "red <b>apple</b> cat", "dog <i>fish", "blue<br>green",
    )  # fmt: skip
    assert code == 0, err
    assert out.splitlines() == ["red <b>apple</b> cat", "dog fish", "blue <br>green"]
    assert err.strip().splitlines() == ["warning: malformed markup translated as plain text: "
                                        "<i> is never closed"]  # fmt: skip
    source, target = tmp_path / "in.html", tmp_path / "out.html"
    source.write_text("red <b>apple</b> cat\n<i>blue</i> green\n")
    argv = ["translate", "--model", model_base_dir, "--input", str(source), "--output"]
    code, _, err = run_cli(*argv, str(target), "--markup", "html", "--alignments")
    assert code == 0, err
    assert target.read_text().splitlines() == [
        "red <b>apple</b> cat\t0-0 1-1 2-2", "<i>blue</i> green\t0-0 1-1",
    ]  # fmt: skip


@pytest.mark.scenario
def test_markup_of_an_export_made_before_translate_markup(
    aligned_export, translator, tmp_path, capsys
):
    """`translate --markup` on an export with alignments but no `translate_markup` signature
    (made before it) carries the tags in Python, with the signature's answers."""
    import tensorflow as tf

    from keras_transformer.commands.signatures import load_aligning_function

    older = str(tmp_path / "1")
    signatures = {k: v for k, v in translator.signatures.items() if k != "translate_markup"}
    tf.saved_model.save(translator, older, signatures=signatures)
    assert "translate_markup" not in tf.saved_model.load(older).signatures
    texts = ["red <b>apple</b> cat", "dog <i>fish", "<i>blue</i> green<br>"]
    answers = [load_aligning_function(p, True, "html")(texts) for p in (older, aligned_export)]
    assert answers[0] == answers[1]
    assert answers[0][0][0] == "red <b>apple</b> cat\t0-0 1-1 2-2"
    warning = "warning: malformed markup translated as plain text: <i> is never closed"
    assert capsys.readouterr().err.strip().splitlines() == [warning] * 2


@pytest.mark.scenario
def test_export_command_takes_alignments_from_the_config_and_the_flag(
    tmp_path, copy_model, toy_spm_path, run_cli
):
    import json
    import os
    import shutil

    from keras_transformer.config import from_dict, save_config
    from keras_transformer.workdir import save_model_weights

    workdir = tmp_path / "workdir"
    os.makedirs(workdir / "checkpoints")
    config = {
        "model": fx.MODEL_KWARGS,
        "data": {"max_source_length": fx.MAX_SOURCE_LENGTH, "vocab_size": 40},
        "export": {"base_dir": str(tmp_path / "saved_models"), "alignments": True},
    }
    save_config(from_dict(config), str(workdir / "config.yaml"))
    shutil.copy(toy_spm_path, workdir / "spm.model")
    save_model_weights(copy_model, workdir / "checkpoints" / "ckpt-1.weights.h5")
    metadata = os.path.join(str(tmp_path), "saved_models", "workdir", "{}", "assets.extra",
                            "keras_transformer.json")  # fmt: skip
    for version, flags, expected in [(1, [], True), (2, ["--no-alignments"], False)]:
        code, _, err = run_cli("export", "--workdir", str(workdir), *flags)
        assert code == 0, err
        with open(metadata.format(version)) as f:
            assert json.load(f)["alignments"] is expected
    code, out, err = run_cli(
        "translate", "--model", str(tmp_path / "saved_models" / "workdir" / "1"), "--alignments",
        "red apple cat",
    )  # fmt: skip
    assert code == 0 and out.splitlines() == ["red apple cat\t0-0 1-1 2-2"], err


def test_export_alignments_are_the_saved_models_and_the_litert_exports(run_cli, tmp_path):
    code, _, err = run_cli(
        "export", "--workdir", str(tmp_path), "--format", "ctranslate2", "--alignments"
    )
    assert code == 2 and "--alignments applies to --format saved_model or litert" in err


@pytest.mark.parametrize("flags", [["--n-best", "2"], ["--prefix", "red"], ["--seed", "1"]])
def test_cli_alignments_refuse_other_signatures(model_base_dir, run_cli, flags):
    code, _, err = run_cli("translate", "--model", model_base_dir, "--alignments", *flags, "x")
    assert code == 2 and "cannot be combined" in err and "Traceback" not in err


def test_synthetic_markup_keeps_every_tag_around_the_right_words_with_true_alignments():
    from keras_transformer.alignment import markup_scores, synthetic_markup_set
    from keras_transformer.markup import element_words

    items = synthetic_markup_set(200, seed=1)
    assert len(items) == 200 and sum("<br/>" in text for text, _, _, _ in items) > 20
    for text, _, _, expected in items[:20]:
        assert set(element_words(text)) == set(expected)
    outputs = [transfer_tags(text, target, pairs) for text, target, pairs, _ in items]
    scores = markup_scores(outputs, items)
    assert scores["kept"] == 1.0  # every tag exactly once, properly nested
    assert scores["right_words"] >= 0.95  # 0.98: a parent with a gap can push a child out
    broken = [*outputs[:10], outputs[10].replace("</", "<", 1)]
    assert markup_scores(broken, items[:11])["kept"] < 1.0
