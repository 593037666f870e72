"""The dev set chooses the final model: `export.average_checkpoints: auto`, `decode.alpha: auto`
and `train.keep_best`, checked by decoding every candidate again here."""

import dataclasses
import json
import os
import shutil
import time

import h5py
import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer.config import decoding_settings, from_dict, load_config, save_config
from keras_transformer.data import Tokenizer, read_pairs
from keras_transformer.evaluation import evaluate_bleu
from keras_transformer.final_model import PAPER_ALPHA, Plan, final_model, read_best
from keras_transformer.models import build_transformer
from keras_transformer.training import train
from keras_transformer.workdir import (
    Workdir,
    average_checkpoints,
    checkpoint_path,
    save_model_weights,
)
from tests.training_helpers import tiny_config


def _chosen_config(workdir):
    return tiny_config(
        workdir,
        data=dict(
            dev="synthetic:split=dev,size=24,max_words=8",
            test="synthetic:split=test,size=10,max_words=8",
        ),
        train=dict(
            steps=40,
            steps_per_epoch=8,
            checkpoint_every=8,
            keep_checkpoints=4,
            keep_best=2,
            eval_max_sentences=16,
            warmup_steps=10,
        ),  # fmt: skip
        decode=dict(beam_size=2, alpha="auto"),
        export=dict(average_checkpoints="auto", select_max_sentences=20),
    )


@pytest.fixture(scope="module")
def chosen_run(_shared_root):
    """A 40-step run whose final model the dev set chose, trained once per test run (both
    workers read it; no test changes it): its config, workdir and `result.json`."""
    from shared_runs import shared_directory

    root = shared_directory(_shared_root, "final_model_chosen_run",
                            lambda directory: train(_chosen_config(directory)))  # fmt: skip
    layout = Workdir(str(root))
    with open(layout.result, encoding="utf-8") as f:
        result = json.load(f)
    return _chosen_config(root), layout, result


def _plan(config):
    """The `final_model.Plan` that `train` and `export` resolve from `config`."""
    return Plan.of(config, decoding_settings(config, export=True))


def _dev_bleu(config, layout, tokenizer, steps, kind, alpha, settings=None, sentences=None):
    """The dev BLEU of one candidate, recomputed from its files."""
    model = build_transformer(config.model, tokenizer.vocab_size)
    directory = layout.best if kind == "best" else layout.checkpoints
    average_checkpoints(model, [checkpoint_path(directory, s) for s in steps])
    pairs = read_pairs(config.data.dev)[: sentences or config.export.select_max_sentences]
    settings = settings or dataclasses.replace(decoding_settings(config, export=True), alpha=alpha)
    return evaluate_bleu(model, tokenizer, pairs, config.data, settings)[0]["bleu"]


def _finalists(config, layout, tokenizer, screened):
    """The checkpoint sets the greedy screening passes on, recomputed: every screened set's
    greedy dev BLEU on the first `select_screen_sentences`, the best `select_finalists` (a tie
    keeps the simpler: fewer checkpoints, then the last ones)."""
    greedy = dataclasses.replace(decoding_settings(config, export=True), beam_size=1)
    n = min(config.export.select_screen_sentences, config.export.select_max_sentences)
    for entry in screened["greedy_dev_bleu"]:
        recomputed = _dev_bleu(
            config, layout, tokenizer, entry["steps"], entry["kind"], None, greedy, n
        )
        assert recomputed == entry["dev_bleu"], entry
    ranked = sorted(
        screened["greedy_dev_bleu"],
        key=lambda e: (-e["dev_bleu"], len(e["steps"]), e["kind"] != "last"),
    )
    return {(tuple(e["steps"]), e["kind"]) for e in ranked[: config.export.select_finalists]}


@pytest.mark.scenario
def test_the_chosen_candidate_has_the_best_dev_bleu_of_all_recomputed(chosen_run):
    config, layout, result = chosen_run
    selection = result["selection"]
    tokenizer = Tokenizer(layout.spm)
    candidates = selection["candidates"]
    # Screened greedily: the last checkpoint, the averages of the last 2, 3 and 4 (the best/
    # ones are new sets only where they differ from these); the finalists at the beam, each at
    # alpha 0.6 and 1.0.
    screened = selection["screened"]
    last_sets = {tuple(e["steps"]) for e in screened["greedy_dev_bleu"] if e["kind"] == "last"}
    assert last_sets == {(40,), (32, 40), (24, 32, 40), (16, 24, 32, 40)}
    assert screened["sentences"] == 20
    finalists = _finalists(config, layout, tokenizer, screened)
    assert {(tuple(c["steps"]), c["kind"]) for c in candidates} == finalists
    assert len(candidates) == 2 * len(finalists) == 2 * config.export.select_finalists
    assert {c["alpha"] for c in candidates} == {PAPER_ALPHA, 1.0}
    recomputed = [
        _dev_bleu(config, layout, tokenizer, c["steps"], c["kind"], c["alpha"]) for c in candidates
    ]
    assert recomputed == [c["dev_bleu"] for c in candidates]
    best = max(recomputed)
    # A tie keeps the simpler: fewer checkpoints, then the paper's alpha, then the last ones.
    simplest = min(
        (c for c in candidates if c["dev_bleu"] == best),
        key=lambda c: (len(c["steps"]), c["alpha"] != PAPER_ALPHA, c["kind"] != "last"),
    )
    assert selection["chosen"] == simplest
    assert selection["sentences"] == 20 and selection["seconds"] >= 0
    assert result["checkpoint_steps"] == simplest["steps"] and result["alpha"] == simplest["alpha"]
    # The export carries the choice: its card records it.
    with open(os.path.join(result["saved_model"], "assets.extra", "model_card.json")) as f:
        card = json.load(f)
    assert card["training"]["selection"]["chosen"] == simplest


@pytest.mark.scenario
def test_keep_best_keeps_the_checkpoints_of_the_best_dev_bleu(chosen_run):
    config, layout, _ = chosen_run
    tokenizer = Tokenizer(layout.spm)
    scores, kept = read_best(layout.best)
    # Scored every checkpoint_every steps but the last (the final model is scored on its own).
    assert sorted(scores) == [8, 16, 24, 32]
    greedy = dataclasses.replace(decoding_settings(config), beam_size=1, alpha=PAPER_ALPHA)
    for step in (16, 24, 32):  # still in checkpoints/ (keep_checkpoints 4): recomputed
        n = config.train.eval_max_sentences  # KeepBest scores with the dev evaluation's subset
        assert _dev_bleu(config, layout, tokenizer, [step], "last", None, greedy, n) == scores[step]
    ranked = sorted(scores, key=lambda s: (-scores[s], s))
    assert kept == ranked[:2]
    files = sorted(f for f in os.listdir(layout.best) if f.endswith(".weights.h5"))
    assert files == sorted(f"ckpt-{s}.weights.h5" for s in kept)
    for step in kept:
        if step >= 16:  # the same weights as the step checkpoint
            a = build_transformer(config.model, tokenizer.vocab_size)
            b = build_transformer(config.model, tokenizer.vocab_size)
            average_checkpoints(a, [checkpoint_path(layout.best, step)])
            average_checkpoints(b, [checkpoint_path(layout.checkpoints, step)])
            for x, y in zip(a.get_weights(), b.get_weights()):
                np.testing.assert_array_equal(x, y)


@pytest.mark.scenario
def test_the_same_workdir_chooses_the_same_candidate(chosen_run):
    config, layout, result = chosen_run
    tokenizer = Tokenizer(layout.spm)
    again = final_model(
        _plan(load_config(layout.config)), layout, tokenizer.vocab_size, tokenizer,
        read_pairs(config.data.dev), report=lambda line: None,
    )  # fmt: skip
    assert again.selection["candidates"] == result["selection"]["candidates"]
    assert (again.steps, again.alpha) == (result["checkpoint_steps"], result["alpha"])


@pytest.mark.scenario
def test_the_model_card_states_the_workdirs_facts(chosen_run):
    """Every fact of the card against its source: the config, the prepared manifest,
    `result.json`, and the calibration recomputed from the exported model's own answers."""
    import tensorflow as tf

    from keras_transformer.data.prepare import read_manifest
    from keras_transformer.export import calibration as calib

    config, layout, result = chosen_run
    with open(os.path.join(result["saved_model"], "assets.extra", "model_card.json")) as f:
        card = json.load(f)
    manifest = read_manifest(layout.prepared)
    corpora = card["corpora"]
    assert corpora["train"]["spec"] == config.data.train
    for key in ("lines", "written", "truncated", "skipped"):
        assert corpora["train"][key] == manifest["counts"][key], key
    assert corpora["train"]["written"] > 0
    for split, spec, size in (("dev", config.data.dev, 24), ("test", config.data.test, 10)):
        assert corpora[split] == {"spec": spec, "sentences": size}
        evaluation = card["evaluation"][split]
        assert evaluation == {**result[split], "beam_size": config.decode.beam_size}
        assert evaluation["signature"]["bleu"].startswith("nrefs:1|")
    assert card["vocabulary"]["size"] == Tokenizer(layout.spm).vocab_size
    training = card["training"]
    for key in ("step", "training_seconds", "precision", "checkpoint_steps", "alpha"):
        assert training[key] == result[key], key
    assert training["step"] == config.train.steps and training["precision"] == "float32"
    assert card["decoding"]["alpha"] == result["alpha"]
    # The confidence's map, refitted from the export's own answers on the dev sentences.
    pairs = read_pairs(config.data.dev)
    loaded = tf.saved_model.load(result["saved_model"])
    nbest = loaded.signatures["translate_nbest"](text=tf.constant([s for s, _ in pairs]))
    scores = np.asarray(nbest["scores"], "float64")
    hypotheses = [t.decode("utf-8") for t in np.asarray(nbest["translations"])[:, 0]]
    x = calib.features(scores[:, 0], scores[:, 0] - scores[:, 1])
    chrf = calib.sentence_chrf(hypotheses, [r for _, r in pairs])
    fitted = calib.fit_calibration(x, chrf / 100.0)
    report = calib.calibration_report(calib.apply_calibration(fitted, x), hypotheses,
                                      [r for _, r in pairs], chrf)  # fmt: skip
    calibration = card["calibration"]
    assert calibration["fitted"] and calibration["sentences"] == len(pairs)
    for key, value in fitted.items():
        assert calibration[key] == pytest.approx(value, rel=1e-3, abs=1e-3), key
    for key in ("spearman_chrf", "mean_confidence"):
        assert calibration[key] == pytest.approx(report[key], abs=2e-3), key
    assert calibration["mean_sentence_chrf"] == pytest.approx(report["mean_sentence_chrf"])


@pytest.mark.scenario
def test_export_select_on_dev_from_the_command_line(tmp_path, copy_model, toy_spm_path, capsys):
    """`export --select-on-dev` on a workdir whose config averages a fixed number: the flag
    makes the dev set choose, and both the card and `result.json` record the choice."""
    config, layout = _copy_workdir(tmp_path, copy_model, toy_spm_path)
    fixed = dataclasses.replace(
        config,
        decode=dataclasses.replace(config.decode, alpha=1.0),
        export=dataclasses.replace(
            config.export,
            name="copy",
            average_checkpoints=2,
            base_dir=str(tmp_path / "saved_models"),
        ),
    )
    save_config(fixed, layout.config)
    code = cli.main(["export", "--workdir", str(tmp_path), "--select-on-dev"])
    assert code == 0, capsys.readouterr().err
    path = str(tmp_path / "saved_models" / "copy" / "1")
    assert f"to {path}" in capsys.readouterr().out
    with open(os.path.join(path, "assets.extra", "model_card.json")) as f:
        card = json.load(f)
    selection = card["training"]["selection"]
    assert len(selection["candidates"]) == 4 and selection["sentences"] == 40
    assert len(selection["screened"]["greedy_dev_bleu"]) == 3  # steps 300; 200-300; 100-300
    tokenizer = Tokenizer(layout.spm)
    again = final_model(
        _plan(fixed), layout, tokenizer.vocab_size, tokenizer, read_pairs(config.data.dev),
        report=lambda line: None, select=True,
    )  # fmt: skip
    timeless = lambda d: {k: v for k, v in d.items() if k != "seconds"}  # noqa: E731
    assert timeless(selection) == timeless(again.selection)
    with open(layout.result) as f:
        (recorded,) = json.load(f)["exports"]
    assert recorded["saved_model"] == path and recorded["selection"] == selection
    assert (recorded["checkpoint_steps"], recorded["alpha"]) == (again.steps, again.alpha)


def test_export_select_on_dev_decodes_over_the_exports_shortlist(
    tmp_path, toy_spm_path, monkeypatch
):
    """`export --select-on-dev` chooses over the lexical table its SavedModel will decode over
    (the `ExportPlan`'s, as `train`'s choice does), not over the whole vocabulary."""
    import keras_transformer.data.shortlist as shortlist_module
    import keras_transformer.final_model as final_module

    layout = Workdir(str(tmp_path))
    shutil.copy(toy_spm_path, layout.spm)
    save_config(tiny_config(tmp_path, decode=dict(alpha=1.0)), layout.config)
    table, seen = object(), []  # the workdir's table, as `resolve_export_plan` reads it

    class Chosen(Exception):
        pass

    def choose(*args, **kwargs):
        seen.append(args[-1])  # its `shortlist`
        raise Chosen

    monkeypatch.setattr(shortlist_module, "export_shortlist", lambda layout, required: table)
    monkeypatch.setattr(final_module, "select_on_dev", choose)
    with pytest.raises(Chosen):
        cli.main(["export", "--workdir", str(tmp_path), "--select-on-dev"])
    assert seen == [table]


@pytest.mark.scenario
def test_average_and_select_on_dev_exclude_each_other(tmp_path, capsys):
    code = cli.main(["export", "--workdir", str(tmp_path), "--average", "2", "--select-on-dev"])
    assert code == 2
    assert "--average and --select-on-dev exclude each other" in capsys.readouterr().err


# ------------------------------------------------------------------ a choice with real spread
# The trained copy model (conftest.py's `copy_model`) written as three checkpoints with more or
# less noise: the candidates' dev BLEU differ, and the choice must be the recomputed maximum.


def _copy_workdir(root, copy_model, toy_spm_path):
    import _inference_fixtures as fx

    layout = Workdir(str(root))
    os.makedirs(layout.checkpoints)
    shutil.copy(toy_spm_path, layout.spm)
    pairs = fx.dev_pairs(48)
    for side, column in (("src", 0), ("tgt", 1)):
        with open(root / f"dev.{side}", "w") as f:
            f.write("".join(p[column] + "\n" for p in pairs))
    config = from_dict(
        {
            "model": dict(fx.MODEL_KWARGS),
            "data": dict(
                dev=f"text:{root}/dev.src,{root}/dev.tgt",
                max_source_length=fx.MAX_SOURCE_LENGTH,
                max_target_length=fx.MAX_SOURCE_LENGTH,
            ),
            "train": dict(keep_checkpoints=3),
            "decode": dict(beam_size=2, alpha="auto", max_extra_length=8, batch_size=8),
            "export": dict(average_checkpoints="auto", select_max_sentences=40),
            "runtime": dict(workdir=str(root)),
        },
        name="copy",
    )
    save_config(config, layout.config)
    rng = np.random.default_rng(0)
    weights = copy_model.get_weights()
    for step, noise in ((100, 0.9), (200, 0.4), (300, 0.15)):
        model = build_transformer(config.model, copy_model.vocab_size)
        model.set_weights(
            [w + noise * w.std() * rng.standard_normal(w.shape).astype(w.dtype) for w in weights]
        )
        save_model_weights(model, layout.checkpoint(step))
    return config, layout


@pytest.mark.scenario
@pytest.mark.parametrize("screen", [0, 40])
def test_the_choice_is_the_recomputed_maximum_where_the_candidates_differ(
    tmp_path, copy_model, toy_spm_path, screen
):
    """Without screening (0) every candidate is decoded at the beam; with it, the two best of
    the three checkpoint sets by greedy BLEU are, and the choice is the maximum among those."""
    config, layout = _copy_workdir(tmp_path, copy_model, toy_spm_path)
    config = dataclasses.replace(
        config, export=dataclasses.replace(config.export, select_screen_sentences=screen)
    )
    tokenizer = Tokenizer(layout.spm)
    pairs = read_pairs(config.data.dev)
    lines = []
    plan = _plan(config)
    final = final_model(plan, layout, tokenizer.vocab_size, tokenizer, pairs, report=lines.append)
    candidates = final.selection["candidates"]
    if screen:
        finalists = _finalists(config, layout, tokenizer, final.selection["screened"])
        assert {(tuple(c["steps"]), c["kind"]) for c in candidates} == finalists
        assert len(candidates) == 4  # 2 of the 3 sets (300; 200-300; 100-300) x 2 alphas
    else:
        assert "screened" not in final.selection
        assert len(candidates) == 6  # step 300; 200-300; 100-300; x alpha 0.6, 1.0
    recomputed = [
        _dev_bleu(config, layout, tokenizer, c["steps"], "last", c["alpha"]) for c in candidates
    ]
    assert recomputed == [c["dev_bleu"] for c in candidates]
    assert len(set(recomputed)) >= (2 if screen else 3), recomputed  # a choice to make
    best = max(recomputed)
    simplest = min(
        (c for c in candidates if c["dev_bleu"] == best),
        key=lambda c: (len(c["steps"]), c["alpha"] != PAPER_ALPHA),
    )
    assert final.selection["chosen"] == simplest
    assert (final.steps, final.alpha) == (simplest["steps"], simplest["alpha"])
    # The model returned holds the chosen weights.
    reference = build_transformer(config.model, tokenizer.vocab_size)
    average_checkpoints(reference, [layout.checkpoint(s) for s in simplest["steps"]])
    for a, b in zip(final.model.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert any(line.startswith("chose ") for line in lines)
    # Without auto, the paper's recipe: the average of the last N, no choice.
    fixed = dataclasses.replace(
        config,
        decode=dataclasses.replace(config.decode, alpha=1.0),
        export=dataclasses.replace(config.export, average_checkpoints=2),
    )
    plain = final_model(_plan(fixed), layout, tokenizer.vocab_size, report=lines.append)
    assert plain.steps == [200, 300] and plain.selection is None and plain.alpha is None


@pytest.mark.scenario
def test_a_deadline_passed_keeps_only_the_first_finalist(tmp_path, copy_model, toy_spm_path):
    """At the end of a `train.max_minutes` budget with no time left, the choice decodes the
    best-screened finalist at the beam (every alpha) and no other: the scoring and the export
    still have to fit."""
    config, layout = _copy_workdir(tmp_path, copy_model, toy_spm_path)
    tokenizer = Tokenizer(layout.spm)
    lines = []
    final = final_model(
        _plan(config), layout, tokenizer.vocab_size, tokenizer, read_pairs(config.data.dev),
        report=lines.append, deadline=time.perf_counter() - 1.0, after_sentences=100,
    )  # fmt: skip
    screened = final.selection["screened"]["greedy_dev_bleu"]
    first = max(screened, key=lambda e: (e["dev_bleu"], -len(e["steps"])))
    assert {tuple(c["steps"]) for c in final.selection["candidates"]} == {tuple(first["steps"])}
    assert len(final.selection["candidates"]) == 2  # its two alphas
    assert any("leaves no time for 1 more finalist" in line for line in lines)


class _ScriptedEvaluator:
    """A `DevEvaluator` stand-in whose dev BLEU at each step is given."""

    def __init__(self, bleu):
        self.bleu = bleu
        self.scored = []

    def skips(self, step):
        return False

    def score(self, step):
        self.scored.append(step)
        return {"bleu": self.bleu[step]}, []


@pytest.mark.scenario
def test_keep_best_keeps_the_k_best_scored_steps_across_a_resume(tmp_path):
    import keras

    from keras_transformer.training.run.callbacks import StepCheckpoint
    from keras_transformer.training.run.dev_evaluation import KeepBest

    bleu = {2: 5.0, 4: 9.0, 6: 7.0, 8: 9.0, 10: 3.0, 12: 8.0}
    layout = Workdir(str(tmp_path))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.random.rand(12, 3), np.random.rand(12, 2)
    evaluator = _ScriptedEvaluator(bleu)
    for epochs in ((0, 3), (3, 6)):  # two fits: the second one reads best/scores.json back
        callbacks = [
            StepCheckpoint(layout.checkpoints, 2, keep=100),
            KeepBest(evaluator, layout.best, keep=3, every=2),
        ]
        model.fit(x, y, batch_size=6, initial_epoch=epochs[0], epochs=epochs[1], verbose=0,
                  callbacks=callbacks, shuffle=False)  # fmt: skip
    scores, kept = read_best(layout.best)
    assert scores == bleu and evaluator.scored == sorted(bleu)
    assert kept == [4, 8, 12]  # 9.0, 9.0 (the earlier first), 8.0
    files = sorted(f for f in os.listdir(layout.best) if f.endswith(".weights.h5"))
    assert files == ["ckpt-12.weights.h5", "ckpt-4.weights.h5", "ckpt-8.weights.h5"]
    for step in kept:  # the weights of that step
        with (
            h5py.File(checkpoint_path(layout.best, step)) as a,
            h5py.File(layout.checkpoint(step)) as b,
        ):
            assert _h5_arrays(a) and _h5_arrays(a) == _h5_arrays(b)


def _h5_arrays(f):
    arrays = {}
    f.visititems(lambda name, obj: arrays.update({name: obj[()].tobytes()})
                 if hasattr(obj, "shape") else None)  # fmt: skip
    return arrays
