"""The repository itself: what `git ls-files` tracks stays small. A wheel, a model or a data set
committed by accident (19 MB of wheels once sat at the root) makes every clone pay for it
forever; a file over `MAX_BYTES` must be on `LARGE_FILES` with the reason it belongs here."""

import fnmatch
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_BYTES = 1 << 20

# Paths (fnmatch patterns) that may grow past MAX_BYTES, each with its reason.
LARGE_FILES = {
    "benchmarks/results/*.jsonl": "the append-only ledgers: lines are never edited or deleted "
    "(CONTRIBUTING.md, Where results go), so they only grow",
    "docs/results.md": "generated from the ledgers (benchmarks/results_page.py): grows with them",
}


def _git(*arguments):
    """`git arguments...`'s completed process, run in the checkout."""
    if not os.path.exists(os.path.join(ROOT, ".git")):  # a directory, or a worktree's file
        pytest.skip("not a git checkout (an unpacked sdist): nothing is tracked")
    return subprocess.run(["git", *arguments], cwd=ROOT, capture_output=True)


def _tracked_files():
    done = _git("ls-files", "-z")
    assert done.returncode == 0, done.stderr
    return [name for name in done.stdout.decode("utf-8").split("\0") if name]


def test_no_large_file_is_tracked_without_a_reason():
    large = {}
    for name in _tracked_files():
        path = os.path.join(ROOT, name)
        if os.path.isfile(path) and os.path.getsize(path) > MAX_BYTES:
            large[name] = os.path.getsize(path)
    unexplained = {
        name: size
        for name, size in large.items()
        if not any(fnmatch.fnmatch(name, pattern) for pattern in LARGE_FILES)
    }
    assert not unexplained, (
        f"tracked files over {MAX_BYTES} bytes with no reason in LARGE_FILES (remove them with "
        f"`git rm --cached`, or add a pattern and why it belongs in the repository): {unexplained}"
    )


def test_build_outputs_are_ignored():
    """A wheel or a build directory left in the checkout is not offered to `git add`."""
    names = ["numpy-2.4.6-cp311-cp311-manylinux2014_x86_64.whl", "dist/x.tar.gz", "build/lib/x.py"]
    done = _git("check-ignore", "--no-index", *names)
    assert done.stdout.decode().split() == names, done.stdout
