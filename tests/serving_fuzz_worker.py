"""Fuzzes every signature of a SavedModel with random byte strings (run by test_serving_fuzz.py).

Usage: python serving_fuzz_worker.py SAVED_MODEL_DIR SEED ROWS MAX_BYTES

Runs in a fresh process that imports only `tensorflow` and `tensorflow_text`, as TF Serving
would: no code of keras_transformer. Every signature found in `loaded.signatures` gets requests
built from its own input spec (every input a string vector of one batch size): batches of 0 to
512 rows, strings of 0 to MAX_BYTES bytes (random bytes, invalid and overlong UTF-8, NUL bytes,
lone surrogates, words of the model's language, whitespace), about ROWS rows per signature.
Checks each answer: every output has one row per input row, strings are UTF-8, numbers are
finite; and the resident memory stays bounded. Prints one JSON line: the counts, the memory
figures and the failures (signature, request shape, error), empty when all went well.
"""

import json
import random
import sys
import time

import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SentencePiece ops of the graph)

WORDS = ["red", "green", "blue", "apple", "cat", "the", "a", "Guten", "Morgen", "."]


def rss_mb():
    """The process's resident memory now, in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def random_row(rng, max_bytes):
    """One hostile string: a size class (mostly short, rarely up to `max_bytes`), then a kind."""
    size = rng.choice(
        [0, rng.randint(1, 16), rng.randint(16, 300), rng.randint(300, 5000), max_bytes]
        if rng.random() < 0.02
        else [0, rng.randint(1, 16), rng.randint(16, 300)]
    )
    kind = rng.randrange(7)
    if kind == 0:
        return rng.randbytes(size)  # mostly invalid UTF-8
    if kind == 1:
        return b"\x00" * size
    if kind == 2:  # code points from the whole range; lone surrogates pass as invalid UTF-8
        text = "".join(chr(rng.randrange(0x110000)) for _ in range(size // 4 + 1))
        return text.encode("utf-8", "surrogatepass")[:size]
    if kind == 3:  # overlong encodings, truncated sequences, stray continuation bytes
        pieces = [b"\xc0\x80", b"\xe2\x82", b"\x80", b"\xff\xfe", b"\xf4\x90\x80\x80", b"a"]
        return b"".join(rng.choice(pieces) for _ in range(size // 2 + 1))[:size]
    if kind == 4:
        return " ".join(rng.choice(WORDS) for _ in range(size // 4 + 1)).encode()[:size]
    if kind == 5:
        return bytes(rng.choice(b" \t\n\r\x0b\x0c") for _ in range(size))
    word = rng.choice(WORDS).encode() + b"\x00" + rng.randbytes(3)
    return (word * (size // 8 + 1))[:max_bytes]  # a long word overshoots: at most max_bytes


def batch_size(rng):
    """0 to 512 rows: mostly a few, sometimes hundreds."""
    roll = rng.random()
    if roll < 0.03:
        return 0
    if roll < 0.85:
        return rng.randint(1, 8)
    if roll < 0.97:
        return rng.randint(9, 64)
    return rng.randint(65, 512)


def string_inputs(name, signature):
    """`{name: rank}` of the signature's inputs; each must be a string vector (`[None]`) or
    matrix (`[None, None]`: `translate_constrained`'s constraints, a few columns a request)."""
    _, specs = signature.structured_input_signature
    for key, spec in specs.items():
        if spec.dtype != tf.string or spec.shape.rank not in (1, 2):
            raise SystemExit(f"{name}: input {key} is {spec}; the fuzzer sends string tensors")
    return {key: specs[key].shape.rank for key in sorted(specs)}


def check_answer(outputs, n):
    """A problem with the outputs of a request of `n` rows, or None."""
    for key, value in outputs.items():
        array = value.numpy()
        if array.shape[:1] != (n,):
            return f"output {key} has shape {array.shape} for {n} rows"
        if value.dtype == tf.string:
            for item in array.reshape(-1):
                item.decode("utf-8")  # raises on invalid UTF-8
        elif value.dtype.is_floating and not np.all(np.isfinite(array)):
            return f"output {key} is not finite: {array.reshape(-1)[:8]}"
    return None


def requests_for(inputs, rng, rows, max_bytes):
    """Random requests (`{input name: [bytes] * n}`) until about `rows` rows."""
    requests, sent = [], 0
    while sent < rows:
        n = batch_size(rng)
        columns = rng.randint(0, 3)  # of the matrices
        requests.append(
            {key: _rows(rng, max_bytes, n, columns, rank) for key, rank in inputs.items()}
        )
        sent += n
    return requests


def _rows(rng, max_bytes, n, columns, rank):
    """numpy bytes `[n]`, or `[n, columns]` for a matrix input."""
    shape = (n,) if rank == 1 else (n, columns)
    rows = np.empty(shape, dtype=object)
    for index in np.ndindex(shape):
        rows[index] = random_row(rng, max_bytes)
    return rows


def send(name, signature, requests, memory):
    """Sends `requests` to one signature; returns the failures."""
    failures = []
    for batch in requests:
        n = len(next(iter(batch.values())))
        try:
            tensors = {key: tf.constant(rows, tf.string, rows.shape) for key, rows in batch.items()}
            problem = check_answer(signature(**tensors), n)
        except Exception as e:  # noqa: BLE001  (any error is a failure to report)
            problem = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        if problem:
            sizes = {key: [len(row) for row in rows.ravel()][:16] for key, rows in batch.items()}
            failures.append({"signature": name, "rows": n, "sizes": sizes, "problem": problem})
        memory["peak_mb"] = max(memory["peak_mb"], rss_mb())
    return failures


def main():
    path, seed, rows, max_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    loaded = tf.saved_model.load(path)
    rng = random.Random(seed)
    names = sorted(loaded.signatures)
    inputs = {name: string_inputs(name, loaded.signatures[name]) for name in names}
    requests = {name: requests_for(inputs[name], rng, rows, max_bytes) for name in names}
    # Warm-up: each signature once on a full-size request, so later growth is not start-up.
    for name in names:
        big = [rng.randbytes(max_bytes)] + [rng.randbytes(rng.randint(0, 64)) for _ in range(511)]
        shapes = {key: [512] + [1] * (rank - 1) for key, rank in inputs[name].items()}
        loaded.signatures[name](
            **{k: tf.constant(big, tf.string, shape) for k, shape in shapes.items()}
        )
    memory = {"after_warmup_mb": rss_mb()}
    memory["peak_mb"] = memory["after_warmup_mb"]
    report = {"signatures": names, "failures": [], "seconds": {}}
    report["rows"] = {
        name: sum(len(r[next(iter(inputs[name]))]) for r in requests[name]) for name in names
    }
    report["requests"] = {name: len(requests[name]) for name in names}
    sizes = [
        len(row)
        for name in names
        for r in requests[name]
        for rows in r.values()
        for row in rows.ravel()
    ]
    report["bytes"], report["largest"] = sum(sizes), max(sizes)
    # Twice: the second pass repeats the first's requests (shapes TensorFlow has seen), so
    # memory that still grows there is held per request.
    for attempt in ("first", "second"):
        for name in names:
            started = time.time()
            failures = send(name, loaded.signatures[name], requests[name], memory)
            report["seconds"][f"{name}_{attempt}"] = round(time.time() - started, 1)
            report["failures"] += failures if attempt == "first" else []
        memory[f"after_{attempt}_pass_mb"] = rss_mb()
    report["memory"] = memory
    report["modules"] = sorted(m for m in sys.modules if m.split(".")[0] == "keras_transformer")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
