"""Test settings: quiet TensorFlow logs, deterministic seeds."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402

from keras_transformer import fast_paths  # noqa: E402


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
def exported_copy_model(copy_model, toy_spm_bytes, tmp_path_factory):
    """`(translator, path of version 1)`: `copy_model` as a `Translator` and exported as the
    SavedModel `saved_models/toy/1` (decoding settings `fx.EXPORT_DECODE`, `fx.EXPORT_DATA`;
    confidence calibrated on `fx.dev_pairs()`)."""
    import _inference_fixtures as fx

    from keras_transformer.export import Translator, export_saved_model

    base = str(tmp_path_factory.mktemp("exported") / "saved_models")
    path = export_saved_model(
        copy_model, toy_spm_bytes, fx.EXPORT_DECODE, fx.EXPORT_DATA, base, "toy",
        dev_pairs=fx.dev_pairs(),
    )  # fmt: skip
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
def run_cli(capsys):
    """`run_cli(*argv)` -> `(exit code, stdout, stderr)` of `keras-transformer argv...`, run in
    this process."""
    from keras_transformer import cli

    def run(*argv):
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run
