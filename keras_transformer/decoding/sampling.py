"""Sampling the next token: temperature, top-k and top-p (nucleus) with seeded, stateless noise.

`sampling_picker` makes the `pick(log_probs, index) -> tokens` that `greedy_search` calls
instead of its argmax. Shapes stay static (XLA, `ops.while_loop`): top-k is `ops.top_k` with a
Python `k`, and top-p is read off those `k` sorted values. The noise is a counter-based hash of
(seed, step, token), written with `keras.ops` integer ops, so a seeded run repeats exactly on
every backend and device, and an input's sample depends on its own seed only (not on the batch
it is decoded in).

References:
    Fan et al., 2018, "Hierarchical Neural Story Generation" (top-k sampling);
    Holtzman et al., 2020, "The Curious Case of Neural Text Degeneration" (top-p);
    Edunov et al., 2018, "Understanding Back-Translation at Scale" (sampled back-translation).
"""

from keras import ops

# Below this a log-probability is impossible (the search's NEG_INF is -1e9).
_IMPOSSIBLE = -0.5e9


def _shift_right(x, bits):
    """Logical right shift of int32 `x` (ops.right_shift is arithmetic for signed ints)."""
    return ops.bitwise_and(ops.right_shift(x, bits), (1 << (32 - bits)) - 1)


def _hash(x):
    """int32 -> int32, C. Wellons' `lowbias32` in wrapping int32 arithmetic (0x846ca68b is
    -2073254261 as an int32)."""
    x = ops.bitwise_xor(x, _shift_right(x, 16))
    x = x * 2146121005  # 0x7feb352d
    x = ops.bitwise_xor(x, _shift_right(x, 15))
    x = x * -2073254261
    return ops.bitwise_xor(x, _shift_right(x, 16))


def uniform_noise(seeds, index, vocab_size):
    """float32 `[rows, vocab_size]` in (0, 1): a hash of (row's seed, step `index`, token id)."""
    per_step = _hash(ops.bitwise_xor(_hash(ops.cast(seeds, "int32")), index))  # [rows]
    tokens = ops.arange(vocab_size, dtype="int32")  # [vocab]
    bits = _hash(ops.bitwise_xor(ops.expand_dims(per_step, 1), tokens))  # [rows, vocab]
    return (ops.cast(_shift_right(bits, 8), "float32") + 0.5) / float(1 << 24)


def _keep_mask(log_probs, topk, topp):
    """Boolean `[rows, vocab]`: the `topk` most likely tokens, then the fewest of them holding
    `topp` of their mass (a token tied with the last one kept is kept too)."""
    vocab = log_probs.shape[-1]
    k = int(topk) if vocab is None else min(int(topk), int(vocab))
    values, _ = ops.top_k(log_probs, k)  # [rows, k] best first
    probs = ops.exp(values - ops.logsumexp(values, axis=-1, keepdims=True))  # over the top k
    mass_before = ops.cumsum(probs, axis=-1) - probs  # [rows, k]
    kept = ops.logical_and(ops.less(mass_before, topp), ops.greater(values, _IMPOSSIBLE))
    kept = ops.logical_or(kept, ops.equal(ops.arange(k), 0))  # the best token always stays
    threshold = ops.min(ops.where(kept, values, values[:, :1]), axis=-1, keepdims=True)
    return ops.greater_equal(log_probs, threshold)


def sampling_picker(topk, temperature=1.0, topp=1.0, seeds=0):
    """A `pick(log_probs, index) -> tokens` drawing each token from the model's distribution
    divided by `temperature` and restricted to the `topk` most likely tokens, then to their
    nucleus of mass `topp` (Gumbel-max: the argmax of log p plus Gumbel noise is a sample).

    Args:
        topk: sample among the K most likely tokens (K = 1: greedy search's choice).
        temperature: the logits are divided by this (> 0).
        topp: in (0, 1]; 1 keeps all K.
        seeds: int32 `[rows]` (or a scalar for all rows), one random stream per row.

    Returns:
        `pick(log_probs [rows, vocab], index int32 scalar) -> int32 [rows]`.
    """
    if int(topk) < 1:
        raise ValueError(f"sampling needs topk >= 1, got {topk}")

    def pick(log_probs, index):
        rows, vocab = ops.shape(log_probs)[0], ops.shape(log_probs)[1]
        scaled = ops.log_softmax(log_probs / float(temperature), axis=-1)  # [rows, vocab]
        scaled = ops.where(ops.greater(log_probs, _IMPOSSIBLE), scaled, log_probs)
        keep = _keep_mask(scaled, topk, topp)  # [rows, vocab]
        row_seeds = ops.broadcast_to(ops.cast(seeds, "int32"), (rows,))
        gumbel = -ops.log(-ops.log(uniform_noise(row_seeds, index, vocab)))  # [rows, vocab]
        noisy = ops.where(keep, scaled + gumbel, 2.0 * _IMPOSSIBLE)
        return ops.cast(ops.argmax(noisy, axis=-1), "int32")

    return pick
