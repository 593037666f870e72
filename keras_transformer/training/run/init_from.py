"""Fine-tuning: a new run that starts from a trained model's weights and vocabulary.

`train.init_from` (`keras-transformer train --init-from PATH`) names the parent: a training
workdir (its last complete step checkpoint, see `workdir.complete_checkpoints`) or one step
checkpoint `PARENT/checkpoints/ckpt-<step>.weights.h5`. The run writes its own workdir:

- its corpus is prepared with the parent's SentencePiece model (copied to `WORKDIR/spm.model`
  before `prepare`, which then trains none), so token ids mean what they meant to the parent;
- the model starts from the parent's weights (step 0 equals the parent), with a fresh optimizer
  and learning-rate schedule (its own warm-up: `train.warmup_steps`);
- the `model:` section and the vocabulary settings must be the parent's (its `config.yaml`);
  any difference is refused with one line naming the key (dropouts may differ);
- `WORKDIR/init_from.json` records the parent (path, checkpoint, step) on the first start, and
  `result.json` and the export's model card repeat it. A resumed fine-tuning run (killed, then
  run again) restores its own resume state and reads nothing of the parent.
"""

import json
import os

from keras_transformer import hyper_parameters, local_files
from keras_transformer.config import load_config
from keras_transformer.data.tokenizer import adopt_model
from keras_transformer.errors import ConfigError, first_line
from keras_transformer.workdir import (
    CHECKPOINT_PATTERN,
    Workdir,
    complete_checkpoints,
    load_model_weights,
    read_text,
    write_atomically,
)

# The file of the child workdir that records its parent.
RECORD = "init_from.json"
# Keys that must be the parent's: the weights' shapes and meaning, and the vocabulary's.
_MODEL_KEYS = hyper_parameters.WEIGHTS
_DATA_KEYS = ("vocab_size", "spm_model_type")


def _gfile():
    return local_files.gfile()  # tf.io.gfile, or the local disk without TensorFlow (JAX)


def resolve_parent(path):
    """`{"path", "workdir", "checkpoint", "step"}` of a parent given as a workdir or a step
    checkpoint file; `ConfigError` (one line) when it is neither or has no usable checkpoint."""
    from keras_transformer.integrity import checkpoint_problem

    gfile, path = _gfile(), os.fspath(path)
    if gfile.isdir(path):
        workdir = path
        checkpoints = complete_checkpoints(Workdir(path).checkpoints, 1)
        if not checkpoints:
            raise ConfigError(
                f"train.init_from: {path} has no complete step checkpoint "
                "(checkpoints/ckpt-<step>.weights.h5)"
            )
        step, checkpoint = checkpoints[-1]
    else:
        match = CHECKPOINT_PATTERN.match(os.path.basename(path))
        if not match or not gfile.exists(path):
            raise ConfigError(
                f"train.init_from: {path} is neither a training workdir nor a step checkpoint "
                "(WORKDIR/checkpoints/ckpt-<step>.weights.h5)"
            )
        problem = checkpoint_problem(path)
        if problem:
            raise ConfigError(f"train.init_from: {path} is torn or corrupted ({problem})")
        workdir = os.path.dirname(os.path.dirname(path.rstrip("/")))
        step, checkpoint = int(match.group(1)), path
    for needed in (Workdir(workdir).config, Workdir(workdir).spm):
        if not gfile.exists(needed):
            raise ConfigError(f"train.init_from: {workdir} is not a training workdir: no {needed}")
    return {"path": path, "workdir": workdir, "checkpoint": checkpoint, "step": step}


def check_compatible(config, parent):
    """Refuses (`ConfigError`, one line) a config whose model or vocabulary settings differ
    from the parent's `config.yaml`, naming the first key that differs."""
    theirs = load_config(Workdir(parent["workdir"]).config)
    for section, keys in (("model", _MODEL_KEYS), ("data", _DATA_KEYS)):
        for key in keys:
            mine, parents = (
                getattr(getattr(config, section), key),
                getattr(getattr(theirs, section), key),
            )
            if mine != parents:
                raise ConfigError(
                    f"train.init_from: {section}.{key}: {parents} in the parent "
                    f"({parent['workdir']}), {mine} here; fine-tuning keeps the parent's model "
                    "and vocabulary"
                )


def recorded_parent(config):
    """The parent recorded in the workdir by its first start, or None."""
    path = os.path.join(Workdir.of(config).root, RECORD)
    if not _gfile().exists(path):
        return None
    return json.loads(read_text(path))


def prepare_parent(config):
    """Before `prepare`: resolves and checks the parent, installs its vocabulary as
    `WORKDIR/spm.model` and records it in `WORKDIR/init_from.json` (all once: a later run
    reads the record). Returns the parent's dict, or None without `train.init_from`.

    Raises:
        ConfigError: no usable parent, another model shape or vocabulary, or a workdir that
            already holds a different vocabulary.
    """
    if not config.train.init_from:
        return None
    recorded = recorded_parent(config)
    if recorded is not None:
        return recorded
    parent = resolve_parent(config.train.init_from)
    check_compatible(config, parent)
    layout, vocabulary = Workdir.of(config), Workdir(parent["workdir"]).spm
    _gfile().makedirs(layout.root)
    if not adopt_model(vocabulary, layout.spm):
        raise ConfigError(
            f"train.init_from: {layout.spm} is not the parent's vocabulary ({vocabulary}); use "
            "another --workdir"
        )
    write_atomically(os.path.join(layout.root, RECORD), json.dumps(parent, indent=1))
    return parent


def load_parent_weights(model, config, parent, has_resume_state):
    """Loads the parent's checkpoint into `model` unless the workdir holds a resume state (a
    resumed fine-tuning run continues from its own backups, which `fit` restores);
    `has_resume_state(directory)` is the engine's (`training.engines`)."""
    if parent is None or has_resume_state(Workdir.of(config).backup):
        return
    try:
        load_model_weights(model, parent["checkpoint"])
    except (ValueError, OSError) as e:
        raise ConfigError(
            f"train.init_from: cannot load {parent['checkpoint']}: {first_line(e)}"
        ) from None
    print(f"starting from {parent['checkpoint']} (step {parent['step']})", flush=True)
