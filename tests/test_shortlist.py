"""The vocabulary shortlist: the lexical table built from parallel pairs, its file, the batch's
shortlist in the graph, and the search restricted to it (never a piece outside it; with every
piece in it, the unrestricted search's answers)."""

import hashlib
import os
import shutil

import _inference_fixtures as fx
import numpy as np
import pytest
import tensorflow as tf
from _shortlist_tables import full_table as _full_table
from _shortlist_tables import identity_table as _identity_table

from keras_transformer.data import synthetic
from keras_transformer.data.shortlist import (
    batch_shortlist,
    build_lexical_table,
    read_lexical_table,
    save_lexical_table,
)
from keras_transformer.decoding import translate_ids
from keras_transformer.decoding.shortlist import SPECIAL_IDS, row_shortlists
from keras_transformer.errors import DataError

pytestmark = pytest.mark.numerics


# --------------------------------------------------------------------------- the lexical table


def test_table_of_the_synthetic_corpus_finds_the_lexicon():
    """Built on words of the synthetic corpus, each singular noun's best translation is its
    target stem, by construction of the corpus."""
    pairs_text = list(synthetic.iter_generate("train", size=3000, seed=3))
    words = {}

    def ids(text):
        return np.array([words.setdefault(w, len(words) + 4) for w in text.split()], np.int32)

    pairs = [(ids(source), ids(target)) for source, target in pairs_text]
    table = build_lexical_table(pairs, vocab_size=len(words) + 4, k=3, m=5)
    lexicon = synthetic.lexicon()
    checked = 0
    for noun, (stem, _) in lexicon.nouns.items():
        if noun in words and stem in words:
            assert table.translations[words[noun], 0] == words[stem], noun
            checked += 1
    assert checked > 100
    # The most frequent target words are the frequent ones: the determiners' forms lead.
    target_counts = {}
    for _, target in pairs_text:
        for w in target.split():
            target_counts[w] = target_counts.get(w, 0) + 1
    top = sorted(target_counts, key=lambda w: -target_counts[w])[:5]
    assert [words[w] for w in top] == table.frequent.tolist()


def test_table_ranks_by_dice_and_pads_with_zero():
    # 5 -> 7 always; 6 (everywhere) co-occurs with 5 as often but also elsewhere.
    pairs = [([5], [7, 6])] * 4 + [([8], [6])] * 6 + [([9], [10])]
    table = build_lexical_table(pairs, vocab_size=12, k=2, m=1)
    assert table.translations[5].tolist() == [7, 6]
    assert table.translations[8].tolist() == [6, 0]  # one translation, then padding
    assert table.translations[4].tolist() == [0, 0]  # never seen
    assert table.frequent.tolist() == [6]
    assert table.settings["pairs"] == 11
    with pytest.raises(DataError):
        build_lexical_table([([12], [1])], vocab_size=12)


def test_table_file_round_trips(tmp_path):
    table = build_lexical_table([([5, 6], [7]), ([6], [8, 9])], vocab_size=10, k=2, m=2)
    path = save_lexical_table(table, str(tmp_path / "shortlist.npz"))
    back = read_lexical_table(path)
    np.testing.assert_array_equal(back.translations, table.translations)
    np.testing.assert_array_equal(back.frequent, table.frequent)
    assert back.settings == table.settings
    assert [p.name for p in tmp_path.iterdir()] == ["shortlist.npz"]  # no temporary left
    with pytest.raises(DataError):
        read_lexical_table(str(tmp_path / "missing.npz"))


# --------------------------------------------------------------------------- the batch's shortlist


def test_shortlist_is_the_sorted_union_padded_to_the_bucket():
    translations = [[0, 0], [0, 0], [0, 0], [0, 0], [0, 0], [20, 7], [9, 20], [30, 31]]
    source = np.array([[5, 6, 3, 0]], np.int32)
    ids, real, _ = row_shortlists(translations, [11], source, extras=[[[40, 0]]], bucket=8)
    ids, real = np.asarray(ids), np.asarray(real)
    expected = sorted({*SPECIAL_IDS, 20, 7, 9, 11, 40})
    assert ids.shape == (16,) and real.sum() == len(expected)
    assert ids[real].tolist() == expected  # EOS, PAD, BOS, UNK, the prefix's 40 included
    assert not real[len(expected) :].any() and (ids[~real] == 0).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_numpy_shortlist_is_the_sorted_union_of_its_parts(seed):
    """The runtimes' NumPy shortlist (`batch_shortlist`, marking ids in a table) is `np.unique`
    of the table's rows of the source pieces (a padding position's none), the frequent and
    special ids and the extra ids:
    also for target ids beyond the source vocabulary, a batch of padding alone, and no ids."""
    rng = np.random.default_rng(seed)
    translations = rng.integers(0, 5000, size=(300, 7))
    frequent = rng.integers(0, 5000, size=9)
    for source, extra in (
        (rng.integers(0, 300, size=(4, 11)), rng.integers(0, 5000, size=(4, 3))),
        (np.zeros((2, 5), np.int64), None),
        (np.zeros((0, 5), np.int64), np.zeros((0, 2), np.int64)),
    ):
        ids, real = batch_shortlist(translations, frequent, source, extra_ids=extra, bucket=16)
        parts = [translations[source[source != 0]].ravel(), frequent, SPECIAL_IDS]  # no pad
        parts += [] if extra is None else [np.ravel(extra)]
        assert ids.dtype == np.int32 and ids.size % 16 == 0
        np.testing.assert_array_equal(ids[real], np.unique(np.concatenate(parts)))


def test_shortlist_has_a_static_width_per_bucket_in_a_graph():
    translations = tf.constant(np.arange(100)[:, None] % 50, tf.int32)
    run = tf.function(
        lambda s: row_shortlists(translations, [], s, bucket=16)[:2],
        input_signature=[tf.TensorSpec([None, None], tf.int32)],
    )
    ids, real = run(tf.constant([[10, 11, 12, 3]]))
    assert ids.shape == (16,)
    assert np.asarray(ids)[np.asarray(real)].tolist() == [0, 1, 2, 3, 10, 11, 12]


# --------------------------------------------------------------------------- the search


@pytest.fixture(scope="module")
def sources():
    texts = ["red apple cat", "dog dog fish bird", "blue", "plum pear white black green", ""]
    return texts, fx.encode_sources(texts)


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize("kernels", ["none", "all"])
def test_a_shortlist_of_every_piece_changes_nothing(model, sources, beam_size, kernels):
    _, source_ids = sources
    kwargs = dict(beam_size=beam_size, alpha=0.6, max_extra_length=6, return_all=True)
    kwargs["kernels"] = kernels
    plain = translate_ids(model, source_ids, **kwargs)
    listed = translate_ids(model, source_ids, shortlist=_full_table(model.vocab_size), **kwargs)
    assert model.vocab_size % 64 != 0  # the shortlist has padding columns
    np.testing.assert_array_equal(listed.ids, plain.ids)
    np.testing.assert_allclose(listed.scores, plain.scores, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(listed.token_scores, plain.token_scores, rtol=1e-5, atol=1e-5)


def test_a_piece_outside_the_shortlist_never_occurs(model, sources):
    """The copy model's answers use the source's pieces; a table that leaves one of them out
    gives other answers, made only of shortlisted pieces."""
    _, source_ids = sources
    kwargs = dict(beam_size=3, alpha=0.6, max_extra_length=6, return_all=True)
    plain = np.asarray(translate_ids(model, source_ids, **kwargs).ids)
    dropped = int(source_ids[0, 0])  # the first piece of "red apple cat"
    assert dropped in plain[0, 0]
    table = _identity_table(model.vocab_size, without=[dropped])
    listed = translate_ids(model, source_ids, shortlist=table, **kwargs)
    ids = np.asarray(listed.ids)
    allowed, real, _ = row_shortlists(table.translations, table.frequent, source_ids)
    allowed = set(np.asarray(allowed)[np.asarray(real)].tolist())
    assert dropped not in allowed
    assert set(ids.ravel().tolist()) <= allowed  # every hypothesis, every position
    assert not np.array_equal(ids[0, 0], plain[0, 0])
    # Rows whose pieces are all listed keep their answer ("blue" and "" have no dropped piece).
    for row in (2, 4):
        if dropped not in source_ids[row]:
            np.testing.assert_array_equal(ids[row, 0], plain[row, 0])
    # Greedy, and the uncached reference, also stay in the list.
    greedy = np.asarray(translate_ids(model, source_ids, shortlist=table, beam_size=1).ids)
    uncached = translate_ids(model, source_ids, shortlist=table, beam_size=1, use_cache=False)
    assert set(greedy.ravel().tolist()) <= allowed
    np.testing.assert_array_equal(uncached.ids, greedy)


def test_forced_prefix_pieces_are_in_the_shortlist(model, sources):
    _, source_ids = sources
    source_ids = source_ids[:3]
    piece = 4  # in none of the three sources: outside their table's shortlist
    assert piece not in source_ids
    prefix = np.array([[piece, 0]] * 3, np.int32)
    table = _identity_table(model.vocab_size)
    for k in (1, 3):
        out = translate_ids(
            model, source_ids, shortlist=table, beam_size=k, max_extra_length=6, prefix_ids=prefix
        )
        assert (np.asarray(out.ids)[:, 0] == piece).all()
        assert np.isfinite(np.asarray(out.scores)).all() and (np.asarray(out.scores) > -1e8).all()


def test_sampling_stays_in_the_shortlist(model, sources):
    _, source_ids = sources
    table = _identity_table(model.vocab_size)
    out = translate_ids(
        model, source_ids, shortlist=table, sampling_topk=5, sampling_temperature=3.0, seed=1
    )
    allowed, real, _ = row_shortlists(table.translations, table.frequent, source_ids)
    assert set(np.asarray(out.ids).ravel().tolist()) <= set(np.asarray(allowed)[real].tolist())


def test_untied_projection_with_every_piece_changes_nothing():
    import keras

    from keras_transformer.models import Transformer

    keras.utils.set_random_seed(1)
    model = Transformer(
        vocab_size=70, num_layers=1, d_model=16, num_heads=2, d_ff=32, dropout=0.0,
        tie_output_projection=False,
    )  # fmt: skip
    source = np.array([[5, 6, 7, 3], [8, 3, 0, 0]], np.int32)
    for k in (1, 3):
        plain = translate_ids(model, source, beam_size=k, max_extra_length=4)
        listed = translate_ids(
            model, source, beam_size=k, max_extra_length=4, shortlist=_full_table(70)
        )
        np.testing.assert_array_equal(listed.ids, plain.ids)
        np.testing.assert_allclose(listed.scores, plain.scores, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- the SavedModel


def test_the_final_evaluation_decodes_over_the_shortlist(model):
    """`evaluate_bleu` (the run's dev/test scores and its dev-set choice) decodes over
    the export's lexical table when given one, as the export's `serving_default` does: without
    the pieces of "cat" the copy model cannot copy "red apple cat", over the whole vocabulary
    it does."""
    from types import SimpleNamespace

    from keras_transformer.config import DecodingSettings
    from keras_transformer.evaluation import evaluate_bleu

    sp = fx.spm_processor()
    pairs = [(text, text) for text in fx.NORMAL]
    data = SimpleNamespace(max_source_length=fx.MAX_SOURCE_LENGTH, max_target_length=None)
    settings = DecodingSettings(beam_size=3, alpha=0.6, max_extra_length=8, batch_size=4)
    plain, answers = evaluate_bleu(model, sp, pairs, data, settings)
    assert answers[0] == "red apple cat"
    cat = fx.encode_sources(["cat"])[0, :-1].tolist()
    table = _identity_table(model.vocab_size, without=cat)
    listed, found = evaluate_bleu(model, sp, pairs, data, settings, shortlist=table)
    assert "cat" not in found[0] and found[2] == "blue"
    assert listed["bleu"] < plain["bleu"]


def _translator(model, spm_bytes, shortlist=None):
    from keras_transformer.export import Translator

    decode, data = fx.EXPORT_DECODE, fx.EXPORT_DATA
    return Translator(
        model, spm_bytes, max_source_length=data["max_source_length"], shortlist=shortlist,
        **{key: decode[key] for key in ("beam_size", "alpha", "max_extra_length", "batch_size")},
    )  # fmt: skip


@pytest.mark.scenario
def test_translator_with_a_shortlist_keeps_to_it(copy_model, toy_spm_bytes):
    texts = tf.constant(fx.NORMAL + fx.HOSTILE)
    plain = _translator(copy_model, toy_spm_bytes)
    full = _translator(copy_model, toy_spm_bytes, _full_table(copy_model.vocab_size))
    fx.assert_same_answers(full.serve(texts), plain.serve(texts), atol=1e-4)
    # Without the pieces of "cat" the copy model cannot copy "red apple cat".
    cat = fx.encode_sources(["cat"])[0, :-1].tolist()
    table = _identity_table(copy_model.vocab_size, without=cat)
    listed = _translator(copy_model, toy_spm_bytes, table).serve(texts)["translation"].numpy()
    answers = plain.serve(texts)["translation"].numpy()
    assert answers[0] == b"red apple cat" and listed[0] != answers[0]
    assert b"cat" not in listed[0]
    assert listed[2] == answers[2] == b"blue"  # nothing of it left out


def test_translator_refuses_a_table_of_another_vocabulary_and_xla(copy_model, toy_spm_bytes):
    from keras_transformer.export import Translator

    with pytest.raises(ValueError, match="source rows"):
        _translator(copy_model, toy_spm_bytes, _full_table(copy_model.vocab_size + 1))
    with pytest.raises(ValueError, match="XLA"):
        Translator(copy_model, toy_spm_bytes, jit_compile=True, shortlist=_full_table(10))


@pytest.mark.scenario
def test_exported_shortlist_serves(copy_model, toy_spm_bytes, tmp_path):
    import json

    from keras_transformer.export import export_saved_model

    cat = fx.encode_sources(["cat"])[0, :-1].tolist()
    table = _identity_table(copy_model.vocab_size, without=cat)
    path = export_saved_model(
        copy_model, toy_spm_bytes, fx.export_plan(shortlist=table), str(tmp_path), "toy",
    )  # fmt: skip
    loaded = tf.saved_model.load(path)
    texts = tf.constant(["red apple cat", "blue"])
    out = loaded.signatures["serving_default"](text=texts)
    expected = _translator(copy_model, toy_spm_bytes, table).serve(texts)
    fx.assert_same_answers(out, expected, atol=1e-4)
    assert b"cat" not in out["translation"].numpy()[0]
    nbest = loaded.signatures["translate_nbest"](text=texts)["translations"].numpy()
    assert not any(b"cat" in t for t in nbest.ravel())
    with open(f"{path}/assets.extra/keras_transformer.json") as f:
        assert json.load(f)["shortlist"]["k"] == 1


# --------------------------------------------------------------------------- the command


def test_config_refuses_the_shortlist_with_xla():
    from keras_transformer.config import ConfigError, from_dict

    assert from_dict({"export": {"shortlist": True}}).export.shortlist  # train's export too
    with pytest.raises(ConfigError, match="export.shortlist and export.jit_compile"):
        from_dict({"export": {"shortlist": True, "jit_compile": True}})


def test_the_saved_model_decodes_over_the_shortlist_by_default_where_it_can_be_built(
    tmp_path, capsys
):
    from keras_transformer.config import from_dict, saved_model_shortlist
    from keras_transformer.data.shortlist import export_shortlist
    from keras_transformer.errors import DataError
    from keras_transformer.workdir import Workdir

    default = from_dict({}).export
    assert default.shortlist is None
    # (use, required): null uses it unless the search compiles with XLA; asked for (the flag or
    # export.shortlist: true), a table that cannot be built is an error.
    assert saved_model_shortlist(default) == (True, False)
    assert saved_model_shortlist(default, jit_compile=True) == (False, False)
    assert saved_model_shortlist(default, asked=True) == (True, True)
    assert saved_model_shortlist(default, asked=False) == (False, False)
    assert saved_model_shortlist(from_dict({"export": {"shortlist": True}}).export) == (True, True)
    off = from_dict({"export": {"shortlist": False}}).export
    assert saved_model_shortlist(off) == (False, False)
    assert saved_model_shortlist(off, asked=True) == (True, True)
    # A workdir without a SentencePiece model or prepared pairs: by default the whole
    # vocabulary, said in one line; asked for, an error.
    empty = Workdir(str(tmp_path))
    assert export_shortlist(empty, required=False) is None
    err = capsys.readouterr().err
    assert err.startswith("no vocabulary shortlist (") and err.count("\n") == 1, err
    with pytest.raises(DataError, match="SentencePiece"):
        export_shortlist(empty, required=True)
    assert not (tmp_path / "shortlist.npz").exists()
    # A prepared workdir whose shard is gone: the same (the end of a run is not lost to it).
    from training_helpers import tiny_config

    from keras_transformer.data.prepare import prepare, read_manifest

    config = tiny_config(tmp_path / "work", data={"train": "synthetic:size=100,max_words=6"})
    prepare(config, verbose=False)
    layout = Workdir.of(config)
    os.remove(os.path.join(layout.prepared, read_manifest(layout.prepared)["shards"][0]["file"]))
    capsys.readouterr()
    assert export_shortlist(layout, required=False) is None
    assert capsys.readouterr().err.startswith("no vocabulary shortlist (")
    with pytest.raises(DataError):
        export_shortlist(layout, required=True)
    assert not os.path.exists(layout.shortlist)


def test_shortlist_command_on_a_prepared_workdir(tmp_path, capsys):
    from training_helpers import tiny_config

    from keras_transformer.cli import main
    from keras_transformer.data.prepare import prepare
    from keras_transformer.workdir import Workdir

    workdir = tmp_path / "work"
    data = dict(vocab_size=120, max_source_length=40, max_target_length=40)
    config = tiny_config(workdir, data={**data, "train": "synthetic:size=400,max_words=8"})
    written = prepare(config, verbose=False)["counts"]["written"]
    layout = Workdir.of(config)
    assert main(["shortlist", "--workdir", layout.root, "--k", "4", "--m", "10"]) in (0, None)
    assert layout.shortlist in capsys.readouterr().out
    table = read_lexical_table(layout.shortlist)
    assert table.translations.shape == (120, 4) and table.frequent.shape == (10,)
    # The fingerprint of the SentencePiece model its ids are pieces of.
    spm_sha256 = hashlib.sha256(open(layout.spm, "rb").read()).hexdigest()
    assert table.settings == {
        "k": 4, "m": 10, "pairs": written, "estimate": "dice", "spm_sha256": spm_sha256,
    }  # fmt: skip
    assert (table.translations[4:] > 3).any()  # pieces found translations
    refused = [["shortlist", "--k", "0"], ["shortlist", "--m", "-1"]]
    refused.append(["export", "--format", "litert", "--shortlist"])
    for command, *flags in refused:
        assert main([command, "--workdir", layout.root, *flags]) == 2, flags


# --------------------------------------------------------------------------- a stale table


def _prepared_workdir(path, seed, vocab_size=120):
    """A prepared workdir of `vocab_size` pieces whose corpus (and so vocabulary) `seed` picks."""
    from training_helpers import tiny_config

    from keras_transformer.data.prepare import prepare
    from keras_transformer.workdir import Workdir

    data = dict(vocab_size=vocab_size, max_source_length=40, max_target_length=40)
    train = f"synthetic:size=400,max_words=8,seed={seed}"
    config = tiny_config(path, data={**data, "train": train})
    prepare(config, verbose=False)
    return Workdir.of(config)


def _same_table(a, b):
    return np.array_equal(a.translations, b.translations) and np.array_equal(a.frequent, b.frequent)


def test_a_table_of_another_sentencepiece_model_of_the_same_size_is_rebuilt(tmp_path, capsys):
    """`WORKDIR/shortlist.npz` built for another vocabulary of the same size (another
    `data.train` or `data.seed`) is not used as it is (its ids are other pieces): the export's
    read finds its fingerprint is not the workdir's SentencePiece model's and rebuilds it, in
    one line; so does a table of an older version, which records none."""
    from keras_transformer.data.shortlist import build_workdir_shortlist, export_shortlist

    ours = _prepared_workdir(tmp_path / "ours", seed=1)
    theirs = _prepared_workdir(tmp_path / "theirs", seed=2)
    assert open(ours.spm, "rb").read() != open(theirs.spm, "rb").read()
    own = build_workdir_shortlist(ours, k=4, m=10)  # what a rebuild gives
    other = build_workdir_shortlist(theirs, k=4, m=10)
    assert other.vocab_size == own.vocab_size and not _same_table(other, own)
    shutil.copy(theirs.shortlist, ours.shortlist)  # the stale table, same size
    capsys.readouterr()
    table = export_shortlist(ours, required=True)
    assert _same_table(table, own), "the stale table was used as it is"
    out = capsys.readouterr().out
    assert out.startswith("rebuilt the vocabulary shortlist") and out.count("\n") == 1, out
    assert "another SentencePiece model" in out
    assert _same_table(read_lexical_table(ours.shortlist), own)  # written over it, k and m kept
    assert table.settings["k"] == 4 and table.settings["m"] == 10
    # Now current: read as it is, nothing said.
    assert _same_table(export_shortlist(ours, required=True), own)
    assert capsys.readouterr().out == ""
    # A table without a fingerprint (written before tables had one): rebuilt too.
    old = read_lexical_table(theirs.shortlist)
    settings = {key: value for key, value in old.settings.items() if key != "spm_sha256"}
    save_lexical_table(type(old)(old.translations, old.frequent, settings), ours.shortlist)
    assert _same_table(export_shortlist(ours, required=False), own)
    assert "records no SentencePiece model" in capsys.readouterr().out


def test_a_table_of_another_size_is_rebuilt_or_refused_in_one_line(tmp_path, capsys):
    """a table of another vocabulary size (which the export's graph refuses with a
    ValueError after training) is rebuilt from the prepared pairs; where it cannot be, the
    export refuses in one line under `export.shortlist: true` and decodes over the whole
    vocabulary otherwise (one line): it is never handed on."""
    from keras_transformer.data.prepare import read_manifest
    from keras_transformer.data.shortlist import export_shortlist
    from keras_transformer.errors import DataError

    ours = _prepared_workdir(tmp_path / "ours", seed=1, vocab_size=120)
    theirs = _prepared_workdir(tmp_path / "theirs", seed=1, vocab_size=100)
    export_shortlist(theirs, required=True)
    shutil.copy(theirs.shortlist, ours.shortlist)
    capsys.readouterr()
    table = export_shortlist(ours, required=False)
    assert table.vocab_size == 120, "a table of another size was handed to the export"
    assert capsys.readouterr().out.startswith("rebuilt the vocabulary shortlist")
    # Stale and no prepared pairs to rebuild it from.
    shutil.copy(theirs.shortlist, ours.shortlist)
    os.remove(os.path.join(ours.prepared, read_manifest(ours.prepared)["shards"][0]["file"]))
    with pytest.raises(DataError, match="stale") as refused:
        export_shortlist(ours, required=True)
    assert "\n" not in str(refused.value)
    assert export_shortlist(ours, required=False) is None
    err = capsys.readouterr().err
    assert err.startswith("no vocabulary shortlist (") and err.count("\n") == 1, err
    assert "whole vocabulary" in err


@pytest.mark.scenario
def test_a_run_scores_and_exports_over_one_current_shortlist(tmp_path, monkeypatch, capsys):
    """`train` on a workdir whose `shortlist.npz` is another vocabulary's (another
    size, which the export's graph refuses) does not crash after training: the table is
    rebuilt once, before the final model's choice, and the choice on dev, the dev and test
    scores of result.json (the dev figures the choice's) decode over the very table the
    SavedModel is exported with."""
    from training_helpers import tiny_config

    import keras_transformer.export.saved_model as export_package  # the registry's exporter
    from keras_transformer import final_model
    from keras_transformer.data.prepare import prepare
    from keras_transformer.training import train
    from keras_transformer.training.run import finish
    from keras_transformer.workdir import Workdir

    config = tiny_config(
        tmp_path,
        data=dict(test="synthetic:split=test,size=6,max_words=8"),
        train=dict(steps=4),
        export=dict(average_checkpoints="auto"),  # the dev set chooses
    )
    prepare(config, verbose=False)
    layout = Workdir.of(config)
    stale = build_lexical_table([([5], [6])], vocab_size=100, k=2, m=2)
    save_lexical_table(stale, layout.shortlist)  # the model has 200 pieces
    chosen, scored, exported = [], [], []
    evaluate_bleu = finish.evaluate_bleu

    def recording(calls):
        def evaluate(*args, **kwargs):
            calls.append(kwargs.get("shortlist"))
            return evaluate_bleu(*args, **kwargs)

        return evaluate

    export_saved_model = export_package.export_saved_model

    def exporting(model, tokenizer, plan, *args, **kwargs):
        exported.append(plan.shortlist)
        return export_saved_model(model, tokenizer, plan, *args, **kwargs)

    monkeypatch.setattr(final_model, "evaluate_bleu", recording(chosen))
    monkeypatch.setattr(finish, "evaluate_bleu", recording(scored))
    monkeypatch.setattr(export_package, "export_saved_model", exporting)
    result = train(config)
    assert result["saved_model"] and os.path.isdir(result["saved_model"])
    assert "rebuilt the vocabulary shortlist" in capsys.readouterr().out
    (table,) = exported
    assert table is not None and table.vocab_size == 200
    assert chosen and all(t is table for t in chosen), chosen  # every candidate
    assert len(scored) == 1 and scored[0] is table, scored  # test (dev: the choice's figures)
    assert result["dev"]["bleu"] == result["selection"]["chosen"]["dev_bleu"]
    assert read_lexical_table(layout.shortlist).vocab_size == 200
