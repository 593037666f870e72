"""Tiny configs and TensorBoard readers shared by the training tests."""

import glob
import os

import numpy as np
import tensorflow as tf

from keras_transformer.config import from_dict


def tiny_config(workdir, **sections):
    """A seconds-long run on a few hundred synthetic pairs; `sections` override per key."""
    values = {
        "model": dict(num_layers=1, d_model=32, num_heads=2, d_ff=64, dropout=0.0),
        "data": dict(
            train="synthetic:split=train,size=300,max_words=8",
            dev="synthetic:split=dev,size=6,max_words=8",
            vocab_size=200,
            max_source_length=24,
            max_target_length=24,
            tokens_per_batch=384,
            bucket_boundaries=[12, 24],
        ),
        "train": dict(
            steps=8,
            warmup_steps=4,
            learning_rate_scale=3.0,
            steps_per_epoch=4,
            checkpoint_every=2,
            keep_checkpoints=2,
            log_every=1,
            eval_max_sentences=6,
        ),
        "decode": dict(beam_size=1, batch_size=8, max_extra_length=5),
        "runtime": dict(workdir=str(workdir), jit_compile=False),
        "export": dict(base_dir=os.path.join(str(workdir), "saved_models"), average_checkpoints=2),
    }
    for section, overrides in sections.items():
        values[section].update(overrides)
    return from_dict(values, name="tiny")


def read_scalars(logdir):
    """`{tag: [(step, value), ...]}` from every TensorBoard event file under `logdir`."""
    scalars = {}
    for path in sorted(
        glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True)
    ):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "text":
                    scalars.setdefault(value.tag, []).append((event.step, None))
                    continue
                number = float(np.asarray(tf.make_ndarray(value.tensor)))
                scalars.setdefault(value.tag, []).append((event.step, number))
    for series in scalars.values():
        series.sort(key=lambda item: item[0])
    return scalars
