"""`runtime.mixed_precision: auto`: train in the precision that is fastest on this machine.

On CPUs the `lscpu` flags do not tell whether bfloat16 pays. Of two 2-core CPUs that both list
`avx512_bf16` (neither has AMX), one (an Intel Xeon) trains `configs/small.yaml`'s model slower
in mixed_bfloat16 than in float32 and the other (an AMD EPYC) faster (the figures are in
docs/guides/precision-xla.md). So on a CPU `auto` measures it. It runs a few train steps of
the run's own model on the run's own first batches in float32 and in mixed_bfloat16, in
alternating rounds, and keeps bfloat16 only when it is at least `MIN_SPEEDUP` times faster.
On TPUs and on GPUs of compute capability 8.0 or more (Ampere and later), `auto` means
mixed_bfloat16 without timing. Older GPUs get mixed_float16 (with loss scaling).

The choice and the measured rates go to `WORKDIR/precision.json`. A resumed run reads the file
instead of timing again, so a run never changes precision halfway. Under several workers only
the chief times, and every worker uses the chief's choice.
"""

import json
import os
import time

import tensorflow as tf

from keras_transformer import stopping
from keras_transformer.training.engines.strategies import device_kind
from keras_transformer.workdir import read_text, write_atomically

CHOICE_FILE = "precision.json"
#: bfloat16 must be at least this much faster than float32 to be chosen (timing noise, and
#: bfloat16's coarser rounding, call for a margin).
MIN_SPEEDUP = 1.1
CANDIDATES = ("float32", "mixed_bfloat16")
_CODES = {"float32": 0.0, "mixed_bfloat16": 1.0, "mixed_float16": 2.0}


def choose(rates, min_speedup=MIN_SPEEDUP):
    """The precision to train in, given `{"float32": tokens/s, "mixed_bfloat16": tokens/s}`."""
    if rates["mixed_bfloat16"] >= min_speedup * rates["float32"]:
        return "mixed_bfloat16"
    return "float32"


def accelerator_precision(kind):
    """`auto` on a TPU or GPU (no timing needed): bfloat16 where the hardware has it."""
    if kind == "tpu":
        return "mixed_bfloat16"
    details = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
    capability = details.get("compute_capability") or (0, 0)
    return "mixed_bfloat16" if tuple(capability) >= (8, 0) else "mixed_float16"


def _target_tokens(batch):
    labels = batch[1]
    return int(tf.math.count_nonzero(labels))


def measure_rates(build, batches, rounds=2):
    """Target tokens per second of a train step in each of `CANDIDATES`.

    Args:
        build: `policy -> compiled model` (the run's model and optimizer in that precision).
        batches: a few training batches, `(x, y)` or `(x, y, sample_weight)`. Each model
            first trains on all of them once (tracing each shape), then `rounds` times each,
            the precisions taking turns, so both see the same machine state.
        rounds: timed passes over `batches` per precision.

    Returns:
        `{policy: tokens per second}`.
    """
    batches = list(batches)
    tokens = sum(_target_tokens(b) for b in batches)
    models = {policy: build(policy) for policy in CANDIDATES}

    def one_pass(model):
        for batch in batches:
            # Nothing is written before the timing ends: a stop here times again next run.
            stopping.check("the precision timing (runtime.mixed_precision: auto)")
            x, y, weights = (tuple(batch) + (None,))[:3]
            logs = model.train_on_batch(x, y, sample_weight=weights, return_dict=True)
        # The step's values are ready only when read back.
        float(logs["loss"])

    for model in models.values():
        one_pass(model)
    seconds = dict.fromkeys(CANDIDATES, 0.0)
    for _ in range(rounds):
        for policy, model in models.items():
            started = time.perf_counter()
            one_pass(model)
            seconds[policy] += time.perf_counter() - started
    return {policy: rounds * tokens / seconds[policy] for policy in CANDIDATES}


def resolve_precision(directory, strategy, build, batches, chief=True, agree=float):
    """The concrete precision for `runtime.mixed_precision: auto`, and what decided it.

    Args:
        directory: the workdir; the choice is read from or written to `precision.json` there.
        strategy: the run's `tf.distribute` strategy (its device kind decides if no timing is
            needed).
        build: `policy -> compiled model`, for `measure_rates`.
        batches: `() -> a few training batches`, for `measure_rates` (called only when timing).
        chief: only the chief times and writes; the others take its answer through `agree`.
        agree: `value -> the chief's value`, the same on every worker (the strategy input's
            `agreement()`).

    Returns:
        `(policy, record)`: `record` is what `precision.json` holds (`precision`, `reason`, and
        after a timing `tokens_per_second` and `seconds`).
    """
    path = os.path.join(directory, CHOICE_FILE)
    record = None
    if chief:
        record = _read(path)
        if record is None:
            record = _decide(strategy, build, batches)
            _write(path, record)
            print(_describe(record), flush=True)
        else:
            print(f"precision auto: {record['precision']} (as chosen before, {path})", flush=True)
    code = agree(_CODES[record["precision"]] if chief else 0.0)
    policy = next(name for name, value in _CODES.items() if value == code)
    return policy, record or {"precision": policy, "reason": "the chief's choice"}


def _decide(strategy, build, batches):
    kind = device_kind(strategy)
    if kind != "cpu":
        return {"precision": accelerator_precision(kind), "reason": f"{kind}: bfloat16 hardware"}
    started = time.perf_counter()
    rates = measure_rates(build, batches())
    return {
        "precision": choose(rates),
        "reason": f"timed on this CPU (bfloat16 needs {MIN_SPEEDUP}x)",
        "tokens_per_second": {k: round(v, 1) for k, v in rates.items()},
        "seconds": round(time.perf_counter() - started, 1),
    }


def _describe(record):
    rates = record.get("tokens_per_second")
    if not rates:
        return f"precision auto: {record['precision']} ({record['reason']})"
    ratio = rates["mixed_bfloat16"] / rates["float32"]
    return (
        f"precision auto: float32 {rates['float32']:,.0f} target tokens/s, mixed_bfloat16 "
        f"{rates['mixed_bfloat16']:,.0f} ({ratio:.2f}x; {MIN_SPEEDUP}x needed), measured in "
        f"{record['seconds']:.0f} s: training in {record['precision']}"
    )


def _read(path):
    try:
        record = json.loads(read_text(path))
    except (OSError, ValueError):
        return None
    return record if record.get("precision") in _CODES else None


def _write(path, record):
    write_atomically(path, json.dumps(record, indent=2))
