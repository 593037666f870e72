"""The end of a run, after training: what the export serves (`export_plan`, resolved first,
with the vocabulary shortlist it decodes over), the final model (the dev set's choice or the
average of the last checkpoints), its dev and test scores, the export, `result.json` and the
summary printed. The same on either engine; the SavedModel is made where the engine
`exports` (TensorFlow).

The choice, the scores and the export all decode over the one table of `export_plan`, so
that `result.json`'s BLEU and the model card score the search the SavedModel serves."""

import dataclasses
import json
import os
import time

from keras_transformer import local_files
from keras_transformer.config import budget_seconds, export_name
from keras_transformer.evaluation import evaluate_bleu
from keras_transformer.final_model import (
    KEPT_FIGURES,
    KeptFigures,
    figures_key,
    final_model,
    reused_dev_scores,
    shortlist_key,
)
from keras_transformer.training.run import end_reserve
from keras_transformer.training.run.callbacks import tensorboard
from keras_transformer.training.run.fitting import read_split
from keras_transformer.workdir import join, read_json, write_atomically


def finished_result(layout, config):
    """The result of a finished run in this workdir (printed), or None."""
    previous = read_json(layout.result)
    budget = budget_seconds(config.train)[0]
    out_of_time = (
        previous
        and budget is not None
        and previous.get("stopped_by_time_budget")
        and previous.get("training_seconds", 0) >= _training_budget(previous, config, budget)
    )
    if previous and (previous.get("step", 0) >= config.train.steps or out_of_time):
        print(f"{layout.root} already holds a finished run ({previous['step']} steps).", flush=True)
        print_summary(previous)
        return previous
    return None


def _training_budget(previous, config, budget):
    """Training's seconds of the budget: where a finished run moved them (`end_reserve`) under
    the same `train.max_minutes`, its own."""
    kept = previous.get("budget") or {}
    if kept.get("max_minutes") == config.train.max_minutes and "training_seconds" in kept:
        return min(budget, kept["training_seconds"])
    return budget


def budget_json(run, stopper):
    """result.json's `budget`: the minutes, training's part of them (moved by the end's
    estimate, `end_reserve`) and that estimate (None where the reserve was fixed)."""
    kept = end_reserve.read_estimate(run.layout.root, run.config.train)
    return {
        "max_minutes": run.config.train.max_minutes,
        "training_seconds": round(stopper.max_seconds, 1),
        "end_estimate_seconds": kept["end_seconds"] if kept else None,
    }


def worker_done(run, step):
    """A non-chief worker's end (training ended at `step`): the chief averages, scores and
    exports."""
    print(f"Worker finished training at step {step}; the chief evaluates and exports.", flush=True)
    return {"name": run.config.name, "step": step, "chief": False}


def export_plan(run):
    """What the run's SavedModel serves (`export.plan.ExportPlan`, resolved by the function
    `keras-transformer export` resolves it with, from the run's config and no flag), or None on
    an engine that does not export (JAX, whose compiled search takes no shortlist: its scores
    are over the whole vocabulary). Resolved once, before the final model is chosen: the
    choice, the scoring and the export decode over its lexical table (`plan.shortlist`), so
    that result.json's BLEU is that of the search the export serves.

    Its table is `WORKDIR/shortlist.npz`, or built from the prepared pairs when it is missing or
    was built for another SentencePiece model (one line says so); where it cannot be built,
    `export.shortlist: true` refuses (one line) and null goes on over the whole vocabulary (one
    line)."""
    if not run.engine.exports:
        return None
    from keras_transformer.export.plan import resolve_export_plan

    return resolve_export_plan(run.config, run.layout.root, run.export_decoding)


def choose_final_model(run, tokenizer, deadline=None, shortlist=None):
    """The final model (`final_model.final_model`, as `keras-transformer export` makes it): the
    average of the last `export.average_checkpoints` checkpoints (the paper's final models), or
    the candidate the dev set chooses where the config says `auto`.

    It is float32 whatever the training precision, and outside the strategy (decoding and export
    need no replicas): the dev/test figures of `result.json` are those of the exported
    SavedModel, which gives the same answers as a later re-export of the workdir (on JAX, the
    only export: `keras-transformer export --workdir`) and runs on any CPU (bfloat16 decoding is
    slow on CPUs without bfloat16 instructions).

    `deadline` (`time.perf_counter()`): the end of `train.max_minutes`; the choice leaves time
    to score the dev and test sets and to calibrate the export on dev after it. `shortlist`:
    the export's lexical table (`export_plan`'s), which the choice decodes over."""
    config, plan = run.config, run.plan
    dev_pairs = read_split(config.data.dev) if plan.selects else None
    after = 0
    if deadline is not None and dev_pairs:
        from keras_transformer.export.saved_model import MAX_CALIBRATION_SENTENCES

        test_pairs = read_split(config.data.test) or []
        reuses = end_reserve.scoring_reuses_the_choice(plan, run.decoding, len(dev_pairs))
        scoring = 0 if reuses else 1
        after = (scoring * len(dev_pairs) + len(test_pairs)
                 + min(len(dev_pairs), MAX_CALIBRATION_SENTENCES))  # fmt: skip
    return final_model(
        plan, run.layout, tokenizer.vocab_size, tokenizer, dev_pairs, strict=False,
        kept=_kept_figures(run.layout), deadline=deadline, after_sentences=after,
        shortlist=shortlist,
    )  # fmt: skip


def _kept_figures(layout):
    """The figures of the last phases kept so far (a stopped run goes on from them)."""
    return KeptFigures(join(layout.root, KEPT_FIGURES))


def score(run, final, tokenizer, step, stopper, shortlist=None):
    """sacreBLEU / chrF of the final model (a `FinalModel`) on the dev and test sets (the
    `decode` settings, with the length penalty chosen on dev if any), decoded over
    `shortlist` (the export's lexical table, `export_plan`'s; None: the whole vocabulary)."""
    config, layout = run.config, run.layout
    settings = run.decoding.without_sampling()  # BLEU of the search
    if final.alpha is not None:
        settings = dataclasses.replace(settings, alpha=final.alpha)
    result = {
        "name": config.name,
        "step": step,
        "backend": run.engine.backend,
        "stopped_by_time_budget": stopper.out_of_time,
        "training_seconds": round(stopper.elapsed, 1),
        "beam_size": config.decode.beam_size,
        "checkpoints": layout.checkpoints,
        "averaged_checkpoints": len(final.steps),
        "checkpoint_steps": final.steps,
        "alpha": settings.alpha,
        "precision": config.runtime.mixed_precision or "float32",
        "logs": layout.logs,
    }
    if final.selection:
        result["selection"] = final.selection
    cache, kept = {}, _kept_figures(layout)
    key = figures_key(
        steps=final.steps, settings=dataclasses.asdict(settings), data=config.data,
        shortlist=shortlist_key(shortlist),
    )  # fmt: skip
    summary = tensorboard()
    for split, spec in (("dev", config.data.dev), ("test", config.data.test)):
        pairs = read_split(spec)
        if not pairs:
            continue
        scores = kept.get("scores", key, split)
        if scores is None and split == "dev":
            # The choice decoded these sentences with these settings already: not twice.
            scores = reused_dev_scores(final, settings, len(pairs), shortlist)
        if scores is None:
            scores, _ = evaluate_bleu(
                final.model, tokenizer, pairs, config.data, settings, _cache=cache,
                stop_phase="the final model's scoring", shortlist=shortlist,
            )  # fmt: skip
            kept.put("scores", key, split, scores)
        result[split] = scores
        if summary is not None:
            writer = summary.create_file_writer(os.path.join(layout.logs, split))
            with writer.as_default(step=step):
                summary.scalar(f"final_{split}_bleu", scores["bleu"])
            writer.flush()
    return result


def export(run, model, tokenizer, result=None, alpha=None, plan=None):
    """Exports the SavedModel as `plan` says (`export_plan`, resolved before the scoring; its
    decoding settings with the length penalty `alpha` chosen on dev) where the engine
    `exports` (TensorFlow); returns its path (None on JAX, where `keras-transformer export
    --workdir` on TensorFlow makes the same one).

    Its model card gets the run's (resolved) config, the manifest's counts and `result`'s
    steps, time, precision and scores; the dev set calibrates its confidence (on the scores of
    its own search, over its shortlist)."""
    if not run.engine.exports:
        return None
    from keras_transformer.data.prepare import read_manifest
    from keras_transformer.export.card import card_facts
    from keras_transformer.export.plan import run_export

    config = run.config
    try:
        manifest = read_manifest(run.layout.prepared)
    except (OSError, ValueError):
        manifest = None
    plan = export_plan(run) if plan is None else plan
    if alpha is not None:  # chosen on dev
        plan = dataclasses.replace(plan, settings=dataclasses.replace(plan.settings, alpha=alpha))
    facts = card_facts(config, manifest, result, tokenizer.vocab_size)
    name = export_name(config, run.layout.root)
    card = (facts, read_split(config.data.dev))
    return run_export(plan, model, tokenizer, config.export.base_dir, name, card)


def finish(run, result):
    """Writes `result.json` (whole or absent), drops the kept figures, prints the summary."""
    result["wall_seconds"] = round(time.time() - run.started, 1)
    # Whole or absent (a full disk leaves no torn result.json that would end the next run).
    write_atomically(run.layout.result, json.dumps(result, indent=2))
    kept, gfile = join(run.layout.root, KEPT_FIGURES), local_files.gfile()
    if gfile.exists(kept):
        gfile.remove(kept)
    print_summary(result)
    return result


def print_summary(result):
    lines = [f"Finished {result['name']} at step {result['step']}."]
    for split in ("dev", "test"):
        scores = result.get(split)
        if scores:
            lines.append(
                f"  {split} sacreBLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  "
                f"({scores['sentences']} sentences, beam {result['beam_size']})"
            )
    selection = result.get("selection")
    if selection:
        lines.append(
            f"  chosen on {selection['sentences']} dev sentences in {selection['seconds']}s: "
            f"{selection['chosen']['description']}"
        )
        for c in selection["candidates"]:
            lines.append(f"    dev BLEU {c['dev_bleu']:6.2f}  {c['description']}")
    lines.append(f"  checkpoints: {result['checkpoints']}")
    lines.append(f"  TensorBoard: tensorboard --logdir {result['logs']}")
    if result.get("saved_model"):
        lines.append(f"  SavedModel:  {result['saved_model']}")
    elif result.get("backend") == "jax":
        root = os.path.dirname(result["checkpoints"].rstrip("/"))
        lines.append(
            "  SavedModel:  KERAS_BACKEND=tensorflow keras-transformer export --workdir " + root
        )
    else:
        lines.append("  SavedModel:  not exported")
    print("\n".join(lines), flush=True)
