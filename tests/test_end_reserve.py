"""A time budget that holds: the end of a `train.max_minutes` run (the dev set's choice, the
scoring, the calibration, the export) is estimated from decoding speeds measured during
training, training stops early enough for it, and the dev scoring reuses the choice's decoding
of the chosen candidate."""

import dataclasses
import json

import pytest

from keras_transformer.config import decoding_settings
from keras_transformer.data import Tokenizer, read_pairs
from keras_transformer.evaluation import evaluate_bleu
from keras_transformer.final_model import final_model, reused_dev_scores
from keras_transformer.models import build_transformer
from keras_transformer.training import train
from keras_transformer.training.recipe.schedules import BudgetSchedule
from keras_transformer.training.run import end_reserve
from keras_transformer.training.run.callbacks import StopAtStep
from keras_transformer.training.run.end_reserve import EndReserve, EndWork, end_work
from keras_transformer.training.run.run_state import RunState
from tests.test_final_model import _copy_workdir, _plan
from tests.test_training_schedule import _assert_documented_time_keys
from tests.training_helpers import tiny_config


def _scoring(config):
    """The dev and test scoring's `DecodingSettings` (`train`'s `_Run.decoding`)."""
    return decoding_settings(config).without_sampling()


def _counting(monkeypatch):
    """Counts the sentences `final_model` decodes: `{beam size: sentences}`."""
    import keras_transformer.final_model as fm

    counted = {}

    def counting(model, tokenizer, pairs, data, settings, **kw):
        counted[settings.beam_size] = counted.get(settings.beam_size, 0) + len(pairs)
        return evaluate_bleu(model, tokenizer, pairs, data, settings, **kw)

    monkeypatch.setattr(fm, "evaluate_bleu", counting)
    return counted


@pytest.mark.scenario
@pytest.mark.parametrize("screen", [0, 40])
def test_the_end_work_counts_what_the_choice_decodes(
    tmp_path, copy_model, toy_spm_path, monkeypatch, screen
):
    """The estimate's sentence counts are those the dev set's choice decodes, with and without
    the greedy screening (3 checkpoint sets, 2 alphas, 40 of 48 dev sentences)."""
    config, layout = _copy_workdir(tmp_path, copy_model, toy_spm_path)
    config = dataclasses.replace(
        config, export=dataclasses.replace(config.export, select_screen_sentences=screen)
    )
    pairs = read_pairs(config.data.dev)
    counted = _counting(monkeypatch)
    tokenizer = Tokenizer(layout.spm)
    plan = _plan(config)
    final_model(plan, layout, tokenizer.vocab_size, tokenizer, pairs, report=lambda line: None)
    test_sentences = 10
    work = end_work(plan, _scoring(config), len(pairs), test_sentences)
    calibration = len(pairs)  # all 48 (under the calibration's 1,000)
    scoring = len(pairs)  # 40 of 48 chosen on: the scoring decodes dev again
    assert work.beam == counted[2] + scoring + test_sentences + calibration
    assert work.greedy == counted.get(1, 0)
    assert counted.get(1, 0) == (3 * 40 if screen else 0)
    assert counted[2] == (2 if screen else 3) * 2 * 40


@pytest.mark.scenario
def test_the_dev_scoring_reuses_the_choices_decoding(tmp_path, copy_model, toy_spm_path):
    """Where the choice decoded every dev sentence with the scoring's search, the chosen
    candidate's figures are the scoring's (equal to decoding it again); elsewhere nothing is
    reused, and the estimate counts the dev set once less."""
    config, layout = _copy_workdir(tmp_path, copy_model, toy_spm_path)
    pairs = read_pairs(config.data.dev)
    config = dataclasses.replace(
        config, export=dataclasses.replace(config.export, select_max_sentences=len(pairs))
    )
    tokenizer = Tokenizer(layout.spm)
    final = final_model(_plan(config), layout, tokenizer.vocab_size, tokenizer, pairs,
                        report=lambda line: None)  # fmt: skip
    settings = dataclasses.replace(decoding_settings(config).without_sampling(), alpha=final.alpha)
    reused = reused_dev_scores(final, settings, len(pairs))
    again, _ = evaluate_bleu(final.model, tokenizer, pairs, config.data, settings)
    assert reused == again and reused["bleu"] == final.selection["chosen"]["dev_bleu"]
    other = dataclasses.replace(settings, alpha=settings.alpha + 0.5)
    assert reused_dev_scores(final, other, len(pairs)) is None
    assert reused_dev_scores(final, settings, len(pairs) - 1) is None
    # 3 checkpoint sets screened, 2 finalists x 2 alphas at the beam; calibration on all 48.
    work = end_work(_plan(config), _scoring(config), len(pairs), 0)
    assert work.beam == 48 + 2 * 2 * 48  # dev scoring reused
    forty = dataclasses.replace(
        config, export=dataclasses.replace(config.export, select_max_sentences=40)
    )
    work = end_work(_plan(forty), _scoring(forty), len(pairs), 0)
    assert work.beam == 48 + 48 + 2 * 2 * 40  # dev scored again


class _Readings:
    """A clock that returns the given readings, one a call."""

    def __init__(self, readings):
        self.readings = list(readings)

    def __call__(self):
        return self.readings.pop(0)


class _Evaluator:
    def __init__(self, pairs, tokenizer):
        self.pairs, self.tokenizer = pairs, tokenizer

    def skips(self, step):
        return False


def test_the_estimate_moves_the_stop_and_the_decay_and_a_resume_keeps_it(
    tmp_path, copy_model, toy_spm_path, capsys
):
    """At a dev evaluation the end's seconds are the measured speeds times the end's work;
    training's stop moves to the budget less those, the learning rate's time runs faster by the
    same factor, and a new run in the workdir (a resume) starts from the kept estimate."""
    config, layout = _copy_workdir(tmp_path, copy_model, toy_spm_path)
    config = dataclasses.replace(
        config, train=dataclasses.replace(config.train, max_minutes=10.0, end_minutes=None)
    )
    tokenizer = Tokenizer(layout.spm)
    pairs = read_pairs(config.data.dev)
    size = decoding_settings(config, export=True).batch_size
    probe = min(len(pairs), end_reserve.SAMPLE_BATCHES * size)
    # Beam: 9 s then 2 s for the probe (7 s of tracing); greedy: 4 s then 1 s (3 s).
    clock = _Readings([0, 9, 10, 12, 20, 24, 30, 31])
    stopper = StopAtStep(10**6, max_seconds=540.0, run_state=RunState(timer=clock))
    work = EndWork(beam=1000, greedy=300, traces=10)
    beam = decoding_settings(config, export=True).without_sampling()
    callback = EndReserve(
        config.train, config.data, beam, _Evaluator(pairs, tokenizer), stopper, work,
        lambda: build_transformer(config.model, tokenizer.vocab_size), root=layout.root,
    )  # fmt: skip
    callback.set_model(copy_model)
    capsys.readouterr()
    callback.on_epoch_end(0)
    lines = capsys.readouterr().out.splitlines()
    end = end_reserve.MARGIN * (1000 * 2 / probe + 300 * 1 / probe + 10 * 7)  # beam, greedy, traces
    assert callback.estimate["end_seconds"] == pytest.approx(end, abs=0.06)
    assert stopper.max_seconds == pytest.approx(600 - end)
    assert stopper.run_state.schedule_scale == pytest.approx(540 / (600 - end))
    assert "training stops at" in lines[0]
    # An epoch that ends training (the budget reached) measures nothing: nothing left to move.
    clock.readings = [0]
    copy_model.stop_training = True
    try:
        callback.on_epoch_end(1)
    finally:
        copy_model.stop_training = False
    assert clock.readings == [0] and not capsys.readouterr().out
    # A later run of the same workdir (a resume) starts where the estimate left training.
    again = StopAtStep(10**6, max_seconds=540.0)
    EndReserve(config.train, config.data, beam, _Evaluator(pairs, tokenizer), again, work, None,
               root=layout.root)  # fmt: skip
    assert again.max_seconds == pytest.approx(stopper.max_seconds, abs=0.1)
    assert again.run_state.schedule_scale == pytest.approx(stopper.run_state.schedule_scale, 1e-3)
    # Another budget ignores it; an end shorter than the tenth keeps the tenth; training keeps
    # at least half of the budget.
    longer = dataclasses.replace(config, train=dataclasses.replace(config.train, max_minutes=20))
    assert end_reserve.read_estimate(layout.root, longer.train) is None
    assert end_reserve.training_seconds(config.train, 10.0) == 540.0
    assert end_reserve.training_seconds(config.train, 500.0) == 300.0


def test_the_schedule_reaches_zero_where_the_moved_stop_is():
    """With the stop moved to half of the schedule's seconds, the learning rate reaches zero
    when training stops (the decay follows the stop)."""
    from tests.test_training_schedule import _FakeTimer, _fit, _toy

    schedule = BudgetSchedule(16, warmup_steps=2, total_steps=10**6, total_seconds=100.0)
    model = _toy(schedule)
    stopper = StopAtStep(10**6, max_seconds=50.0, run_state=RunState(timer=_FakeTimer()))
    stopper.run_state.schedule_scale = 2.0
    _fit(model, [stopper], steps=50)
    assert int(model.optimizer.iterations) == 5 and stopper.out_of_time
    assert float(schedule.elapsed_seconds) == pytest.approx(100.0)
    assert float(schedule(5)) == 0.0


@pytest.mark.scenario
def test_a_budgeted_run_records_its_estimate_and_scores_dev_once(tmp_path, monkeypatch):
    """`train` on a budget: the estimate made at the dev evaluation is kept and lands in
    result.json's `budget` beside the end's seconds; the dev figures are the chosen candidate's
    (decoded once: the scoring reuses them)."""
    import keras_transformer.training.run.finish as finish

    decoded = []
    original = finish.evaluate_bleu
    monkeypatch.setattr(
        finish, "evaluate_bleu", lambda *a, **kw: decoded.append(len(a[2])) or original(*a, **kw)
    )
    config = tiny_config(
        tmp_path,
        train=dict(steps=8, max_minutes=30.0, keep_checkpoints=2),
        decode=dict(beam_size=2, batch_size=8, max_extra_length=5),
        export=dict(average_checkpoints="auto", select_max_sentences=100),
    )
    result = train(config)
    kept = end_reserve.read_estimate(str(tmp_path), config.train)
    assert kept and kept["end_seconds"] > 0 and set(kept["speeds"]) == {"beam", "greedy", "trace"}
    assert result["budget"] == {
        "max_minutes": 30.0,
        "training_seconds": kept["training_seconds"],
        "end_estimate_seconds": kept["end_seconds"],
    }
    assert result["dev"]["bleu"] == result["selection"]["chosen"]["dev_bleu"]
    assert decoded == []  # no dev (and no test set) decoded by the scoring
    with open(tmp_path / "result.json") as f:
        assert json.load(f)["budget"] == result["budget"]
    _assert_documented_time_keys(tmp_path / "result.json")
