"""Several training corpora in `data.train`: `N*` copies and `bt:` tagged back-translation, whose
sources reach the model led by the reserved `<BT>` piece."""

import collections
import os

import pytest
from training_helpers import tiny_config

from keras_transformer.data import prepare, read_pairs
from keras_transformer.data.corpora import TAG, training_specs
from keras_transformer.data.prepared import prepared_examples
from keras_transformer.errors import DataError
from keras_transformer.workdir import Workdir


def _write(directory, name, pairs):
    source, target = os.path.join(directory, f"{name}.src"), os.path.join(directory, f"{name}.tgt")
    with open(source, "w") as s, open(target, "w") as t:
        s.writelines(p[0] + "\n" for p in pairs)
        t.writelines(p[1] + "\n" for p in pairs)
    return f"text:{source},{target}"


def _config(workdir, train):
    return tiny_config(
        workdir,
        data=dict(train=train, vocab_size=200, max_source_length=100, max_target_length=100),
    )


def _records(config):
    return [
        (tuple(s.tolist()), tuple(t.tolist()))
        for s, t in prepared_examples(
            Workdir.of(config).prepared, training=False
        ).as_numpy_iterator()
    ]


def test_specs_take_copies_and_a_tag():
    assert training_specs("synthetic:size=3") == [("synthetic:size=3", 1, False)]
    assert training_specs(["3*bt:tsv:x.tsv", " bt:text:a,b", "text:c,d"]) == [
        ("tsv:x.tsv", 3, True), ("text:a,b", 1, True), ("text:c,d", 1, False),
    ]  # fmt: skip
    for bad, needle in (([], "empty"), (["0*text:a,b"], "0 times"), (["bt:gz:a"], "gz")):
        with pytest.raises(DataError, match=needle):
            training_specs(bad)


def test_bt_sources_start_with_the_tag_and_real_ones_do_not(tmp_path):
    pairs = read_pairs("synthetic:split=train,size=200,max_words=8", verbose=False)
    real, synthetic = pairs[:120], pairs[120:]
    real_spec = _write(tmp_path, "real", real)
    bt_spec = _write(tmp_path, "synth", synthetic)
    config = _config(tmp_path / "w", [real_spec, f"2*bt:{bt_spec}"])
    manifest = prepare(config, verbose=False)
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=Workdir.of(config).spm)
    tag = processor.piece_to_id(TAG)
    assert tag != processor.unk_id() and processor.id_to_piece(tag) == TAG
    encode = processor.encode
    expected = [(tuple(encode(s)), tuple(encode(t))) for s, t in real]
    expected += 2 * [((tag, *encode(s)), tuple(encode(t))) for s, t in synthetic]
    records = _records(config)
    assert collections.Counter(records) == collections.Counter(expected)
    assert manifest["counts"]["written"] == len(real) + 2 * len(synthetic)
    # The tag is one id at the head of the synthetic sources, and nowhere else.
    assert sum(source[:1] == (tag,) for source, _ in records) == 2 * len(synthetic)
    assert not any(tag in source[1:] or tag in target for source, target in records)


def test_a_single_corpus_prepares_as_before(tmp_path):
    """One corpus, as a string, a list of one or one copy: the same vocabulary (no tag piece)
    and the same records."""
    spec = "synthetic:split=train,size=150,max_words=8"
    made = []
    for name, train in (("string", spec), ("list", [spec]), ("copy", [f"1*{spec}"])):
        config = _config(tmp_path / name, train)
        prepare(config, verbose=False)
        with open(Workdir.of(config).spm, "rb") as f:
            made.append((f.read(), _records(config)))
    assert made[0] == made[1] == made[2]
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=made[0][0])
    assert processor.piece_to_id(TAG) == processor.unk_id()
