"""Trains a tiny Transformer for a few steps under a tf.distribute strategy (run as a subprocess).

Usage: python distributed_worker.py mirrored|multi_worker OUTPUT.npz
For `multi_worker` the cluster comes from TF_CONFIG. The weights after training go to OUTPUT.npz.
"""

import sys

import numpy as np
import tensorflow as tf


def dataset(batch, seed):
    rng = np.random.default_rng(seed)
    src = rng.integers(4, 40, size=(64, 7)).astype("int32")
    tgt = rng.integers(4, 40, size=(64, 6)).astype("int32")
    src[:, 5:] = 0  # some padding
    tgt[:, 4:] = 0
    labels = np.concatenate([tgt[:, 1:], np.zeros((64, 1), "int32")], axis=1)
    ds = tf.data.Dataset.from_tensor_slices(({"source_ids": src, "target_ids": tgt}, labels))
    return ds.repeat().batch(batch, drop_remainder=True)


def main(kind, output):
    if kind == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    import keras

    from keras_transformer.config import from_dict
    from keras_transformer.models import build_transformer
    from keras_transformer.training import compile_model

    config = from_dict(
        {
            "model": dict(num_layers=1, d_model=16, num_heads=2, d_ff=32, dropout=0.1),
            "train": dict(warmup_steps=2, learning_rate_scale=2.0),
        }
    )
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = build_transformer(config.model, vocab_size=40)
        compile_model(model, config)
    # Different data per worker (as with a sharded corpus): only gradient averaging keeps the
    # replicas identical.
    history = model.fit(dataset(8, seed=1), steps_per_epoch=3, epochs=2, verbose=2)
    assert np.isfinite(history.history["loss"]).all(), history.history
    weights = {f"w{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}
    # Every variable's copies on the local replicas (two for `mirrored`).
    copies = [
        [np.asarray(c) for c in strategy.experimental_local_results(v.value)]
        for v in model.trainable_variables
    ]
    weights["local_copies"] = np.asarray(len(copies[0]))
    weights["local_copies_equal"] = np.asarray(
        all(np.array_equal(c[0], other) for c in copies for other in c[1:])
    )
    weights["iterations"] = np.asarray(int(model.optimizer.iterations.numpy()))
    np.savez(output, **weights)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
