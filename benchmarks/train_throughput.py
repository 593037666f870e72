"""Training throughput of our Transformer with `model.fit`, comparable with ../shared/bench peers.

Usage (from the repository root, PYTHONPATH=$PWD):
    python benchmarks/train_throughput.py '{"vocab": 32000, "d": 512, "layers": 6, "heads": 8,
        "ff": 2048, "batch": 64, "steps": 3}'

Keys (all optional): the shapes of ../shared/bench/README.md (vocab, d, layers, heads, ff, batch,
src, tgt, steps), `xla` (true | false | "auto": the library's per-device default), `dtype` (a Keras
dtype policy, default float32), `peak_gflops` (to print MFU). A/B candidates (ab_train.py):
`metrics` (false: none), `loss` ("dense": Keras's categorical cross-entropy on one-hot targets),
`optimizer` ("keras": keras.optimizers.Adam instead of the library's FusedAdam).

The model is built and compiled exactly as `keras-transformer train` does (build_transformer,
training.recipe.compile_model: the library's loss, metrics, Adam and learning-rate schedule).
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

from benchmarks.common import (  # noqa: E402
    bench_config,
    emit,
    parse_shapes,
    train_flops_per_token,
)
from keras_transformer.models.transformer import build_transformer  # noqa: E402
from keras_transformer.training.recipe import compile_model  # noqa: E402


def experiment_config(cfg):
    """The library's config for these shapes: every other setting is the paper's default."""
    return bench_config(cfg)


def build_and_compile(cfg):
    """Our model compiled exactly as `keras-transformer train` compiles it; returns it and xla.

    `cfg["metrics"] = false` drops the training metrics (the peers compute none).
    """
    config = experiment_config(cfg)
    if keras.backend.backend() == "tensorflow":
        from keras_transformer.training.engines.strategies import resolve_jit_compile

        xla = resolve_jit_compile(config.runtime.jit_compile)
    else:  # JAX: the step is always compiled by XLA
        xla = True
    keras.utils.set_random_seed(0)
    model = build_transformer(config.model, cfg["vocab"], dtype=cfg.get("dtype"))
    compile_model(model, config, jit_compile=xla)
    if cfg.get("metrics") is False or cfg.get("loss") or cfg.get("optimizer"):
        # Candidates for A/B runs (benchmarks/ab_train.py) before they move into the library.
        loss, optimizer = model.loss, model.optimizer
        if cfg.get("loss") == "dense":
            loss = DenseSmoothedLoss()
        if cfg.get("optimizer") == "keras":
            optimizer = keras.optimizers.Adam(
                learning_rate=optimizer._learning_rate, beta_1=0.9, beta_2=0.98, epsilon=1e-9
            )
        metrics = None if cfg.get("metrics") is False else model._compile_metrics._user_metrics
        model.compile(optimizer=optimizer, loss=loss, metrics=metrics, jit_compile=xla)
    return model, xla


class DenseSmoothedLoss(keras.losses.Loss):
    def __init__(self):
        super().__init__(reduction="mean_with_sample_weight")

    def __call__(self, y_true, y_pred, sample_weight=None):
        mask = keras.ops.cast(keras.ops.not_equal(y_true, 0), "float32")
        return super().__call__(y_true, y_pred, sample_weight=mask)

    def call(self, y_true, y_pred):
        vocab = y_pred.shape[-1]
        target = keras.ops.one_hot(y_true, vocab) * 0.9 + 0.1 / vocab
        return keras.ops.categorical_crossentropy(target, y_pred, from_logits=True)


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


def make_dataset(cfg):
    """Random full-length id sequences, `steps + 1` batches, cached in memory (a tf.data
    dataset; on another backend, `(x, y)` numpy arrays that `fit` batches)."""
    rng = np.random.default_rng(0)
    n = cfg["batch"] * (cfg["steps"] + 1)
    src = rng.integers(3, cfg["vocab"], (n, cfg["src"])).astype("int32")
    tgt = rng.integers(3, cfg["vocab"], (n, cfg["tgt"] + 1)).astype("int32")
    if keras.backend.backend() != "tensorflow":
        return {"source_ids": src, "target_ids": tgt[:, :-1]}, tgt[:, 1:]
    import tensorflow as tf

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
    data = make_dataset(cfg)
    timer = _StepTimer()
    if isinstance(data, tuple):
        x, y = data
        model.fit(x, y, batch_size=cfg["batch"], epochs=1, verbose=0, shuffle=False,
                  callbacks=[timer])  # fmt: skip
    else:
        model.fit(data, epochs=1, verbose=0, callbacks=[timer])
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
        backend=keras.backend.backend(),
        dtype=cfg.get("dtype") or "float32",
        params=model.count_params(),
        cfg=cfg,
    )
    if cfg.get("peak_gflops"):
        result["mfu"] = round(flops * tokens_per_s / (cfg["peak_gflops"] * 1e9), 3)
    emit(**result)


if __name__ == "__main__":
    main(sys.argv)
