"""The model card every export carries: `assets.extra/model_card.json` and `model_card.md`.

What the model was trained on (corpus specs and counts from the prepared data's manifest), how
(config, steps, time, precision), how well it scores (sacreBLEU and chrF with their signatures),
how it decodes (settings, speed measured at export), and how far its confidence can be trusted
(the calibration's figures). TF Serving ignores `assets.extra`; `keras-transformer info` prints
the card.
"""

import dataclasses
import datetime
import json
import os

CARD_JSON = "model_card.json"
CARD_MARKDOWN = "model_card.md"


def card_facts(config=None, manifest=None, result=None, vocab_size=None):
    """The training-side facts of a card from what a workdir holds (any may be None).

    Args:
        config: the `ExperimentConfig` (or its dict).
        manifest: the prepared data's manifest (`keras_transformer.data.prepare.read_manifest`).
        result: the training result (`result.json`: steps, seconds, precision, dev/test scores,
            and a fine-tuned run's parent, `init_from`: path, checkpoint, step).
        vocab_size: the vocabulary's size.
    """
    if dataclasses.is_dataclass(config):
        config = dataclasses.asdict(config)
    config = config or {}
    data = config.get("data", {})
    result = result or {}
    corpora = {}
    for split in ("train", "dev", "test"):
        if data.get(split):
            corpora[split] = {"spec": data[split]}
    if manifest and "train" in corpora:
        counts = manifest.get("counts", {})
        corpora["train"].update(
            {k: counts[k] for k in ("lines", "written", "truncated", "skipped") if k in counts}
        )
    for split in ("dev", "test"):
        if split in corpora and result.get(split):
            corpora[split]["sentences"] = result[split].get("sentences")
    return {
        "config": config,
        "corpora": corpora,
        "vocabulary": {"size": vocab_size, "model": "SentencePiece (in the graph)"},
        "training": {
            key: result[key]
            for key in (
                "step",
                "training_seconds",
                "precision",
                "averaged_checkpoints",
                "checkpoint_steps",
                "alpha",
                "selection",
                "init_from",
            )  # fmt: skip
            if key in result
        },
        # Measured at the end of training with the `decode` settings of that run (its beam).
        "evaluation": {
            split: {**result[split], "beam_size": result.get("beam_size")}
            for split in ("dev", "test")
            if result.get(split)
        },
    }


def build_card(facts, name, decoding, calibration, speed, signatures):
    """The card's dict: `facts` (from `card_facts`) plus what the export itself knows."""
    from keras_transformer import __version__

    card = {
        "name": str(name),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "package": {"name": "keras-transformer", "version": __version__},
    }
    card.update(facts or card_facts())
    card.update(
        {
            "decoding": decoding,
            "calibration": calibration,
            "decoding_speed": speed,
            "signatures": signatures,
        }
    )
    return card


def _table(rows):
    lines = ["| | |", "|---|---|"]
    lines += [f"| {k} | {'' if v is None else v} |" for k, v in rows]
    return lines


def _evaluation_lines(card):
    lines = []
    for split, scores in card.get("evaluation", {}).items():
        signature = scores.get("signature", {})
        lines.append(
            f"- {split}: sacreBLEU {scores.get('bleu')}, chrF {scores.get('chrf')} "
            f"({scores.get('sentences')} sentences, beam {scores.get('beam_size')}, at the end "
            "of training)"
        )
        for metric, label in (("bleu", "BLEU"), ("chrf", "chrF")):
            if metric in signature:
                lines.append(f"  - {label} signature: `{signature[metric]}`")
    return lines or ["- not evaluated (no dev/test set given to the export)"]


def render_markdown(card):
    """The card as Markdown (what `keras-transformer info` prints)."""
    lines = [f"# Model card: {card['name']}", ""]
    lines += [f"Exported {card['created']} by keras-transformer {card['package']['version']}.", ""]
    lines += ["## Data", ""]
    for split, corpus in card.get("corpora", {}).items():
        extra = ", ".join(f"{k} {v}" for k, v in corpus.items() if k != "spec")
        lines.append(f"- {split}: `{corpus['spec']}`" + (f" ({extra})" if extra else ""))
    lines += [f"- vocabulary: {card.get('vocabulary', {}).get('size')} SentencePiece pieces", ""]
    training = dict(card.get("training", {}))
    parent = training.pop("init_from", None)  # fine-tuning: train.init_from
    lines += ["## Training", ""]
    if parent:
        lines += [f"Fine-tuned from `{parent['checkpoint']}` (step {parent['step']}).", ""]
    selection = training.pop("selection", None)  # the dev set chose (final_model.py)
    lines += _table(training.items()) + [""]
    if selection:
        lines += [
            f"Chosen on {selection['sentences']} dev sentences among "
            f"{len(selection['candidates'])} candidates: {selection['chosen']['description']} "
            f"(dev BLEU {selection['chosen']['dev_bleu']:.2f}).",
            "",
        ]
    lines += ["## Quality", ""] + _evaluation_lines(card) + [""]
    lines += ["## Decoding", ""] + _table(card.get("decoding", {}).items()) + [""]
    speed = card.get("decoding_speed")
    lines += ["## Decoding speed (measured at export, this machine)", ""]
    lines += (_table(speed.items()) if speed else ["not measured (no dev set)"]) + [""]
    calibration = card.get("calibration", {})
    lines += ["## Confidence", ""]
    lines += [
        "`confidence` = sigmoid(bias + score_weight x score + margin_weight x n-best margin), "
        "fitted on the dev set against sentence chrF / 100 (the Spearman and decile figures "
        "below are on those same sentences).",
        "",
    ]
    lines += _table(calibration.items()) + [""]
    lines += ["## Signatures", ""]
    for key, spec in card.get("signatures", {}).items():
        inputs = ", ".join(spec["inputs"])
        outputs = ", ".join(spec["outputs"])
        lines.append(f"- `{key}`: {inputs} -> {outputs}")
    lines += ["", "## Config", "", "```json", json.dumps(card.get("config", {}), indent=2), "```"]
    return "\n".join(lines) + "\n"


def write_card(export_dir, card):
    """Writes `assets.extra/model_card.json` and `model_card.md` under `export_dir` (any
    TensorFlow filesystem)."""
    import tensorflow as tf

    extra = os.path.join(export_dir, "assets.extra")
    tf.io.gfile.makedirs(extra)
    with tf.io.gfile.GFile(os.path.join(extra, CARD_JSON), "w") as f:
        f.write(json.dumps(card, indent=2, default=str))
    with tf.io.gfile.GFile(os.path.join(extra, CARD_MARKDOWN), "w") as f:
        f.write(render_markdown(card))


def read_card_markdown(model_dir):
    """The Markdown card of the SavedModel in `model_dir` (any TensorFlow filesystem). Raises
    FileNotFoundError."""
    import tensorflow as tf

    path = os.path.join(model_dir, "assets.extra", CARD_MARKDOWN)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"no model card at {path}")
    with tf.io.gfile.GFile(path, "r") as f:
        return f.read()
