"""`keras-transformer distill` (sequence-level distillation, #88): the teacher's translation of the
corpus stops at a chunk boundary (exit 75) and resumes to the corpus an uninterrupted run makes,
leaving no half-written corpus; shard workers make the corpus one worker makes; a missing shard
and bad flags are refused in one line (exit 2); `distill.keep_original` adds the original pairs;
the student gets the teacher's vocabulary byte for byte.

The fast tests replace the teacher's export with a function (`teacher_translation`) and the
student's training with a recorder (`train_command`): what they check is the corpus and the
command's phases, not a model. The scenario test translates with a real exported teacher."""

import json
import os
import types

import pytest

from keras_transformer import distillation, stopping
from keras_transformer.commands import distill, flags
from keras_transformer.commands.train import load_command_config
from keras_transformer.data import corpora
from keras_transformer.errors import UsageError

PAIRS = [(f"source {i} " + "word " * (i % 4), f"target {i}") for i in range(11)]


class FakeTeacher:
    """A teacher that upper-cases its input, counts what it translated and can ask for a stop
    (through `stopping.request`, as a signal would) after its Nth call."""

    def __init__(self, stop_after=None):
        self.translated, self.calls, self.stop_after = [], 0, stop_after

    def load(self, teacher, beam_size, verbose=False):
        def translate(texts):
            self.calls += 1
            self.translated += texts
            if self.calls == self.stop_after:
                stopping.request("a test's stop request")
            return [[text.upper()] for text in texts]

        return translate, "the fake teacher"


@pytest.fixture
def setup(tmp_path, monkeypatch, toy_spm_path):
    """`(teacher workdir, student config, trainings recorded)`: a teacher workdir (config,
    vocabulary, result.json naming an export) and a student config whose corpus is `PAIRS`."""
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "config.yaml").write_text("name: teacher\n")
    (teacher / "spm.model").write_bytes(open(toy_spm_path, "rb").read())
    (teacher / "result.json").write_text(json.dumps({"saved_model": str(tmp_path / "export")}))
    corpus = tmp_path / "train.tsv"
    corpus.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS), encoding="utf-8")
    config = tmp_path / "student.yaml"
    config.write_text(f"data:\n  train: tsv:{corpus}\ndistill:\n  chunk_lines: 3\n")
    trainings = []
    monkeypatch.setattr(distill, "train_command", trainings.append)
    return str(teacher), str(config), trainings


def _distill(run_cli, setup, workdir, *extra, **environment):
    teacher, config, _ = setup
    argv = ["distill", "--teacher", teacher, "--config", config, "--workdir", workdir, *extra]
    return run_cli(*argv, **environment)


def _corpus_bytes(workdir):
    corpus = distillation.distilled_corpus(workdir)
    assert corpus is not None, f"no distilled corpus in {workdir}"
    with open(corpus["source"], "rb") as s, open(corpus["target"], "rb") as t:
        return s.read(), t.read()


def _one_worker_corpus(run_cli, setup, monkeypatch, workdir):
    monkeypatch.setattr(distill, "teacher_translation", FakeTeacher().load)
    code, _, err = _distill(run_cli, setup, workdir)
    assert code == 0, err
    return _corpus_bytes(workdir)


def test_one_worker_distills_the_corpus_and_trains_the_student(
    run_cli, setup, monkeypatch, tmp_path
):
    source, target = _one_worker_corpus(run_cli, setup, monkeypatch, str(tmp_path / "one"))
    assert source.decode().splitlines() == [s.strip() for s, _ in PAIRS]
    assert target.decode().splitlines() == [s.strip().upper() for s, _ in PAIRS]
    (args,) = setup[2]  # the student trained once, on the distilled pairs only
    config = load_command_config(args)
    assert config.data.train == [f"text:{tmp_path}/one/distilled/source.txt,"
                                 f"{tmp_path}/one/distilled/target.txt"]  # fmt: skip


def test_a_stopped_translation_exits_75_and_resumes_to_the_same_corpus(
    run_cli, setup, monkeypatch, tmp_path
):
    """(a) and (d): stopped after its second chunk, no corpus is there and the student has not
    trained; the same command goes on from the third chunk to the uninterrupted run's corpus."""
    expected = _one_worker_corpus(run_cli, setup, monkeypatch, str(tmp_path / "whole"))
    setup[2].clear()
    workdir = str(tmp_path / "stopped")
    stopped = FakeTeacher(stop_after=2)
    monkeypatch.setattr(distill, "teacher_translation", stopped.load)
    code, _, err = _distill(run_cli, setup, workdir)
    assert code == 75, err
    assert err.count("\n") == 1 and "stopped by a test's stop request" in err, err
    assert "6 lines translated are kept" in err, err
    assert distillation.distilled_corpus(workdir) is None
    assert not os.path.exists(os.path.join(workdir, distillation.CORPUS))
    assert not setup[2]  # no training

    resumed = FakeTeacher()
    monkeypatch.setattr(distill, "teacher_translation", resumed.load)
    code, _, err = _distill(run_cli, setup, workdir)
    assert code == 0, err
    assert _corpus_bytes(workdir) == expected
    assert len(stopped.translated) == 6 and len(resumed.translated) == len(PAIRS) - 6
    assert len(setup[2]) == 1


def test_two_shard_workers_make_the_corpus_one_worker_makes(run_cli, setup, monkeypatch, tmp_path):
    """(b): shard 0 from the flags, shard 1 from a Slurm array's environment; each worker stops
    after its shard (no training), and the merge run trains on the one worker's corpus."""
    expected = _one_worker_corpus(run_cli, setup, monkeypatch, str(tmp_path / "whole"))
    setup[2].clear()
    workdir = str(tmp_path / "sharded")
    code, out, err = _distill(run_cli, setup, workdir, "--shard", "0", "--num-shards", "2")
    assert code == 0 and "shard 0 of 2 complete" in out, err
    slurm = {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "2"}
    code, out, err = _distill(run_cli, setup, workdir, **slurm)
    assert code == 0 and "shard 1 of 2 complete" in out, err
    assert not setup[2] and distillation.distilled_corpus(workdir) is None
    code, _, err = _distill(run_cli, setup, workdir, "--num-shards", "2")
    assert code == 0, err
    assert _corpus_bytes(workdir) == expected
    assert len(setup[2]) == 1


def test_a_missing_shard_is_refused_in_one_line(run_cli, setup, monkeypatch, tmp_path):
    """(c)"""
    monkeypatch.setattr(distill, "teacher_translation", FakeTeacher().load)
    workdir = str(tmp_path / "sharded")
    code, _, err = _distill(run_cli, setup, workdir, "--shard", "0", "--num-shards", "3")
    assert code == 0, err
    code, _, err = _distill(run_cli, setup, workdir, "--num-shards", "3")
    assert code == 2 and err.count("\n") == 1, err
    assert "needs shard 1 of 3" in err and "--shard 1 --num-shards 3" in err, err
    assert distillation.distilled_corpus(workdir) is None and not setup[2]


def test_keep_original_adds_the_original_pairs(run_cli, setup, monkeypatch, tmp_path):
    """(e)"""
    monkeypatch.setattr(distill, "teacher_translation", FakeTeacher().load)
    workdir = str(tmp_path / "student")
    code, _, err = _distill(run_cli, setup, workdir, "--set", "distill.keep_original=true")
    assert code == 0, err
    config = load_command_config(setup[2][0])
    pairs = list(corpora.iter_training_pairs(config.data.train, verbose=False))
    assert len(pairs) == 2 * len(PAIRS)
    assert pairs[len(PAIRS) :] == [(s.strip(), t.strip()) for s, t in PAIRS]
    assert pairs[: len(PAIRS)] == [(s.strip(), s.strip().upper()) for s, _ in PAIRS]


def test_the_student_has_the_teacher_vocabulary(run_cli, setup, monkeypatch, tmp_path):
    """(f), and another vocabulary already in the student's workdir is refused."""
    monkeypatch.setattr(distill, "teacher_translation", FakeTeacher().load)
    workdir = tmp_path / "student"
    code, _, err = _distill(run_cli, setup, str(workdir))
    assert code == 0, err
    teacher_spm = os.path.join(setup[0], "spm.model")
    assert (workdir / "spm.model").read_bytes() == open(teacher_spm, "rb").read()

    other = tmp_path / "other"
    other.mkdir()
    (other / "spm.model").write_bytes(b"another vocabulary")
    code, _, err = _distill(run_cli, setup, str(other))
    assert code == 2 and err.count("\n") == 1 and "not the teacher's vocabulary" in err, err


@pytest.mark.parametrize(
    "extra, environment, message",
    [
        (["--shard", "2", "--num-shards", "2"], {}, "--shard must be in [0, 2)"),
        (["--shard", "-1", "--num-shards", "2"], {}, "--shard must be in [0, 2)"),
        (["--shard", "0", "--num-shards", "0"], {}, "--num-shards must be a positive integer"),
        (["--shard", "1"], {}, "--shard 1 needs --num-shards"),
        ([], {"JOB_COMPLETION_INDEX": "1"}, "JOB_COMPLETION_INDEX 1 needs --num-shards"),
        ([], {"SLURM_ARRAY_TASK_ID": "x"}, "SLURM_ARRAY_TASK_ID must be an integer"),
    ],
)
def test_bad_shard_flags_exit_2_in_one_line(run_cli, setup, tmp_path, extra, environment, message):
    """(g)"""
    code, _, err = _distill(run_cli, setup, str(tmp_path / "w"), *extra, **environment)
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_a_missing_teacher_exits_2_in_one_line(run_cli, setup, tmp_path):
    """(g): no such teacher; an export without its vocabulary; a workdir without an export."""
    _, config, _ = setup
    workdir = str(tmp_path / "w")
    lacking = tmp_path / "untrained"
    lacking.mkdir()
    (lacking / "config.yaml").write_text("name: untrained\n")
    export = tmp_path / "export"
    export.mkdir()
    for teacher, message in [
        (tmp_path / "nowhere", "no such workdir or export directory"),
        (export, "is an export: give its SentencePiece model with --teacher-vocabulary"),
        (lacking, "the workdir has no export yet"),
    ]:
        code, _, err = run_cli(
            "distill", "--teacher", teacher, "--config", config, "--workdir", workdir
        )
        assert code == 2 and err.count("\n") == 1 and message in err, err
    code, _, err = run_cli("distill", "--config", config)
    assert code == 2 and "--teacher" in err, err


def test_the_shard_request_reads_the_job_environment():
    args = types.SimpleNamespace(shard=None, num_shards=None)
    assert flags.shard_request(args, {}) == flags.ShardRequest(None, 1)
    assert flags.shard_request(
        args, {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4"}
    ) == (flags.ShardRequest(3, 4))
    indexed = types.SimpleNamespace(shard=None, num_shards=5)
    assert flags.shard_request(indexed, {"JOB_COMPLETION_INDEX": "4"}) == flags.ShardRequest(4, 5)
    given = types.SimpleNamespace(shard=0, num_shards=2)  # the flags win
    assert flags.shard_request(given, {"JOB_COMPLETION_INDEX": "1"}) == flags.ShardRequest(0, 2)
    with pytest.raises(UsageError, match="JOB_COMPLETION_INDEX must be in"):
        flags.shard_request(indexed, {"JOB_COMPLETION_INDEX": "5"})


def _toy_student(tmp_path, sources):
    """The `--set`s of a student at toy scale (`_recipes.TOY`) on `sources` copied: the copy
    model's task, its corpus in text files."""
    from _recipes import TOY, TOY_DEFAULTS

    (tmp_path / "train.src").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    (tmp_path / "train.tgt").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    corpus = f"text:{tmp_path / 'train.src'},{tmp_path / 'train.tgt'}"
    settings = {**TOY_DEFAULTS, **TOY, "data.train": corpus, "data.dev": corpus}
    settings.update({"data.test": "null", "export.base_dir": str(tmp_path / "saved_models")})
    return [a for key, value in settings.items() for a in ("--set", f"{key}={value}")]


@pytest.mark.scenario(
    slow="exports the copy model (a shared fixture), trains and exports a student"
)
def test_a_real_teacher_distills_and_the_student_trains(
    run_cli, exported_copy_model, toy_spm_path, tmp_path
):
    """The toy chain: the teacher's export translates the corpus as `translate --input` does;
    the student, with the teacher's vocabulary, trains and exports through `train`, and its
    export translates; a beam size other than the export's is refused in one line."""
    import _inference_fixtures as fx

    _, export = exported_copy_model
    sources = fx.toy_sentences(24, seed=3)
    toy = _toy_student(tmp_path, sources)
    teacher = ["--teacher", export, "--teacher-vocabulary", toy_spm_path]
    config = ["--config", "configs/quickstart.yaml"]
    code, _, err = run_cli(
        "distill", *teacher, *config, "--workdir", tmp_path / "beam5", *toy,
        "--set", "distill.beam_size=5",
    )  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "distill.beam_size is 5" in err, err

    workdir = tmp_path / "student"
    code, out, err = run_cli("distill", *teacher, *config, "--workdir", workdir, *toy)
    assert code == 0, err
    code, _, err = run_cli(
        "translate", "--model", export, "--input", tmp_path / "train.src",
        "--output", tmp_path / "teacher.txt",
    )  # fmt: skip
    assert code == 0, err
    corpus = distillation.distilled_corpus(str(workdir))
    assert open(corpus["target"]).read() == (tmp_path / "teacher.txt").read_text()
    assert (workdir / "spm.model").read_bytes() == open(toy_spm_path, "rb").read()
    result = json.loads((workdir / "result.json").read_text())
    assert result["saved_model"].startswith(str(tmp_path / "saved_models"))
    code, out, err = run_cli("translate", "--model", result["saved_model"], *sources[:2])
    assert code == 0 and len(out.splitlines()) == 2, err  # the chain's end: the student answers
    code, out, err = run_cli("distill", *teacher, *config, "--workdir", workdir, *toy)
    assert code == 0, err  # run again: every phase done, nothing redone


def test_the_teacher_is_a_workdir_or_an_export_with_its_vocabulary(setup, tmp_path, toy_spm_path):
    teacher, _, _ = setup
    resolved = distill.resolve_teacher(teacher)
    assert resolved == distill.Teacher(str(tmp_path / "export"), os.path.join(teacher, "spm.model"))
    export = tmp_path / "export"
    export.mkdir()
    assert distill.resolve_teacher(str(export), toy_spm_path) == distill.Teacher(
        str(export), toy_spm_path
    )
    with pytest.raises(UsageError, match="vocabulary .* is missing"):
        distill.resolve_teacher(str(export), str(tmp_path / "none.model"))


def test_a_stop_while_the_sources_are_read_leaves_no_source_file(
    run_cli, setup, monkeypatch, tmp_path
):
    """The sources of a shard are read with safe points too (a big corpus takes a while); the
    stopped run leaves no shard file, and the next one makes it whole."""
    monkeypatch.setattr(distill, "teacher_translation", FakeTeacher().load)
    monkeypatch.setattr(distillation, "_CHECK_EVERY", 4)
    pairs = distillation.corpus_pairs

    def stopping_pairs(train):
        for i, pair in enumerate(pairs(train)):
            if i == 5:
                stopping.request("a test's stop request")
            yield pair

    monkeypatch.setattr(distillation, "corpus_pairs", stopping_pairs)
    workdir = str(tmp_path / "student")
    code, _, err = _distill(run_cli, setup, workdir)
    assert code == 75 and err.count("\n") == 1 and "reading the sources of shard 0" in err, err
    assert not os.path.exists(distillation.Shard(workdir, 0, 1).source)
    monkeypatch.setattr(distillation, "corpus_pairs", pairs)
    code, _, err = _distill(run_cli, setup, workdir)
    assert code == 0, err
    assert len(_corpus_bytes(workdir)[0].splitlines()) == len(PAIRS)
