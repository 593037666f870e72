"""The manual's shell recipes, run as written at toy scale (tests/test_recipes.py).

A fenced ```` ```bash ```` or ```` ```python ```` block of the README or of a page under docs/
carries an HTML comment on the line before its fence (invisible on GitHub and in the site):

- `<!-- ci:main -->`, `<!-- ci:test -->`: the README's two commands (`.ci/run` runs the second;
  the first is a recipe too);
- `<!-- docs-test: recipe [fresh] [after=quickstart] [files=A,B,...] -->`: a shell or Python
  recipe, run here;
- `<!-- docs-test: run -->`: a Python example, run by tests/test_docs.py;
- `<!-- docs-test: skip REASON -->`: not run, and why (a server, a GPU, a download, hours);
- `<!-- docs-test: tree -->` on a plain block listing files: checked against what the recipes
  above it wrote.

The recipes of a page run in order in one temporary directory, as a reader goes down the page,
so a path one step writes and a later step reads (an export's name, a file) is checked across
blocks. `fresh` starts a new directory (an alternative to the recipe above it, not its next
step); `after=quickstart` starts the directory with the quickstart trained and exported, as the
pages that begin "after the quickstart" assume (a copy of the `toy_quickstart` fixture's, which
ran `QUICKSTART` once per session): a page that trains the quickstart itself (the quickstart
guide, the Python API's `train`; the README's main command always) starts so too, and its
`train` runs as written and finds the run finished; `files=` writes the named corpus files first
(synthetic text: `*.en` the source side, `*.de` the target side, `*.tsv` both; a name with
`dev` or `test` in it takes that split, `mono.*` a monolingual sample). A recipe that is one
`keras-transformer train` which another place of the manual runs alike (the same command on the
same `files=`: the README's own-corpus command is the own-corpus guide's) is trained once per
session (`shared_training`) and copied in the same way: each page's command then runs as
written and finds its run finished.

What is not the reader's: `keras-transformer train` and `prepare` run at toy scale (a
one-layer model of width 32, 8 steps, no time budget, synthetic corpora a few hundred pairs
long where the config's corpus is synthetic): a `--set` of the recipe wins over the toy
defaults (the precision, the XLA switch, the corpora), not over the toy sizes; a Python
recipe's `load_config` adds the same settings to its overrides. `pip install .`
(the checkout is installed already) does nothing. Nothing else is changed: corpus specs, paths,
export names and flags run as written, so a recipe that would download (a `tfds:` corpus) or
read a file no earlier step wrote fails here as it would for the reader.
"""

import glob
import os
import re
import shlex
import stat
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MARKED_BLOCK = re.compile(
    r"(?:<!--(?P<marker>[^\n]*?)-->\n)?```(?P<language>bash|python)\n(?P<code>.*?)```"
    r"|<!--(?P<tree_marker> docs-test: tree )-->\n```\n(?P<tree>.*?)```",
    re.S,
)

# Sizes and lengths a recipe cannot change: seconds per run.
TOY = {
    "model.num_layers": "1",
    "model.d_model": "32",
    "model.num_heads": "2",
    "model.d_ff": "64",
    "data.vocab_size": "200",
    "data.max_source_length": "24",
    "data.max_target_length": "24",
    "data.tokens_per_batch": "384",
    "data.bucket_boundaries": "[12, 24]",
    "data.spm_max_sentences": "2000",
    "train.steps": "8",
    "train.warmup_steps": "4",
    "train.steps_per_epoch": "4",
    "train.checkpoint_every": "2",
    "train.keep_checkpoints": "3",
    "train.max_minutes": "null",
    "train.eval_max_sentences": "6",
    "export.select_max_sentences": "6",
    "export.select_screen_sentences": "6",
}
# Settings a recipe's own `--set` overrides.
TOY_DEFAULTS = {
    "runtime.mixed_precision": "float32",
    "runtime.jit_compile": "false",
    "decode.batch_size": "8",
}
# Where the config's corpus is synthetic (the quickstart's): a few hundred short pairs.
TOY_SYNTHETIC = {
    "data.train": "synthetic:split=train,size=300,max_words=8",
    "data.dev": "synthetic:split=dev,size=6,max_words=8",
    "data.test": "synthetic:split=test,size=6,max_words=8",
}

SHIM = '''#!{python}
"""keras-transformer at toy scale for the recipe runner (tests/_recipes.py)."""
import sys

sys.path.insert(0, {tests!r})
from _recipes import toy_argv  # noqa: E402

from keras_transformer.cli import main  # noqa: E402

sys.exit(main(toy_argv(sys.argv[1:])))
'''

PIP_SHIM = """#!/usr/bin/env bash
# pip for the recipe runner: the checkout (with its extras) is installed already.
case "$*" in
  "install ."|"install .["*|'install ".['*|"install -e ."*) echo "recipe runner: $* (installed)";;
  *) echo "recipe runner: pip $* is not a recipe step it can run" >&2; exit 1;;
esac
"""


def doc_pages():
    """The README and every page of the site (not docs/_incoming/, which the build excludes),
    as absolute paths."""
    pages = glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    pages = [p for p in pages if os.sep + "_incoming" + os.sep not in p]
    return [os.path.join(ROOT, "README.md")] + sorted(pages)


def parse_marker(marker):
    """`(kind, options)` of a block's marker: kind is `ci:main`, `ci:test`, `run`, `recipe`,
    `skip` or None; options is a dict (`fresh`, `after`, `files`, or `reason` for skip)."""
    if marker is None:
        return None, {}
    marker = marker.strip()
    if marker in ("ci:main", "ci:test"):
        return marker, {}
    match = re.fullmatch(r"docs-test: (\w+)(?: (.*))?", marker)
    if not match:
        return None, {}
    kind, rest = match.group(1), (match.group(2) or "").strip()
    if kind == "skip":
        return kind, {"reason": rest}
    options = {}
    for word in rest.split():
        key, _, value = word.partition("=")
        options[key] = value.split(",") if key == "files" else (value or True)
    return kind, options


def marked_blocks(text):
    """`[(line, language, kind, options, code)]` of the bash and python blocks (and the marked
    file trees, language `tree`) of Markdown `text`; `line` is the fence's."""
    found = []
    for m in MARKED_BLOCK.finditer(text):
        if m.group("tree") is not None:
            language, kind, options, code = "tree", "tree", {}, m.group("tree")
            fence = m.start("tree")
        else:
            language, code = m.group("language"), m.group("code")
            kind, options = parse_marker(m.group("marker"))
            fence = m.start("language")
        found.append((text.count("\n", 0, fence - 1) + 1, language, kind, options, code))
    return found


def blocks(path):
    """`marked_blocks` of the page at `path`."""
    with open(path, encoding="utf-8") as f:
        return marked_blocks(f.read())


def tree_paths(listing):
    """`(paths, folders)` of a documented file tree: `paths` every listed path, `folders`
    `{folder: names}` for each folder whose contents are listed under it (indented by two
    spaces per level) and not marked incomplete with `...`. `# comments` are ignored, several
    names on a line are joined by `, `, a folder ends in `/`, and a line at the left margin may
    be a path (`saved_models/quickstart/1/`)."""
    paths, folders, incomplete, stack = [], {}, set(), []
    for raw in listing.splitlines():
        text = raw.split("#")[0].rstrip()
        if not text.strip():
            continue
        depth = (len(text) - len(text.lstrip())) // 2
        stack = stack[:depth]
        parent = "/".join(stack)
        for name in (n.strip() for n in text.strip().split(",")):
            if name == "...":
                incomplete.add(parent)
                continue
            paths.append(f"{parent}/{name}" if parent else name)
            if parent:
                folders.setdefault(parent, set()).add(name.rstrip("/"))
        if text.strip().endswith("/"):
            stack.append(text.strip().rstrip("/"))
    return paths, {f: names for f, names in folders.items() if f not in incomplete}


def check_tree(listing, directory, where):
    """Every listed path exists, and a folder whose contents are listed holds nothing else."""
    paths, folders = tree_paths(listing)
    problems = [f"{p} is listed but was not written" for p in paths
                if not os.path.exists(os.path.join(str(directory), p))]  # fmt: skip
    for folder, names in folders.items():
        here = os.path.join(str(directory), folder)
        extra = sorted(set(os.listdir(here)) - names) if os.path.isdir(here) else []
        if extra:
            problems.append(f"{folder}/ also holds {extra}: list them (or `...`)")
    assert not problems, f"the file tree at {where}:\n" + "\n".join(problems)


def _set_keys(argv):
    keys = set()
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--set" and i + 1 < len(argv) else None
        if arg.startswith("--set="):
            value = arg[len("--set=") :]
        if value:
            keys.add(value.split("=", 1)[0].strip())
    return keys


def _config_corpus(argv):
    """The config's `data.train` (as written in its file), or None."""
    from keras_transformer.config import load_config

    if "--config" not in argv:
        return None
    try:
        return load_config(argv[argv.index("--config") + 1]).data.train
    except Exception:  # the CLI itself reports a bad config
        return None


def toy_argv(argv):
    """The command line the shim runs: `train`/`prepare` at toy scale, the rest as written."""
    if not argv or argv[0] not in ("train", "prepare"):
        return argv
    own = _set_keys(argv)
    extra = [(k, v) for k, v in TOY_DEFAULTS.items() if k not in own]
    corpus = _config_corpus(argv)
    if isinstance(corpus, str) and corpus.startswith("synthetic:"):
        extra += [(k, v) for k, v in TOY_SYNTHETIC.items() if k not in own]
    extra += list(TOY.items())
    return argv + [a for k, v in extra for a in ("--set", f"{k}={v}")]


def toy_overrides(path, overrides):
    """`load_config`'s overrides at toy scale, as `toy_argv` gives `train` (Python recipes)."""
    argv = ["train", "--config", str(path)]
    for override in overrides or []:
        argv += ["--set", override]
    out = toy_argv(argv)
    return [out[i + 1] for i in range(3, len(out), 2)]


def toy_python():
    """Makes `keras_transformer.config.load_config` load at toy scale (a Python recipe's
    first line): `load_config(path, overrides)` as written, then the toy settings."""
    import keras_transformer.config as config

    load = config.load_config

    def load_config(path, overrides=None, **kwargs):
        return load(path, overrides=toy_overrides(path, overrides), **kwargs)

    load_config.__doc__ = load.__doc__
    config.load_config = load_config


PYTHON_PREAMBLE = (
    "import sys; sys.path.insert(0, {tests!r}); import _recipes; _recipes.toy_python()\n"
)


def _split(name):
    return "dev" if "dev" in name else "test" if "test" in name else "train"


def write_files(directory, names):
    """The corpus files a recipe names, from the synthetic corpus."""
    from keras_transformer.data import read_pairs

    for name in names:
        split = _split(os.path.basename(name))
        size = {"train": 300, "dev": 6, "test": 6}[split]
        if os.path.basename(name).startswith("mono."):
            split, size = "test", 24
        pairs = read_pairs(f"synthetic:split={split},size={size},max_words=8", verbose=False)
        if name.endswith(".tsv"):
            lines = [f"{s}\t{t}" for s, t in pairs]
        elif name.endswith(".en"):
            lines = [s for s, _ in pairs]
        elif name.endswith(".de"):
            lines = [t for _, t in pairs]
        else:
            raise ValueError(f"files={name}: the runner writes *.en, *.de and *.tsv files")
        path = os.path.join(directory, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))


def make_bin(directory):
    """A directory to put first on PATH: the toy `keras-transformer` and a no-op `pip`."""
    os.makedirs(directory, exist_ok=True)
    shim = SHIM.format(python=sys.executable, tests=os.path.join(ROOT, "tests"))
    for name, text in (("keras-transformer", shim), ("pip", PIP_SHIM)):
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return directory


def run_block(code, cwd, bin_dir, where, timeout=600, language="bash"):
    """Runs one recipe with bash (-e -u -o pipefail), or a Python recipe (several blocks of a
    page joined, as a reader runs them in one session) with this interpreter at toy scale; a
    failure names the page and line."""
    if language == "python":
        script = os.path.join(str(cwd), "recipe.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(PYTHON_PREAMBLE.format(tests=os.path.join(ROOT, "tests")) + code)
        code = f"python {shlex.quote(script)}"
    env = dict(os.environ)
    env.pop("KERAS_BACKEND", None)
    # A recipe that reaches for a TFDS corpus fails (nothing downloads in tests) without
    # leaving a partial dataset in the user's ~/tensorflow_datasets.
    env["TFDS_DATA_DIR"] = os.path.join(str(cwd), "tensorflow_datasets")
    # The toy commands first; the recipe's own `python` is this interpreter's.
    path = [bin_dir, os.path.dirname(sys.executable), env["PATH"]]
    env["PATH"] = os.pathsep.join(path)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(
            f"the recipe at {where} exited {result.returncode}:\n"
            + textwrap.indent(code, "  $ ")
            + "\n--- output (last 3000 characters) ---\n"
            + (result.stdout + result.stderr)[-3000:]
        )
    return result.stdout


QUICKSTART = "keras-transformer train --config configs/quickstart.yaml"


def toy_quickstart_config():
    """The config `QUICKSTART` trains at toy scale (what the `toy_quickstart` fixture runs)."""
    from keras_transformer.config import load_config

    path = os.path.join(ROOT, "configs", "quickstart.yaml")
    return load_config(path, overrides=toy_overrides(path, []))


def lone_train(code):
    """The words after `keras-transformer` when the recipe `code` is one `keras-transformer
    train` command and nothing else (continuation lines and comments aside), else None."""
    lines = [line for line in code.replace("\\\n", " ").splitlines() if line.strip()]
    lines = [line for line in lines if not line.lstrip().startswith("#")]
    if len(lines) != 1 or any(c in lines[0] for c in ";&|<>`$("):
        return None
    words = shell_words(lines[0])
    if words[:2] != ["keras-transformer", "train"] or words.count("keras-transformer") != 1:
        return None
    return words[1:]


def train_config(argv, cwd):
    """The config `keras-transformer train` (`argv`: its words after the program name) runs at
    toy scale in `cwd`, as the shim resolves it."""
    from keras_transformer.cli import build_parser
    from keras_transformer.commands.train import load_command_config

    here = os.getcwd()
    os.chdir(cwd)
    try:
        return load_command_config(build_parser().parse_args(toy_argv(argv)))
    finally:
        os.chdir(here)


def shared_training(root, code, files, where):
    """A directory in which the recipe `code` (one `keras-transformer train`, that two places
    of the manual run alike from the same corpus `files`) ran at toy scale: built once per test
    run (`shared_runs.shared_directory`, which registers its run: trained again from scratch
    elsewhere, it fails), like `toy_quickstart`. `where`: the place that asked first."""
    import hashlib

    from shared_runs import shared_directory

    key = hashlib.sha256(repr((code, list(files))).encode("utf-8")).hexdigest()[:12]
    name = f"recipe_train_{key}"
    config = train_config(lone_train(code), root)
    bin_dir = make_bin(os.path.join(str(root), f"{name}_bin"))

    def build(directory):
        write_files(str(directory), files)
        run_block(code, directory, bin_dir, f"{where} (trained once per run, shared)")

    return shared_directory(root, name, build, provides=config)


def shell_words(code):
    """The words of a recipe's commands (for checks on what it runs)."""
    return shlex.split(code.replace("\\\n", " "), comments=True)
