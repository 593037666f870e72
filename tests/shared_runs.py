"""Things built once per test run and shared by every pytest-xdist worker: a trained workdir, its
exports.

`shared_directory(run_root(tmp_path_factory, config), name, build)` returns a directory that
`build(path)` filled. The first worker to ask builds it (under an exclusive `flock`); the
others wait on the lock and then read it. Tests only read what it returns: a test that changes
a shared run copies it first (`shutil.copytree`).

The runs a shared fixture provides are registered (`provide`): a test that trains one of them
again from scratch, uninterrupted, fails and names the fixture to use instead. The check wraps
the trainer (`check_training`) in the test process and, through `tests/guard/sitecustomize.py`,
in every Python subprocess the tests start.
"""

import fcntl
import hashlib
import importlib.abc
import json
import os
import pathlib
import shutil
import sys
import time


def run_root(factory, config):
    """The directory every worker of this pytest run shares (`pytest-N/`, the parent of the
    workers' own `popen-gwK/` under xdist; the run's own base directory without xdist). An
    xdist worker is told by its `config.workerinput`, not by the environment, which a pytest
    started by a test inherits."""
    base = factory.getbasetemp()
    if hasattr(config, "workerinput"):
        base = base.parent
    root = base / "shared"
    root.mkdir(exist_ok=True)
    return root


def shared_directory(root, name, build, provides=None):
    """`root/name`, built by `build(path)` once per test run whatever the number of workers
    (`root`: `run_root(tmp_path_factory, config)`).

    It is built in place (a trained workdir records its own path) and marked complete by a file
    beside it: one left incomplete by a failed build is built again. `provides`: the config of
    the run it trains, which no test may then train again (`provide`)."""
    root = pathlib.Path(root)
    if provides is not None:
        provide(root, name, provides)
    target, done = root / name, root / f"{name}.complete"
    with open(root / f"{name}.lock", "w") as lock:
        asked = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not done.exists():
                shutil.rmtree(target, ignore_errors=True)
                target.mkdir()
                with training_allowed():
                    build(target)
                done.touch()
            else:
                _record_wait(root, name, time.monotonic() - asked)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target


def _record_wait(root, name, seconds):
    """A wait of over a second for a directory another worker was building, appended to
    `root/waits.jsonl` (one line, one `write`): the tier's summary sums them
    (tests/_tier_times.py), since a worker that waits runs no test."""
    if seconds < 1.0:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    line = json.dumps({"name": name, "seconds": round(seconds, 1), "test": test})
    try:
        with open(pathlib.Path(root) / "waits.jsonl", "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError:
        pass


# ------------------------------------------------------------------ runs trained once, not again

PROVIDED = "KT_TESTS_PROVIDED_RUNS"  # the registry file: {fingerprint: fixture name}
BUILDING = "KT_TESTS_BUILDING_SHARED"  # set while a shared fixture builds (it may train)
VOLATILE = {("runtime", "workdir"), ("export", "base_dir"), ("export", "name")}


def fingerprint(config):
    """What makes two runs the same run: the config without where it writes, and the Keras
    backend that trains it (the same config trained on JAX is another run: the fixtures train
    on TensorFlow)."""
    import keras

    values = config.to_dict()
    for section, key in VOLATILE:
        values.get(section, {}).pop(key, None)
    values["keras_backend"] = keras.backend.backend()
    text = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def provide(root, name, config):
    """Registers `config`'s run as provided by the shared fixture `name` (for this process and
    every subprocess the tests start; the registry is the run's, shared by the workers) and
    installs the check in this process."""
    path = os.path.join(str(root), "provided.json")
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        provided = {}
        if os.path.exists(path):
            with open(path) as f:
                provided = json.load(f)
        provided[fingerprint(config)] = name
        with open(path + ".tmp", "w") as f:
            json.dump(provided, f)
        os.replace(path + ".tmp", path)
        fcntl.flock(lock, fcntl.LOCK_UN)
    os.environ[PROVIDED] = path
    guard = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guard")
    if guard not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join([guard, os.environ.get("PYTHONPATH", "")])
    install_import_hook()


class training_allowed:
    """`with training_allowed():` a shared fixture trains the runs it provides
    (`shared_directory`)."""

    def __enter__(self):
        self.before = os.environ.get(BUILDING)
        os.environ[BUILDING] = "1"

    def __exit__(self, *exc):
        if self.before is None:
            os.environ.pop(BUILDING, None)
        else:
            os.environ[BUILDING] = self.before


def check_training(config, layout):
    """Raises when `config` is a run a shared fixture provides, trained from scratch (no
    state in its workdir yet) and uninterrupted, outside that fixture."""
    path = os.environ.get(PROVIDED)
    if not path or os.environ.get(BUILDING) or os.environ.get("KERAS_TRANSFORMER_SIGTERM_AT"):
        return
    if os.path.exists(layout.checkpoints) or os.path.exists(layout.backup):
        return  # a resume: what a scenario test exercises
    with open(path) as f:
        provided = json.load(f)
    name = provided.get(fingerprint(config))
    if name:
        raise AssertionError(
            f"this test trains the run that the shared fixture `{name}` provides "
            f"(tests/conftest.py): use the fixture (copy its workdir to change it)"
        )


def _wrap(trainer):
    if getattr(trainer._train, "_checked", False):
        return
    original = trainer._train

    def _train(config):
        from keras_transformer.workdir import Workdir

        check_training(config, Workdir.of(config))
        return original(config)

    _train._checked = True
    trainer._train = _train


class _AfterImport(importlib.abc.MetaPathFinder):
    """Wraps the trainer once `keras_transformer.training.run.outline` is imported."""

    NAME = "keras_transformer.training.run.outline"

    def find_spec(self, name, path, target=None):
        if name != self.NAME:
            return None
        sys.meta_path.remove(self)
        try:
            import importlib.util

            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            _wrap(module)

        loader.exec_module = exec_and_wrap
        return spec


def install_import_hook():
    """The check, on the trainer of this process: now if it is imported, else when it is."""
    module = sys.modules.get(_AfterImport.NAME)
    if module is not None:
        _wrap(module)
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
