"""What carrying markup in the SavedModel's graph costs: an untrained preset model exported with
alignments, and on the sentences of `keras_transformer.alignment.synthetic_markup_set` (one to
three elements each, some nested, some `<br/>`):

- `translate_markup` on the marked sentences against `serving_default` (alignments on) on their
  plain text, called alternately, seconds per call;
- the markup graph alone (`export.markup_graph.plain_texts` and `tagged_texts` in one
  `tf.function`, on the same sentences and `serving_default`'s translations and alignments);
- the export's seconds with alignments (tracing `translate_markup` too) and without.

One JSON line per round and a summary (medians, ratios); with `BENCH_LABEL` set they are appended
to `benchmarks/results/markup_cost.jsonl`. Run it alone on the machine: the figures are times.

    BENCH_LABEL=small PYTHONPATH=$PWD python benchmarks/markup_cost.py --preset transformer_small
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import demo_vocabulary, emit  # noqa: E402


def _export(model, tokenizer, work, alignments):
    from keras_transformer.export import ExportPlan, export_saved_model

    start = time.perf_counter()
    data = dict(max_source_length=64, max_target_length=64)
    base = os.path.join(work, f"saved_{int(alignments)}")
    plan = ExportPlan(data=data, alignments=alignments)
    path = export_saved_model(model, tokenizer, plan, base, "demo")
    return path, time.perf_counter() - start


def _timed(call):
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _graph_alone(loaded, marked, is_html, serve_out):
    """The markup graph on `serving_default`'s answers, as a timed call."""
    import tensorflow as tf

    from keras_transformer.export import markup_graph

    tables = markup_graph.Tables()

    @tf.function
    def run(text, is_html, translation, alignment):
        plain, valid = markup_graph.plain_texts(text, is_html, tables)
        return markup_graph.tagged_texts(text, is_html, translation, alignment, valid, tables)

    args = (marked, is_html, serve_out["translation"], serve_out["alignment"])
    run(*args)  # traced once
    return lambda: run(*args)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="transformer_small")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import keras
    import tensorflow as tf

    from keras_transformer.alignment import synthetic_markup_set
    from keras_transformer.data.tokenizer import Tokenizer
    from keras_transformer.markup import strip_markup
    from keras_transformer.models import Transformer

    work = tempfile.mkdtemp(prefix="kt-markup-cost-")
    tokenizer = Tokenizer(demo_vocabulary(work))
    keras.utils.set_random_seed(0)
    model = Transformer.from_preset(args.preset, vocab_size=tokenizer.vocab_size)
    _, export_plain_s = _export(model, tokenizer, work, False)
    path, export_aligned_s = _export(model, tokenizer, work, True)
    loaded = tf.saved_model.load(path)
    serve, marked_fn = loaded.signatures["serving_default"], loaded.signatures["translate_markup"]
    items = synthetic_markup_set(args.sentences, seed=1)
    marked = tf.constant([text for text, _, _, _ in items])
    plain = tf.constant([strip_markup(text) for text, _, _, _ in items])
    kinds = tf.constant(["html"] * len(items))
    is_html = tf.fill([len(items)], True)
    calls = {
        "serving_default": lambda: serve(text=plain),
        "translate_markup": lambda: marked_fn(text=marked, markup=kinds),
    }
    calls["markup_graph"] = _graph_alone(loaded, marked, is_html, serve(text=plain))
    for call in calls.values():
        call()  # warm
    times = {name: [] for name in calls}
    for round_ in range(args.rounds):
        row = {name: round(_timed(call), 4) for name, call in calls.items()}
        for name, seconds in row.items():
            times[name].append(seconds)
        emit(what="markup_cost_round", preset=args.preset, round=round_, **row)
    median = {name: statistics.median(values) for name, values in times.items()}
    emit(
        what="markup_cost",
        preset=args.preset,
        sentences=len(items),
        rounds=args.rounds,
        serving_default_s=round(median["serving_default"], 4),
        translate_markup_s=round(median["translate_markup"], 4),
        markup_graph_s=round(median["markup_graph"], 4),
        markup_graph_ms_per_sentence=round(1000 * median["markup_graph"] / len(items), 3),
        translate_markup_over_serving_default=round(
            median["translate_markup"] / median["serving_default"], 3
        ),
        export_s=round(export_plain_s, 2),
        export_with_alignments_s=round(export_aligned_s, 2),
    )


if __name__ == "__main__":
    main()
