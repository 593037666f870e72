"""How fast the vocabulary shortlist's lexical table is built (`data.shortlist.
build_lexical_table`, what `keras-transformer shortlist` and an export without `shortlist.npz`
run over the prepared pairs): pairs counted per second, the shards' reading excluded.

Usage (run it alone on the machine: the figures are times):
    python benchmarks/shortlist_build.py [--pairs 100000,400000] [--vocab 8000]

The pairs are random: 5 to 24 pieces a side, drawn by a Zipf law (exponent 1.1) over the
vocabulary after the special ids, as a corpus's pieces are. One JSON line per size.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import emit  # noqa: E402
from keras_transformer.data.shortlist import DEFAULT_K, DEFAULT_M, build_lexical_table  # noqa: E402


def random_pairs(count, vocab, seed=0):
    """`count` `(source, target)` int32 arrays of 5 to 24 Zipf-drawn pieces each."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 25, size=(count, 2))
    weights = 1.0 / np.arange(1, vocab - 3) ** 1.1
    pieces = rng.choice(np.arange(4, vocab), size=int(lengths.sum()), p=weights / weights.sum())
    pieces, pairs, start = pieces.astype(np.int32), [], 0
    for source, target in lengths:
        pairs.append(
            (pieces[start : start + source], pieces[start + source : start + source + target])
        )
        start += source + target
    return pairs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default="100000,400000", help="comma-separated pair counts")
    parser.add_argument("--vocab", type=int, default=8000, help="the vocabulary's pieces")
    args = parser.parse_args()
    for count in (int(c) for c in args.pairs.split(",")):
        pairs = random_pairs(count, args.vocab)
        start = time.perf_counter()
        build_lexical_table(pairs, args.vocab)
        seconds = time.perf_counter() - start
        emit(what="shortlist_build", pairs=count, vocab=args.vocab, k=DEFAULT_K, m=DEFAULT_M,
             seconds=round(seconds, 2), pairs_per_second=round(count / seconds))  # fmt: skip


if __name__ == "__main__":
    main()
