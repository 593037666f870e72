"""Op counts of the traced training step and beam-4 decoding graph (a load-independent check).

Wall-clock timings on a shared 2-core machine drift by tens of percent; two versions of the code
whose traced graphs hold the same ops run the same kernels. Run it in two checkouts and compare:

    PYTHONPATH=$PWD python benchmarks/graph_ops.py ['<shapes JSON>'] > ops.json

Prints one JSON line: {"train": {op type: count}, "decode": {...}, "cfg": ...}, counting the ops
of the graph and of every function in it (the decoding loop's body among them).
"""

import collections
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.common import parse_shapes  # noqa: E402
from benchmarks.train_throughput import build_and_compile, make_dataset  # noqa: E402
from keras_transformer.decoding import translate_ids  # noqa: E402

TINY = dict(vocab=512, d=64, layers=2, heads=4, ff=128, batch=8, src=16, tgt=16, steps=1)


def op_counts(concrete):
    graph_def = concrete.graph.as_graph_def()
    counts = collections.Counter(node.op for node in graph_def.node)
    for function in graph_def.library.function:
        counts.update(node.op for node in function.node_def)
    return dict(sorted(counts.items()))


def main(argv):
    cfg = parse_shapes(argv, TINY)
    model, _ = build_and_compile(cfg)
    x, y = next(iter(make_dataset(cfg)))
    train = tf.function(lambda x, y: model.train_step((x, y)))
    rng = np.random.default_rng(0)
    src = tf.constant(rng.integers(4, cfg["vocab"], (4, cfg["src"])).astype("int32"))

    @tf.function
    def decode(s):
        result = translate_ids(model, s, beam_size=4, max_extra_length=8)
        return result.ids, result.scores

    print(
        json.dumps(
            {
                "train": op_counts(train.get_concrete_function(x, y)),
                "decode": op_counts(decode.get_concrete_function(src)),
                "cfg": cfg,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv)
