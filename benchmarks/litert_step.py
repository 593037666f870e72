"""Where the LiteRT decoder step's time goes: the exported step against variants without parts of
it, timed in turns in one process.

Usage (from the repository root, PYTHONPATH=$PWD):
    python benchmarks/litert_step.py --shapes small,base --beam-size 4
    python benchmarks/litert_step.py --shapes base --beam-size 1 --quantization float32
    python benchmarks/litert_step.py --shapes base --shortlist 10446  # and the shortlist step

For each shape (random weights) the step is converted as `export --format litert` converts it
(`keras_transformer.export.litert.convert_graphs`), then again with parts taken out:

- `plain_top_k`: `ops.top_k` over the whole vocabulary instead of `blocked_top_k`;
- `no_head`: no output projection, log-softmax normaliser or top-k (the decoder stack alone);
- `no_attention`: the decoder stack without its self- and cross-attention products (the
  fully-connected layers, layer norms and residuals only), no head.

With `--shortlist N` (a shortlist of `N` columns, padded as the runtime pads it), also the
shortlist step (`litert_graphs.shortlist_step_function`, its columns made once per chunk):

- `shortlist`: the exported shortlist step;
- `shortlist_plain_top_k`: with `ops.top_k` over the columns instead of `blocked_top_k`;
- `shortlist_gather`: the columns' rows gathered from the int8 (or float) table and dequantized
  in the step at every call (the design before the columns became an input);
- `shortlist_full_product`: the full step's product over the whole vocabulary (the constant,
  int8, projection), then the shortlist's columns of it taken;
- with `--groups G1,G2` (sentences per group), `shortlist_groups_G`: each group of `G`
  sentences over its own shortlist (`serve_compare.synthetic_table`'s for the serve_compare
  sources, the widest group's width), a batched product `[groups, G * beams, d] x [groups, d,
  n]`.

`--variants` picks a subset (default: all).

Each runs at 32 sentences x beam rows, a 33-position cache and a 32-token source (the
serve_compare shapes), 2 threads; the best of `--rounds` rounds of 3 calls, the variants taking
turns. The differences are the parts' costs: `head = full - no_head`, `attention = no_head -
no_attention`. One JSON line per shape (ledger `litert_step` with BENCH_LABEL set).
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from benchmarks.common import emit  # noqa: E402
from benchmarks.serve_compare import SENTENCES, SHAPES, build_model  # noqa: E402

VARIANTS = ("full", "plain_top_k", "no_head", "no_attention")
SHORTLIST_VARIANTS = (
    "shortlist", "shortlist_plain_top_k", "shortlist_gather", "shortlist_full_product"
)  # fmt: skip


def _without_attention(graphs):
    """The attention products replaced by what keeps the layers' projections in the graph."""

    def self_attention(layer, h, keys, values, bias, beams):
        new_keys = graphs._heads(layer.key_dense(h), beams, layer.num_heads)
        new_values = graphs._heads(layer.value_dense(h), beams, layer.num_heads)
        return layer.output_dense(graphs._merge(new_values)), (new_keys, new_values)

    def cross_attention(layer, h, keys, values, bias, beams):
        return layer.output_dense(h)

    return self_attention, cross_attention


def convert_variant(model, settings, quantization, variant):
    """The step's LiteRT flatbuffer for `variant` (module docstring)."""
    from keras import ops

    from keras_transformer.export import litert_graphs

    saved = (litert_graphs._self_attention, litert_graphs._cross_attention,
             litert_graphs.blocked_top_k, model.project, model.vocab_size)  # fmt: skip
    try:
        if variant == "plain_top_k":
            litert_graphs.blocked_top_k = lambda x, k: ops.top_k(x, k)
        if variant in ("no_head", "no_attention"):  # 16 outputs instead of the vocabulary
            model.project = lambda y, kernel=None: ops.matmul(y, ops.ones((y.shape[-1], 16)))
            model.vocab_size = 16
        if variant == "no_attention":
            attention = _without_attention(litert_graphs)
            litert_graphs._self_attention, litert_graphs._cross_attention = attention
        return _convert_step(model, settings, quantization)
    finally:
        (litert_graphs._self_attention, litert_graphs._cross_attention,
         litert_graphs.blocked_top_k, model.project, model.vocab_size) = saved  # fmt: skip


def convert_shortlist_variant(model, settings, quantization, variant):
    """The shortlist step's LiteRT flatbuffer for `variant` (module docstring)."""
    import tensorflow as tf
    from keras import ops

    from keras_transformer.export import litert, litert_graphs

    quantized = None
    if quantization == "dynamic_int8":
        quantized = litert_graphs.quantized_rows(model.target_embedding.embeddings.numpy())
    beams = settings.beam_size
    saved = litert_graphs.blocked_top_k
    try:
        if variant == "shortlist_plain_top_k":
            litert_graphs.blocked_top_k = lambda x, k: ops.top_k(x, k)
        step = litert_graphs.shortlist_step_function(model, beams, 2 * beams, quantized)
        specs = litert._specs(model, beams, shortlist=True)
        if variant == "shortlist_gather":
            step, specs = _gathering(step, specs, model, quantized)
        if variant == "shortlist_full_product" or variant.startswith("shortlist_groups_"):
            groups = None
            if variant.startswith("shortlist_groups_"):
                groups = SENTENCES // int(variant.rsplit("_", 1)[1])
            step, specs = _other_head(model, beams, 2 * beams, quantized, groups, specs)
        function = tf.function(step, input_signature=specs, autograph=False)
        return litert._convert(function, quantization)[0]
    finally:
        litert_graphs.blocked_top_k = saved


def _other_head(model, beams, top_k, quantized, groups, specs):
    """A shortlist step with another head (module docstring): `groups` None, the full product
    then the shortlist's columns; else `groups` groups of sentences, each with its columns
    (`output_ids`, `output_rows`, `output_bias`, `output_ban` with a leading `[groups]`)."""
    import tensorflow as tf
    from keras import ops

    from keras_transformer.export import litert_graphs as graphs

    embed = graphs._embedding(model, quantized)

    def step(ids, position, self_bias, cross_bias, caches, output_ids, output_rows,
             output_bias, output_ban, eos_column):  # fmt: skip
        attentions = graphs._attentions(model, beams, self_bias, cross_bias, caches)
        x = embed(ids, position)
        if groups is None:
            logits, new = model.decoder_step(x, *attentions)
            logits = ops.take(logits, output_ids, axis=1) + output_bias
            banned = logits + output_ban
        else:
            y, _, new = model.decoder.step(x, *attentions, training=False)
            y = ops.reshape(y, (groups, -1, model.d_model))
            product = tf.matmul(y, output_rows, transpose_b=True)
            grouped = product + ops.expand_dims(output_bias, 1)  # [groups, G * beams, n]
            width = ops.shape(output_rows)[1]
            logits = ops.reshape(grouped, (-1, width))
            banned = ops.reshape(grouped + ops.expand_dims(output_ban, 1), (-1, width))
        outputs = graphs._new_caches(new)
        top_logits, top_columns = graphs.blocked_top_k(banned, top_k)
        normaliser = ops.logsumexp(logits, axis=-1, keepdims=True)
        outputs["top_log_probs"] = top_logits - normaliser
        if groups is None:
            top_ids = ops.take(output_ids, top_columns, axis=0)
        else:
            columns = ops.reshape(top_columns, (groups, -1))
            top_ids = ops.reshape(tf.gather(output_ids, columns, batch_dims=1), (-1, top_k))
        outputs["top_ids"] = ops.cast(top_ids, "int32")
        outputs["eos_log_probs"] = ops.take(logits, eos_column, axis=1)[:, 0] - normaliser[:, 0]
        return outputs

    if groups is None:
        return _without_rows(step), [x for x in specs if getattr(x, "name", None) != "output_rows"]
    grouped = {"output_ids": tf.int32, "output_bias": tf.float32, "output_ban": tf.float32}
    specs = [tf.TensorSpec([None, None], grouped[x.name], name=x.name)
             if getattr(x, "name", None) in grouped else x for x in specs]  # fmt: skip
    specs = [tf.TensorSpec([None, None, model.d_model], tf.float32, name="output_rows")
             if getattr(x, "name", None) == "output_rows" else x for x in specs]  # fmt: skip
    return step, specs


def _without_rows(step):
    def without(ids, position, self_bias, cross_bias, caches, output_ids, output_bias,
                output_ban, eos_column):  # fmt: skip
        return step(ids, position, self_bias, cross_bias, caches, output_ids, None,
                    output_bias, output_ban, eos_column)  # fmt: skip

    return without


def group_widths(cfg, sentences_per_group, beams):
    """The widest shortlist of the serve_compare sources' groups of `sentences_per_group`
    sentences under `serve_compare.synthetic_table` (k 50, m 100), padded as the runtime pads
    it (to 64, at least `2 * beams` blocks)."""
    from benchmarks.serve_compare import synthetic_table
    from keras_transformer.lexical_table import batch_shortlist

    table = synthetic_table(cfg["vocab"], 50, 100)
    ids = np.random.default_rng(1).integers(4, cfg["vocab"], (SENTENCES, cfg["src"]))
    ids = np.concatenate([ids, np.full((SENTENCES, 1), 3)], axis=1)  # as word_vocabulary's ids
    widths = []
    for start in range(0, SENTENCES, sentences_per_group):
        listed, _ = batch_shortlist(table.translations, table.frequent,
                                    ids[start : start + sentences_per_group])  # fmt: skip
        widths.append(max(listed.size, 2 * beams * 64))
    return max(widths)


def _gathering(step, specs, model, quantized):
    """`step` with its `output_rows` gathered from the projection's table at every call (the
    int8 rows dequantized with their scales, as `_embedding` does), and the specs without
    `output_rows`."""
    from keras import ops

    from keras_transformer.export import litert_graphs

    arrays = litert_graphs.projection_rows(model, quantized)
    table = ops.convert_to_tensor(arrays["rows"])
    scales = None
    if "scales" in arrays:
        steps, unit = litert_graphs.fixed_point_scales(arrays["scales"])
        scales = ops.convert_to_tensor(steps), unit

    def gathering(ids, position, self_bias, cross_bias, caches, output_ids, output_bias,
                  output_ban, eos_column):  # fmt: skip
        rows = ops.cast(ops.take(table, output_ids, axis=0), "float32")
        if scales is not None:
            row_scales = ops.cast(ops.take(scales[0], output_ids, axis=0), "float32")
            rows = rows * ops.expand_dims(row_scales * scales[1], 1)
        return step(ids, position, self_bias, cross_bias, caches, output_ids, rows,
                    output_bias, output_ban, eos_column)  # fmt: skip

    return gathering, [x for x in specs if getattr(x, "name", None) != "output_rows"]


def _convert_step(model, settings, quantization):
    """The step alone, as `litert.convert_graphs` converts it."""
    import tensorflow as tf

    from keras_transformer.export import litert, litert_graphs

    quantized = None
    if quantization == "dynamic_int8":
        quantized = litert_graphs.quantized_rows(model.target_embedding.embeddings.numpy())
    beams = settings.beam_size
    step = litert_graphs.step_function(
        model, beams, 2 * beams, (settings.pad_id, settings.bos_id), settings.eos_id, quantized
    )
    function = tf.function(step, input_signature=litert._specs(model, beams), autograph=False)
    return litert._convert(function, quantization)[0]


def ready_interpreter(flatbuffer, cfg, beams, columns=None, groups=None):
    """`columns`: the shortlist step's width (padded as the runtime pads it); `groups`: that
    many groups of sentences, each with `columns` of its own."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=flatbuffer, num_threads=2)
    inputs = {d["name"]: d["index"] for d in interpreter.get_input_details()}
    c, positions, heads = 32, cfg["tgt"] + 1, cfg["heads"]
    size = cfg["d"] // heads
    shapes = {"ids": [c * beams], "position": [1], "self_bias": [c, 1, beams, beams * positions],
              "cross_bias": [c, 1, 1, cfg["src"]]}  # fmt: skip
    rng = np.random.default_rng(0)
    values = {}
    if columns is not None:
        lead = () if groups is None else (groups,)
        ids = [np.sort(rng.choice(np.arange(4, cfg["vocab"]), columns - 4, replace=False))
               for _ in range(groups or 1)]  # fmt: skip
        ids = np.stack([np.concatenate([np.arange(4), x]) for x in ids]).astype("int32")
        values["output_ids"] = ids.reshape(lead + (columns,))
        values["output_rows"] = 0.05 * rng.standard_normal(lead + (columns, cfg["d"]), "float32")
        values["output_bias"] = values["output_ban"] = np.zeros(lead + (columns,), "float32")
        values["eos_column"] = np.array([3], "int32")
        values = {name: v for name, v in values.items() if name in inputs}
        shapes.update({name: list(v.shape) for name, v in values.items()})
    for i in range(cfg["layers"]):
        shapes[f"self_keys_{i}"] = shapes[f"self_values_{i}"] = [c, heads, beams * positions, size]
        shapes[f"cross_keys_{i}"] = shapes[f"cross_values_{i}"] = [c, heads, cfg["src"], size]
    for name, shape in shapes.items():
        interpreter.resize_tensor_input(inputs[name], shape)
    interpreter.allocate_tensors()
    for name, shape in shapes.items():
        if name in values:
            value = values[name]
        elif name == "ids":
            value = rng.integers(4, cfg["vocab"], shape).astype("int32")
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
    parser.add_argument("--shortlist", type=int, default=None,
                        help="also the shortlist step over this many columns")  # fmt: skip
    parser.add_argument("--groups", default="", help="sentences per shortlist group, e.g. 8,4")
    parser.add_argument("--variants", default="", help="a subset of the variants (default all)")
    args = parser.parse_args()
    from keras_transformer.config import DecodingSettings

    settings = DecodingSettings(beam_size=args.beam_size)
    for name in args.shapes.split(","):
        cfg = SHAPES[name]
        model = build_model(cfg)
        chosen = [v for v in args.variants.split(",") if v]
        interpreters, widths = {}, {}
        for v in VARIANTS:
            if not chosen or v in chosen:
                flatbuffer = convert_variant(model, settings, args.quantization, v)
                interpreters[v] = ready_interpreter(flatbuffer, cfg, args.beam_size)
        if args.shortlist:
            block, top_k = 64, 2 * args.beam_size  # as the runtime pads it
            width = max(-(-args.shortlist // block) * block, top_k * block)
            for v in SHORTLIST_VARIANTS:
                if not chosen or v in chosen:
                    flatbuffer = convert_shortlist_variant(model, settings, args.quantization, v)
                    interpreters[v] = ready_interpreter(flatbuffer, cfg, args.beam_size, width)
        for size in [int(g) for g in args.groups.split(",") if g]:
            v = f"shortlist_groups_{size}"
            widths[v] = group_widths(cfg, size, args.beam_size)
            flatbuffer = convert_shortlist_variant(model, settings, args.quantization, v)
            interpreters[v] = ready_interpreter(flatbuffer, cfg, args.beam_size, widths[v],
                                                SENTENCES // size)  # fmt: skip
        load = os.getloadavg()[0]
        best = dict.fromkeys(interpreters, float("inf"))
        for _ in range(args.rounds):
            for v, interpreter in interpreters.items():
                start = time.perf_counter()
                for _ in range(3):
                    interpreter.invoke()
                best[v] = min(best[v], (time.perf_counter() - start) / 3)
        ms = {v: round(1e3 * s, 2) for v, s in best.items()}
        parts = {}
        if {"full", "no_head", "no_attention", "plain_top_k"} <= set(ms):
            parts = dict(head=round(ms["full"] - ms["no_head"], 2),
                         attention=round(ms["no_head"] - ms["no_attention"], 2),
                         top_k_saved=round(ms["plain_top_k"] - ms["full"], 2))  # fmt: skip
        emit(what="litert_step_ms", shape=name, beam=args.beam_size,
             quantization=args.quantization, rows=32 * args.beam_size, **ms, **parts,
             shortlist_width=args.shortlist, group_widths=widths,
             load1=load, load1_end=os.getloadavg()[0])  # fmt: skip


if __name__ == "__main__":
    main()
