"""`keras-transformer translate --input FILE --output FILE`: streamed, length-sorted translation
in input order, any gfile path, n-best, a SIGKILLed run that resumes without translating a
written line twice, and bad arguments (exit 2, one line)."""

import json
import os
import signal
import subprocess
import sys

import _inference_fixtures as fx
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import file_translation

# Numerically sensitive: CI runs this module again with oneDNN off and with one thread.
pytestmark = pytest.mark.numerics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Words of the copy model's vocabulary, 1 to 9 of them: lengths vary within every chunk.
LINES = fx.toy_sentences(40, seed=5)
LINES = [" ".join([line] * (1 + i % 2)) for i, line in enumerate(LINES)]


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def _translate_file(run_cli, model, source, target, *extra):
    argv = ["translate", "--model", model, "--input", source, "--output", target, *extra]
    return run_cli(*argv)


def test_chunks_are_translated_by_length_and_written_in_input_order():
    lines = ["a b c d e", "a", "", "a b c", "a b", "a b c d e f g", "a b c d"]
    batches = []

    def translate(texts):
        batches.append(list(texts))
        return [[text.upper(), f"{len(text)}"] for text in texts]

    data = file_translation.translate_chunk(translate, lines, 3, lines_per_input=2)
    expected = [out for line in lines for out in (line.upper(), str(len(line)))]
    assert data.decode("utf-8").split("\n")[:-1] == expected
    assert [len(batch) for batch in batches] == [3, 3, 1]
    lengths = [len(text) for batch in batches for text in batch]
    assert lengths == sorted(lengths)  # little padding: similar lengths share a batch


@pytest.mark.scenario
def test_file_translation_equals_the_translation_of_arguments(tmp_path, model_base_dir, run_cli):
    source = _write(tmp_path / "in.txt", LINES)
    target = str(tmp_path / "out.txt")
    code, out, err = _translate_file(
        run_cli, model_base_dir, source, target, "--chunk-lines", "7", "--batch-size", "3"
    )
    assert code == 0, err
    assert f"{len(LINES)} lines" in out and "lines/s" in err  # the summary and the progress
    assert not os.path.exists(target + file_translation.PROGRESS_SUFFIX)
    code, expected, err = run_cli("translate", "--model", model_base_dir, *LINES)
    assert code == 0, err
    with open(target, encoding="utf-8") as f:
        assert f.read() == expected


@pytest.mark.scenario
def test_any_tensorflow_filesystem_and_n_best(model_base_dir, run_cli):
    source, target = "ram://file-translation/in.txt", "ram://file-translation/out.txt"
    with tf.io.gfile.GFile(source, "w") as f:
        f.write("\n".join(LINES[:6]))  # no newline after the last line: still a line
    code, _, err = _translate_file(
        run_cli, model_base_dir, source, target, "--n-best", "2", "--chunk-lines", "4"
    )
    assert code == 0, err
    _, expected, _ = run_cli("translate", "--model", model_base_dir, "--n-best", "2", *LINES[:6])
    with tf.io.gfile.GFile(target, "r") as f:
        _assert_same_nbest_lines(f.read(), expected)
    assert len(expected.splitlines()) == 12


def _assert_same_nbest_lines(text, expected):
    """`score<TAB>translation` lines: the same translations, the scores equal as numbers. A
    file is translated in chunks, so its batches differ from one call's, and batch composition
    changes the float rounding (in the sixth decimal on an Intel Xeon); 1e-4 is far above that
    and far below any difference between two hypotheses' scores that matters here."""
    rows = [line.split("\t", 1) for line in text.splitlines()]
    reference = [line.split("\t", 1) for line in expected.splitlines()]
    assert [t for _, t in rows] == [t for _, t in reference]
    np.testing.assert_allclose(
        [float(s) for s, _ in rows], [float(s) for s, _ in reference], atol=1e-4
    )


# The command in a subprocess whose 3rd chunk is half written when it SIGKILLs itself: the
# bytes of a chunk that a buffered writer had already pushed out, ending in a partial line.
_DYING = """
import os, signal, sys
from keras_transformer import cli, file_translation
real, calls = file_translation.translate_chunk, []
def dying(*args, **kwargs):
    data = real(*args, **kwargs)
    calls.append(1)
    if len(calls) == 3:
        lines = data.split(b"\\n")
        with open(sys.argv[sys.argv.index("--output") + 1], "ab") as f:
            f.write(b"\\n".join(lines[:3]) + b"\\n" + lines[3][:2])
        os.kill(os.getpid(), signal.SIGKILL)
    return data
file_translation.translate_chunk = dying
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.scenario
def test_a_killed_translation_resumes_without_translating_a_line_twice(
    tmp_path, model_base_dir, run_cli, monkeypatch
):
    source = _write(tmp_path / "in.txt", LINES)
    target = str(tmp_path / "out.txt")
    argv = ["translate", "--model", model_base_dir, "--input", source, "--output", target]
    argv += ["--chunk-lines", "8", "--batch-size", "3"]
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    killed = subprocess.run(
        [sys.executable, "-c", _DYING, *argv], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    with open(target + file_translation.PROGRESS_SUFFIX) as f:
        assert json.load(f)["lines"] == 16  # two chunks recorded
    with open(target, "rb") as f:
        written = f.read()
    assert written.count(b"\n") == 19 and not written.endswith(b"\n")  # 3 more, one partial

    seen = []
    real = file_translation.translate_chunk

    def spy(translate, lines, *args):
        seen.extend(lines)
        return real(translate, lines, *args)

    monkeypatch.setattr(file_translation, "translate_chunk", spy)
    code, out, err = run_cli(*argv)
    assert code == 0, err
    assert seen == LINES[19:]  # every written line kept, none translated twice
    assert "19 done before" in out
    monkeypatch.undo()
    reference = str(tmp_path / "reference.txt")
    code, _, err = _translate_file(run_cli, model_base_dir, source, reference)
    assert code == 0, err
    with open(target, "rb") as f, open(reference, "rb") as g:
        assert f.read() == g.read()
    assert not os.path.exists(target + file_translation.PROGRESS_SUFFIX)


def test_resume_keeps_complete_n_best_groups_only(tmp_path):
    output = str(tmp_path / "out.txt")
    identity = {"input": "in.txt", "input_bytes": 10, "model": "m", "lines_per_input": 2}
    with open(output + file_translation.PROGRESS_SUFFIX, "w") as f:
        json.dump(dict(identity, lines=1, output_bytes=4), f)
    with open(output, "wb") as f:
        # Recorded: 1 input (2 lines); then 2 whole inputs, one line and a half of the next.
        f.write(b"a\nb\nc\nd\ne\nf\ng\nh")
    assert file_translation.resume_point(output, identity) == (3, 12)
    with open(output, "rb") as f:
        assert f.read() == b"a\nb\nc\nd\ne\nf\n"


def test_an_empty_input_gets_an_empty_output(tmp_path):
    source, target = _write(tmp_path / "in.txt", []), str(tmp_path / "out.txt")
    result = file_translation.translate_file(lambda texts: [], source, target)
    assert result["lines"] == 0 and os.path.getsize(target) == 0
    assert not os.path.exists(target + file_translation.PROGRESS_SUFFIX)


@pytest.mark.parametrize(
    "make_argv, message",
    [
        (lambda d: ["--input", str(d / "missing.txt"), "--output", str(d / "o")], "input file"),
        (lambda d: ["--input", str(d / "in.txt"), "--output", str(d / "no/o")], "directory"),
        (lambda d: ["--input", str(d / "in.txt"), "--output", str(d / "o"), "x"], "TEXT"),
        (lambda d: ["--input", str(d / "in.txt")], "go together"),
        (lambda d: ["--output", str(d / "o")], "go together"),
        (lambda d: ["--input", str(d / "in.txt"), "--output", str(d / "in.txt")], "input file"),
        (lambda d: ["--input", str(d / "in.txt"), "--output", str(d / "done.txt")], "has no"),
        (lambda d: ["--input", str(d / "in.txt"), "--output", str(d / "o"), "--chunk-lines", "0"],
         "--chunk-lines"),
        (lambda d: ["--input", str(d / "in.txt"), "--output", str(d / "o"), "--prefix", "a"],
         "--prefix"),
    ],
)  # fmt: skip
def test_bad_arguments_exit_2(tmp_path, model_base_dir, run_cli, make_argv, message):
    _write(tmp_path / "in.txt", LINES[:3])
    _write(tmp_path / "done.txt", LINES[:3])  # a finished output: no progress file beside it
    code, out, err = run_cli("translate", "--model", model_base_dir, *make_argv(tmp_path))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert "Traceback" not in err


@pytest.mark.scenario
def test_a_progress_file_of_another_input_is_refused(tmp_path, model_base_dir, run_cli):
    target = str(tmp_path / "out.txt")
    first = _write(tmp_path / "a.txt", LINES[:3])
    code, _, err = _translate_file(run_cli, model_base_dir, first, target)
    assert code == 0, err
    os.rename(target, target + ".kept")
    with open(target + file_translation.PROGRESS_SUFFIX, "w") as f:  # as a killed run left it
        identity = file_translation._identity(first, "elsewhere", 1)
        json.dump(dict(identity, lines=0, output_bytes=0), f)
    other = _write(tmp_path / "b.txt", LINES[3:5])
    for source, what in ((other, "records input"), (first, "records model")):
        code, _, err = _translate_file(run_cli, model_base_dir, source, target)
        assert code == 2 and what in err and len(err.strip().splitlines()) == 1, err
