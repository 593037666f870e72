"""`train(config)` on Keras's JAX backend (`KERAS_BACKEND=jax`): `model.fit` on numpy batches,
with no TensorFlow needed once the data is prepared.

What it shares with the TensorFlow trainer (`training.trainer`): the workdir's layout, the
model (`build_transformer`), the recipe (`recipe.compile_model`: the masked label-smoothed loss,
the metrics, Adam/AdamW on the config's schedule), the precision policy, the step checkpoints
(`checkpoints/ckpt-<step>.weights.h5` with their checksums, which `keras-transformer export`
reads on the TensorFlow backend into the same SavedModel) and `result.json`.

What is its own: the batches are numpy (`data.records`: the prepared TFRecord shards read in
plain Python); the resume state is `backup/state-<step>.npz` (every model variable, dropout's
seed states included, every optimizer variable and the data position), so a run killed at any
point and run again ends with the weights of an uninterrupted run; dev BLEU (greedy) is printed
and appended to `logs/dev_bleu.jsonl` after each epoch; with several local devices the model is
trained under `keras.distribution.DataParallel` over all of them. As on TensorFlow,
`data.tokens_per_batch` is per device and micro-batch: a step's batch holds `tokens_per_batch` x
devices x `train.gradient_accumulation_steps` tokens (its rows a multiple of devices x k), and
`train.gradient_accumulation_steps` k > 1 sums k micro-batches' gradients inside the step
(exactly the whole batch's gradient; `models/_train_step.py`). The final model is the last
step's; export it with `keras-transformer export --workdir ...` (TensorFlow).

TensorFlow-only (see docs/guides/jax.md): tf.distribute strategies (multi-worker, TPUStrategy),
`runtime.mixed_precision: auto`, `train.init_from`, `train.max_minutes`, TensorBoard's logs,
the checkpoint written on SIGTERM, the dev set's choice of the exported model, the exported
SavedModel itself.
"""

import dataclasses
import io
import json
import math
import os
import sys
import time

import keras
import numpy as np

from keras_transformer.config import EOS_ID, decoding_settings, save_config
from keras_transformer.data.records import numpy_batches, prepared_pairs
from keras_transformer.errors import UsageError
from keras_transformer.models import build_transformer
from keras_transformer.training.recipe import compile_model
from keras_transformer.workdir import (
    Workdir,
    join,
    list_checkpoints,
    read_json,
    save_model_weights,
    write_atomically,
)


def train(config):
    """Trains `config`'s model on the JAX backend and writes the workdir (see the module's
    docstring); returns the dict written to `result.json`. Running it again on the same workdir
    resumes from the last resume state exactly; a finished run is returned as it is."""
    _check_supported(config)
    layout = Workdir.of(config)
    previous = read_json(layout.result)
    if previous and previous.get("step", 0) >= config.train.steps:
        print(f"{layout.root} already holds a finished run ({previous['step']} steps).")
        return previous
    started = time.time()
    # The `decode:` settings, once: dev BLEU (greedy) during training and the final scoring.
    settings = decoding_settings(config).without_sampling()
    devices = _distribute()
    keras.utils.set_random_seed(config.train.seed)
    pairs, processor = _prepared(config, layout)
    policy = config.runtime.mixed_precision
    model = build_transformer(
        config.model,
        processor.get_piece_size(),
        dtype=None if policy in (None, "float32") else policy,
    )
    compile_model(model, config, jit_compile=True)
    position = restore_state(model, layout.backup)
    # data.tokens_per_batch is per device and micro-batch, as on TensorFlow (per replica).
    share = devices * config.train.gradient_accumulation_steps
    batches = numpy_batches(
        pairs, config.data, seed=config.train.seed, start=position,
        tokens_per_batch=config.data.tokens_per_batch * share, batch_multiple=share,
    )  # fmt: skip
    _fit(config, layout, model, batches, processor, position, settings)
    return _finish(config, layout, model, processor, started, settings)


def _check_supported(config):
    t, runtime = config.train, config.runtime
    problems = []
    if runtime.mixed_precision == "auto":
        problems.append("runtime.mixed_precision: auto (name float32 or mixed_bfloat16)")
    if runtime.strategy not in ("auto", "default", "mirrored"):
        problems.append(f"runtime.strategy: {runtime.strategy}")
    if t.init_from:
        problems.append("train.init_from")
    if t.max_minutes is not None:
        problems.append("train.max_minutes (train for train.steps)")
    if problems:
        raise UsageError(
            "on the JAX backend, not supported: " + "; ".join(problems)
            + " (train with the TensorFlow backend for these)"
        )  # fmt: skip


def _distribute():
    """Data parallelism over every local device (`keras.distribution.DataParallel`) where
    there are several; returns the number of devices (batch rows are a multiple of it)."""
    devices = keras.distribution.list_devices()
    if len(devices) > 1:
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    return len(devices)


def _prepared(config, layout):
    """`(pairs, sentencepiece processor)` of the workdir's prepared shards: prepared first
    where TensorFlow is installed (`data.prepare`, which writes with it); without TensorFlow
    they must be there already (`keras-transformer prepare` on a machine with it)."""
    import sentencepiece as spm

    try:
        import tensorflow  # noqa: F401
    except ImportError:
        if not os.path.exists(join(layout.prepared, "manifest.json")):
            raise UsageError(
                f"no prepared data in {layout.prepared}: without TensorFlow, run "
                "`keras-transformer prepare` on a machine with it and copy the workdir"
            ) from None
    else:
        from keras_transformer.data.prepare import prepare

        prepare(config)
    save_config(config, layout.config)
    processor = spm.SentencePieceProcessor(model_file=join(layout.prepared, "spm.model"))
    return prepared_pairs(layout.prepared), processor


def _fit(config, layout, model, batches, processor, position, settings):
    t = config.train
    initial_epoch = position // t.steps_per_epoch
    epochs = initial_epoch + math.ceil(max(0, t.steps - position) / t.steps_per_epoch)
    callbacks = [
        StateCheckpoints(layout, t.checkpoint_every, t.keep_checkpoints, t.keep_backups, t.steps),
        keras.callbacks.TerminateOnNaN(),
    ]
    dev = _read_split(config.data.dev)[: t.eval_max_sentences]
    if dev:
        path = join(layout.logs, "dev_bleu.jsonl")
        callbacks.append(DevBleu(dev, processor, config.data, settings, path))
    if position < t.steps:
        model.fit(
            batches,
            initial_epoch=initial_epoch,
            epochs=epochs,
            steps_per_epoch=t.steps_per_epoch,
            callbacks=callbacks,
            verbose=1 if sys.stdout.isatty() else 2,
            shuffle=False,  # numpy_batches shuffles (seeded, so a resume skips exactly)
        )
    step = int(model.optimizer.iterations.numpy())
    if step < t.steps:
        raise RuntimeError(f"training stopped at step {step} of {t.steps} (NaN loss?)")


class StateCheckpoints(keras.callbacks.Callback):
    """Every `every` optimizer steps (and at `last`): the step checkpoint (the model's weights,
    as the TensorFlow trainer writes them) and the resume state (`save_state`)."""

    def __init__(self, layout, every, keep, keep_backups, last):
        super().__init__()
        self.layout, self.every, self.keep, self.keep_backups = layout, every, keep, keep_backups
        self.last = last

    def on_train_batch_end(self, batch, logs=None):
        model = self.model  # Keras syncs the JAX state into the variables here
        step = int(model.optimizer.iterations.numpy())
        if step % self.every and step != self.last:
            return
        os.makedirs(self.layout.checkpoints, exist_ok=True)
        save_model_weights(model, self.layout.checkpoint(step))
        save_state(model, self.layout.backup, step, self.keep_backups)
        for _, path in list_checkpoints(self.layout.checkpoints)[: -self.keep]:
            for name in (path, path + ".sha256"):
                if os.path.exists(name):
                    os.remove(name)


def _state_files(directory):
    if not os.path.isdir(directory):
        return []
    names = [n for n in os.listdir(directory) if n.startswith("state-") and n.endswith(".npz")]
    return sorted((int(n[6:-4]), os.path.join(directory, n)) for n in names)


def save_state(model, directory, step, keep=2):
    """Writes `directory/state-<step>.npz` (appearing whole): every variable of the model and
    of its optimizer, by position, and the data position (= the step: one batch per step)."""
    arrays = {f"m{i}": np.asarray(v.numpy()) for i, v in enumerate(model.variables)}
    arrays.update({f"o{i}": np.asarray(v.numpy()) for i, v in enumerate(model.optimizer.variables)})
    buffer = io.BytesIO()
    np.savez(buffer, position=np.int64(step), **arrays)
    write_atomically(os.path.join(directory, f"state-{step}.npz"), buffer.getvalue())
    for _, path in _state_files(directory)[:-keep]:
        os.remove(path)


def restore_state(model, directory):
    """Restores the last resume state of `directory` into `model` (built and compiled);
    returns its data position, 0 when there is none."""
    states = _state_files(directory)
    if not states:
        return 0
    with np.load(states[-1][1]) as saved:
        for prefix, variables in (("m", model.variables), ("o", model.optimizer.variables)):
            for i, v in enumerate(variables):
                v.assign(saved[f"{prefix}{i}"])
        position = int(saved["position"])
    print(f"resumed from step {position} ({states[-1][1]})", flush=True)
    return position


def translate(model, processor, texts, data, settings):
    """`texts` -> translations (strings) with the model's own search (`translate_ids`) on
    this backend, `settings.batch_size` sentences at a time (sources cut to the `data:`
    section's `max_source_length`), in one jitted function of the
    variables' values (`search_function`): each batch is padded to the batch size and its
    sources to a multiple of 8 tokens, so that few shapes compile (padding changes no output)."""
    max_source, rows = data.max_source_length, settings.batch_size
    search = search_function(model, settings)
    values = [v.value for v in model.variables]
    outputs = []
    for start in range(0, len(texts), rows):
        pieces = [processor.encode(t)[: max_source - 1] + [EOS_ID] for t in texts[start:][
            :rows]]  # fmt: skip
        width = -(-max(map(len, pieces)) // 8) * 8
        ids = np.zeros((rows, width), np.int32)
        ids[:, 0] = EOS_ID  # the padding rows: empty sources
        for i, row in enumerate(pieces):
            ids[i, : len(row)] = row
        found = np.asarray(search(values, ids))[: len(pieces)]
        outputs += [processor.decode(_until_eos(row)) for row in found.tolist()]
    return outputs


def search_function(model, settings):
    """`f(values, source_ids) -> output ids`: `translate_ids(model, source_ids, settings)` as
    one `jax.jit` function of the model's variables' values (Keras's `StatelessScope`), so a
    search compiles once per shape instead of running op by op."""
    import jax

    from keras_transformer.decoding import translate_ids

    def search(values, source_ids):
        with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
            return translate_ids(model, source_ids, settings).ids

    return jax.jit(search)


def _until_eos(row):
    return row[: row.index(EOS_ID)] if EOS_ID in row else [i for i in row if i]


def _bleu(model, processor, pairs, data, settings):
    import sacrebleu

    hypotheses = translate(model, processor, [s for s, _ in pairs], data, settings)
    return sacrebleu.corpus_bleu(hypotheses, [[t for _, t in pairs]]).score


class DevBleu(keras.callbacks.Callback):
    """Greedy dev BLEU after each epoch (the `decode:` `settings` at beam 1, the `data:`
    section `data`): printed and appended to `path` (JSON lines)."""

    def __init__(self, pairs, processor, data, settings, path):
        super().__init__()
        self.pairs, self.processor, self.data, self.path = pairs, processor, data, path
        self.settings = settings

    def on_epoch_end(self, epoch, logs=None):
        model = self.model
        step = int(model.optimizer.iterations.numpy())
        greedy = dataclasses.replace(self.settings, beam_size=1)
        bleu = _bleu(model, self.processor, self.pairs, self.data, greedy)
        print(f"step {step}: dev BLEU (greedy) {bleu:.2f}", flush=True)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, "dev_bleu": round(bleu, 2)}) + "\n")


def _read_split(spec):
    from keras_transformer.data.corpora import read_pairs

    return read_pairs(spec) if spec else []


def _finish(config, layout, model, processor, started, settings):
    """Scores the last step's model on dev and test (the `decode` `settings`) and writes
    `result.json`."""
    step = int(model.optimizer.iterations.numpy())
    result = {
        "name": config.name,
        "step": step,
        "backend": "jax",
        "devices": len(keras.distribution.list_devices()),
        "beam_size": settings.beam_size,
        "alpha": settings.alpha,
        "precision": config.runtime.mixed_precision or "float32",
        "checkpoints": layout.checkpoints,
        "checkpoint_steps": [s for s, _ in list_checkpoints(layout.checkpoints)],
        "saved_model": None,  # keras-transformer export --workdir (TensorFlow backend)
    }
    for split, spec in (("dev", config.data.dev), ("test", config.data.test)):
        pairs = _read_split(spec)
        if pairs:
            bleu = _bleu(model, processor, pairs, config.data, settings)
            result[split] = {"bleu": round(bleu, 2)}
    result["wall_seconds"] = round(time.time() - started, 1)
    write_atomically(layout.result, json.dumps(result, indent=2))
    print(f"Finished {config.name} at step {step} on JAX: {json.dumps(result)}", flush=True)
    print(f"  export: KERAS_BACKEND=tensorflow keras-transformer export --workdir {layout.root}")
    return result
