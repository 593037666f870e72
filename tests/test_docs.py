"""The README and the documentation site (docs/): CI markers, the generated configuration, API
and results references, runnable examples, serving formats, the front door's rules."""

import ast
import dataclasses
import glob
import json
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
from _recipes import doc_pages, marked_blocks

from keras_transformer.config import config_reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
CONFIG_PAGE = os.path.join(DOCS, "reference", "config.md")
START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
CLI_PAGE = os.path.join(DOCS, "reference", "cli.md")
CLI_START, CLI_END = "<!-- cli-reference:start -->", "<!-- cli-reference:end -->"
# The packages whose `__all__` is the public API, each with its page under docs/reference/api/.
PUBLIC_PACKAGES = ["layers", "models", "decoding", "export", "training", "data", "litert"]
# Modules without `__all__`: their public functions (and these classes) are the API.
PUBLIC_MODULES = {
    "config": ["ExperimentConfig"],
    "fast_paths": [],
    "glossary": ["GlossaryError", "TermAnnotator"],
}


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _readme():
    return _read(README)


def _doc_pages():
    return doc_pages()


def _all_docs():
    return "\n".join(_read(p) for p in _doc_pages())


def _blocks(text, language):
    """`[(kind, code)]` of the fenced blocks in `language`, with their markers' kinds (`ci:main`,
    `run`, `recipe`, `skip`, ... or None) as the recipe runner parses them (tests/_recipes.py)."""
    return [(kind, code) for _, lang, kind, _, code in marked_blocks(text) if lang == language]


def test_ci_blocks_follow_their_markers():
    text = _readme()
    # .ci/run extracts the block after <!-- ci:test -->; the main job is the first command.
    blocks = dict(_blocks(text, "bash"))
    main, test = blocks.get("ci:main"), blocks.get("ci:test")
    assert main and test
    assert text.index("<!-- ci:main -->") < text.index("<!-- ci:test -->")
    assert main.startswith("pip install . && keras-transformer train --config configs/quickstart")
    assert "keras-transformer translate --model saved_models/quickstart" in main
    assert test.strip() == (
        'pip install -e ".[test,docs]" && ruff check . && mkdocs build --strict '
        '&& python -m pytest -q -n 2 -m "not scenario" && TF_ENABLE_ONEDNN_OPTS=0 '
        'TF_NUM_INTRAOP_THREADS=1 python -m pytest -q -n 2 -m "numerics and not scenario"'
    )


def _slug(heading):
    """The anchor GitHub and MkDocs give a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path):
    text = _read(path)
    ids = set(re.findall(r'id="([^"]+)"', text))
    return ids | {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_readme_is_a_front_door():
    """A newcomer reads the README in five minutes: at most 180 lines, its prose at most 100
    characters a line (code, tables and markers aside), and no dated run logs."""
    text = _readme()
    assert len(text.splitlines()) <= 180
    prose = re.sub(r"```.*?```", "", text, flags=re.S).splitlines()
    long = [line for line in prose if len(line) > 100 and not line.startswith(("|", "<!--"))]
    assert not long, long
    # No dated run logs (time spans such as 03:36-04:08) in the front door.
    assert not re.search(r"\b\d{1,2}:\d{2}\s*(?:-|–|to)\s*\d{1,2}:\d{2}\b", text)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(links) >= 10
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        target, _, anchor = link.partition("#")
        path = os.path.join(ROOT, target) if target else README
        assert os.path.exists(path), f"README links to a missing {target}"
        if anchor:
            assert anchor in _anchors(path), f"README links to a missing anchor {link}"


# Words of how the project was made rather than of what it is (a reader has no sessions,
# tasks, helpers or issue numbers to look up), as phrases, so that product words stay free:
# TensorFlow's `Session` is capitalised, the beam search's "helpers" follow no article.
PROCESS_WORDS = re.compile(
    r"\bsessions?\b|\bthis task\b|\bthe lead\b|\b(?:[Tt]he|[Aa]nother|[Oo]ther|[Ee]ach) helpers?\b"
    r"|\bhelper engineers?\b|\b[Hh]elpers drop\b|\b[Ii]ssue ?#? ?\d+|\bissue\d+_|\(#\d+\)"
    r"|\bthe GPU machines?\b|\bthis project is tested on\b"
)
# Paths of the machines the project was made on, and a folder beside the repository.
MACHINE_PATHS = re.compile(r"(?<![\w.~$-])/(?:work|tmp|root|home)/|\.\./shared\b")


def test_what_ships_has_no_process_words_or_machine_paths():
    """The docs, the README, the CHANGELOG and every ledger line speak of the product: no
    "issue #11", "other sessions", "this task" or helpers and leads, no `/work/...` or `/tmp/...`
    path of the machine that measured a figure, no `../shared/...` folder a user does not have."""
    from benchmarks import ledger

    paths = [README, os.path.join(ROOT, "CHANGELOG.md")]
    paths += glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)
    paths += glob.glob(os.path.join(ledger.RESULTS, "*.jsonl"))
    paths += [os.path.join(ledger.RESULTS, "figures.yaml")]
    found = []
    for path in paths:
        for number, line in enumerate(_read(path).splitlines(), 1):
            for pattern in (PROCESS_WORDS, MACHINE_PATHS):
                for match in pattern.finditer(line):
                    found.append(f"{os.path.relpath(path, ROOT)}:{number}: {match.group(0)!r}")
    assert not found, "\n".join(found)


def test_home_page_names_every_guide_and_export():
    """The manual's home page links every guide and the results, history and benchmarks pages
    (the JAX, speed and memory, after-the-first-model and benchmarks pages were missing), and
    names the three exports."""
    home = _read(os.path.join(DOCS, "index.md"))
    pages = [os.path.relpath(p, DOCS) for p in glob.glob(os.path.join(DOCS, "guides", "*.md"))]
    pages += ["results.md", "history.md", "benchmarks.md", "survival.md", "reference/config.md"]
    assert not [page for page in pages if f"]({page})" not in home], "pages the home page lacks"
    for export in ("SavedModel", "CTranslate2", "LiteRT"):
        assert export in home.split("## Where to start")[0], export


def test_no_section_opens_mid_sentence():
    """The first paragraph under a heading starts a sentence (precision-xla.md's "bfloat16 on
    CPUs" opened with "model re-exported with ... does;", the rest of a cut sentence)."""
    cut = []
    for path in _doc_pages():
        text = re.sub(r"```.*?```", "CODE", _read(path), flags=re.S)
        for heading, first in re.findall(r"^(#+ .+)\n\s*\n(\S[^\n]*)", text, re.M):
            if first[0].islower():
                cut.append(f"{os.path.relpath(path, ROOT)}: {heading!r} opens with {first!r}")
    assert not cut, "\n".join(cut)


def _generated_part_in_sync(path, start, end, generated):
    """Whether the part of `path` between `start` and `end` is `generated`; under
    `UPDATE_DOCS=1` it is rewritten first."""
    text = _read(path)
    assert text.count(start) == 1 and text.count(end) == 1
    expected = f"{start}\n{generated.strip()}\n{end}"
    current = text[text.index(start) : text.index(end) + len(end)]
    if current != expected and os.environ.get("UPDATE_DOCS"):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace(current, expected))
        current = expected
    return current == expected


def test_config_reference_is_in_sync():
    assert _generated_part_in_sync(CONFIG_PAGE, START, END, config_reference()), (
        "docs/reference/config.md is stale: UPDATE_DOCS=1 python -m pytest tests/test_docs.py"
    )


def test_cli_reference_is_in_sync():
    from keras_transformer.cli import cli_reference

    assert _generated_part_in_sync(CLI_PAGE, CLI_START, CLI_END, cli_reference()), (
        "docs/reference/cli.md is stale: UPDATE_DOCS=1 python -m pytest tests/test_docs.py"
    )


def test_cli_reference_lists_every_subcommand_and_flag():
    """Each subcommand has its section on the page, and each of its flags a row there."""
    import argparse

    from keras_transformer.cli import build_parser

    page = _read(CLI_PAGE)
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(sub.choices) == {
        "prepare", "train", "distill", "translate", "evaluate", "export", "info", "score",
        "shortlist",
    }  # fmt: skip
    for name, parser in sub.choices.items():
        heading = f"## `keras-transformer {name}`"
        assert page.count(heading) == 1, heading
        section = page.split(heading)[1].split("\n## ")[0]
        for action in parser._actions:
            for flag in action.option_strings or [action.dest]:
                if flag not in ("-h", "--help"):
                    assert re.search(rf"^\| [^|]*`{flag}`[^|]* \|", section, re.M), (name, flag)


def test_cli_parser_imports_no_tensorflow():
    """The parser (and the page made from it) is cheap: `--help`, a bad flag and the CLI
    reference answer before TensorFlow or Keras loads."""
    code = (
        "import sys\n"
        "from keras_transformer.cli import build_parser, cli_reference\n"
        "build_parser(); cli_reference()\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'\n"
        "assert 'keras' not in sys.modules, 'keras was imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def test_config_reference_rows_have_four_cells():
    """A `|` inside a default, a valid range or a meaning is escaped: otherwise the table's
    row splits there (the `strategy` and `mixed_precision` rows showed one word)."""
    rows = [line for line in config_reference().splitlines() if line.startswith("| `")]
    assert len(rows) > 50
    for row in rows:
        cells = re.split(r"(?<!\\)\|", row.strip())[1:-1]
        assert len(cells) == 4, row
    assert any("\\|" in row for row in rows)  # some meaning holds one (a choice "a | b")


def test_config_reference_lists_every_key():
    from keras_transformer.config import SECTIONS

    reference = _read(CONFIG_PAGE)
    for section, cls in SECTIONS.items():
        assert f"### `{section}`" in reference
        for field in dataclasses.fields(cls):
            assert re.search(rf"^\| `{field.name}` \| `.*` \| .+ \|$", reference, re.M), field.name


def _module_ast(name):
    path = os.path.join(ROOT, "keras_transformer", *name.split("."))
    path = os.path.join(path, "__init__.py") if os.path.isdir(path) else path + ".py"
    return ast.parse(_read(path))


def public_names():
    """`{module: [public name, ...]}`: the packages' `__all__` and the modules' public functions."""
    names = {}
    for package in PUBLIC_PACKAGES:
        for node in _module_ast(package).body:
            if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "__all__" for t in node.targets
            ):
                names[package] = ast.literal_eval(node.value)
    for module, classes in PUBLIC_MODULES.items():
        functions = [
            node.name
            for node in _module_ast(module).body
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
        ]
        names[module] = functions + classes
    return names


def test_api_reference_has_an_entry_for_every_public_name():
    names = public_names()
    assert set(names) == set(PUBLIC_PACKAGES) | set(PUBLIC_MODULES)
    for module, members in names.items():
        page = _read(os.path.join(DOCS, "reference", "api", f"{module}.md"))
        assert members, module
        for name in members:
            # A rendered entry (mkdocstrings) or, for constants, a row of the page's table.
            entry = f"::: keras_transformer.{module}.{name}\n"
            assert entry in page or f"| `{name}` |" in page, f"{module}.{name} has no entry"


def test_the_top_level_names_have_their_page():
    """`keras_transformer.<name>` (the lazy top-level API) is listed on its page, and each
    name is one a sub-package documents (rendered on that package's page)."""
    import keras_transformer

    page = _read(os.path.join(DOCS, "reference", "api", "keras_transformer.md"))
    names = public_names()
    for name in keras_transformer.__all__:
        assert f"| `{name}` |" in page, f"keras_transformer.{name} is not on its page"
        value = getattr(keras_transformer, name)
        if name not in PUBLIC_PACKAGES:
            home = value.__module__.split(".")[1]  # keras_transformer.<home>[.module]
            assert name in names[home], f"keras_transformer.{name} is not public in {home}"


def test_every_public_callable_has_a_docstring():
    import importlib
    import inspect

    for module, members in public_names().items():
        imported = importlib.import_module(f"keras_transformer.{module}")
        for name in members:
            obj = getattr(imported, name)
            if inspect.isclass(obj):  # its own docstring, not one inherited from Keras
                assert (vars(obj).get("__doc__") or "").strip(), f"{module}.{name}"
            elif callable(obj):
                assert (getattr(obj, "__doc__", None) or "").strip(), f"{module}.{name}"


def test_results_page_is_generated_from_the_ledgers():
    from benchmarks import ledger, results_page

    assert _read(results_page.PAGE) == results_page.render(), (
        "docs/results.md is stale: python -m benchmarks.results_page"
    )
    for question in results_page.questions.QUESTIONS:
        assert os.path.exists(os.path.join(results_page.IMG, f"{question.id}.png"))
    names = ledger.benchmarks()
    assert "quality_budget" in names and "compare" in names
    # One ledger per benchmark: no per-run files beside them.
    assert not glob.glob(os.path.join(ledger.RESULTS, "*_20[0-9][0-9]-*.jsonl"))
    for name in names:
        for line in ledger.read(name):
            missing = {"date", "machine", "cpu_flags", "label", "command"} - set(line)
            assert not missing, (name, missing)


def test_every_ledger_shows_its_figures():
    """Each ledger's table has its own columns (eight ledgers once showed only the date, the
    machine and the label, so README rows linked lines without a number), each column shows
    something, and every field a current figure reads is in a column of its line, not only in
    the folded `more` cell."""
    from benchmarks import figures, ledger, results_page

    names = ledger.benchmarks()
    assert not [n for n in names if n not in results_page.COLUMNS], "a ledger without COLUMNS"
    for name in names:
        rows = ledger.read(name)
        for column in results_page.COLUMNS[name]:
            assert any(column.render(row)[0] for row in rows), (name, column.header)
    hidden = []
    for entry in figures.load():
        for quote in figures.quotes(entry):
            for name, number, field in quote.fields:
                row = ledger.read(name)[number - 1]
                shown = {f for c in results_page.COLUMNS[name] for f in c.render(row)[1]}
                if field not in shown:
                    hidden.append(f"{name} line {number}: {field} ({entry['what'][:40]})")
    assert not hidden, "figures read from fields the page does not show:\n" + "\n".join(hidden)


def test_results_page_tables_are_narrow_and_old_lines_fold():
    """At most 7 columns a table (11 ran off the page), on the results page and each ledger's
    page; a ledger's page shows its latest lines and the lines the current figures read, the
    others folded into a `<details>` block."""
    from benchmarks import ledger, results_page

    read = results_page._read_by_figures()
    for name in [None] + ledger.benchmarks():
        path = (
            results_page.PAGE
            if name is None
            else os.path.join(results_page.LEDGER_DIR, f"{name}.md")
        )
        page = _read(path)
        for line in page.splitlines():
            if line.startswith("|"):
                cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
                assert len(cells) <= 7, line[:120]
            elif line.startswith("<thead>"):
                assert line.count("<th>") <= 7, line[:120]
        if name is None:
            continue
        rows = ledger.read(name)
        section = page[page.index(f"`benchmarks/results/{name}.jsonl`, {len(rows)} lines") :]
        section += "\n\n"  # a table that ends the page
        visible = section[: section.index("\n\n", section.index("|"))]
        shown = re.findall(rf'<a id="{name}-(\d+)">', visible)
        assert len(shown) <= results_page.LATEST + len(read.get(name, ()))
        assert str(len(rows)) in shown  # the latest line is in view
        if len(rows) > len(shown):
            folded = section[section.index("<summary>The other") :]
            assert f'<a id="{name}-1">' in folded or "1" in shown


FIGURES_START, FIGURES_END = "<!-- results-figures:start -->", "<!-- results-figures:end -->"


def _table_cells(row):
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def _readme_results_rows():
    """The cells of each row of the README's headline table (header and rule left out)."""
    text = _readme()
    table = text[text.index(FIGURES_START) : text.index(FIGURES_END)]
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    return [_table_cells(row) for row in rows]


def _check_numbers(entry, shown, wrong):
    from benchmarks import figures

    quotes = figures.quotes(entry)
    numbers = figures.NUMBER.findall(shown)
    if len(numbers) != len(quotes):
        wrong.append(f"{entry['id']} shows {numbers}, figures.yaml has {len(quotes)}")
        return
    for text, quote in zip(numbers, quotes):
        if not figures.shows(text, quote.value):
            wrong.append(f"{entry['id']} shows {text}: {quote.expression} = {quote.value}")


def test_figures_are_the_ledger_lines_they_link():
    """Every number of the current figures, on the results page and in the README's headline
    table, is what `benchmarks/results/figures.yaml` reads from the ledgers (one line's field,
    a ratio, the mean of several lines), to the digits shown; each row of the results page links
    exactly the lines its numbers are read from, and each README row links its page row."""
    from benchmarks import figures, results_page

    entries = figures.load()
    page_rows = [
        _table_cells(line)
        for line in _read(results_page.PAGE).splitlines()
        if line.startswith('| <a id="figure-')
    ]
    assert len(page_rows) == len(entries), "the page's rows are not figures.yaml's entries"
    wrong = []
    for (what, shown, _, sources), entry in zip(page_rows, entries):
        assert what.startswith(f'<a id="figure-{entry["id"]}">'), what
        linked = {
            (name, int(n)) for name, n in re.findall(r"\(ledgers/\w+\.md#(\w+)-(\d+)\)", sources)
        }
        read = set(figures.lines(figures.quotes(entry)))
        if linked != read:
            wrong.append(f"{entry['id']} links {sorted(linked)}, its figure reads {sorted(read)}")
        _check_numbers(entry, shown, wrong)
    # The README: one number a row (`readme: {N: name}`), the N-th of its figure.
    headline = [(entry, n) for entry in entries for n, _ in figures.readme_picks(entry)]
    rows = _readme_results_rows()
    assert 0 < len(rows) == len(headline) <= figures.README_ROWS, "not figures.yaml's headline"
    for (what, shown, _), (entry, n) in zip(rows, headline):
        assert what.endswith(f"(docs/results.md#figure-{entry['id']})"), what
        numbers, quote = figures.NUMBER.findall(shown), figures.quotes(entry)[n - 1]
        if len(numbers) != 1 or not figures.shows(numbers[0], quote.value):
            wrong.append(f"README {entry['id']} {n} shows {shown!r}: {quote.value}")
    assert not wrong, "\n".join(wrong)


def test_a_readme_row_holds_one_number_named_with_its_unit_and_shape():
    """The README's headline table shows one number a cell (it showed twelve ratios in one,
    "1.08x / 1.39x; greedy 1.28x / 1.65x; ..."): an entry names each number it puts there."""
    from benchmarks import figures

    entry = {"id": "s", "figure": "{a[1]:.2f}x / {a[2]:.2f}x", "ledger": "t", "machine": "zen5"}
    read = {"t": [{"a": 1.234}, {"a": 2.5}]}.__getitem__
    rows = figures.readme_rows([dict(entry, readme={2: "speed over a peer, base"})], read)
    row = "| [speed over a peer, base](docs/results.md#figure-s) | 2.50x | AMD EPYC Zen 5 |"
    assert rows.splitlines()[2] == row
    for bad in (True, {3: "no third number"}, {1: " "}, {"1": "a string N"}):
        with pytest.raises(ValueError, match="readme is"):
            figures.readme_picks(dict(entry, readme=bad))


def test_pages_quote_the_figures_from_figures_yaml():
    """A figure quoted outside the tables (`<!-- figure: ID -->...<!-- /figure -->`, or its N-th
    number) is written from figures.yaml, so that each figure has one source: the quickstart's
    BLEU was "about 82 to 87" in the README beside a table row of 81.73, and the guide cited
    other runs."""
    from benchmarks import figures, results_page

    assert not results_page.stale(), "stale: python -m benchmarks.results_page"
    for path in (README, os.path.join(DOCS, "guides", "quickstart.md")):
        assert "<!-- figure: quickstart -->" in _read(path), path
    entry = {"id": "q", "figure": "{bleu[1]:.1f} / {bleu[2]:.1f}", "ledger": "t"}
    read = {"t": [{"bleu": 80.04}, {"bleu": 81.96}]}.__getitem__
    text = "BLEU <!-- figure: q -->old<!-- /figure --> and <!-- figure: q 2 -->1<!-- /figure -->."
    assert figures.render_quotes(text, [entry], read) == (
        "BLEU <!-- figure: q -->80.0 / 82.0<!-- /figure --> and "
        "<!-- figure: q 2 -->82.0<!-- /figure -->."
    )
    starts_a_line = "<!-- figure: q -->x<!-- /figure --> ends the paragraph before it"
    for bad in (starts_a_line, "a <!-- figure: r -->x<!-- /figure --> of no entry"):
        with pytest.raises(ValueError):
            figures.render_quotes(bad, [entry], read)


def test_readme_results_table_is_generated_from_figures_yaml():
    from benchmarks import figures

    text = _readme()
    assert text.count(FIGURES_START) == 1 and text.count(FIGURES_END) == 1
    current = text[text.index(FIGURES_START) + len(FIGURES_START) : text.index(FIGURES_END)]
    assert current.strip() == figures.readme_rows(), (
        "README.md's Results table is stale: python -m benchmarks.results_page"
    )


def test_figures_are_read_exactly_from_their_lines():
    """The expressions of figures.yaml: one line, means, ratios, rounding half up in decimal
    (17.03 and 17.2 average to 17.115, shown 17.12, which binary floats round to 17.11)."""
    from benchmarks import figures

    ledgers = {
        "q": [{"bleu": 17.03, "name": "a"}, {"bleu": 17.2, "flag": True}, {"bleu": 20}],
        "t": [{"tps": 2053.8}],
    }

    def quote(figure, ledger="q"):
        return figures.quotes({"figure": figure, "ledger": ledger}, ledgers.__getitem__)

    [mean] = quote("{mean(bleu[1,2]):.2f}")
    assert (mean.text, mean.lines) == ("17.12", [("q", 1), ("q", 2)])
    assert format(17.115, ".2f") == "17.11"
    [ratio, total] = quote("{bleu[3] / t.tps[1]:.3f}x {t.tps[1] * 1000:+,.0f}")
    assert (ratio.text, total.text) == ("0.010", "+2,053,800")
    assert ratio.lines == [("q", 3), ("t", 1)]
    assert [q.text for q in quote("{min(bleu[1,2,3]):.1f}-{max(bleu[1,2,3]):.1f}")] == [
        "17.0",
        "20.0",
    ]
    assert figures.shows("17.12", mean.value) and figures.shows("17.1", mean.value)
    assert not figures.shows("17.11", mean.value) and not figures.shows("17.115", mean.value + 1)
    assert figures.shows("2,054", figures.decimal.Decimal("2053.8"))
    for bad, message in [
        ("{bleu[1,2]:.2f}", "mean, min or max"),
        ("{bleu[4]:.2f}", "no line 4"),
        ("{bleu[0]:.2f}", "no line 0"),
        ("{missing[1]:.2f}", "no field 'missing'"),
        ("{name[1]:.2f}", "not a number"),
        ("{flag[2]:.2f}", "not a number"),
        ("{bleu[1]}", "{expression:.Nf}"),
        ("{__import__('os'):.2f}", "not allowed"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            quote(bad)
    with pytest.raises(ValueError, match="names no ledger"):
        quote("{bleu[1]:.2f}", ledger=None)


def test_commands_use_real_configs_and_subcommands():
    from keras_transformer.cli import build_parser

    parser = build_parser()
    commands = []
    for _, block in _blocks(_all_docs(), "bash"):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            for part in line.split("&&"):
                part = part.split("|")[-1].strip()
                if part.startswith("keras-transformer "):
                    commands.append(part)
    assert len(commands) >= 10
    for command in commands:
        argv = shlex.split(command.split("#")[0])[1:]
        args = parser.parse_args(argv)  # exits (code 2) on a bad flag
        if getattr(args, "config", None):
            assert os.path.isfile(os.path.join(ROOT, args.config)), command
        for override in getattr(args, "set", []) or []:
            from keras_transformer.config import apply_overrides, from_dict

            from_dict(apply_overrides({}, [override]))  # a real key with a valid value


@pytest.fixture(scope="module")
def exported_quickstart(tmp_path_factory, toy_spm_bytes):
    """A tiny untrained model exported as saved_models/quickstart/1 in a fresh directory: the
    formats are under test here, not the translations."""
    import _inference_fixtures as fx

    from keras_transformer.config import DecodingSettings
    from keras_transformer.export import ExportPlan, export_saved_model
    from keras_transformer.models import Transformer

    base = tmp_path_factory.mktemp("readme")
    model = Transformer(vocab_size=fx.spm_processor().get_piece_size(), **fx.MODEL_KWARGS)
    path = export_saved_model(
        model,
        toy_spm_bytes,
        ExportPlan(
            settings=DecodingSettings(beam_size=2, alpha=0.6, max_extra_length=4, batch_size=4),
            data=dict(max_source_length=12, max_target_length=12),
        ),
        str(base / "saved_models"),
        "quickstart",
    )
    assert path.endswith(os.path.join("quickstart", "1"))
    return base, path


@pytest.fixture(scope="module")
def exported_with_alignments(tmp_path_factory, toy_spm_bytes):
    """The path of a tiny untrained model exported with alignments (its `translate_markup`
    signature)."""
    import _inference_fixtures as fx

    from keras_transformer.config import DecodingSettings
    from keras_transformer.export import ExportPlan, export_saved_model
    from keras_transformer.models import Transformer

    model = Transformer(vocab_size=fx.spm_processor().get_piece_size(), **fx.MODEL_KWARGS)
    base = tmp_path_factory.mktemp("aligned") / "saved_models"
    plan = ExportPlan(
        settings=DecodingSettings(beam_size=2, alpha=0.6, max_extra_length=4, batch_size=4),
        data=dict(max_source_length=12, max_target_length=12),
        alignments=True,
    )
    return export_saved_model(model, toy_spm_bytes, plan, str(base), "quickstart")


@pytest.mark.scenario
def test_python_examples_run(exported_quickstart, monkeypatch, capsys):
    base, _ = exported_quickstart
    monkeypatch.chdir(base)  # relative paths as in the documentation: saved_models/quickstart/1
    blocks = [
        (path, code)
        for path in _doc_pages()
        for kind, code in _blocks(_read(path), "python")
        if kind == "run"
    ]
    assert len(blocks) >= 4 and any(path == README for path, _ in blocks)
    for path, code in blocks:
        exec(compile(code, os.path.relpath(path, ROOT), "exec"), {"__name__": "__docs__"})
    assert os.path.exists(base / "classifier.keras")
    out = capsys.readouterr().out
    assert "(1, 3, 37000)" in out
    assert "(2, 10, 512) bfloat16 (2, 8, 10, 10) bfloat16" in out  # layers.md's output spec


def _signature(path):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    return tf.saved_model.load(path).signatures["serving_default"]


def _rest_examples(text):
    """`[(body, documented response or None)]`: the JSON bodies of the curl requests in `text`
    (on one line or several), each with the ```` ```json ````
    block that directly follows its ```` ```bash ```` block, if any."""
    pattern = re.compile(r"```bash\n(.*?)```(?:\n```json\n(.*?)```)?", re.S)
    examples = []
    for match in pattern.finditer(text):
        bodies = re.findall(r"-d '(\{.*?\})'", match.group(1), re.S)
        for i, body in enumerate(bodies):
            documented = match.group(2) if i == len(bodies) - 1 else None
            examples.append((json.loads(body), documented and json.loads(documented)))
    return examples


def _check_documented_response(documented, response):
    """A documented response has the real one's format, output names and rows (not its
    values: the test's model is untrained)."""
    assert set(documented) == set(response)
    if "outputs" in response:
        assert set(documented["outputs"]) == set(response["outputs"])
        for name, values in documented["outputs"].items():
            assert len(values) == len(response["outputs"][name]), name
    else:
        assert len(documented["predictions"]) == len(response["predictions"])


def _as_json(values):
    values = values.numpy()
    if values.dtype == object:
        return np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(values).tolist()
    return values.tolist()


@pytest.mark.scenario
def test_rest_requests_match_the_signature(exported_quickstart, exported_with_alignments):
    """Answers the documented REST bodies as TF Serving's REST API does, on the real signatures
    (`signature_name`, default `serving_default`; `translate_markup`: an export with
    alignments)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    _, path = exported_quickstart
    loaded = [tf.saved_model.load(p) for p in (path, exported_with_alignments)]
    signatures = dict(loaded[0].signatures)
    signatures["translate_markup"] = loaded[1].signatures["translate_markup"]
    serve = signatures["serving_default"]
    _, inputs = serve.structured_input_signature
    assert list(inputs) == ["text"]
    assert inputs["text"].dtype == tf.string and inputs["text"].shape.as_list() == [None]
    outputs = serve.structured_outputs
    assert set(outputs) == {"translation", "score", "token_scores", "confidence"}
    assert outputs["translation"].dtype == tf.string and outputs["score"].dtype == tf.float32

    examples = _rest_examples(_all_docs())
    bodies = [body for body, _ in examples]
    assert any("instances" in b for b in bodies) and any("inputs" in b for b in bodies)
    named = {b.get("signature_name", "serving_default") for b in bodies}
    assert named == {
        "serving_default", "translate_nbest", "translate_prefix", "score", "translate_constrained",
        "translate_markup",
    }  # fmt: skip
    # The serving guide's translate_prefix example shows its response.
    serving = _read(os.path.join(DOCS, "guides", "export-serving.md"))
    prefix = [
        (body, documented)
        for body, documented in _rest_examples(serving)
        if body.get("signature_name") == "translate_prefix"
    ]
    assert any(documented for _, documented in prefix)
    assert any("instances" in body for body, _ in _rest_examples(_readme()))
    for body, documented in examples:
        signature = signatures[body.get("signature_name", "serving_default")]
        _, inputs = signature.structured_input_signature
        if "instances" in body:
            # Row format, one named input: each instance is that input's value for one row.
            result = signature(text=tf.constant(body["instances"]))
            rows = [dict(zip(result, values)) for values in zip(*map(_as_json, result.values()))]
            response = json.loads(json.dumps({"predictions": rows}))
            assert len(response["predictions"]) == len(body["instances"])
        else:
            # Column format: named inputs in, named outputs out.
            assert set(body["inputs"]) == set(inputs)
            result = signature(**{k: tf.constant(v) for k, v in body["inputs"].items()})
            response = json.loads(
                json.dumps({"outputs": {k: _as_json(v) for k, v in result.items()}})
            )
            assert set(response["outputs"]) == set(signature.structured_outputs)
            rows = len(next(iter(body["inputs"].values())))
            assert all(len(v) == rows for v in response["outputs"].values())
        scores = result.get("score", result.get("scores", result.get("log_probability")))
        assert np.all(np.isfinite(scores)) and np.all(np.asarray(scores) <= 0)
        if documented:
            _check_documented_response(documented, response)


@pytest.mark.scenario
def test_grpc_tensor_matches_the_signature(exported_quickstart):
    """The documented gRPC request tensor: DT_STRING, shape [n], accepted by the signature."""
    import tensorflow as tf

    _, path = exported_quickstart
    proto = tf.make_tensor_proto(["the purple sandwich keeps the tiny ship"], dtype=tf.string)
    assert proto.dtype == tf.string.as_datatype_enum
    assert [d.size for d in proto.tensor_shape.dim] == [1]
    result = _signature(path)(text=tf.constant(tf.make_ndarray(proto)))
    assert result["translation"].shape == (1,) and result["score"].dtype == tf.float32


def test_documented_batch_arithmetic_holds():
    """Every `A x B x C = D` in the manual holds, and scale.md's base-config products use the
    config's own `data.tokens_per_batch` and `train.gradient_accumulation_steps` (it once told
    8-GPU users they needed no accumulation, doubling the paper's batch)."""
    from keras_transformer.config import load_config

    number = r"(\d[\d,]*)"
    products = re.findall(rf"{number} x {number} x {number} = {number}", _all_docs())
    assert len(products) >= 3
    for a, b, c, d in products:
        a, b, c, d = (int(v.replace(",", "")) for v in (a, b, c, d))
        assert a * b * c == d, f"{a:,} x {b:,} x {c:,} is not {d:,}"
    base = load_config(os.path.join(ROOT, "configs", "transformer_base.yaml"))
    tokens, k = base.data.tokens_per_batch, base.train.gradient_accumulation_steps
    scale = _read(os.path.join(DOCS, "guides", "scale.md"))
    for replicas in (1, 8):
        assert f"{tokens:,} x {replicas} x {k} = {tokens * replicas * k:,}" in scale
