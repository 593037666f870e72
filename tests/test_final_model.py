"""The dev set chooses the final model: `export.average_checkpoints: auto`, `decode.alpha: auto`
and `train.keep_best`, checked by decoding every candidate again here."""

import dataclasses
import json
import os

import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer.config import decoding_settings, load_config
from keras_transformer.data import Tokenizer, read_pairs
from keras_transformer.evaluation import evaluate_bleu
from keras_transformer.final_model import PAPER_ALPHA, final_model, read_best
from keras_transformer.models import build_transformer
from keras_transformer.training import train
from keras_transformer.workdir import Workdir, average_checkpoints, checkpoint_path
from tests.training_helpers import tiny_config


@pytest.fixture(scope="module")
def chosen_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("select")
    config = tiny_config(
        workdir,
        data=dict(dev="synthetic:split=dev,size=24,max_words=8"),
        train=dict(
            steps=40, steps_per_epoch=8, checkpoint_every=8, keep_checkpoints=4, keep_best=2,
            eval_max_sentences=16, warmup_steps=10,
        ),  # fmt: skip
        decode=dict(beam_size=2, alpha="auto"),
        export=dict(average_checkpoints="auto"),
    )
    result = train(config)
    return config, Workdir(str(workdir)), result


def _dev_bleu(config, layout, tokenizer, steps, kind, alpha, settings=None):
    """The dev BLEU of one candidate, recomputed from its files."""
    model = build_transformer(config.model, tokenizer.vocab_size)
    directory = layout.best if kind == "best" else layout.checkpoints
    average_checkpoints(model, [checkpoint_path(directory, s) for s in steps])
    pairs = read_pairs(config.data.dev)[: config.train.eval_max_sentences]
    settings = settings or dataclasses.replace(decoding_settings(config, export=True), alpha=alpha)
    return evaluate_bleu(model, tokenizer, pairs, config.data, settings)[0]["bleu"]


def test_the_chosen_candidate_has_the_best_dev_bleu_of_all_recomputed(chosen_run):
    config, layout, result = chosen_run
    selection = result["selection"]
    tokenizer = Tokenizer(layout.spm)
    candidates = selection["candidates"]
    # The last checkpoint, the averages of the last 2, 3 and 4, each at alpha 0.6 and 1.0 (the
    # best/ ones are new sets only where they differ from these).
    last_sets = {tuple(c["steps"]) for c in candidates if c["kind"] == "last"}
    assert last_sets == {(40,), (32, 40), (24, 32, 40), (16, 24, 32, 40)}
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
    assert selection["sentences"] == 16 and selection["seconds"] >= 0
    assert result["checkpoint_steps"] == simplest["steps"] and result["alpha"] == simplest["alpha"]
    # The export carries the choice: its card records it.
    with open(os.path.join(result["saved_model"], "assets.extra", "model_card.json")) as f:
        card = json.load(f)
    assert card["training"]["selection"]["chosen"] == simplest


def test_keep_best_keeps_the_checkpoints_of_the_best_dev_bleu(chosen_run):
    config, layout, _ = chosen_run
    tokenizer = Tokenizer(layout.spm)
    scores, kept = read_best(layout.best)
    # Scored every checkpoint_every steps but the last (the final model is scored on its own).
    assert sorted(scores) == [8, 16, 24, 32]
    greedy = dataclasses.replace(decoding_settings(config), beam_size=1, alpha=PAPER_ALPHA)
    for step in (16, 24, 32):  # still in checkpoints/ (keep_checkpoints 4): recomputed
        assert _dev_bleu(config, layout, tokenizer, [step], "last", None, greedy) == scores[step]
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


def test_the_same_workdir_chooses_the_same_candidate(chosen_run):
    config, layout, result = chosen_run
    tokenizer = Tokenizer(layout.spm)
    again = final_model(
        load_config(layout.config), layout, tokenizer.vocab_size, tokenizer,
        read_pairs(config.data.dev), report=lambda line: None,
    )  # fmt: skip
    assert again.selection["candidates"] == result["selection"]["candidates"]
    assert (again.steps, again.alpha) == (result["checkpoint_steps"], result["alpha"])


def test_average_and_select_on_dev_exclude_each_other(tmp_path, capsys):
    code = cli.main(["export", "--workdir", str(tmp_path), "--average", "2", "--select-on-dev"])
    assert code == 2
    assert "--average and --select-on-dev exclude each other" in capsys.readouterr().err
