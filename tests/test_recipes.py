"""The manual's recipes run as written (at toy scale): every shell block of the README and the
guides is run here or says why not, and every Python block is run (tests/test_docs.py) or says
why not. The markers and what the runner changes: tests/_recipes.py."""

import os

import pytest
from _recipes import (
    QUICKSTART,
    ROOT,
    blocks,
    check_tree,
    doc_pages,
    lone_train,
    make_bin,
    run_block,
    shared_training,
    shell_words,
    tree_paths,
    write_files,
)

PAGES = [os.path.relpath(page, ROOT) for page in doc_pages()]
KINDS = {
    "bash": ("ci:main", "ci:test", "recipe", "skip"),
    "python": ("run", "recipe", "skip"),
    "tree": ("tree",),
}


def _recipe_pages():
    return [
        page
        for page in PAGES
        if any(b[2] in ("recipe", "ci:main") for b in blocks(os.path.join(ROOT, page)))
    ]


def _shared_trainings():
    """`{(code, files): places}` of the recipes that are one `keras-transformer train` which
    several places of the manual run alike (the same command on the same corpus files): the
    README's own-corpus command is the own-corpus guide's first. Each is trained once per run
    (`_recipes.shared_training`)."""
    places = {}
    for page in PAGES:
        for line, language, kind, options, code in blocks(os.path.join(ROOT, page)):
            if kind == "recipe" and language == "bash" and lone_train(code):
                key = (code, tuple(options.get("files", [])))
                places.setdefault(key, []).append(f"{page}:{line}")
    return {key: where for key, where in places.items() if len(where) > 1}


SHARED_TRAININGS = _shared_trainings()


def test_every_block_is_run_or_says_why_not():
    unmarked = []
    for page in PAGES:
        for line, language, kind, options, _ in blocks(os.path.join(ROOT, page)):
            if kind not in KINDS[language]:
                unmarked.append(f"{page}:{line} ({language}, marker {kind})")
            elif kind == "skip" and len(options["reason"]) < 15:
                unmarked.append(f"{page}:{line}: a skip says why in a few words")
    assert not unmarked, "blocks without a docs-test marker:\n" + "\n".join(unmarked)


def test_the_recipes_cover_the_multi_step_work():
    """What the issue asked to run: the README's main job, the quickstart, the back-translation
    recipe (train, export, translate the file the next step reads), the own-corpus, serving,
    precision and JAX pages."""
    recipes = {
        page: [code for _, _, kind, _, code in blocks(os.path.join(ROOT, page)) if kind == "recipe"]
        for page in PAGES
    }
    assert {
        "README.md",
        "docs/guides/quickstart.md",
        "docs/guides/after-the-first-model.md",
        "docs/guides/own-corpus.md",
        "docs/guides/export-serving.md",
        "docs/guides/precision-xla.md",
        "docs/guides/jax.md",
    } <= {page for page, codes in recipes.items() if codes}
    after = recipes["docs/guides/after-the-first-model.md"]
    back_translation = [code for code in after if "mono.en" in code]
    assert back_translation, "the back-translation recipe is run"
    words = shell_words(back_translation[0])
    assert words.count("keras-transformer") == 4


def test_toy_argv_keeps_the_recipes_settings_and_forces_toy_sizes():
    from _recipes import toy_argv

    argv = ["train", "--config", "configs/small.yaml", "--set", "runtime.mixed_precision=bfloat16"]
    argv += ["--set", "model.d_model=512", "--set", "data.train=text:a.en,a.de"]
    out = toy_argv(argv)
    assert out[: len(argv)] == argv
    extra = dict(out[i + 1].split("=", 1) for i in range(len(argv), len(out), 2))
    assert "runtime.mixed_precision" not in extra  # the recipe's own
    assert extra["model.d_model"] == "32"  # after the recipe's: the toy size wins
    assert "data.train" not in extra  # small.yaml's corpus is not synthetic: untouched
    quick = toy_argv(QUICKSTART.split()[1:])
    assert "data.train=synthetic:split=train,size=300,max_words=8" in quick
    assert toy_argv(["export", "--workdir", "w"]) == ["export", "--workdir", "w"]


# Why a page's recipes take over a minute (the scenario tier's limit, tests/_tier_times.py): what
# they run as written, each `keras-transformer` command a fresh process that starts TensorFlow.
SLOW = {
    "README.md": "the main command's translate, the own-corpus training (trained here when this "
    "page comes before the own-corpus guide, which shares it) and the CTranslate2 and LiteRT "
    "exports",
    "docs/guides/after-the-first-model.md": "back-translation as written: three toy trainings "
    "(each choosing on dev and exporting), the reverse model's sampling export (choosing on dev "
    "again) and its translation",
    "docs/guides/export-serving.md": "three SavedModel exports of the quickstart, each tracing "
    "every signature, and five more commands that each start TensorFlow",
    "docs/guides/jax.md": "trains the toy quickstart on JAX twice (the second after `prepare` in "
    "a fresh directory), exports it on TensorFlow and translates",
    "docs/guides/own-corpus.md": "two toy trainings: the TSV one, and the text-file one (shared "
    "with the README: trained here when this page comes first)",
    "docs/guides/python-api.md": "the guide's Python as written, at toy scale in a process of its "
    "own: a `train` with its dev-set choice and export, a model fitted by hand twice (raw and "
    "prepared data), its translations and its export",
    "docs/guides/quickstart.md": "eight `keras-transformer` commands, each starting TensorFlow, "
    "two of them decoding the guide's 200 test sentences (evaluate, score)",
}


def _recipe_params():
    """The pages, each with its `scenario` marker (and its reason to be slow, `SLOW`): on the
    parameter, as the tier check reads the item's closest marker."""
    params = []
    for page in _recipe_pages():
        marker = pytest.mark.scenario(slow=SLOW[page]) if page in SLOW else pytest.mark.scenario
        params.append(pytest.param(page, marks=marker))
    return params


@pytest.mark.parametrize("page", _recipe_params())
def test_recipes_run_as_written(page, tmp_path, request):
    """Every recipe of `page` runs as written, in order. The quickstart's training
    (`QUICKSTART`) is the run `toy_quickstart` provides: that fixture runs the same command
    through the same toy `keras-transformer` once per session, and a directory marked
    `after=quickstart` (and the README's main command, which begins with that training)
    starts as a copy of the fixture's. The page's `train` of the quickstart then runs as
    written and finds its run finished, as a reader's second run of the command does; what the
    training wrote (the file trees, the exports) is checked as before. A page that trains the
    quickstart again from scratch fails (`shared_runs.check_training`). A `train` recipe that
    several pages run alike (`SHARED_TRAININGS`) is trained once per run as well
    (`_recipes.shared_training`) and copied in before it runs as written."""
    import shutil

    bin_dir = make_bin(str(tmp_path / "bin"))
    directory, ran, python = None, 0, []

    def flush():
        # Consecutive Python recipes run as one script: a reader's one session.
        if python:
            code = "".join(block for _, block in python)
            run_block(code, directory, bin_dir, f"{page}:{python[0][0]}", language="python")
            python.clear()

    for line, language, kind, options, code in blocks(os.path.join(ROOT, page)):
        if kind == "tree":
            flush()
            check_tree(code, directory, f"{page}:{line}")
            continue
        if kind not in ("recipe", "ci:main"):
            continue
        if language == "bash":
            flush()
        if directory is None or options.get("fresh"):
            directory = tmp_path / f"user{line}"
            directory.mkdir()
            if options.get("after") == "quickstart" or kind == "ci:main":
                # Trained once per run, copied here. The README's main command trains the
                # quickstart first: test_docs checks that it begins so, and here it must.
                assert kind != "ci:main" or QUICKSTART in code, (page, line, code)
                shutil.copytree(request.getfixturevalue("toy_quickstart"), directory,
                                dirs_exist_ok=True)  # fmt: skip
        files = options.get("files", [])
        shared = SHARED_TRAININGS.get((code, tuple(files))) if language == "bash" else None
        if shared:
            # Trained once per run, copied in: the command then runs as written and finds its
            # run finished. Nothing the page wrote before is replaced (else it would not be the
            # same run).
            trained = shared_training(request.getfixturevalue("_shared_root"), code, files,
                                      shared[0])  # fmt: skip
            for base, _, names in os.walk(trained):
                for name in names:
                    rel = os.path.relpath(os.path.join(base, name), trained)
                    assert rel in files or not (directory / rel).exists(), (page, line, rel)
            shutil.copytree(trained, directory, dirs_exist_ok=True)
        write_files(str(directory), files)
        if language == "python":
            python.append((line, code))
        else:
            run_block(code, directory, bin_dir, f"{page}:{line}")
        ran += 1
    flush()
    assert ran


def test_file_trees_are_read_as_a_reader_reads_them(tmp_path):
    listing = (
        "workdirs/run/\n"
        "  config.yaml          # a comment\n"
        "  spm.model, spm.vocab\n"
        "  logs/\n"
        "    ...\n"
        "saved_models/run/1/   # the model\n"
    )
    paths, folders = tree_paths(listing)
    assert paths == [
        "workdirs/run/",
        "workdirs/run/config.yaml",
        "workdirs/run/spm.model",
        "workdirs/run/spm.vocab",
        "workdirs/run/logs/",
        "saved_models/run/1/",
    ]
    assert folders == {"workdirs/run": {"config.yaml", "spm.model", "spm.vocab", "logs"}}
    for path in ("workdirs/run/logs/x", "saved_models/run/1"):
        (tmp_path / path).mkdir(parents=True)
    for name in ("config.yaml", "spm.model"):
        (tmp_path / "workdirs/run" / name).write_text("")
    with pytest.raises(AssertionError, match="spm.vocab is listed but was not written"):
        check_tree(listing, tmp_path, "here")
    (tmp_path / "workdirs/run/spm.vocab").write_text("")
    check_tree(listing, tmp_path, "here")  # logs/ is marked incomplete: x is fine
    (tmp_path / "workdirs/run/lock.json").write_text("")
    with pytest.raises(AssertionError, match=r"also holds \['lock.json'\]"):
        check_tree(listing, tmp_path, "here")
