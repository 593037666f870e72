"""The questions the results page answers, each with one plot and one small table, read from
the ledgers (`benchmarks/results/*.jsonl`) by rules, not by hand: each question takes the latest
lines that measure it, so a new run appended to a ledger moves its plot and table.

A question's data is a list of points, `{"group", "series", "measure", "value", "reads"}`:
`reads` lists the `[ledger, line, field]` it is read from (one: the value is that field; two:
the value is the first over the second). `benchmarks/results_page.py` draws each plot from
these points, writes them next to the plot (`docs/img/<question>.json`) and `--check` compares
them with the ledgers; `tests/test_results_page.py` reads each point back from its lines.
"""

try:
    from benchmarks import ledger, machines
except ImportError:  # run as a script from benchmarks/
    import ledger
    import machines

NOT_MEASURED = "not measured"


def point(group, series, measure, rows, *reads):
    """A point read from `reads` (`(ledger, line, field)`; two: the first over the second)."""
    return {
        "group": group,
        "series": series,
        "measure": measure,
        "value": value_of({"reads": reads}, read=rows.__getitem__),
        "reads": [list(r) for r in reads],
    }


def _with_and_without(points, rows, name, without, with_, rate=False):
    """A feature's three points: its figure without it, with it, and the time with it over the
    time without (`without`, `with_`: `(ledger, line, field)`; `rate`: the fields are speeds,
    tokens or sentences a second, so that the ratio is without over with)."""
    points.append(point(name, name, "without", rows, without))
    points.append(point(name, name, "with", rows, with_))
    ratio = (without, with_) if rate else (with_, without)
    points.append(point(name, name, "time with / without", rows, *ratio))


def value_of(read_point, read=ledger.read):
    """A point's value recomputed from its ledger lines (what the test compares)."""
    values = [read(name)[number - 1][field] for name, number, field in read_point["reads"]]
    return values[0] if len(values) == 1 else round(values[0] / values[1], 4)


def _rows(*names):
    return {name: ledger.read(name) for name in names}


def _last(rows, name, test):
    """The number of the last line of `name` that passes `test`, or None."""
    found = [n for n, row in enumerate(rows[name], 1) if test(row)]
    return found[-1] if found else None


# Question 1: decoding speed against CTranslate2 and TF Model Garden.
DECODERS = [
    ("ours_saved_model_signature", "ours: SavedModel"),
    ("ours_saved_model_xla", "ours: SavedModel, XLA"),
    ("ours_saved_model_shortlist", "ours: SavedModel, shortlist"),
    ("ours_saved_model_bfloat16", "ours: SavedModel, bfloat16"),
    ("ours_litert_float32", "ours: LiteRT float32"),
    ("ours_litert_dynamic_int8", "ours: LiteRT int8"),
    ("ours_litert_dynamic_int8_shortlist", "ours: LiteRT int8, shortlist"),
    ("ctranslate2_float32", "CTranslate2 float32"),
    ("ctranslate2_int8", "CTranslate2 int8"),
    ("ctranslate2_int8_vmap", "CTranslate2 int8, vmap"),
    ("model_garden", "TF Model Garden"),
]


def decoding():
    """Tokens/s of every export and peer at small and base, beam 1 and 4: for each, the latest
    `serve_compare` run (one label) that measured CTranslate2 float32 there, the last round of
    each system in it; and the latest run that measured TF Model Garden, on its own machine."""
    rows = _rows("serve_compare")
    lines = rows["serve_compare"]
    points = []

    def run(group, label, shapes, beam):
        for system, name in DECODERS:
            number = _last(
                rows,
                "serve_compare",
                lambda r: (
                    (r.get("label"), r.get("system"), r.get("shapes"), r.get("beam"))
                    == (label, system, shapes, beam)
                ),
            )
            if number:
                points.append(
                    point(group, name, "tokens/s", rows, ("serve_compare", number, "tokens_per_s"))
                )

    for shapes in ("small", "base"):
        for beam in (1, 4):
            n = _last(
                rows,
                "serve_compare",
                lambda r: (
                    (r.get("system"), r.get("shapes"), r.get("beam"))
                    == ("ctranslate2_float32", shapes, beam)
                ),
            )
            if n:
                run(f"{shapes}, beam {beam}", lines[n - 1]["label"], shapes, beam)
    for shapes in ("small", "base"):
        n = _last(
            rows,
            "serve_compare",
            lambda r: (r.get("system"), r.get("shapes")) == ("model_garden", shapes),
        )
        if n:
            row = lines[n - 1]
            group = f"{shapes}, beam {row['beam']}, with TF Model Garden"
            run(group, row["label"], shapes, row["beam"])
    return points


# Question 2: training speed and MFU against TF Model Garden and PyTorch.
def training():
    """Training tokens/s and MFU: on a CPU the latest `compare` summary of each shape (ours in
    float32 and mixed_bfloat16, TF Model Garden in float32); on a GPU the latest
    `accelerator_check` run with PyTorch, at its two batch sizes."""
    rows = _rows("compare", "accelerator_check")
    points = []
    for shapes in ("small", "base"):
        n = _last(
            rows,
            "compare",
            lambda r: r.get("shapes") == shapes and r.get("ours_train_tokens_per_s") is not None,
        )
        if not n:
            continue
        group = f"CPU, {shapes}"
        line = ("compare", n)
        points.append(
            point(group, "ours float32", "tokens/s", rows, (*line, "ours_train_tokens_per_s"))
        )
        points.append(point(group, "ours float32", "MFU", rows, (*line, "ours_mfu")))
        if rows["compare"][n - 1].get("ours_bf16_train_tokens_per_s") is not None:
            points.append(
                point(group, "ours mixed_bfloat16", "tokens/s", rows,
                      (*line, "ours_bf16_train_tokens_per_s"))
            )  # fmt: skip
            points.append(
                point(group, "ours mixed_bfloat16", "MFU", rows, (*line, "ours_bf16_mfu"))
            )
        points.append(
            point(
                group, "TF Model Garden float32", "tokens/s", rows, (*line, "mg_train_tokens_per_s")
            )
        )
    gpu = rows["accelerator_check"]
    n = _last(rows, "accelerator_check", lambda r: r.get("what") == "torch_train")
    if n:
        label = gpu[n - 1]["label"]
        device = machines.name(gpu[n - 1])
        for number, row in enumerate(gpu, 1):
            if row.get("label") != label or not row.get("tokens_per_s"):
                continue
            if row.get("what") not in ("train", "torch_train"):
                continue
            group = f"{device}, base, batch {row['cfg']['batch']}"
            if row["what"] == "torch_train":
                series = "PyTorch mixed bfloat16"
            else:
                series = f"ours {row['dtype']}"
            points.append(
                point(
                    group, series, "tokens/s", rows, ("accelerator_check", number, "tokens_per_s")
                )
            )
            if row.get("mfu_measured_bf16") is not None:
                points.append(
                    point(group, series, "MFU", rows,
                          ("accelerator_check", number, "mfu_measured_bf16"))
                )  # fmt: skip
    return points


TRAINING_SERIES = [
    "ours float32",
    "ours mixed_bfloat16",
    "TF Model Garden float32",
    "PyTorch mixed bfloat16",
]


# Question 3: quality against training minutes, and against TF Model Garden.
def quality():
    """Test sacreBLEU of every `quality_budget` run of `configs/small.yaml` as it is (no
    overrides) and of TF Model Garden, by machine, at the minutes each trained."""
    rows = _rows("quality_budget")
    points = []
    for number, row in enumerate(rows["quality_budget"], 1):
        if row.get("system") == "modelgarden":
            series = "TF Model Garden"
        elif row.get("system") == "keras-transformer" and not row.get("overrides"):
            series = "ours, configs/small.yaml"
        else:
            continue
        group = machines.name(row)
        points.append(
            point(group, series, "test BLEU", rows, ("quality_budget", number, "test_bleu"))
        )
        points.append(
            point(group, series, "minutes", rows, ("quality_budget", number, "train_min"))
        )
    return points


# Question 4: what each serving feature costs.
FEATURES = ["vocabulary shortlist", "alignments (export time)", "markup", "constraints"]


def features():
    """Each serving feature's time with it over the time without it (above 1: slower), with what
    it is measured on: the shortlist in `serve_compare` (SavedModel tokens/s, base, beam 4), the
    alignments at export (`markup_cost`), markup per call (`markup_cost`), constraints in
    `glossary` (sentences/s); and its BLEU with and without."""
    rows = _rows("serve_compare", "markup_cost", "glossary", "shortlist_quality")
    points = []
    serve = rows["serve_compare"]
    n = _last(
        rows,
        "serve_compare",
        lambda r: (
            (r.get("system"), r.get("shapes"), r.get("beam"))
            == ("ours_saved_model_shortlist", "base", 4)
        ),
    )
    if n:
        label = serve[n - 1]["label"]
        m = _last(
            rows,
            "serve_compare",
            lambda r: (
                (r.get("label"), r.get("system"), r.get("shapes"), r.get("beam"))
                == (label, "ours_saved_model_signature", "base", 4)
            ),
        )
        if m:
            _with_and_without(points, rows, "vocabulary shortlist",
                              ("serve_compare", m, "tokens_per_s"),
                              ("serve_compare", n, "tokens_per_s"), rate=True)  # fmt: skip
    q = _last(rows, "shortlist_quality", lambda r: r.get("saved_model_delta") is not None)
    if q:
        points.append(
            point("vocabulary shortlist", "vocabulary shortlist", "BLEU with - without", rows,
                  ("shortlist_quality", q, "saved_model_delta"))
        )  # fmt: skip
    k = _last(rows, "markup_cost", lambda r: r.get("export_with_alignments_s") is not None)
    if k:
        _with_and_without(points, rows, "alignments (export time)", ("markup_cost", k, "export_s"),
                          ("markup_cost", k, "export_with_alignments_s"))  # fmt: skip
    k = _last(rows, "markup_cost", lambda r: r.get("translate_markup_s") is not None)
    if k:
        _with_and_without(points, rows, "markup", ("markup_cost", k, "serving_default_s"),
                          ("markup_cost", k, "translate_markup_s"))  # fmt: skip
    g = _last(rows, "glossary", lambda r: r.get("system") == "plain_constrained")
    if g:
        label = rows["glossary"][g - 1]["label"]
        p = _last(rows, "glossary", lambda r: (r.get("label"), r.get("system")) == (label, "plain"))
        if p:
            name = "constraints"
            _with_and_without(points, rows, name, ("glossary", p, "sentences_per_second"),
                              ("glossary", g, "sentences_per_second"), rate=True)  # fmt: skip
            for measure, sign in (("BLEU without", p), ("BLEU with", g)):
                points.append(point(name, name, measure, rows, ("glossary", sign, "test_bleu")))
    return points


class Question:
    """One question of the results page: its `id` (the section's anchor, the plot's name), its
    `title`, what its plot shows (`caption`), its points (`data()`) and the table's layout."""

    def __init__(self, id, title, caption, data, series, missing=NOT_MEASURED):
        self.id, self.title, self.caption, self._data = id, title, caption, data
        # What a cell without a point says: each column of the decoding table is one run.
        self.series, self.missing = series, missing

    def data(self):
        return self._data()


QUESTIONS = [
    Question(
        "decoding-speed",
        "How fast does each export decode, against CTranslate2 and TF Model Garden?",
        "Target tokens/s of a 32-sentence batch, 2 CPU threads, each export and peer (bars), "
        "at the small and base shapes, beam 1 and 4; each panel one run of "
        "`benchmarks/serve_compare.py` on one machine (a cell not in this run: that run did "
        "not measure it; TF Model Garden was measured on one machine only).",
        decoding,
        [name for _, name in DECODERS],
        missing="not in this run",
    ),
    Question(
        "training-speed",
        "How fast does it train, and at what MFU, against TF Model Garden and PyTorch?",
        "Training tokens/s (bars; the table adds the MFU: the model's FLOP/s over the peak "
        "matrix product measured in the same run, bfloat16's on the GPU), on 2 CPU cores "
        "(`benchmarks/compare.py`) and one GPU (`benchmarks/accelerator_check.py`, JAX backend).",
        training,
        TRAINING_SERIES,
    ),
    Question(
        "quality-minutes",
        "What quality do the training minutes buy on Tatoeba, against TF Model Garden?",
        "Test sacreBLEU (Tatoeba en-de, beam 4) against the minutes trained, every "
        "`benchmarks/quality_budget.py` run of `configs/small.yaml` as shipped (dots) and of TF "
        "Model Garden's Transformer trained for the same minutes (crosses), by machine. Every "
        "run so far trained for 30 minutes: there is no curve over minutes yet.",
        quality,
        ["ours, configs/small.yaml", "TF Model Garden"],
    ),
    Question(
        "feature-cost",
        "What does each serving feature cost?",
        "Time with the feature over time without it (bars; 1 is free, below 1 faster): the "
        "vocabulary shortlist in `serve_compare` (SavedModel, base, beam 4), alignments in the "
        "export's time (`markup_cost`), markup per `translate_markup` call (`markup_cost`), "
        "constraints per sentence (`glossary`, a synthetic corpus).",
        features,
        FEATURES,
    ),
]
