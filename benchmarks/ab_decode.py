"""In-process A/B comparison of beam-4 decoding variants (a development aid for noisy machines).

Usage: python benchmarks/ab_decode.py '<shapes JSON>' '<JSON list of variants>' [rounds]
A variant is {"fast_paths": setting or "without": [names], "xla": bool, "plain_top_k": bool}
(see ab_train.py): the fast paths its model is built with (the same weights for all), and
`plain_top_k`: the search's top-K over `[batch, beams * vocab]` traced as `ops.top_k` instead of
`decoding.top_k.blocked_top_k` (the same answer). Calls are timed alternately; prints median
output tokens/s and the ratio to the first variant.
"""

import contextlib
import json
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from benchmarks.ab_train import variant_fast_paths  # noqa: E402
from benchmarks.common import alternate, parse_shapes  # noqa: E402
from benchmarks.decode_throughput import build_model, sources  # noqa: E402
from keras_transformer import fast_paths  # noqa: E402
from keras_transformer.decoding import translate_ids  # noqa: E402


@contextlib.contextmanager
def _plain_top_k(plain):
    """The search traced with `ops.top_k` for its candidates' top-K while `plain`."""
    from keras import ops

    from keras_transformer.decoding import search

    saved = search.blocked_top_k
    if plain:
        search.blocked_top_k = ops.top_k
    try:
        yield
    finally:
        search.blocked_top_k = saved


def main(argv):
    cfg = parse_shapes(argv[:2])
    variants = json.loads(argv[2])
    rounds = int(argv[3]) if len(argv) > 3 else 4
    weights = build_model(cfg).get_weights()
    src = sources(cfg)
    fns = []
    for variant in variants:
        with fast_paths.fast_paths(variant_fast_paths(variant)):
            model = build_model(cfg)  # built with the variant's fast paths (model.kernels)
        model.set_weights(weights)

        @tf.function(jit_compile=bool(variant.get("xla", False)))
        def fn(s, model=model):
            result = translate_ids(model, s, beam_size=4, alpha=0.6, max_length=cfg["tgt"])
            return result.ids, result.scores

        with _plain_top_k(variant.get("plain_top_k", False)):
            fn(src)[0].numpy()  # traced
        fns.append((variant, fn))
    rates = alternate([lambda fn=fn: fn(src)[0].numpy().size for _, fn in fns], rounds)
    first = statistics.median(rates[0])
    for (variant, _), times in zip(fns, rates):
        med = statistics.median(times)
        print(
            json.dumps(
                dict(
                    variant=variant,
                    median_tokens_per_s=round(med, 1),
                    ratio=round(med / first, 3),
                    all=[round(t) for t in times],
                )
            )
        )


if __name__ == "__main__":
    main(sys.argv)
