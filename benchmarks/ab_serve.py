"""In-process A/B of the exported `Translator`'s `serving_default` (strings in, strings out)
under fast-path variants (a development aid for noisy machines).

Usage: python benchmarks/ab_serve.py '<shapes JSON>' '<JSON list of variants>' [rounds] [beam]
The shapes override the small ones (benchmarks/common.py), e.g. '{"vocab": 32000, "d": 512,
"layers": 6, "heads": 8, "ff": 2048}' for base. A variant is {"fast_paths": setting} or
{"without": [names]} (see ab_train.py): the fast paths its model is built with (same weights);
`"jit_compile": true` compiles its search with XLA (`Translator(jit_compile=True)`); `"shortlist":
k` decodes over serve_compare.py's synthetic lexical table of that k (`Translator(shortlist=...)`);
`"precision": "bfloat16"` decodes in bfloat16 (`Translator(precision=...)`).
Model and inputs as in serve_compare.py (32 random sources of `src` words, outputs pinned to
`tgt` tokens), beam 4 unless given. The variants' calls alternate, one call each per round;
prints each variant's median output tokens/s, its ratio to the first one, its median CPU
seconds per call (all threads: the work done, which another process's load on the cores changes
less than the wall time) and their ratio to the first one's, and how many of its translations
differ from the first variant's.
"""

import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from benchmarks.ab_train import variant_fast_paths  # noqa: E402
from benchmarks.common import alternate, parse_shapes  # noqa: E402
from benchmarks.serve_compare import (  # noqa: E402
    SENTENCES,
    build_model,
    sources,
    synthetic_table,
    word_vocabulary,
)
from keras_transformer import fast_paths  # noqa: E402
from keras_transformer.data.shortlist import DEFAULT_M  # noqa: E402
from keras_transformer.export import Translator  # noqa: E402


def main(argv):
    cfg = parse_shapes(argv[:2])
    variants = json.loads(argv[2])
    rounds = int(argv[3]) if len(argv) > 3 else 4
    beam = int(argv[4]) if len(argv) > 4 else 4
    weights, spm_bytes = build_model(cfg).get_weights(), word_vocabulary(cfg["vocab"])
    text = tf.constant(sources(cfg))
    runs, translations = [], []
    for variant in variants:
        with fast_paths.fast_paths(variant_fast_paths(variant)):
            model = build_model(cfg)  # built with the variant's fast paths (model.kernels)
        model.set_weights(weights)
        shortlist = variant.get("shortlist")
        table = synthetic_table(cfg["vocab"], shortlist, DEFAULT_M) if shortlist else None
        translator = Translator(
            model, spm_bytes, beam_size=beam, alpha=0.6, batch_size=SENTENCES,
            max_extra_length=cfg["tgt"] - cfg["src"], max_source_length=cfg["src"] + 1,
            max_length=cfg["tgt"] + 1, jit_compile=bool(variant.get("jit_compile")),
            shortlist=table, precision=variant.get("precision", "float32"),
        )  # fmt: skip
        out = translator(text)  # traced
        translations.append(out["translation"].numpy().tolist())
        runs.append((variant, translator))
    differing = [sum(a != b for a, b in zip(t, translations[0])) for t in translations]

    def call(translator):
        def translate():
            translator(text)["translation"].numpy()
            return SENTENCES * cfg["tgt"]  # every output runs to tgt tokens

        return translate

    cpu = [[] for _ in runs]

    def timed(translate, seconds):
        def run():
            start = time.process_time()
            tokens = translate()
            seconds.append(time.process_time() - start)
            return tokens

        return run

    rates = alternate([timed(call(t), s) for (_, t), s in zip(runs, cpu)], rounds)
    first, first_cpu = statistics.median(rates[0]), statistics.median(cpu[0])
    for (variant, _), times, seconds, differs in zip(runs, rates, cpu, differing):
        median = statistics.median(times)
        line = dict(variant=variant, beam=beam, median_tokens_per_s=round(median, 1),
                    ratio=round(median / first, 3), all=[round(t) for t in times],
                    median_cpu_seconds=round(statistics.median(seconds), 3),
                    cpu_ratio=round(statistics.median(seconds) / first_cpu, 3),
                    translations_unlike_the_first_variant=differs)  # fmt: skip
        print(json.dumps(line))


if __name__ == "__main__":
    main(sys.argv)
