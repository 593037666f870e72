"""Corpus specs: text, tsv and tfds readers, cleaning with counted skips, clear errors."""

import warnings

import pytest

from keras_transformer.data import read_pairs
from keras_transformer.data.corpora import parse_spec
from keras_transformer.errors import DataError, DataWarning, KerasTransformerError


def _write(path, data):
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return str(path)


def test_text_spec_reads_aligned_pairs(tmp_path):
    src = _write(tmp_path / "a.de", "\ufeffGrüße aus Köln\n  Ein Haus \r\nDrei\n")  # BOM, CRLF
    tgt = _write(tmp_path / "a.en", "Greetings from Cologne\nA house\r\nThree\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is skipped, so nothing to warn about
        pairs = read_pairs(f"text:{src},{tgt}", verbose=False)
    assert pairs == [
        ("Grüße aus Köln", "Greetings from Cologne"),
        ("Ein Haus", "A house"),
        ("Drei", "Three"),
    ]


def test_text_spec_without_final_newline_and_unicode_line_separator(tmp_path):
    # U+2028 is a line break for str.splitlines but not for the files' line structure.
    src = _write(tmp_path / "s", "eins\u2028zwei\ndrei")
    tgt = _write(tmp_path / "t", "one two\nthree")
    assert read_pairs(f"text:{src},{tgt}", verbose=False) == [
        ("eins\u2028zwei", "one two"),
        ("drei", "three"),
    ]


def test_empty_and_invalid_utf8_lines_are_skipped_and_counted(tmp_path):
    src = _write(tmp_path / "s", b"good one\n\nbad \xff\xfe bytes\nfine\n   \nlast\n")
    tgt = _write(tmp_path / "t", b"gut eins\nleer\nschlecht\n\n\xc3\x28\nletzte\n")
    with pytest.warns(DataWarning) as record:
        pairs = read_pairs(f"text:{src},{tgt}", verbose=False)
    assert pairs == [("good one", "gut eins"), ("last", "letzte")]
    assert len(record) == 1
    message = str(record[0].message)
    assert "skipped 4 of 6" in message
    assert "2 with an empty side" in message
    assert "2 with invalid UTF-8" in message


def test_mismatched_line_counts_name_both_counts(tmp_path):
    src = _write(tmp_path / "src.txt", "a\nb\nc\n")
    tgt = _write(tmp_path / "tgt.txt", "x\ny\n")
    with pytest.raises(DataError) as info:
        read_pairs(f"text:{src},{tgt}", verbose=False)
    message = str(info.value)
    assert "3" in message and "2" in message
    assert "src.txt has 3" in message and "tgt.txt has 2" in message
    assert "\n" not in message


def test_missing_file_is_a_data_error_naming_it(tmp_path):
    src = _write(tmp_path / "here.txt", "a\n")
    missing = str(tmp_path / "missing.txt")
    with pytest.raises(DataError, match="missing.txt"):
        read_pairs(f"text:{src},{missing}", verbose=False)
    with pytest.raises(DataError, match="nowhere.tsv"):
        read_pairs(f"tsv:{tmp_path / 'nowhere.tsv'}", verbose=False)
    # The CLI turns every KerasTransformerError into exit code 2 with one line.
    assert issubclass(DataError, KerasTransformerError)


def test_tsv_spec(tmp_path):
    path = _write(
        tmp_path / "c.tsv",
        "Hallo\tHello\nno tab here\nDanke\tThanks\tattribution\t42\n\t\nTschüß 👋\tBye 👋\n",
    )
    with pytest.warns(DataWarning, match=r"skipped 2 of 5.*1 with an empty side.*1 without a TAB"):
        pairs = read_pairs(f"tsv:{path}", verbose=False)
    assert pairs == [("Hallo", "Hello"), ("Danke", "Thanks"), ("Tschüß 👋", "Bye 👋")]


def test_comma_in_a_path_is_resolved_by_existing_files(tmp_path):
    src = _write(tmp_path / "a,b.src", "x\n")
    tgt = _write(tmp_path / "c.tgt", "y\n")
    assert read_pairs(f"text:{src},{tgt}", verbose=False) == [("x", "y")]


@pytest.mark.parametrize(
    "spec, match",
    [
        ("corpus.txt", "must start with"),
        ("csv:file.csv", "unknown corpus kind 'csv'"),
        ("text:only_one_file", "text:SOURCE_FILE,TARGET_FILE"),
        ("synthetic:colour=blue", "unknown synthetic option"),
        ("synthetic:size=many", "size must be an integer"),
        ("synthetic:split=validation", "split must be one of"),
        ("tfds:wmt14_translate/de-en:train,backwards", "unknown tfds option"),
    ],
)
def test_bad_specs_raise_one_line_data_errors(spec, match):
    with pytest.raises(DataError, match=match) as info:
        read_pairs(spec, verbose=False)
    assert "\n" not in str(info.value)


def test_parse_spec():
    assert parse_spec("tfds:wmt14_translate/de-en:train[:1%]") == (
        "tfds",
        "wmt14_translate/de-en:train[:1%]",
    )
    assert parse_spec("synthetic:") == ("synthetic", "")


def _mock_examples(name, split, num_examples):
    """The examples tfds.testing.mock_data produces for `name` (deterministic)."""
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=num_examples):
        return list(tfds.load(name, split=split).as_numpy_iterator())


def _expected(examples, source_key, target_key):
    pairs = []
    for example in examples:
        source = example[source_key].decode("utf-8").strip()
        target = example[target_key].decode("utf-8").strip()
        if source and target:
            pairs.append((source, target))
    return pairs


@pytest.mark.parametrize(
    "name, split, source_key, target_key",
    [
        ("wmt14_translate/de-en", "validation", "de", "en"),
        ("ted_hrlr_translate/pt_to_en", "train", "pt", "en"),
    ],
)
def test_tfds_spec_with_mock_data(name, split, source_key, target_key):
    import tensorflow_datasets as tfds

    examples = _mock_examples(name, split, 12)
    expected = _expected(examples, source_key, target_key)
    assert len(expected) >= 6  # mock text is random; a few may be blank
    spec = f"tfds:{name}:{split}" if split != "train" else f"tfds:{name}"
    with tfds.testing.mock_data(num_examples=12):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DataWarning)
            assert read_pairs(spec, verbose=False) == expected
            # The direction follows the config name unless an option says otherwise.
            reversed_pairs = read_pairs(f"{spec},reverse", verbose=False)
            explicit = read_pairs(f"{spec},src={target_key},tgt={source_key}", verbose=False)
    assert reversed_pairs == [(t, s) for s, t in expected]
    assert explicit == reversed_pairs


def test_tfds_unknown_feature_is_a_data_error():
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=2):
        with pytest.raises(DataError, match="no feature named 'fr'"):
            read_pairs("tfds:wmt14_translate/de-en,src=fr,tgt=en", verbose=False)


def test_tfds_unknown_dataset_is_a_data_error():
    with pytest.raises(DataError, match="cannot load the TFDS dataset"):
        read_pairs("tfds:no_such_dataset_xyz", verbose=False)
