"""The ledgers as a stranger reads them: every line shown reruns (no scratch directory, temporary
path or checkout beside the repository; a comparison of two checkouts names their commits), its
command sets what the line records, and every machine has one name, that of
`benchmarks/machines.py`, on every page."""

import glob
import json
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lines():
    """`(benchmark, number, line as written, line as shown)` for every ledger line."""
    from benchmarks import ledger

    fixes = ledger.corrections()
    for name in ledger.benchmarks():
        for number, row in enumerate(ledger.read(name), 1):
            yield name, number, row, ledger.shown(name, number, row, fixes)


def test_shown_lines_hold_no_scratch_paths_or_sibling_checkouts():
    """No line as the results page shows it names a scratch workdir (`workdirs/s7`), a temporary
    path (`$TMPDIR/ciclone/...`), a checkout beside the repository (`../main`), or how checkouts
    were made and run (`git worktree add`, "one after the other"); nor does a figure's
    reproduce line."""
    from benchmarks import figures, ledger

    found = [
        f"{name} {number}: {trace}"
        for name, number, _, shown in _lines()
        for trace in ledger.traces(shown)
    ]
    for entry in figures.load():
        found += [f"figure {entry['id']}: {t}" for t in ledger.traces({"r": entry["reproduce"]})]
    assert not found, "\n".join(found)


def test_shown_commands_set_what_their_lines_record():
    """Each shown command's flags (`--shapes`, `--beam-size`, `--minutes`, `--rounds`,
    `--precision`, `--set KEY=VALUE` against `overrides`, a JSON shape against `cfg`, ...) agree
    with the settings its line records (quality_budget 3 showed the command of another run)."""
    from benchmarks import ledger

    found = [
        f"{name} {number}: {problem}"
        for name, number, _, shown in _lines()
        for problem in ledger.disagreements(shown)
    ]
    assert not found, "\n".join(found)


def test_showing_a_line_changes_no_measured_value():
    """The ledgers are records: what is shown differs from what is written only in the command
    and in the text of paths and checkouts, never in a number, and no line is added or lost."""
    changed = []
    for name, number, row, shown in _lines():
        assert list(shown) == list(row), (name, number)
        for key, value in row.items():
            if shown[key] != value and (
                not isinstance(value, (str, list, dict)) or key in ("date", "label", "machine")
            ):
                changed.append(f"{name} {number}: {key}")
            if isinstance(value, (list, dict)) and json.dumps(shown[key]) != json.dumps(value):
                numbers = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")
                if numbers.findall(json.dumps(value)) != numbers.findall(json.dumps(shown[key])):
                    changed.append(f"{name} {number}: {key}")
    assert not changed, "\n".join(changed)


def _commit_known(commit):
    done = subprocess.run(
        ["git", "-C", ROOT, "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    )
    return done.returncode == 0


def test_each_correction_is_needed_and_names_real_commits():
    """`benchmarks/corrections.yaml` holds only what a line lacks or records wrong: each line it
    corrects would otherwise show a trace or a command that disagrees with its settings; each
    commit it names is one of this repository's."""
    from benchmarks import ledger

    fixes = ledger.corrections()
    needless = []
    for (name, number), fix in fixes.items():
        row = ledger.read(name)[number - 1]
        bare = ledger.shown(name, number, row, fixes={})
        if not ledger.traces(bare) and not ledger.disagreements(bare):
            needless.append(f"{name} {number}")
    assert not needless, "corrections for lines that need none: " + ", ".join(needless)
    commits = {
        side
        for fix in fixes.values()
        for side in (fix.get("compared") or {}).values()
        if re.fullmatch(r"[0-9a-f]{7,40}", str(side))
    }
    assert commits
    if not os.path.isdir(os.path.join(ROOT, ".git")) and not os.path.isfile(
        os.path.join(ROOT, ".git")
    ):
        return  # a source tree without its history: nothing to look the commits up in
    assert not [c for c in sorted(commits) if not _commit_known(c)], "unknown commits"


def test_quality_budget_3_shows_the_command_of_its_own_settings():
    """The line was converted from a per-run file under that file's first command (scale 1.2,
    the default averaging); its own settings are scale 0.6 and one checkpoint."""
    from benchmarks import ledger

    row = ledger.read("quality_budget")[2]
    assert row["label"] == "recipe_lr06_avg1" and row["averaged_checkpoints"] == 1
    assert ledger.disagreements(row)  # as written
    shown = ledger.shown("quality_budget", 3)
    assert "train.learning_rate_scale=0.6" in shown["command"]
    assert "export.average_checkpoints=1" in shown["command"]
    assert "--label recipe_lr06_avg1" in shown["command"]
    assert not ledger.disagreements(shown)
    assert shown["test_bleu"] == row["test_bleu"] == 22.1


def test_a_comparison_of_two_checkouts_states_its_commits_and_one_command():
    from benchmarks import ledger

    shown = ledger.shown("ab_checkouts", 19)
    assert shown["command"] == (
        "commit 08a712e vs commit aaa4872: "
        "python benchmarks/ab_checkouts.py A B --rounds 3 --shapes small,base"
    )
    assert shown["checkout"] == "A: commit 08a712e"
    serve = ledger.shown("serve_compare", 63)
    assert serve["command"].startswith("commit 08a712e vs commit aaa4872, the same command in")
    assert serve["checkout"] == "B: commit aaa4872"
    assert ledger.shown("export_cost", 1)["command"] == (
        "commit a13a5c6 vs commit fd76970: python benchmarks/export_cost.py A B --rounds 3"
    )
    assert ledger.shown("decode_sweep", 11)["workdir"] == "DIR/w_bf16/ours_bf16"
    assert ledger.shown("serve_warmup", 1)["model"] == "saved_models/quickstart/1"


def _checkout(path):
    """A tiny git checkout that `ledger.compared` takes for one of this repository."""
    os.makedirs(os.path.join(path, "benchmarks"))
    with open(os.path.join(path, "benchmarks", "ledger.py"), "w") as f:
        f.write("# a checkout\n")
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.org",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.org",
    )
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "c"]):
        subprocess.run(["git", "-C", path, *args], check=True, env=env, capture_output=True)
    return subprocess.run(
        ["git", "-C", path, "rev-parse", "--short", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to make two checkouts")
def test_record_writes_checkouts_as_commits_and_refuses_what_a_stranger_cannot_rerun(
    tmp_path, monkeypatch
):
    """New lines: a run on two checkouts is written `commit X vs commit Y: ... A B ...` with its
    `checkout` fields as `A` and `B`; a scratch directory as `DIR`; a line naming a checkout
    beside the repository, or whose command sets other than the line records, is refused."""
    from benchmarks import ledger

    monkeypatch.setattr(ledger, "RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(ledger.tempfile, "gettempdir", lambda: str(tmp_path))
    before, after = str(tmp_path / "before"), str(tmp_path / "after")
    first, second = _checkout(before), _checkout(after)
    script = os.path.join(ledger.REPO, "benchmarks", "ab_checkouts.py")
    monkeypatch.setattr(ledger.sys, "argv", [script, before, after, "--rounds", "2"])
    line = ledger.record("toy", {"checkout": before, "rounds": 2}, label="toy")
    assert line["command"] == (
        f"commit {first} vs commit {second}: python benchmarks/ab_checkouts.py A B --rounds 2"
    )
    assert line["checkout"] == "A"
    budget = os.path.join(ledger.REPO, "benchmarks", "quality_budget.py")
    monkeypatch.setattr(ledger.sys, "argv", [budget, "--work", str(tmp_path / "scratch" / "w")])
    assert ledger.record("toy", {}, label="toy")["command"] == (
        "python benchmarks/quality_budget.py --work DIR/w"
    )
    monkeypatch.setattr(ledger.sys, "argv", [script, before, "--rounds", "2"])
    with pytest.raises(ValueError, match="without the commits"):
        ledger.record("toy", {}, label="toy")  # one checkout: not a comparison it can write
    with pytest.raises(ValueError, match="could not rerun"):
        ledger.record("toy", {}, label="toy", command="python x.py ../main ../house-style")
    with pytest.raises(ValueError, match="learning_rate_scale"):
        ledger.record(
            "toy",
            {"overrides": ["train.learning_rate_scale=0.6"]},
            label="toy",
            command="python benchmarks/quality_budget.py --set train.learning_rate_scale=1.2",
        )
    with open(tmp_path / "results" / "toy.jsonl", encoding="utf-8") as f:
        assert len(f.readlines()) == 2  # the refused lines are not written


def test_every_ledger_line_is_measured_on_one_machine_of_the_table():
    """Each line matches exactly one row of `benchmarks/machines.py`: by its `cpu` (family and
    model) where it records one, else by its CPU name and flags."""
    from benchmarks import machines

    counts = {}
    for name, number, row, _ in _lines():
        key = machines.of(row).key  # raises for none or several
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) == set(machines.BY_KEY), counts
    zen4 = {"machine": "AMD EPYC, 2 cores", "cpu": "family 25, model 17", "cpu_flags": ["avx2"]}
    assert machines.of(zen4).key == "zen4"  # the recorded numbers decide over the flags
    zen3 = {"machine": "AMD EPYC, 2 cores", "cpu": "family 25, model 1", "cpu_flags": ["avx2"]}
    assert machines.of(zen3).key == "zen3"
    with pytest.raises(ValueError, match="machines.py"):
        machines.of({"machine": "Apple M2", "cpu_flags": []})


def test_a_figure_names_the_machine_of_the_lines_it_reads():
    """figures.yaml's `machine` is the table's key of every line the figure reads, in the order
    first read (a figure read on the Zen 4 once said "AMD EPYC, AVX-512", as Zen 5 ones did)."""
    from benchmarks import figures, ledger, machines

    wrong = []
    for entry in figures.load():
        read = figures.lines(figures.quotes(entry))
        keys = list(dict.fromkeys(machines.of(ledger.read(n)[i - 1]).key for n, i in read))
        if machines.keys(entry["machine"]) != keys:
            wrong.append(f"{entry['id']}: machine {entry['machine']}, its lines {keys}")
    assert not wrong, "\n".join(wrong)


# A CPU named on a page: an EPYC or a Xeon however written, and a Zen generation.
_CPU = re.compile(
    r"\b(?:AMD\s+)?EPYC\b[^.;:|)\n]{0,30}|\b(?:Intel\s+)?Xeon\b[^.;:|)\n]{0,20}|Zen\s?\d"
)


def _page_texts():
    from benchmarks import results_page

    paths = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CHANGELOG.md")]
    paths += glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    paths += [os.path.join(ROOT, "benchmarks", "results", "figures.yaml")]
    for path in sorted(paths):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if path == results_page.PAGE:
            # The page's own words and its run cells; the folded `more` cells quote each
            # line's fields as written (its `machine` is the CPU's model name as recorded).
            text = re.sub(r"<details><summary>\d+ fields</summary>.*?</details>", "", text)
        yield os.path.relpath(path, ROOT), text


def test_pages_name_each_cpu_as_the_machine_table_does():
    """A page names a CPU by its name in `benchmarks/machines.py` ("AMD EPYC Zen 5", "Intel Xeon
    @ 2.5 GHz"), or a Zen by its generation alone ("the Zen 4"): not "AMD EPYC, AVX-512" for a
    Zen 5 the next page calls Zen 5, not a bare "AMD EPYC" that is any of three."""
    from benchmarks import machines

    names = sorted(machines.NAMES, key=len, reverse=True)
    known = {re.search(r"Zen \d", n).group(0) for n in names if "Zen" in n}
    found = []
    for path, text in _page_texts():
        # A name may be wrapped across lines: a line break is a space of the same length, so
        # that a match's offset still gives its line. Each name found is blanked out.
        rest = text.replace("\n", " ")
        for name in names:
            rest = re.sub(re.escape(name).replace("\\ ", r"\s"), lambda m: "#" * len(m[0]), rest)
        for match in _CPU.finditer(rest):
            word = match.group(0)
            if re.sub(r"Zen\s?", "Zen ", word) in known:
                continue
            found.append(f"{path}:{text.count(chr(10), 0, match.start()) + 1}: {word.strip()!r}")
    assert not found, "\n".join(found)


def test_the_machine_table_in_the_docs_is_the_module_s():
    """docs/benchmarks.md shows the table `python -m benchmarks.machines` prints."""
    from benchmarks import machines

    with open(os.path.join(ROOT, "docs", "benchmarks.md"), encoding="utf-8") as f:
        assert machines.table() in f.read(), "python -m benchmarks.machines"


def test_the_history_names_the_machine_of_the_lines_each_row_links():
    """Each row of the experiment history names the machines of the ledger lines it links, in
    the order first linked."""
    from benchmarks import ledger, machines

    with open(os.path.join(ROOT, "docs", "history.md"), encoding="utf-8") as f:
        rows = [line for line in f if line.startswith("| ") and "](ledgers/" in line]
    assert rows
    wrong = []
    for row in rows:
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        links = re.findall(r"ledgers/[a-z_]+\.md#([a-z_]+)-(\d+)", row)
        keys = dict.fromkeys(machines.of(ledger.read(b)[int(n) - 1]).key for b, n in links)
        if cells[1] != machines.names(", ".join(keys)):
            wrong.append(f"{cells[0][:50]}: {cells[1]}, its lines {list(keys)}")
    assert not wrong, "\n".join(wrong)
