"""Training throughput of our Transformer with `model.fit`, comparable with ../shared/bench peers.

Usage (from the repository root, PYTHONPATH=$PWD):
    python benchmarks/train_throughput.py '{"vocab": 32000, "d": 512, "layers": 6, "heads": 8,
        "ff": 2048, "batch": 64, "steps": 3}'

Keys (all optional): the shapes of ../shared/bench/README.md (vocab, d, layers, heads, ff, batch,
src, tgt, steps), `xla` (true | false | "auto": the library's per-device default), `dtype` (a Keras
dtype policy, default float32), `peak_gflops` (to print MFU).

The paper's settings, as in the peers: post-norm, residual dropout 0.1, one embedding matrix shared
by source, target and softmax, label smoothing 0.1, Adam(0.9, 0.98, 1e-9); random token ids, every
sequence full length. Counting as in the peers: target tokens/s = batch * tgt * steps / seconds,
timed from the end of one warm-up step to the end of the last step.

Prints one JSON line (what="train").
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.common import emit, parse_shapes, train_flops_per_token  # noqa: E402
from keras_transformer.models import Transformer  # noqa: E402


def smoothed_loss_fn(vocab, epsilon=0.1, kind=None):
    """Label-smoothed cross-entropy (smoothing over all `vocab` classes), padding (id 0) masked.

    The library's loss is used once the training package provides it. Otherwise (or with an
    explicit `kind`): "dense" builds the smoothed target distribution and calls the fused
    softmax-cross-entropy kernel (as Model Garden does); "gather" picks the label's logit with
    take_along_axis (its gradient is a scatter into a [batch, len, vocab] zero tensor: slow on CPU).
    """
    if kind is None:
        try:
            from keras_transformer.training.losses import LabelSmoothedCrossEntropy

            return LabelSmoothedCrossEntropy(label_smoothing=epsilon)
        except ImportError:
            kind = "dense"
    ops = keras.ops

    def dense(labels, logits):
        labels = ops.cast(labels, "int32")
        target = ops.one_hot(labels, vocab, dtype=logits.dtype) * (1.0 - epsilon) + epsilon / vocab
        per_token = ops.categorical_crossentropy(target, logits, from_logits=True)
        return per_token * ops.cast(ops.not_equal(labels, 0), per_token.dtype)

    def gather(labels, logits):
        labels = ops.cast(labels, "int32")
        lse = ops.logsumexp(logits, axis=-1)
        picked = ops.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
        mean = ops.mean(logits, axis=-1)
        per_token = lse - (1.0 - epsilon) * picked - epsilon * mean
        return per_token * ops.cast(ops.not_equal(labels, 0), per_token.dtype)

    def sparse(labels, logits):
        # (1 - eps) * CE(label) + eps * CE(uniform): the fused sparse kernel plus lse - mean.
        labels = ops.cast(labels, "int32")
        ce = ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        uniform = ops.logsumexp(logits, axis=-1) - ops.mean(logits, axis=-1)
        per_token = (1.0 - epsilon) * ce + epsilon * uniform
        return per_token * ops.cast(ops.not_equal(labels, 0), per_token.dtype)

    return {"dense": dense, "gather": gather, "sparse": sparse}[kind]


def resolve_xla(value):
    if isinstance(value, bool):
        return value
    try:
        from keras_transformer.training.distribute import resolve_jit_compile

        return bool(resolve_jit_compile(value))
    except ImportError:
        # CPU default measured in benchmarks/README.md: the TF graph (oneDNN) beats XLA on CPU.
        return bool(tf.config.list_physical_devices("GPU") or tf.config.list_physical_devices("TPU"))


class _StepTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.start = self.end = None

    def on_train_batch_end(self, batch, logs=None):
        if batch == 0:  # end of the warm-up step (tracing, compilation, first run)
            float(keras.ops.convert_to_numpy(logs["loss"]))
            self.start = time.perf_counter()

    def on_train_end(self, logs=None):
        float(keras.ops.convert_to_numpy(logs["loss"]))
        self.end = time.perf_counter()


def build_and_compile(cfg):
    """The model with the paper's training settings, compiled for `model.fit`; returns it and xla."""
    xla = resolve_xla(cfg.get("xla", "auto"))
    keras.utils.set_random_seed(0)
    model = Transformer(
        vocab_size=cfg["vocab"],
        num_layers=cfg["layers"],
        d_model=cfg["d"],
        num_heads=cfg["heads"],
        d_ff=cfg["ff"],
        dropout=0.1,
        dtype=cfg.get("dtype"),
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-4, beta_1=0.9, beta_2=0.98, epsilon=1e-9),
        loss=smoothed_loss_fn(cfg["vocab"], kind=cfg.get("loss")),
        jit_compile=xla,
    )
    return model, xla


def make_dataset(cfg):
    """Random full-length id sequences, `steps + 1` batches, cached in memory."""
    rng = np.random.default_rng(0)
    n = cfg["batch"] * (cfg["steps"] + 1)
    src = rng.integers(3, cfg["vocab"], (n, cfg["src"])).astype("int32")
    tgt = rng.integers(3, cfg["vocab"], (n, cfg["tgt"] + 1)).astype("int32")
    ds = (
        tf.data.Dataset.from_tensor_slices(
            ({"source_ids": src, "target_ids": tgt[:, :-1]}, tgt[:, 1:])
        )
        .batch(cfg["batch"], drop_remainder=True)
        .cache()
        .prefetch(2)
    )
    return ds


def main(argv):
    cfg = parse_shapes(argv)
    model, xla = build_and_compile(cfg)
    ds = make_dataset(cfg)
    timer = _StepTimer()
    model.fit(ds, epochs=1, verbose=0, callbacks=[timer])
    seconds = timer.end - timer.start
    tokens_per_s = cfg["batch"] * cfg["tgt"] * cfg["steps"] / seconds
    flops = train_flops_per_token(cfg)
    result = dict(
        impl="keras_transformer",
        what="train",
        tokens_per_s=round(tokens_per_s, 1),
        seconds=round(seconds, 3),
        flops_per_token=int(flops),
        model_gflops_per_s=round(flops * tokens_per_s / 1e9, 1),
        xla=xla,
        dtype=cfg.get("dtype") or "float32",
        params=model.count_params(),
        cfg=cfg,
    )
    if cfg.get("peak_gflops"):
        result["mfu"] = round(flops * tokens_per_s / (cfg["peak_gflops"] * 1e9), 3)
    emit(**result)


if __name__ == "__main__":
    main(sys.argv)
