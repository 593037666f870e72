"""Loaded at the start of every Python subprocess a test starts (tests put this folder on
PYTHONPATH: `training_helpers.subprocess_env`, `_recipes.run_block`): installs the check of
`shared_runs.check_training` in that process too, without importing anything of ours until the
trainer itself is imported."""

import os
import sys

if os.environ.get("KT_TESTS_PROVIDED_RUNS"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import shared_runs

    shared_runs.install_import_hook()
