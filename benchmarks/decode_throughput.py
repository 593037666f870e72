"""Decoding throughput of our Transformer: beam 4 (alpha 0.6) and greedy, cached, in one graph.

Usage (from the repository root, PYTHONPATH=$PWD):
    python benchmarks/decode_throughput.py '{"vocab": 32000, "d": 512, "layers": 6, "heads": 8,
        "ff": 2048}'

Keys (all optional): the shapes of ../shared/bench/README.md; `xla` (true | false | "auto": the
library's per-device default for decoding); `runs` (timed calls, default 3); `check` (how many of
the sources are also decoded without the cache to check the outputs are identical, default 32;
0 skips); `greedy` (false skips the greedy figure).

Counting as in ../shared/bench/peer_modelgarden.py: the first 32 sources of the (random, full
length) batch, at most `tgt` output tokens, output tokens/s = 32 * output length * runs / seconds
after one warm-up call, where the output length is the width of the returned id matrix (`tgt`).
`mean_output_tokens` says how many tokens the outputs really hold before padding (random weights
rarely pick EOS, so it is about `tgt`).

Prints one JSON line per figure (what="beam4_decode", "greedy_decode", "beam4_cache_check").
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.common import emit, parse_shapes  # noqa: E402
from keras_transformer.decoding import translate_ids  # noqa: E402
from keras_transformer.models import Transformer  # noqa: E402
from keras_transformer.training.engines.strategies import resolve_jit_compile  # noqa: E402


def resolve_decode_xla(value):
    """`auto`: the library's per-device default (XLA on GPUs/TPUs, the TF graph on CPUs, where
    it decodes faster: benchmarks/README.md)."""
    return bool(resolve_jit_compile(value))


def build_model(cfg):
    keras.utils.set_random_seed(0)
    return Transformer(
        vocab_size=cfg["vocab"],
        num_layers=cfg["layers"],
        d_model=cfg["d"],
        num_heads=cfg["heads"],
        d_ff=cfg["ff"],
        dropout=0.1,
        dtype=cfg.get("dtype"),
    )


def sources(cfg):
    """The first 32 rows of the peer's random source batch (same generator, same draw)."""
    rng = np.random.default_rng(0)
    src = rng.integers(3, cfg["vocab"], (cfg["batch"], cfg["src"]))
    return tf.constant(src[:32], tf.int32)


def time_decoder(fn, src, runs):
    ids, scores = fn(src)  # warm-up: tracing and compilation
    ids.numpy()
    start = time.perf_counter()
    for _ in range(runs):
        ids, scores = fn(src)
    ids = ids.numpy()
    return ids, scores.numpy(), time.perf_counter() - start


def main(argv):
    cfg = parse_shapes(argv)
    xla = resolve_decode_xla(cfg.get("xla", "auto"))
    runs = int(cfg.get("runs", 3))
    model = build_model(cfg)
    src = sources(cfg)

    def decoder(beam_size, use_cache=True, jit=xla):
        @tf.function(jit_compile=jit, reduce_retracing=True)
        def fn(source_ids):
            result = translate_ids(
                model,
                source_ids,
                beam_size=beam_size,
                alpha=0.6,
                max_length=cfg["tgt"],
                use_cache=use_cache,
            )
            return result.ids, result.scores

        return fn

    figures = [("beam4_decode", 4)]
    if cfg.get("greedy", True):
        figures.append(("greedy_decode", 1))
    cached = {}
    for what, beam in figures:
        ids, scores, seconds = time_decoder(decoder(beam), src, runs)
        cached[beam] = (ids, scores)
        emit(
            impl="keras_transformer",
            what=what,
            tokens_per_s=round(ids.size * runs / seconds, 1),
            seconds_per_call=round(seconds / runs, 3),
            out_shape=list(ids.shape),
            mean_output_tokens=round(float((ids != 0).sum(axis=1).mean()), 2),
            xla=xla,
            cfg=cfg,
        )

    n_check = int(cfg.get("check", 32))
    if n_check:
        # The uncached search re-runs the whole decoder on the prefix at every step: the
        # straightforward reference for the cached one.
        ref_ids, ref_scores = decoder(4, use_cache=False, jit=False)(src[:n_check])
        ids, scores = cached[4]
        same = bool(np.array_equal(ids[:n_check], ref_ids.numpy()))
        emit(
            impl="keras_transformer",
            what="beam4_cache_check",
            sources=n_check,
            identical_ids=same,
            max_score_diff=float(np.max(np.abs(scores[:n_check] - ref_scores.numpy()))),
        )


if __name__ == "__main__":
    main(sys.argv)
