"""The results ledger: one append-only JSON-lines file per benchmark, `results/<benchmark>.jsonl`.

Every line is one measured figure with where and how it was taken: `date` (UTC, ISO 8601),
`machine` (the CPU's model name and core count), `cpu` (its family and model numbers, where
the name does not tell two generations apart: an "AMD EPYC" is a Zen 4 or a Zen 5, whose fp32
matrix products differ 2.3x), `cpu_flags` (the instruction-set flags that move the figures:
AVX-512, bfloat16, AMX, VNNI), `label` (what the run tried), `command` (the
command line that reproduces it, as run from the repository root), then the benchmark's own
fields. No line holds a path of the machine that measured it: a path inside the repository is
written relative to its root, a temporary one as `$TMPDIR/...`, one in the home directory as
`~/...`, any other as `DIR/<its last name>` (`portable`); a scratch directory (a temporary one,
a `workdirs/s<N>` one) as `DIR`, a directory of the reader's choosing (`neutral`). A command run
on two checkouts of the repository is written with the checkouts as `A` and `B` and their
commits first (`commit 1a2b3c4 vs commit 5d6e7f8: python benchmarks/ab_checkouts.py A B`), and
`record` refuses a line that still names a scratch directory, a temporary path or a checkout
beside the repository (`traces`). Lines are only ever appended; `docs/results.md` is generated
from these files (`python -m benchmarks.results_page`), each line as `shown` gives it: older
lines with the same rewriting, and with the facts `benchmarks/corrections.yaml` gives for them.

A benchmark script appends its figures when the environment names the run:

    BENCH_LABEL=vocab_8000 python benchmarks/quality_budget.py --set data.vocab_size=8000

Without `BENCH_LABEL` the scripts only print their JSON lines (smoke tests, development).
"""

import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile

import yaml

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
CORRECTIONS = os.path.join(os.path.dirname(RESULTS), "corrections.yaml")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# An absolute path inside a string: after the start, a space, a quote, `=`, `:` or `,`.
_ABSOLUTE = re.compile(r"(?:(?<=^)|(?<=[\s'\"=:,(]))/(?:[\w.+@-]+/)*[\w.+@-]+/?")
# The flags that decide oneDNN's defaults and the bfloat16/int8 kernels on a CPU.
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni",
         "amx_bf16", "amx_tile", "amx_int8")


def _first_cpu(path):
    """`{field: value}` of the first processor's block of `/proc/cpuinfo` at `path` ({} where
    it cannot be read)."""
    fields = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    if fields:  # the end of the first processor's block
                        break
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_info(path="/proc/cpuinfo"):
    """`(model name, relevant flags)` of this machine's CPU (`platform.processor()` elsewhere)."""
    fields = _first_cpu(path)
    name = fields.get("model name") or platform.processor() or platform.machine()
    present = set(fields.get("flags", "").split())
    return name, [flag for flag in FLAGS if flag in present]


def cpu_generation(path="/proc/cpuinfo"):
    """`"family F, model M"` of this machine's first CPU (x86 Linux), or None."""
    fields = _first_cpu(path)
    if "cpu family" not in fields or "model" not in fields:
        return None
    return f"family {fields['cpu family']}, model {fields['model']}"


def ledger_path(benchmark):
    """The ledger file of `benchmark` (a script's name without `.py`)."""
    return os.path.join(RESULTS, f"{benchmark}.jsonl")


def _portable_path(path, root):
    path = os.path.normpath(path)
    for base, shown in (
        (os.path.realpath(root), "."),
        (os.path.normpath(root), "."),
        (os.path.realpath(tempfile.gettempdir()), "$TMPDIR"),
        ("/tmp", "$TMPDIR"),
        (os.path.expanduser("~"), "~"),
    ):
        if base not in ("/", "") and (path == base or path.startswith(base + os.sep)):
            rest = os.path.relpath(path, base)
            if shown == ".":
                return rest
            return shown if rest == "." else f"{shown}/{rest}"
    return f"DIR/{os.path.basename(path)}"


def portable(value, root=REPO):
    """`value` (a string, or a list or dict of them) with every absolute path written so that it
    means the same on another machine: relative to `root` (the repository) inside it, else
    `$TMPDIR/...`, `~/...` or `DIR/<its last name>`."""
    if isinstance(value, str):
        return _ABSOLUTE.sub(lambda m: _portable_path(m.group(0), root), value)
    if isinstance(value, list):
        return [portable(v, root) for v in value]
    if isinstance(value, dict):
        return {k: portable(v, root) for k, v in value.items()}
    return value


# A temporary directory made for one run ($TMPDIR/<its name>, after `portable`) and the scratch
# workdirs `workdirs/s<N>` of the runs that trained models for other benchmarks: a reader names
# their own, `DIR`. A clone of the repository in $TMPDIR is the repository: its paths are
# relative to its root.
_CLONE = re.compile(r"\$TMPDIR/ciclone/")
_SCRATCH = re.compile(r"\$TMPDIR/[\w.+@-]+|(?<![\w/.-])workdirs/s\d+(?![\w.-])")
# What a stranger cannot rerun: a scratch or temporary directory, a path of the machine that
# measured, a checkout beside the repository, or the story of how the checkouts were run.
TRACES = re.compile(
    r"\$TMPDIR|(?<![\w.~$-])/(?:tmp|work|root|home)/|(?<![\w.])\.\./|(?<![\w/.-])workdirs/s\d+"
    r"|\bciclone\b|\bworktree\b|one after the other"
)
_COMMIT = re.compile(r"[0-9a-f]{7,40}")
# The benchmarks that run two checkouts of the repository against each other.
COMPARING = ("benchmarks/ab_checkouts.py", "benchmarks/export_cost.py")


def neutral(value):
    """`value` (a string, or a list or dict of them) with scratch directories written as `DIR`
    (`$TMPDIR/bench/prepared` -> `DIR/prepared`, `workdirs/s7/w/ours` -> `DIR/w/ours`) and a
    temporary clone of the repository as the repository (`$TMPDIR/ciclone/saved_models/x` ->
    `saved_models/x`)."""
    if isinstance(value, str):
        return _SCRATCH.sub("DIR", _CLONE.sub("", value))
    if isinstance(value, list):
        return [neutral(v) for v in value]
    if isinstance(value, dict):
        return {k: neutral(v) for k, v in value.items()}
    return value


def traces(line):
    """`["field: text", ...]`: what in a line (a dict) a stranger could not rerun: a scratch or
    temporary directory, a path of the machine that measured it, a checkout beside the
    repository (`../main`), how checkouts were made or run (`worktree`, "one after the
    other"), a comparison of checkouts (a `checkout` field, a `COMPARING` script) whose command
    does not start with the commits compared."""
    found = []

    def walk(key, value):
        if isinstance(value, str):
            found.extend(f"{key}: {m.group(0)!r}" for m in TRACES.finditer(value))
        elif isinstance(value, list):
            for v in value:
                walk(key, v)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(f"{key}.{k}", v)

    for key, value in line.items():
        walk(key, value)
    command = str(line.get("command", ""))
    if ("checkout" in line or any(script in command for script in COMPARING)) and not re.match(
        r"commit [0-9a-f]{7,40}\b", command
    ):
        found.append("command: a comparison of checkouts without the commits compared")
    return found


# A command's flags and the fields of its line that record the same setting. A field holding
# one of several values (`--shapes small,base`, one line per shape) is in the flag's list; a
# field holding a list (`rounds`: one figure per round) has as many items as the flag says.
SETTINGS = {
    "--shapes": ("shapes",),
    "--beam-size": ("beam", "beam_size"),
    "--beams": ("beam_size",),
    "--alphas": ("alpha",),
    "--alpha": ("alpha",),
    "--minutes": ("minutes",),
    "--steps": ("budget_steps",),
    "--rounds": ("rounds",),
    "--runs": ("runs",),
    "--precision": ("precision",),
    "--batch-size": ("batch_size",),
    "--sentences": ("sentences",),
    "--workdir": ("workdir",),
    "--model": ("model",),
    "--average": ("average",),
    "--k": ("k",),
    "--m": ("m",),
    "--seed": ("seed",),
    "--preset": ("preset",),
    "--strategy": ("strategy",),
    "--shortlist-width": ("shortlist_width",),
    "--label": ("label",),
}
_LISTS = {"--shapes", "--beams", "--alphas"}
# Settings a benchmark adds to a line's `overrides` from its own flags (`--train`, `--test`).
_SCRIPT_SETTINGS = {"data.train", "data.test"}
# The peer of a comparison labels its line by its system, not by `--label`.
_PEERS = {"modelgarden"}


def _same(flag, recorded, given):
    if isinstance(recorded, list) and flag in ("--rounds", "--runs"):
        return str(len(recorded)) == given
    if flag == "--shortlist-width":  # the script rounds the width up to a multiple of 64
        return str(recorded) == str(-(-int(given) // 64) * 64)
    if flag in ("--model", "--workdir") and str(recorded).startswith(given.rstrip("/") + "/"):
        return True  # the model's version directory inside the path given
    try:
        return float(recorded) == float(given)
    except (TypeError, ValueError):
        return str(recorded) == given


def disagreements(line, labels=True):
    """`["what differs", ...]`: where a line's command sets something other than the line
    records: a flag of `SETTINGS` against its field, each `--set KEY=VALUE` against the line's
    `overrides` (both ways), a JSON shape argument against its `cfg`. `labels=False` leaves
    `--label` out (`record`: `BENCH_LABEL` names the line, `--label` the run's own files)."""
    command = re.split(r"\s#\s|\s\(", line.get("command", ""))[0]
    try:
        words = shlex.split(command)
    except ValueError as error:
        return [f"the command cannot be read: {error}"]
    found, sets = [], []
    index = 0
    while index < len(words):
        word, value = words[index], None
        if word.startswith("--") and "=" in word:
            word, value = word.split("=", 1)
        elif word.startswith("--") and index + 1 < len(words):
            if not words[index + 1].startswith("--"):
                value = words[index + 1]
                index += 1
        index += 1
        if word == "--set" and value is not None:
            sets.append(value)
        elif word.startswith("{"):
            try:
                shape = json.loads(word)
            except ValueError:
                continue
            cfg = line.get("cfg")
            if isinstance(shape, dict) and isinstance(cfg, dict):
                found += [
                    f"{key}={shape[key]} in the command, {cfg[key]} in cfg"
                    for key in shape
                    if key in cfg and not _same(None, cfg[key], str(shape[key]))
                ]
        elif word in SETTINGS and value is not None:
            if word == "--label" and (not labels or line.get("system") in _PEERS):
                continue
            given = value.split(",") if word in _LISTS else [value]
            for field in SETTINGS[word]:
                recorded = line.get(field)
                if recorded is None:
                    continue
                values = recorded if isinstance(recorded, list) and word in _LISTS else [recorded]
                if not all(any(_same(word, r, g) for g in given) for r in values):
                    found.append(f"{word} {value} in the command, {field} {recorded!r}")
    overrides = line.get("overrides")
    if isinstance(overrides, list):
        for setting in sets:
            if setting not in overrides:
                found.append(f"--set {setting} in the command, not in overrides")
        for setting in overrides:
            if setting not in sets and setting.partition("=")[0] not in _SCRIPT_SETTINGS:
                found.append(f"overrides {setting}, not set by the command")
    return found


def _is_checkout(path):
    return os.path.isfile(os.path.join(path, "benchmarks", "ledger.py"))


def _commit(checkout):
    """The short commit of `checkout`, "plus uncommitted changes" where it has any."""

    def git(*args):
        return subprocess.run(
            ["git", "-C", checkout, *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "a commit not known (not a git checkout)"
    return f"commit {commit}" + (" plus uncommitted changes" if dirty else "")


def compared(argv):
    """`(command, {path: letter})` for a command line run on two or more checkouts of this
    repository (`ab_checkouts.py /tmp/before .`): the checkouts written `A`, `B`, ... and their
    commits first, `commit 1a2b3c4 vs commit 5d6e7f8: python benchmarks/ab_checkouts.py A B`;
    `(None, {})` for any other command."""
    checkouts = [a for a in dict.fromkeys(argv[1:]) if not a.startswith("-") and _is_checkout(a)]
    if len(checkouts) < 2:
        return None, {}
    letters = {path: chr(ord("A") + i) for i, path in enumerate(checkouts)}
    command = shlex.join(["python", *[letters.get(a, a) for a in argv]])
    commits = " vs ".join(_commit(path) for path in checkouts)
    return f"{commits}: {portable(command)}", letters


def record(benchmark, fields, label=None, command=None):
    """Appends `fields` to `benchmark`'s ledger with the date, machine, CPU flags, label and
    command line; a no-op (returns None) when no label is given and `BENCH_LABEL` is unset.
    Raises ValueError for a line a stranger could not rerun (`traces`)."""
    label = label or os.environ.get("BENCH_LABEL")
    if not label:
        return None
    name, flags = cpu_info()
    letters = {}
    if command is None:
        command, letters = compared(sys.argv)
    line = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{name}, {os.cpu_count()} cores",
        "cpu": cpu_generation(),
        "cpu_flags": flags,
        "label": label,
        "command": neutral(portable(command or shlex.join(["python", *sys.argv]))),
    }
    line.update(
        {
            key: letters.get(value, value) if isinstance(value, str) else value
            for key, value in fields.items()
            if key not in line
        }
    )
    line.update({key: neutral(portable(line[key])) for key in fields if key in line})
    found = traces(line) + disagreements(line, labels=False)
    if found:
        raise ValueError(
            f"{benchmark}: a ledger line a stranger could not rerun ({'; '.join(found)}): "
            "pass the command as run from the repository root, scratch directories as DIR, "
            "with the settings the line records"
        )
    os.makedirs(RESULTS, exist_ok=True)
    with open(ledger_path(benchmark), "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    return line


def read(benchmark):
    """The ledger's lines, as dicts, in the order they were appended."""
    with open(ledger_path(benchmark), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def corrections(path=None):
    """`{(benchmark, line number): correction}` from `benchmarks/corrections.yaml`: for lines
    written before `record` wrote commands as they are now, the facts shown in their place
    (`command`; `compared`, the commits behind `A` and `B`; `checkouts`, which `A` or `B` a
    field's text names), each with `why`. The ledger lines themselves are never edited."""
    path = path or CORRECTIONS
    stamp = (path, os.path.getmtime(path))
    if stamp not in _CORRECTIONS:
        _CORRECTIONS.clear()
        _CORRECTIONS[stamp] = _read_corrections(path)
    return _CORRECTIONS[stamp]


_CORRECTIONS = {}


def _read_corrections(path):
    with open(path, encoding="utf-8") as f:
        entries = yaml.safe_load(f) or []
    found = {}
    for entry in entries:
        unknown = set(entry) - {"ledger", "lines", "command", "compared", "checkouts", "why"}
        if unknown or not entry.get("why") or not {"command", "compared"} & set(entry):
            raise ValueError(
                f"corrections.yaml: {entry}: ledger, lines, why, and a command "
                f"or the commits compared ({unknown or 'missing keys'})"
            )
        first, _, last = str(entry["lines"]).partition("-")
        for number in range(int(first), int(last or first) + 1):
            if (entry["ledger"], number) in found:
                raise ValueError(f"corrections.yaml: {entry['ledger']} line {number} twice")
            found[(entry["ledger"], number)] = entry
    return found


def _side(text):
    """How a side of a comparison is shown: a commit as `commit 1a2b3c4`, else its words."""
    return f"commit {text}" if _COMMIT.fullmatch(str(text)) else str(text)


def shown(benchmark, number, row=None, fixes=None):
    """Line `number` (1-based) of `benchmark` as the results page shows it: its measured
    fields as written, its command and paths `neutral`, and where `benchmarks/corrections.yaml`
    has an entry for it, the command it gives and the comparison's commits (`A` and `B`)."""
    row = dict(row if row is not None else read(benchmark)[number - 1])
    fix = (corrections() if fixes is None else fixes).get((benchmark, number))
    if fix:
        command = fix.get("command", row["command"])
        checkouts = {str(k): v for k, v in (fix.get("checkouts") or {}).items()}
        sides = fix.get("compared") or {}
        if checkouts:
            command = shlex.join(checkouts.get(a, a) for a in shlex.split(command))
            for key, value in row.items():
                if key != "command" and isinstance(value, str) and value in checkouts:
                    letter = checkouts[value]
                    row[key] = f"{letter}: {_side(sides.get(letter, letter))}"
        if sides:
            words = " vs ".join(f"{_side(sides[letter])}" for letter in sorted(sides))
            uses = set(shlex.split(command)) & set(sides)
            if not uses:
                words += ", the same command in a checkout of each"
            command = f"{words}: {command}"
        row["command"] = command
    return neutral(row)


def benchmarks():
    """The names of the benchmarks that have a ledger, sorted."""
    return sorted(n[: -len(".jsonl")] for n in os.listdir(RESULTS) if n.endswith(".jsonl"))


def unlabelled_env():
    """This process's environment without `BENCH_LABEL`: for child benchmark processes whose
    lines the parent records itself (`compare.py`, `ab_checkouts.py`)."""
    return {key: value for key, value in os.environ.items() if key != "BENCH_LABEL"}
