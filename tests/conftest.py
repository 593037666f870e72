"""Test settings: quiet TensorFlow logs, deterministic seeds."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Two malloc arenas per process (the xdist workers and the tests' subprocesses inherit it): with
# one per thread, TensorFlow's freed tensors stay spread over many arenas and a worker's memory
# only grows (see `_free_memory_after_each_module`).
os.environ.setdefault("MALLOC_ARENA_MAX", "2")

import keras  # noqa: E402
import pytest  # noqa: E402

from keras_transformer import fast_paths  # noqa: E402

# ------------------------------------------------------------------ no silent skips in CI
# The tests the `test` extra (setup.py) is installed to run, each of which skips when what it
# needs is missing. Under CI=true (.ci/run sets it) a skip of any of them fails the run
# (tests/_no_silent_skips.py), so a dependency change cannot switch these checks off unnoticed.
# Every `skip`/`importorskip` in tests/ is covered here (tests/test_no_silent_skips.py checks).
MUST_RUN = {
    "tests/test_export_ct2.py": "CTranslate2's greedy, beam, target_prefix and int8 outputs "
    "agree with ours; the whole module skips without `ctranslate2`",
    "tests/test_ct2_vmap.py": "the lexical table as CTranslate2's vmap.txt: CTranslate2 loads "
    "it and decodes only its pieces with use_vmap=True; the whole module skips without "
    "`ctranslate2`",
    "tests/test_glossary.py::test_ctranslate2_reads_the_annotated_text": "CTranslate2 decodes "
    "a glossary-annotated text as translate_glossary does (`ctranslate2`)",
    "tests/test_layers_keras_hub.py": "our layers pass KerasHub's own layer test, imported from "
    "a private path (keras_hub.src.tests.test_case) that a KerasHub release may move or drop",
    "tests/test_backends.py": "the layers and the decoder-only model pass on the JAX backend "
    "(`jax`, `keras_hub`)",
    "tests/test_decoding.py::test_search_runs_on_jax": "beam search runs on the JAX backend",
    "tests/test_top_k.py::test_the_same_on_jax_eager_and_jitted": "the two-pass top-k gives "
    "`ops.top_k`'s answer on the JAX backend, eager and jitted (`jax`)",
    "tests/test_notebook.py": "the quickstart notebook matches its generator and runs top to "
    "bottom (`nbformat`, `nbclient`, `ipykernel`)",
    "tests/test_export.py::test_saved_model_cli_shows_the_serving_signature": "the serving "
    "signature as `saved_model_cli` shows it (the tool ships with tensorflow)",
    "tests/test_export_signatures.py::test_saved_model_cli_lists_all_signatures": "every "
    "signature as `saved_model_cli` lists it (the tool ships with tensorflow)",
    "tests/test_training_precision.py::test_accelerators_decide_without_timing": "the "
    "accelerator precision choice (`importorskip('tensorflow')`, a core dependency)",
    "tests/test_stopping.py::test_sigterm_during_the_ctranslate2_conversion_exits_75_and_the_"
    "same_command_finishes": "SIGTERM during the CTranslate2 conversion (`ctranslate2`)",
    "tests/test_jax_backend.py": "the model, loss, step and search on the JAX backend with "
    "TensorFlow unimportable, and the same numbers on both backends (`jax`)",
    "tests/test_repository.py": "no large file is tracked without a reason, wheels are "
    "ignored; it needs a git checkout (CI runs on a clean clone)",
    "tests/test_litert_shortlist.py": "the LiteRT export's shortlist step: no piece outside "
    "the shortlist, every piece listed answers as without it; the whole module skips without "
    "`ai-edge-litert`",
    "tests/test_litert_projection.py": "the int8 model of a batch's shortlist columns the "
    "LiteRT runtime writes: its logits, its columns, its head; the whole module skips without "
    "`ai-edge-litert`",
    "tests/test_litert_rows.py": "a row's answer is its own in the LiteRT runtime over a "
    "shortlist; the whole module skips without `ai-edge-litert`",
    "tests/test_litert.py": "the LiteRT export answers as the SavedModel, its runtime runs "
    "without TensorFlow, and the CLI uses it; the whole module skips without `ai-edge-litert`",
    "tests/test_results_page.py::test_results_page_is_small": "the results page's own HTML "
    "under its size limit (`markdown`, from the docs extra)",
    "tests/test_results_page.py::test_results_page_and_readme_table_in_a_browser": "the "
    "results page and the README's table read in headless Chromium: every plot loads, no table "
    "is wider than its column, the page under 12,000 px (Debian's `chromium`, which .ci/run "
    "installs, `playwright` from the test extra, and `site/` built by the README's command)",
    "tests/test_workdir_lock.py::test_a_run_in_another_pid_namespace_does_not_take_over_a_live_"
    "lock": "a run in another pid namespace of this host (a container with host networking) "
    "does not take a live lock over; it skips without `unshare` or where `unshare --pid` is not "
    "permitted (CI runs as root)",
}


def pytest_configure(config):
    from _no_silent_skips import NoSilentSkips

    config.pluginmanager.register(NoSilentSkips(MUST_RUN), "no-silent-skips")
    import _tier_times

    _tier_times.register(config)  # with --durations: the time by test file
    if getattr(config.option, "maxworkerrestart", "") is None:  # xdist: recycled workers
        config.option.maxworkerrestart = "1000"
    if not hasattr(config, "workerinput"):  # not an xdist worker: a controller or one process
        _CONTROLLER[:] = [config]
        tolerate_sends_to_a_recycled_worker()
        ignore_the_collection_of_a_worker_sent_home()


def ignore_the_collection_of_a_worker_sent_home():
    """A worker that replaces a recycled one (below) near the end of a run can start while the
    controller shuts down: xdist tells it to shut down at once and never schedules it, but it
    still collects. If another worker is recycled meanwhile, xdist's `worker_errordown` resets
    `shuttingdown`; the first one's collection then reached the scheduler, which asserts it
    knows the worker (`assert node in self.node2pending`) and ended the run with an
    INTERNALERROR. A collection from a worker the scheduler does not hold has no tests to run:
    it is dropped (as xdist drops every collection while it shuts down)."""
    try:
        from xdist.dsession import DSession
    except ImportError:
        return
    collectionfinish = DSession.worker_collectionfinish
    if getattr(collectionfinish, "_ignores_workers_sent_home", False):
        return

    def worker_collectionfinish(self, node, ids):
        if self.sched is not None and node not in self.sched.nodes:
            return  # sent home when it became ready: it runs nothing
        collectionfinish(self, node, ids)

    worker_collectionfinish._ignores_workers_sent_home = True
    DSession.worker_collectionfinish = worker_collectionfinish


def tolerate_sends_to_a_recycled_worker():
    """When a worker leaves (recycled, below), xdist hands its pending tests to the others at
    once; one that has left too, its exit not yet processed, has a closed channel, and the send
    raised `OSError: cannot send (already closed?)` as an INTERNALERROR that ended the run. The
    scheduler records the tests as that worker's before it sends them, so a send that fails
    loses nothing: the worker's own exit, processed next, hands them on again."""
    try:
        from xdist.workermanage import WorkerController
    except ImportError:
        return
    send = WorkerController.send_runtest_some
    if getattr(send, "_tolerates_closed", False):
        return

    def send_runtest_some(self, indices):
        try:
            send(self, indices)
        except OSError:  # its pipe is gone: so is the worker, whose exit event follows
            pass  # (xdist's own `shutdown` treats a closed pipe the same way)

    send_runtest_some._tolerates_closed = True
    WorkerController.send_runtest_some = send_runtest_some


# ------------------------------------------------------------------ workers that do not grow
# TensorFlow keeps what a test process traced and loaded (graphs, functions, kernels) for good:
# an xdist worker that runs half the suite grew to 8 GB. A worker whose resident memory has
# passed WORKER_MEMORY_LIMIT leaves at the start of the next test module, before running
# anything of it; xdist starts a fresh worker in its place (its session fixtures come from
# the shared directory, tests/shared_runs.py) and the test that had not begun is scheduled
# again: it is reported as `rerun` where the worker was replaced, then runs in full. A module
# whose tests each train or export in-process (the write-fault matrix grew a worker to 4.9 GB)
# cannot wait for its end: past WORKER_MEMORY_HARD_LIMIT the worker leaves before its next test,
# wherever it is (its module fixtures are then made again, or read from the shared directory).
WORKER_MEMORY_LIMIT = int(float(os.environ.get("KT_TESTS_WORKER_MEMORY_GB", "2.5")) * 2**30)
WORKER_MEMORY_HARD_LIMIT = int(
    float(os.environ.get("KT_TESTS_WORKER_HARD_MEMORY_GB", WORKER_MEMORY_LIMIT * 1.4 / 2**30))
    * 2**30
)
_last_module = []
_CONTROLLER = []  # the controller's config (pytest_handlecrashitem runs there)


def _resident_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _recycle_mark(config, nodeid):
    """The file a recycled worker leaves for the controller: this test had not begun."""
    import hashlib

    root = config._tmp_path_factory.getbasetemp()
    if hasattr(config, "workerinput"):
        root = root.parent  # the run's directory, the controller's own base
    return root / "recycled" / hashlib.sha1(nodeid.encode("utf-8")).hexdigest()


def _name_the_running_test(nodeid):
    """With KT_TESTS_CURRENT_DIR (set by .ci/run), this worker names the test it runs in a
    file named by its pid: .ci/peak_memory.py puts the run's peak memory down to tests."""
    directory = os.environ.get("KT_TESTS_CURRENT_DIR")
    if not directory or not os.path.isdir(directory):
        return
    path = os.path.join(directory, str(os.getpid()))
    try:
        with open(path + ".tmp", "w") as f:
            f.write(nodeid)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    # An xdist worker of this run (a pytest that a test starts inherits the worker's
    # environment, PYTEST_XDIST_WORKER included, but is no worker).
    if not hasattr(item.config, "workerinput"):
        return None
    _name_the_running_test(item.nodeid)
    module = item.nodeid.split("::")[0]
    boundary = bool(_last_module) and _last_module[-1] != module
    first = not _last_module  # a worker's first test never recycles it: no test runs forever
    _last_module[:] = [module]
    resident = _resident_bytes()
    if (boundary and resident > WORKER_MEMORY_LIMIT) or (
        not first and resident > WORKER_MEMORY_HARD_LIMIT
    ):
        import sys

        mark = _recycle_mark(item.config, item.nodeid)
        mark.parent.mkdir(exist_ok=True)
        mark.touch()
        sys.stderr.write(f"recycling this worker at {_resident_bytes() / 2**30:.1f} GB\n")
        sys.stderr.flush()
        os._exit(0)  # xdist replaces it; `pytest_handlecrashitem` reschedules `item`
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """A worker recycled for its memory (above) left before `crashitem` began: run it on the
    next worker. A real crash fails as before (its report says so)."""
    mark = _recycle_mark(_CONTROLLER[0], crashitem) if _CONTROLLER else None
    if mark is not None and mark.exists():
        mark.unlink()
        sched.mark_test_pending(crashitem)
        report.outcome = "rerun"
        report.longrepr = "its worker was recycled for its memory before the test began"


def pytest_report_teststatus(report, config):
    if report.outcome == "rerun":  # see pytest_handlecrashitem
        return "rerun", "R", ("RERUN", {"yellow": True})
    return None


@pytest.fixture(autouse=True)
def _seed_policy_and_fast_paths():
    keras.utils.set_random_seed(1234)
    policy = keras.config.dtype_policy()
    enabled = fast_paths.enabled_names()
    yield
    keras.config.set_dtype_policy(policy)
    fast_paths.set_fast_paths(enabled)


# ------------------------------------------------------------------ shared trained-model fixtures
# Built once per test process (session scope) and shared by the modules that need them; the
# recipes are in _inference_fixtures.py.


@pytest.fixture(scope="module", autouse=True)
def _free_memory_after_each_module():
    """After each test module, collect garbage and clear TensorFlow's eager kernel cache: an
    xdist worker lives for half the suite and builds hundreds of models of other shapes, and a
    worker grown to 10.7 GB was killed for memory beside a MirroredStrategy subprocess (a 2-core,
    23 GB machine); and return the freed memory to the system (`malloc_trim`). Keras's name
    counters are left alone (`keras.backend.clear_session` would reset them under the session's
    fixtures)."""
    import ctypes
    import gc
    import sys

    yield
    gc.collect()
    if "tensorflow" in sys.modules:
        from tensorflow.python.eager import context

        context.context().clear_kernel_cache()
    try:  # what was freed goes back to the system (glibc keeps freed pages in its arenas)
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@pytest.fixture(scope="session", autouse=True)
def _shared_root(tmp_path_factory, request):
    """What the shared fixtures build once per run, whatever the number of workers
    (tests/shared_runs.py)."""
    import _inference_fixtures as fx
    from _recipes import toy_quickstart_config
    from shared_runs import provide, run_root

    fx.SHARED_ROOT = run_root(tmp_path_factory, request.config)
    # Registered first: no test may train it again, before or after the fixture builds it.
    provide(fx.SHARED_ROOT, "toy_quickstart", toy_quickstart_config())
    return fx.SHARED_ROOT


@pytest.fixture(scope="session", autouse=True)
def _one_load_per_saved_model():
    """Each SavedModel loaded once per worker: `tf.saved_model.load(path)` keeps its graphs in
    the process for good (hundreds of MB for an export with every signature), and the CLI tests
    load the same few exports dozens of times in-process. An export never changes once written
    (it appears whole, under a new version), so a path whose `saved_model.pb` has the same size
    and modification time is the same model; loads with options, and failing loads, are not
    kept."""
    import tensorflow as tf

    load, loaded = tf.saved_model.load, {}

    def cached_load(export_dir, *args, **kwargs):
        if args or kwargs:
            return load(export_dir, *args, **kwargs)
        try:
            info = os.stat(os.path.join(os.fspath(export_dir), "saved_model.pb"))
        except (OSError, TypeError):
            return load(export_dir)
        key = (os.path.realpath(os.fspath(export_dir)), info.st_size, info.st_mtime_ns)
        if key not in loaded:
            loaded[key] = load(export_dir)
        return loaded[key]

    tf.saved_model.load = cached_load
    yield
    tf.saved_model.load = load


@pytest.fixture(scope="session")
def toy_quickstart(_shared_root):
    """A directory in which the README's quickstart ran at toy scale (`tests/_recipes.py`:
    `keras-transformer train --config configs/quickstart.yaml` with `toy_argv`'s settings):
    `workdirs/quickstart/` and `saved_models/quickstart/1/`. Trained once per run; a test that
    changes it copies it first."""
    from _recipes import QUICKSTART, make_bin, run_block, toy_quickstart_config
    from shared_runs import shared_directory

    bin_dir = make_bin(str(_shared_root / "toy_quickstart_bin"))
    return shared_directory(
        _shared_root, "toy_quickstart",
        lambda directory: run_block(QUICKSTART, directory, bin_dir, "the toy_quickstart fixture"),
        provides=toy_quickstart_config(),
    )  # fmt: skip


@pytest.fixture(scope="session")
def toy_spm_path():
    """A SentencePiece model (pad 0, unk 1, bos 2, eos 3) of the toy copy-task vocabulary."""
    import _inference_fixtures as fx

    return fx.spm_model_path()


@pytest.fixture(scope="session")
def toy_spm_bytes(toy_spm_path):
    with open(toy_spm_path, "rb") as f:
        return f.read()


@pytest.fixture(scope="session")
def copy_model():
    """A tiny Transformer trained with `model.fit` to copy its input (a few seconds)."""
    import _inference_fixtures as fx

    return fx.trained_model()


@pytest.fixture(scope="session")
def model(copy_model):
    """`copy_model`, under the name the decoding tests use."""
    return copy_model


@pytest.fixture(scope="session")
def exported_copy_model(copy_model, toy_spm_bytes, _shared_root):
    """`(translator, path of version 1)`: `copy_model` as a `Translator` and exported as the
    SavedModel `saved_models/toy/1` (decoding settings `fx.EXPORT_DECODE`, `fx.EXPORT_DATA`;
    confidence calibrated on `fx.dev_pairs()`)."""
    import _inference_fixtures as fx
    from shared_runs import shared_directory

    from keras_transformer.export import Translator, export_saved_model

    def export(directory):
        export_saved_model(
            copy_model, toy_spm_bytes, fx.export_plan(), str(directory / "saved_models"), "toy",
            dev_pairs=fx.dev_pairs(),
        )  # fmt: skip

    # Exported once per run: every worker reads the same version (tests only read it).
    path = str(shared_directory(_shared_root, "exported_copy_model", export)
               / "saved_models" / "toy" / "1")  # fmt: skip
    decode, data = fx.EXPORT_DECODE, fx.EXPORT_DATA
    translator = Translator(
        copy_model,
        toy_spm_bytes,
        beam_size=decode["beam_size"],
        alpha=decode["alpha"],
        max_extra_length=decode["max_extra_length"],
        max_source_length=data["max_source_length"],
        batch_size=decode["batch_size"],
    )
    return translator, path


@pytest.fixture(scope="module")
def model_base_dir(exported_copy_model):
    """The exported copy model's base path (TF Serving's: the highest version is picked)."""
    import os

    _, path = exported_copy_model
    return os.path.dirname(path)


@pytest.fixture
def run_cli():
    """`run_cli(*argv)` -> `(exit code, stdout, stderr)` of `keras-transformer argv...`, run in
    this process (`training_helpers.cli_in_process`)."""
    from training_helpers import cli_in_process

    return cli_in_process
