"""Generates the documentation's results page, `docs/results.md`, from `benchmarks/results/`:
the questions users ask (`benchmarks/questions.py`), each answered by one plot
(`docs/img/<question>.png`, drawn from the points recorded beside it, `docs/img/<question>.json`)
and one small table whose numbers link their ledger lines; then the current figures
(`figures.yaml`, each read from the ledger lines it names; `benchmarks/figures.py`), and a list
of the ledgers. Each ledger has its own page, `docs/ledgers/<benchmark>.md`: one table (its
latest lines and those the figures read, the others folded), each line numbered as in its file
with an anchor `<benchmark>-<line>` that other pages link to. It also writes the README's
headline table and every figure a page quotes (`<!-- figure: ID -->...<!-- /figure -->`).

    python -m benchmarks.results_page           # rewrites the pages, the README's table, the
                                                # figures the pages quote, the plots' data and
                                                # the plots whose data changed
    python -m benchmarks.results_page --plots   # the same, redrawing every plot
    python -m benchmarks.results_page --check   # exit 1 if any of them is stale (a plot's data
                                                # against the ledgers; its PNG only present)

`tests/test_docs.py` and `tests/test_results_page.py` run the checks.
"""

import html
import json
import os
import re
import sys

try:
    from benchmarks import figures, ledger, machines, questions
    from benchmarks.questions import NOT_MEASURED
except ImportError:  # run as a script from benchmarks/
    import figures
    import ledger
    import machines
    import questions
    from questions import NOT_MEASURED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "results.md")
README = os.path.join(ROOT, "README.md")
# The README's Results table lies between these lines.
FIGURES_START, FIGURES_END = "<!-- results-figures:start -->", "<!-- results-figures:end -->"


class Column:
    """One column of a ledger's table: its `header`, and `render(row)` giving the cell's text
    (None: empty) and the fields it shows (the rest of the line goes into the last cell)."""

    def __init__(self, header, fields, text=None):
        self.header, self.fields, self._text = header, tuple(fields), text

    def render(self, row):
        present = [f for f in self.fields if row.get(f) not in (None, "", [], {})]
        if not present:
            return None, ()
        if self._text is None:  # the first field the line has
            return _value(row[present[0]]), (present[0],)
        return self._text(row), tuple(present)


def first(header, *fields):
    """The first of `fields` that the line has."""
    return Column(header, fields)


def pair(header, a, b):
    """`a / b` (or `a` alone)."""
    return Column(header, (a, b), lambda r: " / ".join(_value(r[f]) for f in (a, b) if f in r))


def labelled(header, *parts):
    """`label value, label value` for the `(label, field, suffix)` parts the line has."""
    fields = [field for _, field, _ in parts]

    def text(row):
        shown = [
            f"{label} {_value(row[field])}{suffix}".strip()
            for label, field, suffix in parts
            if row.get(field) is not None
        ]
        return ", ".join(shown)

    return Column(header, fields, text)


def ratios(header="ratios"):
    """Every `*_over_*` field of the line: `ours_litert_float32_over_ct2_int8` is shown as
    `ours litert float32 / ct2 int8`."""

    class _Ratios(Column):
        def render(self, row):
            names = [k for k in row if "_over_" in k and isinstance(row[k], (int, float))]
            text = "; ".join(
                f"{k.replace('_over_', ' / ').replace('_', ' ')} {_value(row[k])}x" for k in names
            )
            return (text or None), tuple(names)

    return _Ratios(header, ())


def _value(value):
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
        return ", ".join(map(_value, value))
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


# At most this many columns of figures per ledger (the page's tables have the line's number,
# the run and the rest of its fields besides: 7 columns in all, narrow enough for the page).
MAX_FIGURE_COLUMNS = 4
# What each ledger's table shows in its own columns; every other field of a line is in the
# line's last cell ("more"). tests/test_docs.py fails on a ledger without an entry, and on a
# current figure (figures.yaml) whose field is not in a column of its line.
COLUMNS = {
    "quality_budget": [
        Column(
            "system, config changes",
            ("system", "overrides"),
            lambda r: " ".join(
                [str(r.get("system", ""))] + [f"`{o}`" for o in r.get("overrides") or []]
            ),
        ),
        labelled("steps, precision", ("", "steps", ""), ("", "precision", "")),
        pair("dev BLEU / chrF", "dev_bleu", "dev_chrf"),
        pair("test BLEU / chrF", "test_bleu", "test_chrf"),
    ],
    "quickstart": [
        labelled("steps, precision", ("", "steps", ""), ("", "precision", "")),
        first("train min", "train_min"),
        pair("dev BLEU / chrF", "dev_bleu", "dev_chrf"),
        pair("test BLEU / chrF", "test_bleu", "test_chrf"),
    ],
    "decode_sweep": [
        first("model's steps", "steps"),
        labelled("beam, alpha", ("beam", "beam_size", ""), ("alpha", "alpha", "")),
        pair("BLEU / chrF", "bleu", "chrf"),
        first("length ratio", "length_ratio"),
    ],
    "compare": [
        first("what", "what", "run"),
        first("tokens/s", "tokens_per_s"),
        labelled(
            "ours / Model Garden",
            ("train", "train_ratio", "x"),
            ("beam-4", "beam4_ratio", "x"),
        ),
        labelled(
            "MFU; bfloat16",
            ("", "mfu", ""),
            ("", "ours_mfu", ""),
            ("bf16 / fp32", "bf16_over_fp32", "x"),
            ("bf16 MFU", "ours_bf16_mfu", ""),
        ),
    ],
    "train_throughput": [
        labelled("dtype, oneDNN", ("", "dtype", ""), ("oneDNN", "onednn", "")),
        first("tokens/s", "tokens_per_s"),
        first("GFLOP/s", "model_gflops_per_s"),
        first("max RSS MB", "max_rss_mb"),
    ],
    "serve_compare": [
        first("system", "system", "what"),
        labelled("shapes, beam", ("", "shapes", ""), ("beam", "beam", "")),
        first("tokens/s", "tokens_per_s"),
        ratios(),
    ],
    "prepare_scale": [
        first("figure", "figure"),
        labelled("corpus", ("", "corpus", ""), ("pairs", "pairs", ""), ("", "corpus_pairs", "")),
        labelled(
            "seconds", ("", "seconds", ""), ("to the first step", "seconds_to_first_step", "")
        ),
        labelled(
            "throughput, shards",
            ("tokens/s", "tokens_per_s", ""),
            ("pairs/s", "pairs_per_s", ""),
            ("shard bytes", "shard_bytes", ""),
        ),
    ],
    "ab_checkouts": [
        labelled("checkout, shapes", ("", "checkout", ""), ("", "shapes", "")),
        first("what", "what"),
        first("tokens/s", "tokens_per_s"),
        labelled(
            "second / first",
            ("train", "train_ratio", "x"),
            ("beam-4", "beam4_decode_ratio", "x"),
        ),
    ],
    "back_translation": [
        labelled(
            "system", ("", "system", ""), ("pairs", "train_pairs", ""), ("lines", "lines", "")
        ),
        labelled("minutes, steps", ("", "train_min", " min"), ("", "steps", " steps")),
        pair("dev BLEU / chrF", "dev_bleu", "dev_chrf"),
        Column(
            "test BLEU / chrF; lines/s",
            ("test_bleu", "test_chrf", "lines_per_second"),
            lambda r: (
                f"{_value(r['lines_per_second'])} lines/s"
                if "test_bleu" not in r
                else f"{_value(r['test_bleu'])} / {_value(r.get('test_chrf', ''))}"
            ),
        ),
    ],
    "translate_file": [
        labelled("system", ("", "system", ""), ("XLA export", "jit_compile", "")),
        labelled("lines, beam", ("", "lines", ""), ("beam", "beam_size", "")),
        first("lines/s", "lines_per_second"),
        first("same as ours", "same_as_ours"),
    ],
    "prepare_workers": [
        first("workers", "workers", "speedup"),
        labelled("pairs, seconds", ("", "pairs", ""), ("", "seconds", " s")),
        first("pairs/s", "pairs_per_second"),
        labelled("ratio, same shards", ("", "ratio", "x"), ("same", "identical_shards", "")),
    ],
    "ci_times": [
        first("phase", "phase"),
        first("s", "seconds"),
        first("tests", "tests"),
        first("peak GB", "peak_gb"),
    ],
    "restart_cost": [
        labelled("strategy, way", ("", "strategy", ""), ("", "way", "")),
        first("position", "position"),
        first("restart s", "restart_seconds"),
        first("ratio", "restart_ratio", "ratio"),
    ],
    "serve_latency": [
        first("sentences per request", "sentences"),
        first("calls", "calls"),
        pair("p50 / p99 ms", "p50_ms", "p99_ms"),
        first("sentences/s", "sentences_per_s"),
    ],
    "profile_ops": [
        labelled("mode, step", ("", "mode", ""), ("", "step_ms", " ms")),
        pair("matmul ms / share", "matmul_ms", "matmul_share"),
        pair("other / idle ms", "other_ms", "idle_ms"),
        first("model GFLOP/s in matmul time", "model_gflops_per_s_in_matmul_time"),
    ],
    "select_on_dev": [
        labelled("seed, steps", ("seed", "seed", ""), ("", "steps", " steps")),
        labelled(
            "chosen: dev / test BLEU",
            ("", "chosen", ""),
            ("dev", "chosen_dev_bleu", ""),
            ("test", "chosen_test_bleu", ""),
        ),
        labelled(
            "budget",
            ("minutes", "budget_min", ""),
            ("training + end", "training_plus_end_s", " s"),
        ),
        labelled(
            "screened choice",
            ("dev BLEU against every candidate", "screened_minus_exhaustive_dev_bleu", ""),
            ("in", "screened_seconds", " s"),
            ("against", "exhaustive_seconds", " s"),
        ),
    ],
    "accelerator_check": [
        labelled("what", ("", "what", ""), ("", "impl", ""), ("", "dtype", "")),
        first("tokens/s", "tokens_per_s"),
        labelled(
            "MFU, peak",
            ("MFU", "mfu_measured_bf16", ""),
            ("bf16 TFLOP/s", "bf16_tflops", ""),
            ("", "device_kind", ""),
        ),
        labelled(
            "quickstart dev BLEU",
            ("beam", "dev_bleu_beam", ""),
            ("greedy", "dev_bleu_greedy", ""),
        ),
    ],
    "confidence": [
        labelled("model", ("", "config", ""), ("", "steps", " steps")),
        first("test sentences", "test_sentences"),
        first("Spearman with chrF", "test_spearman_chrf"),
        pair("chrF: lowest tenth / rest", "test_chrf_lowest_decile", "test_chrf_rest"),
    ],
    "integrity_cost": [
        first("what", "what"),
        first("GB", "gigabytes"),
        first("seconds", "seconds"),
        first("s per GB", "seconds_per_gb"),
    ],
    "litert_footprint": [
        labelled("shape, weights", ("", "shape", ""), ("", "quantization", "")),
        first("parameters", "parameters"),
        first("on disk MB", "disk_mb"),
        first("peak memory MB", "peak_rss_mb"),
    ],
    "litert_quality": [
        labelled("what", ("", "what", ""), ("", "export", "")),
        labelled(
            "same translations",
            ("", "same", ""),
            ("of", "dev_sentences", ""),
            ("max score difference", "max_score_difference", ""),
        ),
        labelled("test BLEU, MB", ("", "bleu", ""), ("", "size_mb", " MB")),
        labelled(
            "BLEU differences",
            ("float16 - float32", "float16_minus_float32", ""),
            ("dynamic_int8 - float32", "dynamic_int8_minus_float32", ""),
            ("float32 - SavedModel", "float32_minus_saved_model", ""),
        ),
    ],
    "litert_step": [
        labelled("shape, beam", ("", "shape", ""), ("beam", "beam", ""), ("", "quantization", "")),
        labelled(
            "step ms (at T cache positions)",
            ("", "full", ""),
            *((f"T {n}", f"full_t{n}", "") for n in (16, 32, 64, 82)),
        ),
        pair("head / attention ms", "head", "attention"),
        first("one-pass top-K saves ms", "top_k_saved"),
    ],
    "serve_warmup": [
        labelled("mode", ("", "mode", ""), ("run", "run", "")),
        labelled("load, replay s", ("load", "load_s", ""), ("replay", "replay_s", "")),
        Column(
            "first / second request ms",
            ("first_request_ms", "second_request_ms", "median_first_request_ms"),
            lambda r: (
                f"median {_value(r['median_first_request_ms'])}"
                if "median_first_request_ms" in r
                else f"{_value(r['first_request_ms'])} / {_value(r.get('second_request_ms'))}"
            ),
        ),
        first("warmup records", "records"),
    ],
    "shortlist_quality": [
        labelled("system", ("", "system", ""), ("", "what", "")),
        pair("test BLEU / chrF", "bleu", "chrf"),
        labelled(
            "with minus without (bfloat16_bleu_deltas: bfloat16 minus float32)",
            ("SavedModel", "saved_model_delta", ""),
            ("LiteRT int8", "litert_int8_delta", ""),
            ("SavedModel with the shortlist", "saved_model_shortlist_delta", ""),
        ),
        labelled(
            "same translations",
            ("SavedModel", "saved_model_same", ""),
            ("LiteRT int8", "litert_int8_same", ""),
            ("SavedModel with the shortlist", "saved_model_shortlist_same", ""),
        ),
    ],
    "shortlist_build": [
        first("pairs", "pairs"),
        first("pairs per second", "pairs_per_second"),
        first("seconds", "seconds"),
    ],
    "glossary": [
        labelled("system", ("", "system", ""), ("fraction", "fraction", "")),
        labelled(
            "term use, constraints met",
            ("", "term_use_rate", ""),
            ("met", "constraints_met", ""),
        ),
        pair("test BLEU / chrF", "test_bleu", "test_chrf"),
        first("sentences/s", "sentences_per_second"),
    ],
    "guided_alignment": [
        labelled("system", ("", "system", ""), ("weight", "weight", "")),
        labelled(
            "AER (pairs scored)",
            ("", "aer", ""),
            ("on", "translated_exactly", ""),
            ("of", "alignment_set", ""),
        ),
        labelled(
            "markup",
            ("kept", "markup_kept", ""),
            ("around the right words", "tags_around_right_words", ""),
        ),
        pair("test BLEU / chrF", "test_bleu", "test_chrf"),
    ],
    "train_backends": [
        labelled("backend, shape", ("", "backend", ""), ("", "shape", ""), ("", "what", "")),
        first("tokens/s", "tokens_per_s"),
        pair("TensorFlow / JAX tokens/s", "tf_tokens_per_s", "jax_tokens_per_s"),
        Column("JAX / TensorFlow", ("jax_over_tf",), lambda r: f"{_value(r['jax_over_tf'])}x"),
    ],
    "markup_cost": [
        labelled("what, preset", ("", "what", ""), ("", "preset", "")),
        labelled(
            "seconds a call",
            ("serving_default", "serving_default", ""),
            ("translate_markup", "translate_markup", ""),
            ("markup graph", "markup_graph", ""),
            ("serving_default", "serving_default_s", ""),
            ("translate_markup", "translate_markup_s", ""),
            ("markup graph", "markup_graph_s", ""),
        ),
        labelled(
            "ratio, ms a sentence",
            ("translate_markup / serving_default", "translate_markup_over_serving_default", "x"),
            ("markup graph ms a sentence", "markup_graph_ms_per_sentence", ""),
        ),
        labelled(
            "export s",
            ("without alignments", "export_s", ""),
            ("with", "export_with_alignments_s", ""),
        ),
    ],
    "export_cost": [
        labelled("checkout, preset", ("", "checkout", ""), ("", "preset", "")),
        labelled(
            "export s",
            ("", "export_s", ""),
            ("first", "first_export_s", ""),
            ("second", "second_export_s", ""),
        ),  # fmt: skip
        labelled(
            "load s",
            ("", "load_s", ""),
            ("first", "first_load_s", ""),
            ("second", "second_load_s", ""),
        ),  # fmt: skip
        labelled(
            "size MB",
            ("", "size_mb", ""),
            ("first", "first_size_mb", ""),
            ("second", "second_size_mb", ""),
        ),  # fmt: skip
    ],
}
# Each ledger's section title, and the script that writes it.
TITLES = {
    "quality_budget": ("Quality per CPU budget", "benchmarks/quality_budget.py"),
    "quickstart": ("The quickstart", "benchmarks/quickstart.py"),
    "decode_sweep": ("Beam size and length penalty on dev", "benchmarks/decode_sweep.py"),
    "compare": ("Speed against TF Model Garden", "benchmarks/compare.sh"),
    "train_throughput": ("Training throughput by precision", "benchmarks/train_throughput.py"),
    "serve_compare": ("Serving speed, three engines", "benchmarks/serve_compare.py"),
    "prepare_scale": ("Preparing WMT'14-sized corpora", "benchmarks/prepare_scale.py"),
    "ab_checkouts": ("Two checkouts alternately", "benchmarks/ab_checkouts.py"),
    "back_translation": ("Tagged back-translation", "benchmarks/back_translation.py"),
    "select_on_dev": ("The dev set chooses the export", "benchmarks/select_on_dev.py"),
    "translate_file": ("Translating a file against CTranslate2", "benchmarks/translate_file.py"),
    "prepare_workers": ("`prepare` with 1 and 2 workers", "benchmarks/prepare_workers.py"),
    "restart_cost": ("What a resume costs at steps 100 and 100,000", "benchmarks/restart_cost.py"),
    "ci_times": ("CI's phases on 2 cores: seconds, tests, peak memory", "benchmarks/ci_times.py"),
    "profile_ops": ("Where a step's wall time goes", "benchmarks/profile_ops.py"),
    "serve_latency": (
        "Requests of 1 to 64 sentences through `serving_default`",
        "benchmarks/serve_latency.py",
    ),
    "export_cost": (
        "The SavedModel export's time, size and load time, two checkouts",
        "benchmarks/export_cost.py",
    ),
    "serve_warmup": (
        "The first request, with and without warmup records",
        "benchmarks/serve_warmup.py",
    ),
    "litert_step": ("Where a LiteRT decoder step's time goes", "benchmarks/litert_step.py"),
    "litert_footprint": (
        "The LiteRT export on disk and in memory",
        "benchmarks/litert_footprint.py",
    ),
    "litert_quality": ("The LiteRT export's answers and BLEU", "benchmarks/litert_quality.py"),
    "confidence": ("The exported confidence on held-out sentences", "benchmarks/confidence.py"),
    "integrity_cost": ("What the checksums cost", "benchmarks/integrity_cost.py"),
    "train_backends": (
        "Training on the JAX and TensorFlow backends on a CPU",
        "benchmarks/train_backends.py",
    ),
    "shortlist_quality": (
        "BLEU with and without the vocabulary shortlist",
        "benchmarks/shortlist_quality.py",
    ),
    "shortlist_build": (
        "Building the vocabulary shortlist's lexical table",
        "benchmarks/shortlist_build.py",
    ),
    "glossary": ("Glossaries: term use and BLEU", "benchmarks/glossary.py"),
    "guided_alignment": (
        "Attention alignments with and without guided alignment",
        "benchmarks/guided_alignment.py",
    ),
    "markup_cost": (
        "Markup in the SavedModel's graph: `translate_markup` against `serving_default`",
        "benchmarks/markup_cost.py",
    ),
    "accelerator_check": (
        "One GPU: the JAX backend against PyTorch",
        "benchmarks/accelerator_check.py",
    ),
}
INTRO = """\
# Results

<!-- Generated by `python -m benchmarks.results_page` from benchmarks/results/ (figures.yaml and
the *.jsonl ledgers): do not edit. tests/test_docs.py fails when this page is stale. -->

The questions users ask of this Transformer, each answered by one plot and one small table read
from the benchmarks' ledgers by `python -m benchmarks.results_page` (the plot's numbers are
recorded beside it, `docs/img/<question>.json`, and checked against the ledgers). Each number
links its ledger line, on the [ledger's own page](#the-ledgers) with the line's other fields;
*not measured* marks a cell no ledger line holds. Speed is measured on the machine named in
the table, 2 CPU threads unless a GPU is named; figures from different machines are not
comparable with each other.

"""
FIGURES_TEXT = """\
## Current figures

The figures the README and the guides quote, each read from the ledger lines its row links
and rounded half up to the digits shown. Quality is measured on the Tatoeba English-German
pairs ([which, and where to get them](benchmarks.md#the-corpus)). How each figure is computed
from its lines, and the command that reproduces it, is folded below the table
([how to add a row](benchmarks.md#current-figures)).

"""
LEDGERS = """\
## The ledgers

Every number above is a line of a ledger, `benchmarks/results/<benchmark>.jsonl`: one
append-only file per benchmark, each line one measurement with its run (label, date, machine
with its CPU flags) and the command that reproduces it (run from the repository root). Each
ledger has its page, a row per line with its number as anchor (`<benchmark>-<line>`), which
this page, the guides and the [experiment history](history.md) link. A benchmark appends its
lines when run with `BENCH_LABEL=<label>` (see [Benchmarks](benchmarks.md)); then
`python -m benchmarks.results_page` regenerates the pages and the plots.

"""
LEDGER_PAGE = """\
# {title}

<!-- Generated by `python -m benchmarks.results_page` from benchmarks/results/{name}.jsonl: do
not edit. -->

[Results](../results.md) | every line of `benchmarks/results/{name}.jsonl`, one measurement a
row: the line's number (its anchor), the run (its label, date and machine), the benchmark's
main figures, and in *more* every other field of the line: the command that reproduces it (run
from the repository root), the machine in full with its CPU flags, the settings. Lines
converted from the earlier per-run files keep that file's name in `source`.

"""

# Each ledger's table shows its latest lines and every line a current figure reads; the
# other lines are folded below it (`<details>`: opened by a click, or by a link to one of them).
LATEST = 8
# Fields every line has, shown in the `run` cell (the machine in a few words; in full in `more`).
_RUN_FIELDS = {"date", "label"}
_MARKDOWN = str.maketrans({"|": "&#124;", "*": "&#42;", "`": "&#96;"})


def _cell(value):
    """A table cell's Markdown: `|` escaped, and a line break allowed after each underscore of a
    long name outside `code` (so that `litert_float32_vs_saved_model` does not push its table
    wider than the page)."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        value = _value(value)
    parts = value.replace("|", "\\|").replace("\n", " ").split("`")
    parts[::2] = [part.replace("_", "_<wbr>") for part in parts[::2]]
    return "`".join(parts)


def _machine(row):
    """The machine's one name (`benchmarks/machines.py`): `AMD EPYC Zen 5`, `NVIDIA H200`."""
    return machines.name(row)


def _more(row, shown):
    """The line's other fields, folded: `command` first, then in the line's order."""
    keys = ["command"] + [k for k in row if k not in shown and k not in _RUN_FIELDS | {"command"}]
    if "machine" in row:  # by its one name (benchmarks/machines.py), with what it recorded
        cores = re.search(r"\d+ (?:cores?|vCPUs?|GPUs?)", str(row["machine"]))
        row = dict(row, machine=_machine(row) + (f", {cores.group(0)}" if cores else ""))
    text = "<br>".join(
        f"{key}: {html.escape(_value(row[key]), quote=False)}".translate(_MARKDOWN)
        for key in keys
        if row.get(key) not in (None, "", [], {})
    )
    return f"<details><summary>{text.count('<br>') + 1} fields</summary>{text}</details>"


def _cells(benchmark, rows, number):
    """The cells of line `number`: its number (with its anchor), its run (label, date,
    machine), the ledger's `COLUMNS` and its other fields folded."""
    row = ledger.shown(benchmark, number, rows[number - 1])
    cells, shown = [], set()
    for column in COLUMNS[benchmark]:
        text, fields = column.render(row)
        cells.append(_cell(text))
        shown.update(fields)
    label = str(row.get("label", "")).replace("|", "\\|").replace("`", "'")
    run = f"`{label}`<br>{row['date'][:10]}, {_cell(_machine(row))}"
    return [f'<a id="{benchmark}-{number}"></a>{number}', run] + cells + [_more(row, shown)]


def _head(benchmark):
    return ["#", "run"] + [column.header for column in COLUMNS[benchmark]] + ["more"]


def table(benchmark, rows, numbers=None):
    """The Markdown table of one ledger's lines (`numbers`, 1-based; all by default), a row per
    line with its anchor `<benchmark>-<n>`."""
    head = _head(benchmark)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for number in numbers or range(1, len(rows) + 1):
        lines.append("| " + " | ".join(_cells(benchmark, rows, number)) + " |")
    return "\n".join(lines)


def _html(cell):
    """A cell's Markdown as HTML: its `code` spans and escaped bars."""
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", cell).replace("\\|", "|")


def html_table(benchmark, rows, numbers):
    """The same table in HTML: the folded lines are inside a `<details>` block, where Markdown
    would take each cell's own `<details>` for the start of an HTML block."""
    head = "".join(f"<th>{_html(_cell(h))}</th>" for h in _head(benchmark))
    body = "\n".join(
        "<tr>" + "".join(f"<td>{_html(c)}</td>" for c in _cells(benchmark, rows, n)) + "</tr>"
        for n in numbers
    )
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"


_LINES = {}


def _read(name):
    """Ledger `name`'s lines, read once a run of `rendered()` (which empties this cache)."""
    if name not in _LINES:
        _LINES[name] = ledger.read(name)
    return _LINES[name]


def _entries():
    if "figures.yaml" not in _LINES:
        _LINES["figures.yaml"] = figures.load()
    return _LINES["figures.yaml"]


def _read_by_figures(entries=None):
    """`{benchmark: {line, ...}}`: the lines the current figures read."""
    read = {}
    for entry in entries if entries is not None else _entries():
        for name, number in figures.lines(figures.quotes(entry, _read)):
            read.setdefault(name, set()).add(number)
    return read


def section(name, rows, read=(), script=None):
    """A ledger's section: its latest `LATEST` lines and those in `read`, then the others
    folded."""
    script = script or f"benchmarks/{name}.py"
    latest = set(range(max(1, len(rows) - LATEST + 1), len(rows) + 1))
    shown = sorted(latest | {n for n in read if 1 <= n <= len(rows)})
    older = [n for n in range(1, len(rows) + 1) if n not in shown]
    figures_note = " and the lines the current figures read" if set(shown) - latest else ""
    text = (
        f"`{script}` writes `benchmarks/results/{name}.jsonl`, {len(rows)} lines: the latest "
        f"{len(latest)}{figures_note}"
        + (f", then the other {len(older)}, folded." if older else ".")
        + f"\n\n{table(name, rows, shown)}\n"
    )
    if older:
        text += (
            f"\n<details>\n<summary>The other {len(older)} lines of <code>{name}</code>"
            f"</summary>\n{html_table(name, rows, older)}\n</details>\n"
        )
    return text


LEDGER_DIR = os.path.join(ROOT, "docs", "ledgers")
IMG = os.path.join(ROOT, "docs", "img")
# CPU flags that change the speed of a CPU's figures (the rest are in the ledger line).
_FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def ledger_link(name, number, prefix="ledgers/"):
    """The link of ledger `name`'s line `number` on its page."""
    return f"{prefix}{name}.md#{name}-{number}"


def ledger_page(name):
    """The Markdown of ledger `name`'s page: every line (the latest in view, the others
    folded)."""
    rows = _read(name)
    title, script = TITLES.get(name, (name, f"benchmarks/{name}.py"))
    read = _read_by_figures().get(name, ())
    return LEDGER_PAGE.format(title=title, name=name) + section(name, rows, read, script)


def _machine_full(row):
    """The machine's one name (`benchmarks/machines.py`), with the CPU flags that matter to
    speed."""
    flags = [f for f in _FLAGS if f in (row.get("cpu_flags") or [])]
    shown = (
        ", ".join(flags) if flags else ("AVX2" if "avx2" in (row.get("cpu_flags") or []) else "")
    )
    name = machines.name(row)
    return name + (f"; {shown}" if shown and not name.startswith("NVIDIA") else "")


def _number(value):
    """A table's number: whole above 100, else to 2 decimals (3 below 0.1), no trailing 0."""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    text = f"{value:.2f}" if abs(value) >= 0.1 or value == 0 else f"{value:.3f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _linked(p):
    name, number, _ = p["reads"][0]
    return f"[{_number(p['value'])}]({ledger_link(name, number)})"


def _runs(points):
    """`(machines, dates, commands)` of the ledger lines `points` read."""
    names, dates, commands = {}, [], {}
    for p in points:
        for name, number, _ in p["reads"]:
            row = ledger.shown(name, number, _read(name)[number - 1])
            names[_machine_full(row)] = True
            dates.append(row["date"][:10])
            commands[re.sub(r" --label \S+", "", row["command"])] = True
    if not dates:
        return "", "", ""
    span = min(dates) if min(dates) == max(dates) else f"{min(dates)} to {max(dates)}"
    code = "<br>".join(f"`{c}`" for c in commands)
    return _cell("; ".join(names)), span, code


def _row(cells):
    return "| " + " | ".join(c.replace("\n", " ") for c in cells) + " |"


def question_table(question, points):
    """The question's table: for the feature costs a row per feature (its measures in columns,
    then the machine, date and command); otherwise a row per series and a column per group (the
    machine, date and command in the table's last rows)."""
    if question.id == "feature-cost":
        measures = ["without", "with", "time with / without", "BLEU with - without"]
        head = ["feature"] + measures + ["machine, date", "command"]
        lines = [_row(head), "|" + "---|" * len(head)]
        for feature in question.series:
            mine = [p for p in points if p["group"] == feature]
            by = {p["measure"]: p for p in mine}
            cells = [feature]
            for measure in measures:
                if measure in by:
                    unit = _feature_unit(feature, measure)
                    cells.append(_linked(by[measure]) + unit)
                elif measure.startswith("BLEU") and "BLEU with" in by:
                    cells.append(f"{_linked(by['BLEU without'])} to {_linked(by['BLEU with'])}")
                else:
                    cells.append(NOT_MEASURED)
            machine, date, command = _runs(mine)
            cells += [f"{machine}<br>{date}" if date else NOT_MEASURED, command or NOT_MEASURED]
            lines.append(_row(cells))
        return "\n".join(lines)
    groups = list(dict.fromkeys(p["group"] for p in points))
    head = [""] + [_cell(g) for g in groups]
    lines = [_row(head), "|" + "---|" * len(head)]
    for series in question.series:
        cells = [_cell(series)]
        for group in groups:
            mine = [p for p in points if (p["group"], p["series"]) == (group, series)]
            cells.append(_question_cell(question, mine))
        lines.append(_row(cells))
    runs = [_runs([p for p in points if p["group"] == g]) for g in groups]
    lines.append(_row(["machine"] + [r[0] for r in runs]))
    lines.append(_row(["date"] + [r[1] for r in runs]))
    lines.append(_row(["command"] + [r[2] for r in runs]))
    return "\n".join(lines)


def _feature_unit(feature, measure):
    if measure == "time with / without":
        return "x"
    if measure in ("without", "with"):
        return {
            "vocabulary shortlist": " tokens/s",
            "alignments (export time)": " s export",
            "markup": " s a call",
            "constraints": " sentences/s",
        }[feature]
    return ""


def _question_cell(question, points):
    if not points:
        return question.missing
    if question.id == "quality-minutes":
        bleu = [p for p in points if p["measure"] == "test BLEU"]
        minutes = {p["value"] for p in points if p["measure"] == "minutes"}
        at = ", ".join(f"{m:g}" for m in sorted(minutes))
        return ", ".join(_linked(p) for p in bleu) + f" (at {at} min)"
    parts = []
    for p in points:
        prefix = "MFU " if p["measure"] == "MFU" else ""
        parts.append(prefix + _linked(p))
    return "; ".join(parts)


def question_section(question, points):
    """A question's section: its heading (anchor: the question's id), plot and table."""
    return (
        f"## {question.title} {{#{question.id}}}\n\n"
        f"[![{question.title}](img/{question.id}.png)](img/{question.id}.png)\n\n"
        f"*{question.caption}*\n\n{question_table(question, points)}\n"
    )


def question_data():
    """`{question id: points}`, each read from the ledgers now."""
    return {q.id: q.data() for q in questions.QUESTIONS}


def render(data=None):
    """The results page's Markdown."""
    if data is None:
        _LINES.clear()
        data = question_data()
    parts = [INTRO]
    for question in questions.QUESTIONS:
        parts.append(question_section(question, data[question.id]))
    parts.append(FIGURES_TEXT + figures.page_rows(_entries(), _read) + "\n")
    names = ledger.benchmarks()
    order = [n for n in TITLES if n in names] + [n for n in names if n not in TITLES]
    listed = "\n".join(
        f"- [{TITLES.get(n, (n,))[0]}](ledgers/{n}.md): `{n}`, {len(_read(n)):,} lines"
        for n in order
    )
    parts.append(LEDGERS + listed + "\n")
    return "\n".join(parts)


def render_readme(text):
    """`text` (the README) with its Results table rewritten from figures.yaml."""
    if text.count(FIGURES_START) != 1 or text.count(FIGURES_END) != 1:
        raise ValueError(f"README.md needs one {FIGURES_START} and one {FIGURES_END}")
    before, rest = text.split(FIGURES_START)
    _, after = rest.split(FIGURES_END)
    rows = figures.readme_rows(_entries(), _read)
    return f"{before}{FIGURES_START}\n{rows}\n{FIGURES_END}{after}"


def _data_path(question_id):
    return os.path.join(IMG, f"{question_id}.json")


def _plot_path(question_id):
    return os.path.join(IMG, f"{question_id}.png")


def data_text(question, points):
    """What is recorded beside a question's plot: the points it was drawn from."""
    return json.dumps({"question": question.id, "points": points}, indent=1) + "\n"


def plot(question, points, path):
    """Draws a question's plot from its points (matplotlib, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib import ticker

    if question.id == "quality-minutes":
        fig, ax = plt.subplots(figsize=(8, 3.4), dpi=100)
        names = list(dict.fromkeys(p["group"] for p in points))
        minutes = sorted({p["value"] for p in points if p["measure"] == "minutes"})
        for index, machine in enumerate(names):
            for offset, series, marker in zip((-0.12, 0.12), question.series, ("o", "x")):
                bleu = [
                    p["value"] for p in points if (p["group"], p["series"], p["measure"])
                    == (machine, series, "test BLEU")
                ]  # fmt: skip
                ax.scatter(
                    [index + offset] * len(bleu),
                    bleu,
                    marker=marker,
                    color="C0" if marker == "o" else "C1",
                    s=28,
                    label=series if index == 0 else None,
                )
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([m.replace(", 2", ",\n2") for m in names], fontsize=7)
        ax.set_xlim(-0.5, len(names) - 0.5)
        shown = ", ".join(f"{m:g}" for m in minutes)
        ax.set_title(f"test sacreBLEU after {shown} minutes of training", fontsize=9)
        ax.set_ylabel("test sacreBLEU")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    elif question.id == "feature-cost":
        fig, ax = plt.subplots(figsize=(8, 2.6), dpi=100)
        shown = [p for p in points if p["measure"] == "time with / without"]
        names = [p["group"] for p in shown]
        ax.barh(names, [p["value"] for p in shown], color="C0")
        for y, p in enumerate(shown):
            ax.text(p["value"], y, f" {p['value']:.2f}x", va="center", fontsize=8)
        ax.axvline(1, color="black", linewidth=0.8)
        ax.invert_yaxis()
        ax.set_xlabel("time with the feature / time without")
        ax.set_xlim(0, max([p["value"] for p in shown] + [1]) * 1.2)
        ax.grid(axis="x", alpha=0.3)
    else:
        measure = "tokens/s"
        groups = list(dict.fromkeys(p["group"] for p in points))
        columns = 3 if len(groups) > 4 else min(2, len(groups))
        rows = -(-len(groups) // columns)
        fig, axes = plt.subplots(
            rows, columns, figsize=(11, 2.6 * rows + 0.4), dpi=100, squeeze=False
        )
        for ax, group in zip(axes.flat, groups):
            shown = [p for p in points if (p["group"], p["measure"]) == (group, measure)]
            order = {name: i for i, name in enumerate(question.series)}
            shown.sort(key=lambda p: order[p["series"]])
            colours = [
                "C1" if not p["series"].startswith("ours") else "C0" for p in shown
            ]  # fmt: skip
            ax.barh([p["series"] for p in shown], [p["value"] for p in shown], color=colours)
            for y, p in enumerate(shown):
                ax.text(p["value"], y, f" {p['value']:,.0f}", va="center", fontsize=7)
            ax.invert_yaxis()
            ax.set_title(group, fontsize=9)
            ax.tick_params(labelsize=7)
            ax.set_xlim(0, max(p["value"] for p in shown) * 1.3)
            ax.set_xlabel(measure, fontsize=8)
            ax.xaxis.set_major_locator(ticker.MaxNLocator(4))
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
        for ax in list(axes.flat)[len(groups) :]:
            ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def pages():
    """The pages that may quote a figure: the README and the manual (not the generated pages:
    the results page and the ledgers' pages, which `rendered()` writes whole)."""
    found = [README] + sorted(
        os.path.join(folder, name)
        for folder, _, names in os.walk(os.path.join(ROOT, "docs"))
        for name in names
        if name.endswith(".md")
    )
    return [path for path in found if path != PAGE and os.path.dirname(path) != LEDGER_DIR]


def rendered(data=None):
    """`{path: text}`: the results page, each ledger's page, the data beside each plot, and
    every page with its quotes (and the README with its headline table) as they should read."""
    _LINES.clear()
    data = data if data is not None else question_data()
    texts = {PAGE: render(data)}
    for name in ledger.benchmarks():
        texts[os.path.join(LEDGER_DIR, f"{name}.md")] = ledger_page(name)
    for question in questions.QUESTIONS:
        texts[_data_path(question.id)] = data_text(question, data[question.id])
    for path in pages():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        text = render_readme(text) if path == README else text
        texts[path] = figures.render_quotes(text, _entries(), _read)
    return texts


def stale():
    """The generated texts that differ from the files (or are missing, with the plots drawn
    from them), relative to the repository."""
    result = []
    for path, text in rendered().items():
        if not os.path.exists(path):
            result.append(os.path.relpath(path, ROOT))
            continue
        with open(path, encoding="utf-8") as f:
            if f.read() != text:
                result.append(os.path.relpath(path, ROOT))
    result += [
        os.path.relpath(_plot_path(q.id), ROOT)
        for q in questions.QUESTIONS
        if not os.path.exists(_plot_path(q.id))
    ]
    expected = {f"{name}.md" for name in ledger.benchmarks()}
    if os.path.isdir(LEDGER_DIR):
        result += [
            os.path.relpath(os.path.join(LEDGER_DIR, n), ROOT)
            for n in sorted(os.listdir(LEDGER_DIR))
            if n not in expected
        ]
    return result


def main(argv):
    if "--check" in argv:
        names = stale()
        if names:
            print(f"{', '.join(names)} stale: python -m benchmarks.results_page", file=sys.stderr)
            return 1
        return 0
    data = question_data()
    os.makedirs(LEDGER_DIR, exist_ok=True)
    redraw = []
    for path, text in rendered(data).items():
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                if f.read() == text:
                    continue
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(path, ROOT)}")
        redraw += [q for q in questions.QUESTIONS if path == _data_path(q.id)]
    expected = {f"{name}.md" for name in ledger.benchmarks()}
    for name in sorted(os.listdir(LEDGER_DIR)):
        if name not in expected:
            os.remove(os.path.join(LEDGER_DIR, name))
            print(f"removed {os.path.relpath(os.path.join(LEDGER_DIR, name), ROOT)}")
    redraw += [q for q in questions.QUESTIONS if not os.path.exists(_plot_path(q.id))]
    for question in dict.fromkeys(redraw) if "--plots" not in argv else questions.QUESTIONS:
        plot(question, data[question.id], _plot_path(question.id))
        print(f"wrote {os.path.relpath(_plot_path(question.id), ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
