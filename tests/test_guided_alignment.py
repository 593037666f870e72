"""Guided alignment training (issue 63): the training pairs' word alignments
(`data.train_alignments`, Pharaoh lines) mapped to piece links by `prepare` and stored with the
pairs, their link matrices in the batches, and the loss on head 0 of the cross-attention of
decoder layer `export.alignment_layer` (`train.guided_alignment_weight`)."""

import os

import numpy as np
import pytest

from keras_transformer.data import alignments as al
from keras_transformer.errors import DataError

CONFIG = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "configs", "quickstart.yaml"
)

# ---------------------------------------------------------------- Pharaoh lines and pieces


def test_parse_line_reads_pharaoh_pairs_and_refuses_anything_else():
    assert al.parse_line("0-0 2-1 1-2\n", "f:1") == [(0, 0), (2, 1), (1, 2)]
    assert al.parse_line("  \r\n", "f:1") == []
    for bad in ("0-", "a-1", "0:1", "1-2-3", "-1-0"):
        with pytest.raises(DataError, match="^f:7: expected 'i-j'"):
            al.parse_line(f"0-0 {bad}", "f:7")


def test_pieces_belong_to_the_word_they_are_in():
    m = al.WORD_MARKER
    pieces = [f"{m}the", f"{m}vio", "lin", "s", m, "X", "y", f"{m}run"]
    assert al.word_of_pieces(pieces) == [0, 1, 1, 1, 2, 2, 2, 3]
    assert al.word_of_pieces(["ab", f"{m}c"]) == [0, 1]  # the first piece begins a word
    # Word 1 (3 pieces) -> word 0 (1 piece), word 0 -> word 1 (2 pieces).
    links = al.piece_links([(1, 0), (0, 1)], [0, 1, 1, 1], [0, 1, 1], "here")
    assert links == [(0, 1), (0, 2), (1, 0), (2, 0), (3, 0)]
    with pytest.raises(DataError, match="^here: the link 4-0 names a word that has no piece"):
        al.piece_links([(4, 0)], [0, 1], [0], "here")


def _stream(tmp_path, sources, targets, lines):
    from keras_transformer.data import corpora

    (tmp_path / "s.txt").write_text("\n".join(sources) + "\n")
    (tmp_path / "t.txt").write_text("\n".join(targets) + "\n")
    (tmp_path / "a.txt").write_text("".join(line + "\n" for line in lines))
    spec = f"text:{tmp_path / 's.txt'},{tmp_path / 't.txt'}"
    counter = corpora.Counter(spec)
    pairs = corpora.iter_pairs(spec, counter, verbose=False)
    return list(al.with_alignments(pairs, counter, str(tmp_path / "a.txt"), spec))


def test_alignment_lines_follow_the_corpus_lines_a_skipped_pair_included(tmp_path):
    out = _stream(tmp_path, ["a b", "", "c d e"], ["x y", "z", "u v"], ["0-1 1-0", "9-9", "2-1"])
    assert out == [("a b", "x y", [(0, 1), (1, 0)]), ("c d e", "u v", [(2, 1)])]


def test_alignment_lines_count_the_words_sentencepiece_reads():
    """The words an alignment line names are SentencePiece's, as the export's alignments'
    are: a zero-width space separates two, U+001C (deleted) and U+0085 (kept) do not; each
    link maps to the pieces of those words."""
    import pathlib
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        out = _stream(pathlib.Path(directory), ["a\u200bb c"], ["x\x1cy z\x85w"], ["2-1 1-0"])
    assert out == [("a\u200bb c", "x\x1cy z\x85w", [(2, 1), (1, 0)])]
    with tempfile.TemporaryDirectory() as directory, pytest.raises(DataError, match="0-2 is out"):
        _stream(pathlib.Path(directory), ["a\u200bb c"], ["x\x1cy z\x85w"], ["0-2"])
    pieces = ["\u2581a", "\u2581b", "\u2581c"], ["\u2581xy", "\u2581z", "\x85", "w"]
    source, target = (al.word_of_pieces(p) for p in pieces)
    links = al.piece_links([(2, 1), (1, 0)], source, target, "here")
    assert links == [(1, 0), (2, 1), (2, 2), (2, 3)]


@pytest.mark.parametrize(
    "lines, message",
    [
        (["0-0", "0-0"], r"has 2 lines but .* has a pair on line 3"),
        (["0-0", "0-0 2-0", "0-0"], r"a\.txt:2: the link 2-0 is out of range: the pair on line 2 "),
        (["0-0", "0-0", "0-3"], r"a\.txt:3: the link 0-3 is out of range"),
        (["0-0", "0-x", "0-0"], r"a\.txt:2: expected 'i-j'"),
        (["0-0", "0-0", "0-0", "0-0"], r"has more lines than"),
    ],
)
def test_a_missing_malformed_or_out_of_range_alignment_line_is_one_named_error(
    tmp_path, lines, message
):
    with pytest.raises(DataError, match=message) as error:
        _stream(tmp_path, ["a", "b c", "d"], ["x", "y", "z w v"], lines)
    assert "\n" not in str(error.value)


def test_alignments_follow_one_corpus_only():
    assert al.check_corpus("synthetic:split=train")[0] == "synthetic:split=train"
    for train in (["synthetic:size=3", "synthetic:size=4"], "2*synthetic:size=3", "bt:tsv:x"):
        with pytest.raises(DataError, match="must be a single corpus"):
            al.check_corpus(train)


# ---------------------------------------------------------------- config


def test_config_refuses_a_weight_without_alignments_and_alignments_with_terminology():
    from keras_transformer.config import from_dict
    from keras_transformer.errors import ConfigError

    assert from_dict({}).train.guided_alignment_weight == 0.0  # off by default
    assert from_dict({}).data.train_alignments is None
    with pytest.raises(ConfigError, match="needs the training pairs' word alignments"):
        from_dict({"train": {"guided_alignment_weight": 1.0}})
    with pytest.raises(ConfigError, match="cannot be combined"):
        from_dict({"data": {"train_alignments": "a.txt", "terminology": "t.tsv"}})
    with pytest.raises(ConfigError, match="export.alignment_layer \\(9\\)"):
        from_dict(
            {
                "data": {"train_alignments": "a.txt"},
                "train": {"guided_alignment_weight": 0.5},
                "export": {"alignment_layer": 9},
            }
        )


# ---------------------------------------------------------------- the loss


def _reference_loss(attention, links):
    """The guided alignment loss in numpy: per target row with links, the cross-entropy of the
    row-normalised links against the attention; the mean over those rows."""
    total, rows = 0.0, 0
    for b in range(links.shape[0]):
        for t in range(links.shape[1]):
            row = links[b, t]
            if row.sum() > 0:
                target = row / row.sum()
                total -= float(np.sum(target * np.log(np.maximum(attention[b, t], 1e-9))))
                rows += 1
    return total / rows if rows else 0.0


def test_guided_alignment_loss_equals_the_numpy_reference():
    from keras_transformer.models.guided_alignment import guided_alignment_loss

    rng = np.random.default_rng(0)
    attention = rng.random((3, 5, 4)).astype("float32")
    attention /= attention.sum(-1, keepdims=True)
    attention[0, 0, 1] = 0.0  # a weight of 0 under a link: floored, not infinite
    links = (rng.random((3, 5, 4)) < 0.3).astype("float32")
    links[0, 0, 1] = 1.0
    links[1] = 0.0  # a pair without links counts for nothing
    got = float(guided_alignment_loss(attention, links))
    assert got == pytest.approx(_reference_loss(attention, links), rel=1e-5)
    assert float(guided_alignment_loss(attention, np.zeros_like(links))) == 0.0


def _tiny_model(layers=2):
    import keras

    from keras_transformer.models import Transformer

    keras.utils.set_random_seed(3)
    return Transformer(
        vocab_size=40, num_layers=layers, d_model=16, num_heads=2, d_ff=32, dropout=0.0,
    )  # fmt: skip


def _toy_batch(rows=4, length=6, seed=0):
    """Sources of random tokens, targets their reverse (token + 10), so target piece t is
    aligned to source piece length - 1 - t: `(x, labels)` with the link matrices."""
    rng = np.random.default_rng(seed)
    source = rng.integers(4, 20, size=(rows, length)).astype("int32")
    target = source[:, ::-1] + 10
    eos, bos = np.full((rows, 1), 3, "int32"), np.full((rows, 1), 2, "int32")
    links = np.zeros((rows, length + 1, length + 1), "float32")
    for t in range(length):
        links[:, t, length - 1 - t] = 1.0
    x = {
        "source_ids": np.concatenate([source, eos], 1),
        "target_ids": np.concatenate([bos, target], 1),
        "alignment": links,
    }
    return x, np.concatenate([target, eos], 1)


def test_the_model_adds_the_loss_of_head_0_of_the_chosen_layer_in_training_only():
    from keras_transformer.models.guided_alignment import GuidedAlignment

    model = _tiny_model()
    x, _ = _toy_batch()
    plain = {k: v for k, v in x.items() if k != "alignment"}
    reference_logits = np.asarray(model(plain, training=True))
    cross = model.attention_scores(plain["source_ids"], plain["target_ids"])
    cross = cross["decoder_cross_attention"]
    # Off (the default): the links are ignored, no loss, the logits the functional graph's.
    assert model.guided_alignment is None
    np.testing.assert_allclose(np.asarray(model(x, training=True)), reference_logits, atol=1e-6)
    assert not model.losses
    for layer in (0, 1):
        model.guided_alignment = GuidedAlignment(weight=0.5, layer=layer)
        logits = np.asarray(model(x, training=True))
        np.testing.assert_allclose(logits, reference_logits, atol=1e-5)
        (loss,) = model.losses
        head0 = np.asarray(cross[layer])[:, 0]
        expected = 0.5 * _reference_loss(head0, x["alignment"])
        assert float(loss) == pytest.approx(expected, rel=1e-4)
        model(x, training=False)  # inference: no loss
        assert not model.losses


@pytest.mark.scenario
def test_the_train_step_adds_the_guided_loss_to_the_label_smoothed_one():
    from training_helpers import tiny_config

    from keras_transformer.training import compile_model

    x, labels = _toy_batch()
    losses = {}
    for weight in (0.0, 2.0):
        config = tiny_config(
            "unused",
            model=dict(num_layers=2, d_model=16, num_heads=2, d_ff=32, dropout=0.0),
            data=dict(train_alignments="a.txt"),
            train=dict(guided_alignment_weight=weight),
        )
        model = compile_model(_tiny_model(), config)
        losses[weight] = float(model.train_on_batch(x, labels, return_dict=True)["loss"])
    model = _tiny_model()  # the same initial weights
    plain = {k: v for k, v in x.items() if k != "alignment"}
    cross = model.attention_scores(plain["source_ids"], plain["target_ids"])
    head0 = np.asarray(cross["decoder_cross_attention"][0])[:, 0]  # layer -2 of 2: layer 0
    added = 2.0 * _reference_loss(head0, x["alignment"])
    assert added > 1.0  # an untrained head is far from the reference
    assert losses[2.0] - losses[0.0] == pytest.approx(added, rel=1e-3)


@pytest.mark.scenario
def test_a_few_guided_steps_raise_the_attention_mass_on_the_reference():
    import keras

    from keras_transformer.models.guided_alignment import GuidedAlignment
    from keras_transformer.training.recipe.losses import MaskedSparseCrossEntropy

    x, labels = _toy_batch(rows=16, seed=1)
    plain = {k: v for k, v in x.items() if k != "alignment"}

    def mass(model):
        cross = model.attention_scores(plain["source_ids"], plain["target_ids"])
        head0 = np.asarray(cross["decoder_cross_attention"][0])[:, 0]
        return float(np.sum(head0 * x["alignment"]) / np.sum(x["alignment"]))

    model = _tiny_model()
    model.guided_alignment = GuidedAlignment(1.0, 0)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=MaskedSparseCrossEntropy())
    model.optimizer.build(model.trainable_variables)
    start = [
        [v.numpy() for v in variables] for variables in (model.variables, model.optimizer.variables)
    ]
    before = mass(model)
    # Without links the guided loss adds 0: the same train step (one trace), unguided.
    unguided = dict(x, alignment=np.zeros_like(x["alignment"]))
    masses = {}
    for name, batch in (("plain", unguided), ("guided", x)):
        for variables, values in zip((model.variables, model.optimizer.variables), start):
            for variable, value in zip(variables, values):
                variable.assign(value)
        for _ in range(30):
            model.train_on_batch(batch, labels)
        masses[name] = mass(model)
    assert before < 0.3  # about uniform over 7 source positions
    assert masses["guided"] > 0.5
    assert masses["guided"] > masses["plain"] + 0.3


# ---------------------------------------------------------------- prepare and the batches


def _synthetic_alignments(path, train):
    from keras_transformer.alignment import format_pairs, true_alignment
    from keras_transformer.data import read_pairs

    pairs = read_pairs(train, verbose=False)
    with open(path, "w") as f:
        for source, target in pairs:
            f.write(format_pairs(true_alignment(source, target) or []) + "\n")
    return pairs


def _word_offsets(processor, sentence):
    """The first piece and the pieces of each word, each word encoded alone (SentencePiece's
    pieces never span a space)."""
    offsets, start = [], 0
    for word in sentence.split():
        n = len(processor.encode(word))
        offsets.append(range(start, start + n))
        start += n
    return offsets


@pytest.mark.scenario
def test_prepare_stores_each_pairs_piece_links_and_the_batches_carry_them(tmp_path):
    import sentencepiece as spm
    from training_helpers import tiny_config

    from keras_transformer.alignment import true_alignment
    from keras_transformer.data import prepare
    from keras_transformer.data.prepared import prepared_dataset, prepared_examples
    from keras_transformer.data.records import numpy_batches, prepared_pairs
    from keras_transformer.workdir import Workdir

    train = "synthetic:split=train,size=200,max_words=8"
    path = tmp_path / "train.align"
    pairs = _synthetic_alignments(path, train)
    config = tiny_config(
        tmp_path / "work",
        data=dict(train=train, train_alignments=str(path), prepare_workers=1),
        train=dict(guided_alignment_weight=1.0),
    )
    manifest = prepare(config, verbose=False)
    assert manifest["alignments"]["file"] == str(path)
    assert manifest["settings"]["data.train_alignments"] == str(path)
    layout = Workdir.of(config)
    processor = spm.SentencePieceProcessor(model_file=layout.spm)
    stored = {}  # source ids -> (target ids, links)
    for source, target, links in prepared_examples(layout.prepared, training=False):
        key = tuple(source.numpy().tolist())
        stored[key] = (target.numpy().tolist(), sorted(map(tuple, links.numpy().tolist())))
    checked = 0
    for source, target in pairs:
        words = true_alignment(source, target)
        ids = tuple(processor.encode(source))
        if ids not in stored or stored[ids][0] != processor.encode(target):
            continue  # dropped (too long), or a repeated source
        s_words, t_words = _word_offsets(processor, source), _word_offsets(processor, target)
        expected = sorted((s, t) for i, j in (words or []) for s in s_words[i] for t in t_words[j])
        assert stored[ids][1] == expected
        checked += 1
    assert checked > 100
    # The batches: x["alignment"] [batch, t, s], 1 at (target piece, source piece) links, on
    # tf.data and in numpy alike.
    x, labels = next(iter(prepared_dataset(layout.prepared, config.data, verbose=False)))
    matrices = x["alignment"].numpy()
    assert matrices.shape == (*labels.shape, x["source_ids"].shape[1])
    for row, source in enumerate(x["source_ids"].numpy()):
        key = tuple(int(v) for v in source if v not in (0, 3))
        _, links = stored[key]
        assert sorted(zip(*np.nonzero(matrices[row].T))) == links
    numpy_x, _ = next(numpy_batches(prepared_pairs(layout.prepared), config.data, seed=1))
    for row, source in enumerate(numpy_x["source_ids"]):
        key = tuple(int(v) for v in source if v not in (0, 3))
        assert sorted(zip(*np.nonzero(numpy_x["alignment"][row].T))) == stored[key][1]


@pytest.mark.scenario
def test_without_alignments_prepare_and_the_batches_are_as_before(tmp_path):
    from training_helpers import tiny_config

    from keras_transformer.data import prepare
    from keras_transformer.data.prepared import prepared_dataset, prepared_examples
    from keras_transformer.data.records import read_tfrecords
    from keras_transformer.workdir import Workdir

    config = tiny_config(tmp_path / "work", data=dict(prepare_workers=1))
    manifest = prepare(config, verbose=False)
    assert "alignments" not in manifest
    assert "data.train_alignments" not in manifest["settings"]
    layout = Workdir.of(config)
    examples = list(prepared_examples(layout.prepared, training=False))
    assert all(len(example) == 2 for example in examples)
    # The records are `[len(source), *source, *target]`, as before.
    records = [
        np.frombuffer(data, "<u2").tolist()
        for shard in manifest["shards"]
        for data in read_tfrecords(f"{layout.prepared}/{shard['file']}")
    ]
    by_source = {tuple(s.numpy().tolist()): t.numpy().tolist() for s, t in examples}
    for record in records:
        n = record[0]
        assert by_source[tuple(record[1 : 1 + n])] == record[1 + n :]
    x, _ = next(iter(prepared_dataset(layout.prepared, config.data, verbose=False)))
    assert sorted(x) == ["source_ids", "target_ids"]


@pytest.mark.scenario
def test_cli_prepare_names_the_alignment_line_it_cannot_use(tmp_path, run_cli):
    path = tmp_path / "train.align"
    path.write_text("0-0\n0-0 0-40\n" + "0-0\n" * 98)
    code, _, err = run_cli(
        "prepare", "--config", CONFIG, "--workdir", str(tmp_path / "work"),
        "--set", "data.train=synthetic:split=train,size=100,max_words=8",
        "--set", f"data.train_alignments={path}", "--set", "data.vocab_size=100",
        "--set", "data.prepare_workers=1",
    )  # fmt: skip
    assert code == 2
    lines = [line for line in err.splitlines() if "train.align:2" in line]
    assert lines and "the link 0-40 is out of range" in lines[0]
