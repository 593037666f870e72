"""The dev set chooses the export: a `configs/small.yaml` run (where `export.average_checkpoints`
and `decode.alpha` are `auto`) against the export of its last checkpoint at alpha 1.0 (the
config's earlier fixed choice), on the dev and test sets of a parallel corpus.

Stage `train` runs `keras-transformer train` for `--minutes` of training (the machine must be
otherwise idle: the minutes bound the steps); its end chooses among the candidates on the first
`export.select_max_sentences` dev sentences and exports the choice. Stage `evaluate` (any time
after, not a timing) exports the last checkpoint at alpha 1.0 with `keras-transformer export
--average 1 --alpha 1.0` and scores both SavedModels with `keras-transformer evaluate` on the
whole dev and test sets (with `--reselect`, the choice is first made again by `keras-transformer
export --select-on-dev` on the trained workdir, with this checkout's settings); it prints one
JSON line (`benchmarks/common.py`'s `emit`; with `BENCH_LABEL` set, also appended to
`benchmarks/results/select_on_dev.jsonl`).

Stage `compare` (after `train`, not a timing of the run) chooses again on the trained workdir
decoding every candidate at the beam (`export.select_screen_sentences: 0`, the choice before the
screening) and prints the screened choice against it, with the run's budget, training and end
seconds (training's part as the end's estimate moved it, `end_reserve`), the estimate, and
whether training and the end together kept `train.max_minutes` (JSON line
`select_on_dev_screened`).

    PYTHONPATH=$PWD python benchmarks/select_on_dev.py --stage train --work workdirs/sel1 --seed 42
    PYTHONPATH=$PWD BENCH_LABEL=run1 python benchmarks/select_on_dev.py --stage evaluate \\
        --work workdirs/sel1
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-m", "keras_transformer.cli"]


def _spec(args, split):
    corpus = os.path.abspath(args.corpus)
    return f"text:{corpus}/{split}.{args.src},{corpus}/{split}.{args.tgt}"


def train(args):
    command = CLI + [
        "train", "--config", args.config, "--workdir", os.path.join(args.work, "workdir"),
        "--set", f"data.train={_spec(args, 'train')}",
        "--set", f"data.dev={_spec(args, 'dev')}",
        "--set", f"data.test={_spec(args, 'test')}",
        "--set", f"train.max_minutes={args.minutes}",
        "--set", f"train.seed={args.seed}",
        "--set", f"export.base_dir={os.path.join(args.work, 'saved_models')}",
        "--set", "export.name=chosen",
    ]  # fmt: skip
    with open(os.path.join(args.work, "train.log"), "w") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)


def _bleu(args, model, split):
    """`(BLEU, chrF)` of a SavedModel on a split, as `keras-transformer evaluate` prints them."""
    corpus = os.path.abspath(args.corpus)
    out = subprocess.run(
        CLI + ["evaluate", "--model", model, "--source", f"{corpus}/{split}.{args.src}",
               "--reference", f"{corpus}/{split}.{args.tgt}", "--batch-size", "64"],
        check=True, capture_output=True, text=True, cwd=REPO,
    ).stdout  # fmt: skip
    scores = json.loads(out.strip().splitlines()[-1])
    return scores["bleu"], scores["chrf"]


def _reselect(args, workdir):
    """`(SavedModel path, selection)`: the choice made again by `export --select-on-dev` on the
    trained workdir (with this checkout's `export.select_max_sentences`)."""
    output = os.path.join(args.work, "reselected")
    subprocess.run(
        CLI + ["export", "--workdir", workdir, "--select-on-dev", "--output", output],
        check=True, capture_output=True, cwd=REPO,
    )  # fmt: skip
    model = os.path.join(output, "chosen")
    version = max(os.listdir(model), key=int)
    with open(os.path.join(model, version, "assets.extra", "model_card.json")) as f:
        return os.path.join(model, version), json.load(f)["training"]["selection"]


def evaluate(args):
    workdir = os.path.join(args.work, "workdir")
    with open(os.path.join(workdir, "result.json")) as f:
        result = json.load(f)
    chosen_model, selection = result["saved_model"], result["selection"]
    if args.reselect:
        chosen_model, selection = _reselect(args, workdir)
    last = os.path.join(args.work, "last_alpha1")
    if not os.path.isdir(last):
        subprocess.run(
            CLI + ["export", "--workdir", workdir, "--average", "1", "--alpha", "1.0",
                   "--output", last],
            check=True, capture_output=True, cwd=REPO,
        )  # fmt: skip
    last_model = os.path.join(last, "chosen")
    figures = {}
    for name, model in (("chosen", chosen_model), ("last_alpha1", last_model)):
        for split in ("dev", "test"):
            figures[f"{name}_{split}_bleu"], figures[f"{name}_{split}_chrf"] = _bleu(
                args, model, split
            )
    emit(
        figure="select_on_dev",
        system="keras-transformer",
        corpus=args.corpus,
        seed=args.seed,
        chosen_by="export --select-on-dev" if args.reselect else "train",
        steps=result["step"],
        train_min=round(result["training_seconds"] / 60, 1),
        precision=result.get("precision"),
        chosen=selection["chosen"]["description"],
        selection_sentences=selection["sentences"],
        selection_seconds=selection["seconds"],
        candidates=[[c["description"], c["dev_bleu"]] for c in selection["candidates"]],
        chosen_not_below_last_alpha1_on_dev=figures["chosen_dev_bleu"]
        >= figures["last_alpha1_dev_bleu"],
        **figures,
    )


def compare(args):
    """The screened choice `train` made against decoding every candidate at the beam (the
    choice before `export.select_screen_sentences`), on the same trained workdir and dev
    sentences; and whether the run kept its `train.max_minutes` budget."""
    import dataclasses

    from keras_transformer.config import budget_seconds, decoding_settings, load_config
    from keras_transformer.data import Tokenizer, read_pairs
    from keras_transformer.final_model import Plan, final_model
    from keras_transformer.workdir import Workdir

    layout = Workdir(os.path.join(args.work, "workdir"))
    with open(layout.result) as f:
        result = json.load(f)
    config = load_config(layout.config)
    every = dataclasses.replace(
        config, export=dataclasses.replace(config.export, select_screen_sentences=0)
    )
    tokenizer = Tokenizer(layout.spm)
    plan = Plan.of(every, decoding_settings(every, export=True))
    exhaustive = final_model(
        plan, layout, tokenizer.vocab_size, tokenizer, read_pairs(config.data.dev),
        report=lambda line: None,
    ).selection  # fmt: skip
    screened = result["selection"]
    training_budget, end_budget = budget_seconds(config.train)
    budget = result.get("budget") or {}  # training's part moved by the end's estimate
    training_budget = budget.get("training_seconds", training_budget)
    end_budget = config.train.max_minutes * 60 - training_budget
    used = result["training_seconds"] + result.get("end_seconds", 0.0)
    emit(
        figure="select_on_dev_screened",
        system="keras-transformer",
        corpus=args.corpus,
        seed=args.seed,
        steps=result["step"],
        budget_min=config.train.max_minutes,
        training_budget_s=training_budget,
        end_budget_s=end_budget,
        training_s=result["training_seconds"],
        end_s=result.get("end_seconds"),
        end_estimate_s=budget.get("end_estimate_seconds"),
        training_plus_end_s=round(used, 1),
        budget_held=used <= config.train.max_minutes * 60,
        wall_s=result["wall_seconds"],
        precision=result.get("precision"),
        selection_sentences=screened["sentences"],
        screened_seconds=screened["seconds"],
        screened_chosen=screened["chosen"]["description"],
        screened_chosen_dev_bleu=screened["chosen"]["dev_bleu"],
        screened_candidates=len(screened["candidates"]),
        exhaustive_seconds=exhaustive["seconds"],
        exhaustive_chosen=exhaustive["chosen"]["description"],
        exhaustive_chosen_dev_bleu=exhaustive["chosen"]["dev_bleu"],
        exhaustive_candidates=len(exhaustive["candidates"]),
        screened_minus_exhaustive_dev_bleu=round(
            screened["chosen"]["dev_bleu"] - exhaustive["chosen"]["dev_bleu"], 2
        ),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=("train", "evaluate", "both", "compare"), default="both")
    parser.add_argument(
        "--corpus", default=os.path.join(REPO, "data", "tatoeba-en-de")
    )
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--config", default=os.path.join(REPO, "configs", "small.yaml"))
    parser.add_argument("--work", required=True)
    parser.add_argument(
        "--reselect",
        action="store_true",
        help="evaluate: choose again with export --select-on-dev on the trained workdir",
    )
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    if args.stage in ("train", "both"):
        train(args)
    if args.stage in ("evaluate", "both"):
        evaluate(args)
    if args.stage == "compare":
        compare(args)


if __name__ == "__main__":
    main()
