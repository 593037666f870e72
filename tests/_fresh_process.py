"""Runs a script in a fresh Python process that imports only `tensorflow` and `tensorflow_text`
(our package is made unimportable), as TF Serving or any other user of the SavedModel would:
the tests of the exported signatures call `run_fresh(script, *args)` and read its last stdout
line as JSON."""

import json
import os
import subprocess
import sys

# Our package may be installed (CI installs it): make it unimportable so that loading the
# SavedModel proves it needs none of our code. tensorflow_text itself imports keras; our package
# must never be needed (a load that tried to import it fails).
PRELUDE = r"""
import importlib.abc, json, sys


class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "keras_transformer":
            raise ImportError("keras_transformer is blocked in this process")
        return None


sys.meta_path.insert(0, _Block())
import tensorflow as tf
import tensorflow_text  # noqa: F401
"""


def latin1(texts):
    """Strings or bytes -> JSON-safe strings that the script turns back into the same bytes
    (`s.encode("latin-1")`): invalid UTF-8 survives the trip."""
    raw = [t if isinstance(t, bytes) else t.encode("utf-8") for t in texts]
    return json.dumps([r.decode("latin-1") for r in raw])


def run_fresh(script, *args, cwd=None, timeout=300, env=None):
    """Runs `PRELUDE + script` with `args` as `sys.argv[1:]` in a fresh process (no
    PYTHONPATH; `env`: more variables); asserts it succeeded and returns its last stdout line
    parsed as JSON."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    env.pop("PYTHONPATH", None)  # our package must not be needed (the script blocks it too)
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + script, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
