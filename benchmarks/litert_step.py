"""Where the LiteRT decoder step's time goes: the exported step against variants without parts of
it, timed in turns in one process.

Usage (from the repository root, PYTHONPATH=$PWD):
    python benchmarks/litert_step.py --shapes small,base --beam-size 4
    python benchmarks/litert_step.py --shapes base --beam-size 1 --quantization float32

For each shape (random weights) the step is converted as `export --format litert` converts it
(`keras_transformer.export.litert.convert_graphs`), then again with parts taken out:

- `plain_top_k`: `ops.top_k` over the whole vocabulary instead of `blocked_top_k`;
- `no_head`: no output projection, log-softmax normaliser or top-k (the decoder stack alone);
- `no_attention`: the decoder stack without its self- and cross-attention products (the
  fully-connected layers, layer norms and residuals only), no head.

Each runs at 32 sentences x beam rows, a 33-position cache and a 32-token source (the
serve_compare shapes), 2 threads; the best of `--rounds` rounds of 3 calls, the variants taking
turns. The differences are the parts' costs: `head = full - no_head`, `attention = no_head -
no_attention`. One JSON line per shape (ledger `litert_step` with BENCH_LABEL set).

`--cache-variants` adds the two ways of reading only the positions written so far (issue 64):

- `full_t16`: the exported step with a 16-position cache (what the runtime's cache buckets,
  `cache_bucket=16`, run for the first 16 positions);
- `own_slots`: each hypothesis attends only its own slot's `T` keys (per-beam caches, `[B, H,
  k, T, d]` read per query instead of `k * T` keys each), which needs the caches copied in
  the beams' new order at every step: `reorder_copy`, numpy's time to gather every layer's
  keys and values `[B * k, H, T, d]` by an origin permutation in place (no graph), and
  `own_slots_with_copy` their sum.

`--shortlist-width 10446` adds the vocabulary shortlist's step at that many columns (padded to a
multiple of 64; 10,446 is `serve_compare --shortlist`'s batch shortlist of the base shapes):

- `shortlist`: the exported shortlist step (`litert_graphs.shortlist_step_function`: the
  columns' float32 kernel an input, gathered once per chunk by the runtime);
- `shortlist_gathered_logits`: the alternative of projecting onto the whole vocabulary with
  the step's own int8 product, then gathering the shortlist's columns of the logits;
- `shortlist_gathered` (`dynamic_int8` only): what a `dynamic_int8` export runs
  (`export.litert.shortlist_head` `"gathered"`): the decoder stack's step, then the runtime's
  int8 model of the shortlist's columns (`keras_transformer.litert.projection`) and the head
  graph, through `keras_transformer.litert.graphs.GatheredHead` as the runtime calls it (the
  model made once, outside the timing).

`--cache-positions 16,32,64,82` adds the exported step at those cache lengths (`full_t{N}`):
what a request pays per step with its caches grown bucket by bucket against sized at once
(82: a 32-token source plus the default `max_extra_length` 50).
"""

import argparse
import functools
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from benchmarks.common import emit  # noqa: E402
from benchmarks.serve_compare import SHAPES, build_model  # noqa: E402
from keras_transformer.search_rules import NEG_INF  # noqa: E402

VARIANTS = ("full", "plain_top_k", "no_head", "no_attention")


def _without_attention(graphs):
    """The attention products replaced by what keeps the layers' projections in the graph."""

    def self_attention(layer, h, keys, values, bias, beams):
        new_keys = graphs._heads(layer.key_dense(h), beams, layer.num_heads)
        new_values = graphs._heads(layer.value_dense(h), beams, layer.num_heads)
        return layer.output_dense(graphs._merge(new_values)), (new_keys, new_values)

    def cross_attention(layer, h, keys, values, bias, beams):
        return layer.output_dense(h)

    return self_attention, cross_attention


def _own_slots_attention(graphs):
    """Self-attention in which each hypothesis reads only its own slot (`[B, H, k, T, d]`):
    the per-beam caches' cost, on the exported step's inputs (its bias's first slot as the
    hypothesis's own)."""
    import tensorflow as tf
    from keras import ops

    def self_attention(layer, h, keys, values, bias, beams):
        heads = layer.num_heads
        q = graphs._heads(layer.query_dense(h), beams, heads) * (1.0 / layer.key_dim**0.5)
        new_keys = graphs._heads(layer.key_dense(h), beams, heads)  # [B, H, k, d]
        new_values = graphs._heads(layer.value_dense(h), beams, heads)
        shape = tf.shape(keys)
        own_shape = [shape[0], heads, beams, shape[2] // beams, shape[3]]
        keys, values = tf.reshape(keys, own_shape), tf.reshape(values, own_shape)
        bias = tf.reshape(bias, [shape[0], 1, beams, beams, shape[2] // beams])[:, :, :, 0]
        cached = ops.sum(ops.expand_dims(q, 3) * keys, axis=-1) + bias  # [B, H, k, T]
        own = ops.sum(q * new_keys, axis=-1, keepdims=True)
        weights = ops.softmax(ops.concatenate([cached, own], axis=-1), axis=-1)
        out = ops.sum(ops.expand_dims(weights[..., :-1], -1) * values, axis=-2)
        out = out + weights[..., -1:] * new_values
        return layer.output_dense(graphs._merge(out)), (new_keys, new_values)

    return self_attention


def reorder_copy_seconds(cfg, beams, positions, rounds):
    """Best time of gathering every layer's per-beam keys and values `[B * k, H, T, d]` by an
    origin permutation in place, as per-beam caches need at each step."""
    rng = np.random.default_rng(0)
    rows, heads = 32 * beams, cfg["heads"]
    caches = [
        rng.standard_normal((rows, heads, positions, cfg["d"] // heads)).astype("float32")
        for _ in range(2 * cfg["layers"])
    ]
    origin = (np.arange(rows) // beams) * beams + rng.integers(0, beams, rows)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for cache in caches:
            cache[:] = cache[origin]
        best = min(best, time.perf_counter() - start)
    return best


def _gathered_logits_step(graphs):
    """`shortlist_step_function`'s signature, its logits the whole vocabulary's (the step's
    own product) with the shortlist's columns gathered (`shortlist_gathered_logits`), then the
    shortlist step's own head (`litert_graphs.shortlist_head`)."""
    import tensorflow as tf

    def function(model, beams, top_k, banned_ids, eos_id, quantized_embedding=None):
        embed = graphs._embedding(model, quantized_embedding)

        def step(ids, position, self_bias, cross_bias, caches, output_ids, output_kernel,
                 output_bias):  # fmt: skip
            attentions = graphs._attentions(model, beams, self_bias, cross_bias, caches)
            logits, new = model.decoder_step(embed(ids, position), *attentions)
            logits = tf.gather(logits, output_ids, axis=1)
            head = graphs.shortlist_head(logits, output_ids, output_bias, top_k, banned_ids,
                                         eos_id)[0]  # fmt: skip
            return {**graphs._new_caches(new), **head}

        return step

    return function


def _gathered_step(model, settings, quantization, cfg, width):
    """`shortlist_gathered`'s call (module docstring): a function running the stack's step and
    a `GatheredHead` over `width` random columns of `model`'s projection rows."""
    from ai_edge_litert.interpreter import Interpreter

    from keras_transformer.export import litert, litert_graphs
    from keras_transformer.litert.graphs import GatheredHead
    from keras_transformer.litert.runtime import gathered_columns

    beams = settings.beam_size
    hidden_step, names = _converted_step(
        model, settings, quantization, litert._hidden_step, shortlist=False
    )
    head, head_names = litert._convert(litert._gathered_head(2 * beams, settings.eos_id), "float32")
    interpreter = ready_interpreter(hidden_step, cfg, beams)
    hidden = interpreter.get_output_details()[names.index("hidden")]["index"]
    rng = np.random.default_rng(0)
    listed = np.sort(rng.choice(np.arange(4, cfg["vocab"]), width - 4, replace=False))
    ids = np.concatenate([np.arange(4), listed]).astype("int32")
    rows = litert_graphs.shortlist_output_rows(model, quantization)
    columns = gathered_columns(rows, ids, np.ones(width, bool), (settings.pad_id, settings.bos_id))

    def make(content):
        return Interpreter(model_content=content, num_threads=2)

    gathered = GatheredHead(head, head_names, make)
    gathered.start(columns)

    def call():
        interpreter.invoke()
        gathered(interpreter.get_tensor(hidden))

    return call


def convert_variant(model, settings, quantization, variant):
    """The step's LiteRT flatbuffer for `variant` (module docstring)."""
    from keras import ops

    from keras_transformer.export import litert_graphs

    if variant == "shortlist":
        return _convert_step(model, settings, quantization, litert_graphs.shortlist_step_function)
    if variant == "shortlist_mask":
        masked = functools.partial(litert_graphs.step_function, masked=True)
        return _convert_step(model, settings, quantization, masked, "mask")
    if variant == "shortlist_gathered_logits":
        function = _gathered_logits_step(litert_graphs)
        return _convert_step(model, settings, quantization, function)

    saved = (litert_graphs._self_attention, litert_graphs._cross_attention,
             litert_graphs.blocked_top_k, model.project, model.vocab_size)  # fmt: skip
    try:
        if variant == "own_slots":
            litert_graphs._self_attention = _own_slots_attention(litert_graphs)
        if variant == "plain_top_k":
            litert_graphs.blocked_top_k = lambda x, k: ops.top_k(x, k)
        if variant in ("no_head", "no_attention"):  # 16 outputs instead of the vocabulary
            model.project = lambda y, *_: ops.matmul(y, ops.ones((y.shape[-1], 16)))
            model.vocab_size = 16
        if variant == "no_attention":
            attention = _without_attention(litert_graphs)
            litert_graphs._self_attention, litert_graphs._cross_attention = attention
        return _convert_step(model, settings, quantization)
    finally:
        (litert_graphs._self_attention, litert_graphs._cross_attention,
         litert_graphs.blocked_top_k, model.project, model.vocab_size) = saved  # fmt: skip


def _convert_step(model, settings, quantization, step_function=None, shortlist="columns"):
    """The step alone (`step_function`: another of `litert_graphs`' steps, with the `shortlist`
    step's inputs), as `litert.convert_graphs` converts it."""
    return _converted_step(model, settings, quantization, step_function, shortlist)[0]


def _converted_step(model, settings, quantization, step_function=None, shortlist="columns"):
    """`_convert_step`'s `(flatbuffer, output names)`."""
    import tensorflow as tf

    from keras_transformer.export import litert, litert_graphs

    quantized = None
    if quantization == "dynamic_int8":
        quantized = litert_graphs.quantized_rows(model.target_embedding.embeddings.numpy())
    beams = settings.beam_size
    listed = step_function is not None
    step_function = litert_graphs.step_function if step_function is None else step_function
    step = step_function(
        model, beams, 2 * beams, (settings.pad_id, settings.bos_id), settings.eos_id, quantized
    )
    specs = litert._specs(model, beams, shortlist=listed and shortlist)
    function = tf.function(step, input_signature=specs, autograph=False)
    return litert._convert(function, quantization)


def ready_interpreter(flatbuffer, cfg, beams, positions=None, columns=None):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=flatbuffer, num_threads=2)
    inputs = {d["name"]: d["index"] for d in interpreter.get_input_details()}
    c, heads = 32, cfg["heads"]
    positions = cfg["tgt"] + 1 if positions is None else positions
    size = cfg["d"] // heads
    shapes = {"ids": [c * beams], "position": [1], "self_bias": [c, 1, beams, beams * positions],
              "cross_bias": [c, 1, 1, cfg["src"]]}  # fmt: skip
    for i in range(cfg["layers"]):
        shapes[f"self_keys_{i}"] = shapes[f"self_values_{i}"] = [c, heads, beams * positions, size]
        shapes[f"cross_keys_{i}"] = shapes[f"cross_values_{i}"] = [c, heads, cfg["src"], size]
    if columns is not None and "output_mask" in inputs:  # the masked shortlist step's
        shapes["output_mask"] = [cfg["vocab"]]
    elif columns is not None:  # the shortlist step's inputs
        shapes.update(output_ids=[columns], output_bias=[columns])
        shapes["output_kernel"] = [cfg["d"], columns]
    for name, shape in shapes.items():
        interpreter.resize_tensor_input(inputs[name], shape)
    interpreter.allocate_tensors()
    rng = np.random.default_rng(0)
    for name, shape in shapes.items():
        if name == "ids":
            value = rng.integers(4, cfg["vocab"], shape).astype("int32")
        elif name == "output_ids":  # the special ids (EOS among them), then increasing ids
            value = np.sort(rng.choice(np.arange(4, cfg["vocab"]), shape[0] - 4, replace=False))
            value = np.concatenate([np.arange(4), value]).astype("int32")
        elif name == "output_mask":  # the special ids, then `columns` ids at random
            listed = rng.choice(np.arange(4, cfg["vocab"]), columns - 4, replace=False)
            value = np.full(shape, NEG_INF, "float32")
            value[np.concatenate([np.arange(4), listed])] = 0.0
        elif name == "position":
            value = np.array([positions // 2], "int32")
        elif name.endswith("bias"):
            value = np.zeros(shape, "float32")
        else:
            value = rng.standard_normal(shape).astype("float32")
        interpreter.set_tensor(inputs[name], value)
    interpreter.invoke()
    return interpreter


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="small,base")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--quantization", default="dynamic_int8")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--cache-variants", action="store_true",
        help="also full_t16, own_slots and reorder_copy (module docstring)",
    )  # fmt: skip
    parser.add_argument(
        "--shortlist-width", type=int, default=0,
        help="also the shortlist step and its alternative at this many columns (0: not)",
    )  # fmt: skip
    parser.add_argument(
        "--cache-positions", default="",
        help="comma-separated cache lengths to time the full step at (full_tN)",
    )  # fmt: skip
    args = parser.parse_args()
    from keras_transformer.config import DecodingSettings

    settings = DecodingSettings(beam_size=args.beam_size)
    cache_positions = {int(p) for p in args.cache_positions.split(",") if p}
    cache_positions = sorted(cache_positions | ({16} if args.cache_variants else set()))
    for name in args.shapes.split(","):
        cfg = SHAPES[name]
        model = build_model(cfg)
        variants = VARIANTS + (("own_slots",) if args.cache_variants else ())
        listed = ("shortlist", "shortlist_gathered_logits", "shortlist_mask")
        listed = listed if args.shortlist_width else ()
        flatbuffers = {
            v: convert_variant(model, settings, args.quantization, v) for v in variants + listed
        }
        width = -(-args.shortlist_width // 64) * 64
        calls = {
            v: ready_interpreter(flatbuffer, cfg, args.beam_size,
                                 columns=width if v in listed else None).invoke
            for v, flatbuffer in flatbuffers.items()
        }  # fmt: skip
        if listed and args.quantization == "dynamic_int8":
            calls["shortlist_gathered"] = _gathered_step(
                model, settings, args.quantization, cfg, width
            )
            listed += ("shortlist_gathered",)
        extra = {}
        for positions in cache_positions:
            calls[f"full_t{positions}"] = ready_interpreter(
                flatbuffers["full"], cfg, args.beam_size, positions=positions
            ).invoke
        load = os.getloadavg()[0]
        best = dict.fromkeys(calls, float("inf"))
        for _ in range(args.rounds):
            for v, call in calls.items():
                start = time.perf_counter()
                for _ in range(3):
                    call()
                best[v] = min(best[v], (time.perf_counter() - start) / 3)
        if args.cache_variants:
            copy = reorder_copy_seconds(cfg, args.beam_size, cfg["tgt"] + 1, args.rounds)
            best["reorder_copy"] = copy
            best["own_slots_with_copy"] = best["own_slots"] + copy
            extra = {
                f"{v}_over_full": round(best[v] / best["full"], 3)
                for v in ("full_t16", "own_slots", "own_slots_with_copy")
            }
        if listed:
            extra.update(shortlist_width=width, **{
                f"{v}_over_full": round(best[v] / best["full"], 3) for v in listed
            })  # fmt: skip
        ms = {v: round(1e3 * s, 2) for v, s in best.items()}
        emit(what="litert_step_ms", shape=name, beam=args.beam_size,
             quantization=args.quantization, rows=32 * args.beam_size, **ms,
             head=round(ms["full"] - ms["no_head"], 2),
             attention=round(ms["no_head"] - ms["no_attention"], 2),
             top_k_saved=round(ms["plain_top_k"] - ms["full"], 2),
             **extra, load1=load, load1_end=os.getloadavg()[0])  # fmt: skip


if __name__ == "__main__":
    main()
