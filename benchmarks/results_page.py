"""Generates the documentation's results page, `docs/results.md`, and the README's Results table
from `benchmarks/results/`: the page opens with the current figures (`figures.yaml`, each read
from the ledger lines it names; `benchmarks/figures.py`), then one table per benchmark (every
line, numbered as in its file, with an anchor `<benchmark>-<line>` that other pages link to),
with the plot of translation quality against training steps, `docs/img/quality_steps.png`.

    python -m benchmarks.results_page           # rewrites the page, the README's table, the plot
    python -m benchmarks.results_page --check   # exit 1 if either text is stale

`tests/test_docs.py` runs the checks.
"""

import os
import sys

try:
    from benchmarks import figures, ledger
except ImportError:  # run as a script from benchmarks/
    import figures
    import ledger

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "results.md")
README = os.path.join(ROOT, "README.md")
PLOT = os.path.join(ROOT, "docs", "img", "quality_steps.png")
# The README's Results table lies between these lines.
FIGURES_START, FIGURES_END = "<!-- results-figures:start -->", "<!-- results-figures:end -->"


def _pair(first, second):
    return lambda r: "" if r.get(first) is None else f"{r[first]} / {r.get(second, '')}"


def _phases(phases):
    return ", ".join(f"{name} {seconds}" for name, seconds in (phases or {}).items())


def _field(name):
    return lambda r: r.get(name)


# The columns of each benchmark's table after `#`, date, machine and label.
COLUMNS = {
    "quality_budget": [
        ("system", _field("system")),
        ("config changes", lambda r: " ".join(f"`{o}`" for o in r.get("overrides") or [])),
        ("precision", _field("precision")),
        ("train min", _field("train_min")),
        ("steps", _field("steps")),
        ("dev BLEU / chrF", _pair("dev_bleu", "dev_chrf")),
        ("test BLEU / chrF", _pair("test_bleu", "test_chrf")),
    ],
    "quickstart": [
        ("steps", _field("steps")),
        ("precision", _field("precision")),
        ("dev BLEU / chrF", _pair("dev_bleu", "dev_chrf")),
        ("test BLEU / chrF", _pair("test_bleu", "test_chrf")),
    ],
    "decode_sweep": [
        ("steps", lambda r: ", ".join(map(str, r.get("steps") or []))),
        ("beam", _field("beam_size")),
        ("alpha", _field("alpha")),
        ("sentences", _field("sentences")),
        ("BLEU / chrF", _pair("bleu", "chrf")),
        ("length ratio", _field("length_ratio")),
    ],
    "compare": [
        ("run", lambda r: r.get("run") or r.get("shapes")),
        ("what", lambda r: r.get("what") or "ratios of medians"),
        ("tokens/s", _field("tokens_per_s")),
        ("GFLOP/s", lambda r: r.get("model_gflops_per_s") or r.get("gflops")),
        ("train ours / MG", _field("train_ratio")),
        ("MFU", lambda r: r.get("mfu") or r.get("ours_mfu")),
        ("bf16 / fp32, bf16 MFU", _pair("bf16_over_fp32", "ours_bf16_mfu")),
        ("beam-4 ours / MG", _field("beam4_ratio")),
        ("max RSS MB", _field("max_rss_mb")),
    ],
    "train_throughput": [
        ("dtype", _field("dtype")),
        ("oneDNN", _field("onednn")),
        ("tokens/s", _field("tokens_per_s")),
        ("GFLOP/s", _field("model_gflops_per_s")),
        ("max RSS MB", _field("max_rss_mb")),
    ],
    "serve_compare": [
        ("system", lambda r: r.get("system") or r.get("what")),
        ("shapes", _field("shapes")),
        ("tokens/s", _field("tokens_per_s")),
        ("ours / CT2 fp32", _field("ours_over_ct2_float32")),
        ("XLA export / CT2 fp32", _field("ours_xla_over_ct2_float32")),
        ("CT2 int8 / fp32", _field("ct2_int8_over_ct2_float32")),
        ("ours / MG", _field("ours_over_model_garden")),
    ],
    "prepare_scale": [
        ("figure", _field("figure")),
        ("corpus", lambda r: r.get("corpus") or r.get("source")),
        ("pairs", lambda r: r.get("pairs") or r.get("corpus_pairs")),
        ("seconds", _field("seconds")),
        ("tokens/s", _field("tokens_per_s")),
        ("max RSS MB", _field("max_rss_mb")),
    ],
    "ab_checkouts": [
        ("checkout", _field("checkout")),
        ("shapes", _field("shapes")),
        ("what", _field("what")),
        ("tokens/s", _field("tokens_per_s")),
        ("train second / first", _field("train_ratio")),
        ("beam-4 second / first", _field("beam4_decode_ratio")),
    ],
    "back_translation": [
        ("system", _field("system")),
        ("train min", _field("train_min")),
        ("steps", _field("steps")),
        ("train pairs", lambda r: r.get("train_pairs") or r.get("lines")),
        ("dev BLEU / chrF", _pair("dev_bleu", "dev_chrf")),
        ("test BLEU / chrF", _pair("test_bleu", "test_chrf")),
        ("lines/s", _field("lines_per_second")),
    ],
    "translate_file": [
        ("system", _field("system")),
        ("lines", _field("lines")),
        ("beam", _field("beam_size")),
        ("batch", _field("batch_size")),
        ("threads", _field("intra_threads")),
        ("XLA export", _field("jit_compile")),
        ("seconds", _field("seconds")),
        ("lines/s", _field("lines_per_second")),
        ("same as ours", _field("same_as_ours")),
    ],
    "prepare_workers": [
        ("workers", lambda r: r.get("workers") or r.get("speedup")),
        ("pairs", _field("pairs")),
        ("seconds", _field("seconds")),
        ("pairs/s", _field("pairs_per_second")),
        ("phases s", lambda r: _phases(r.get("phase_seconds"))),
        ("ratio", _field("ratio")),
        ("identical shards", _field("identical_shards")),
    ],
    "restart_cost": [
        ("strategy", lambda r: r.get("strategy") or "default"),
        ("way", _field("way")),
        ("position", lambda r: r.get("position") or r.get("ratio")),
        ("restart s", _field("restart_seconds")),
        ("ratio", _field("restart_ratio")),
    ],
    "serve_latency": [
        ("sentences per request", _field("sentences")),
        ("calls", _field("calls")),
        ("p50 / p99 ms", _pair("p50_ms", "p99_ms")),
        ("sentences/s", _field("sentences_per_s")),
    ],
    "profile_ops": [
        ("mode", _field("mode")),
        ("step ms", _field("step_ms")),
        ("matmul ms (share)", lambda r: f"{r.get('matmul_ms')} ({r.get('matmul_share')})"),
        ("other ms", _field("other_ms")),
        ("idle ms", _field("idle_ms")),
        ("model GFLOP/s in matmul time", _field("model_gflops_per_s_in_matmul_time")),
    ],
    "select_on_dev": [
        ("seed", _field("seed")),
        ("steps", _field("steps")),
        ("chosen by", lambda r: r.get("chosen_by", "train")),
        ("dev sentences", _field("selection_sentences")),
        ("chosen", _field("chosen")),
        ("chosen dev / test BLEU", _pair("chosen_dev_bleu", "chosen_test_bleu")),
        (
            "last, alpha 1.0: dev / test BLEU",
            _pair("last_alpha1_dev_bleu", "last_alpha1_test_bleu"),
        ),
        ("choice s", _field("selection_seconds")),
    ],
}
TITLES = {
    "quality_budget": "Quality per CPU budget (`benchmarks/quality_budget.py`)",
    "quickstart": "The quickstart (`benchmarks/quickstart.py`)",
    "decode_sweep": "Beam size and length penalty on dev (`benchmarks/decode_sweep.py`)",
    "compare": "Speed against TF Model Garden (`benchmarks/compare.sh`)",
    "train_throughput": "Training throughput by precision (`benchmarks/train_throughput.py`)",
    "serve_compare": "Serving speed, three engines (`benchmarks/serve_compare.py`)",
    "prepare_scale": "Preparing WMT'14-sized corpora (`benchmarks/prepare_scale.py`)",
    "ab_checkouts": "Two checkouts alternately (`benchmarks/ab_checkouts.py`)",
    "back_translation": "Tagged back-translation (`benchmarks/back_translation.py`)",
    "select_on_dev": "The dev set chooses the export (`benchmarks/select_on_dev.py`)",
    "translate_file": "Translating a file against CTranslate2 (`benchmarks/translate_file.py`)",
    "prepare_workers": "`prepare` with 1 and 2 workers (`benchmarks/prepare_workers.py`)",
    "restart_cost": "What a resume costs at steps 100 and 100,000 (`benchmarks/restart_cost.py`)",
    "profile_ops": "Where a step's wall time goes (`benchmarks/profile_ops.py`)",
    "serve_latency": "Requests of 1 to 64 sentences through `serving_default` "
    "(`benchmarks/serve_latency.py`)",
}
INTRO = """\
# Results

<!-- Generated by `python -m benchmarks.results_page` from benchmarks/results/ (figures.yaml and
the *.jsonl ledgers): do not edit. tests/test_docs.py fails when this page is stale. -->

## Current figures

The figures the README quotes. Each is read from the ledger lines its row links to (the ledgers
follow below), as *derived from* says: `field[n]` is that field of line n of the named ledger,
`mean(field[a,b])` the mean of several lines, and ratios and differences are computed from
them; the figure is that value rounded half up to the digits shown. The README's table and this
one are both written from `benchmarks/results/figures.yaml`, and `tests/test_docs.py` checks
every number the README shows against its lines ([how to add a row](benchmarks.md#current-figures)).

"""
LEDGERS = """\
## The ledgers

Every line below is one line of a ledger, `benchmarks/results/<benchmark>.jsonl`: one
append-only file per benchmark, each line carrying its date (UTC), machine, CPU flags, label and
the command that reproduces it, then the measurement. Lines converted from the earlier per-run
files keep that file's name in `source` (their commands are reconstructed from it). A benchmark
appends its lines when run with `BENCH_LABEL=<label>` (see [Benchmarks](benchmarks.md)); then
`python -m benchmarks.results_page` regenerates this page and the plot. What each experiment
changed and what it decided is in the [experiment history](history.md).

Figures from different machines are not comparable with each other (the same 30 minutes buy
1,100 to 7,400 steps); compare lines of one machine, ideally of one invocation.
"""
PLOT_TEXT = """\
![Test sacreBLEU against training steps](img/quality_steps.png)

*Test sacreBLEU (Tatoeba en-de, beam 4) against the training steps that the run's minutes bought
(30 on every line but one, 30.4), one point per `quality_budget.py` run, coloured by machine;
ours (`configs/small.yaml` and one-change variants, dots) and TF Model Garden's Transformer
trained for the same minutes (crosses). The same budget buys each machine its own range of steps,
and that, more than any one change, sets the score.*
"""


def _cell(value):
    if value is None or value == "":
        return ""
    if isinstance(value, float):
        value = f"{value:,.3f}".rstrip("0").rstrip(".")
    elif isinstance(value, int) and not isinstance(value, bool):
        value = f"{value:,}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(benchmark, rows):
    """The Markdown table of one ledger, a row per line with its anchor."""
    columns = COLUMNS.get(benchmark, [])
    head = ["#", "date", "machine", "label"] + [name for name, _ in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for number, row in enumerate(rows, 1):
        cells = [
            f'<a id="{benchmark}-{number}"></a>{number}',
            row["date"][:16].replace("T", " "),
            row.get("machine"),
            row.get("label"),
        ]
        cells += [get(row) for _, get in columns]
        lines.append("| " + " | ".join(_cell(c) if i else c for i, c in enumerate(cells)) + " |")
    return "\n".join(lines)


def render():
    """The results page's Markdown."""
    parts = [INTRO + figures.page_rows() + "\n", LEDGERS]
    names = ledger.benchmarks()
    order = [n for n in TITLES if n in names] + [n for n in names if n not in TITLES]
    for name in order:
        rows = ledger.read(name)
        plot = f"{PLOT_TEXT}\n" if name == "quality_budget" else ""
        parts.append(
            f"### {TITLES.get(name, name)}\n\n`benchmarks/results/{name}.jsonl`, "
            f"{len(rows)} lines.\n\n{plot}{table(name, rows)}\n"
        )
    return "\n".join(parts)


def render_readme(text):
    """`text` (the README) with its Results table rewritten from figures.yaml."""
    if text.count(FIGURES_START) != 1 or text.count(FIGURES_END) != 1:
        raise ValueError(f"README.md needs one {FIGURES_START} and one {FIGURES_END}")
    before, rest = text.split(FIGURES_START)
    _, after = rest.split(FIGURES_END)
    return f"{before}{FIGURES_START}\n{figures.readme_rows()}\n{FIGURES_END}{after}"


def plot(path=PLOT):
    """Test BLEU against training steps for every quality_budget line, by machine (matplotlib,
    no display)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rows = [r for r in ledger.read("quality_budget") if r.get("steps") and r.get("test_bleu")]
    machines = sorted({r["machine"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for index, machine in enumerate(machines):
        for system, marker in (("keras-transformer", "o"), ("modelgarden", "x")):
            points = [r for r in rows if r["machine"] == machine and r.get("system") == system]
            if not points:
                continue
            label = f"{machine}: {'ours' if system == 'keras-transformer' else 'TF Model Garden'}"
            ax.scatter(
                [r["steps"] for r in points],
                [r["test_bleu"] for r in points],
                marker=marker,
                color=f"C{index}",
                label=label,
                s=22,
            )
    ax.set_xlabel("training steps in the run's minutes")
    ax.set_ylabel("test sacreBLEU")
    ax.set_xlim(0, max(r["steps"] for r in rows) * 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main(argv):
    text = render()
    with open(README, encoding="utf-8") as f:
        readme = f.read()
    new_readme = render_readme(readme)
    if "--check" in argv:
        with open(PAGE, encoding="utf-8") as f:
            current = f.read()
        stale = [
            name
            for name, old, new in [
                ("docs/results.md", current, text),
                ("README.md", readme, new_readme),
            ]
            if old != new
        ]
        if stale:
            print(
                f"{' and '.join(stale)} stale: python -m benchmarks.results_page", file=sys.stderr
            )
            return 1
        return 0
    with open(PAGE, "w", encoding="utf-8") as f:
        f.write(text)
    with open(README, "w", encoding="utf-8") as f:
        f.write(new_readme)
    plot()
    print(f"wrote {PAGE}, the Results table of {README} and {PLOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
