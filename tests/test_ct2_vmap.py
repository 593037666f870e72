"""The vocabulary shortlist in the CTranslate2 export: the lexical table written as CTranslate2's
own vocabulary map (`vmap.txt`), which CTranslate2 loads and keeps to with `use_vmap=True`, and
`export --format ctranslate2` writing it. Skipped only when the `ctranslate2` extra is missing."""

import dataclasses
import hashlib
import json
import os

import _inference_fixtures as fx
import pytest
from _shortlist_tables import identity_table as _identity_table
from _shortlist_tables import table as _table
from test_cli_inference import _write_workdir

from keras_transformer import cli
from keras_transformer.data.shortlist import SPECIAL_IDS, save_lexical_table
from keras_transformer.errors import UsageError
from keras_transformer.export.ct2 import export_ctranslate2, vocabulary_map
from keras_transformer.workdir import Workdir

pytestmark = pytest.mark.numerics

os.environ.setdefault("CT2_USE_MKL", "1")  # as tests/test_export_ct2.py
ctranslate2 = pytest.importorskip("ctranslate2")

MAX_EXTRA = 8


def _parse(text):
    """`{source: [targets]}` of a vocabulary map, read as CTranslate2 reads it (a tab ends the
    source, spaces separate the targets)."""
    rules = {}
    for line in text.splitlines():
        source, targets = line.split("\t")
        rules[source] = targets.split(" ") if targets else []
    return rules


def test_vocabulary_map_round_trips():
    pieces = [f"p{i}" for i in range(12)]
    table = _table([[0, 0, 0]] * 5 + [[7, 9, 7], [0, 0, 0], [11, 0, 4]] + [[0, 0, 0]] * 4, [8, 3])
    text = vocabulary_map(table, pieces)
    assert text.startswith("\t") and text.endswith("\n")
    rules = _parse(text)
    # The always-allowed line: the frequent pieces, then the special ids, without repeats.
    assert rules[""] == ["p8", "p3", "p0", "p1", "p2"]
    assert {k: v for k, v in rules.items() if k} == {"p5": ["p7", "p9"], "p7": ["p11", "p4"]}
    back = {pieces.index(s): [pieces.index(t) for t in ts] for s, ts in rules.items() if s}
    for source, row in enumerate(table.translations):
        expected = list(dict.fromkeys(int(t) for t in row if t))
        assert back.get(source, []) == expected


def test_export_refuses_a_table_of_another_vocabulary(copy_model, toy_spm_bytes, tmp_path):
    table = _identity_table(copy_model.vocab_size + 3)
    with pytest.raises(UsageError, match="source rows"):
        export_ctranslate2(copy_model, toy_spm_bytes, str(tmp_path / "x"), shortlist=table)
    assert not os.path.exists(tmp_path / "x")


def _translate(directory, texts, use_vmap, beam_size=4):
    sp = fx.spm_processor()
    translator = ctranslate2.Translator(directory, device="cpu", intra_threads=1)
    sources = [sp.encode(t, out_type=str)[: fx.MAX_SOURCE_LENGTH - 1] for t in texts]
    results = translator.translate_batch(
        sources, beam_size=beam_size, num_hypotheses=beam_size, use_vmap=use_vmap,
        max_decoding_length=max(map(len, sources)) + MAX_EXTRA, return_scores=True,
    )  # fmt: skip
    return sources, [r.hypotheses for r in results]


@pytest.mark.scenario
@pytest.mark.parametrize("quantization", ["int8", None])
def test_ctranslate2_keeps_to_the_vmap(copy_model, toy_spm_bytes, tmp_path, quantization):
    """With `use_vmap=True` every output piece of every hypothesis is in the batch's union of
    the map's lines; the piece the table leaves out is then never produced, as it is without."""
    sp = fx.spm_processor()
    texts = ["red apple cat", "dog dog fish bird", "blue"]
    dropped = sp.encode(texts[0])[0]
    table = _identity_table(copy_model.vocab_size, without=[dropped])
    directory = str(tmp_path / "ct2")
    export_ctranslate2(copy_model, toy_spm_bytes, directory, quantization, shortlist=table)
    with open(os.path.join(directory, "vmap.txt"), encoding="utf-8") as f:
        rules = _parse(f.read())
    with open(os.path.join(directory, "keras_transformer.json")) as f:
        assert json.load(f)["vmap"]["file"] == "vmap.txt"
    _, plain = _translate(directory, texts, use_vmap=False)
    assert sp.id_to_piece(dropped) in plain[0][0]  # the copy model copies it
    sources, listed = _translate(directory, texts, use_vmap=True)
    # CTranslate2 restricts a batch to one list, the union over its sources (as our exports).
    always = set(rules[""]) | {sp.id_to_piece(i) for i in SPECIAL_IDS}
    allowed = always.union(*(rules.get(p, []) for source in sources for p in source))
    assert sp.id_to_piece(dropped) not in allowed
    for hypotheses in listed:
        for hypothesis in hypotheses:
            assert set(hypothesis) <= allowed, hypothesis
    assert sp.id_to_piece(dropped) not in {p for h in listed[0] for p in h}
    # "blue" holds no dropped piece: its answer stays.
    assert listed[2][0] == plain[2][0]


@pytest.mark.scenario
def test_export_command_writes_the_workdirs_vmap(capsys, tmp_path, copy_model, toy_spm_path):
    workdir = _write_workdir(tmp_path, copy_model, toy_spm_path, steps=(100,))
    identity = _identity_table(copy_model.vocab_size)
    with open(toy_spm_path, "rb") as f:  # the table of the workdir's own SentencePiece model
        fingerprint = {"spm_sha256": hashlib.sha256(f.read()).hexdigest()}
    identity = dataclasses.replace(identity, settings=fingerprint)
    save_lexical_table(identity, Workdir(str(workdir)).shortlist)
    output = tmp_path / "ct2"
    code = cli.main(["export", "--workdir", str(workdir), "--format", "ctranslate2",
                     "--quantization", "int8", "--output", str(output)])  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 0, err
    with open(output / "vmap.txt", encoding="utf-8") as f:
        rules = _parse(f.read())
    sp = fx.spm_processor()
    assert rules[sp.id_to_piece(10)] == [sp.id_to_piece(10)]
    code = cli.main(["export", "--workdir", str(workdir), "--format", "ctranslate2",
                     "--no-shortlist", "--output", str(tmp_path / "plain")])  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 0, err
    assert "vmap.txt" not in os.listdir(tmp_path / "plain")
