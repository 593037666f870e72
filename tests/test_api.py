"""The public Python surface: the lazy top-level names and each sub-package's `__all__` (the
Python API contract of the design notes), nothing more re-exported."""

import importlib
import inspect
import os
import subprocess
import sys

import pytest
from training_helpers import subprocess_env

import keras_transformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The contract: what users import from each sub-package. Internals stay importable from their
# modules; a name added here is a promise (and needs its entry in docs/reference/api/).
PUBLIC = {
    "layers": {
        "scaled_dot_product_attention",
        "MultiHeadAttention",
        "SinusoidalPositionalEncoding",
        "TokenEmbedding",
        "PositionwiseFeedForward",
        "TransformerEncoderBlock",
        "TransformerDecoderBlock",
        "TransformerEncoder",
        "TransformerDecoder",
    },
    "models": {"Transformer", "DecoderOnlyTransformer", "build_transformer"},
    "decoding": {
        "DecodingSettings",
        "greedy_search",
        "beam_search",
        "translate_ids",
        "language_model_step",
    },
    # ExportPlan: what export_saved_model and export_litert take whole (beyond DESIGN.md's list).
    "export": {"Translator", "export_saved_model", "export_ctranslate2", "ExportPlan"},
    "training": {"train", "compile_model"},
    "data": {
        "Tokenizer",
        "read_pairs",
        "get_or_train_tokenizer",
        "make_dataset",
        "encode_sources",
        "prepare",
        "prepared_dataset",
    },
}
TOP_LEVEL = {
    "Transformer": "models",
    "load_config": "config",
    "train": "training",
    "Translator": "export",
    "export_saved_model": "export",
    "greedy_search": "decoding",
    "beam_search": "decoding",
}


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_each_package_exports_exactly_its_public_names(package):
    module = importlib.import_module(f"keras_transformer.{package}")
    assert set(module.__all__) == PUBLIC[package]
    # Nothing else is re-exported: the other public attributes are the package's submodules.
    others = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert others == PUBLIC[package]


def test_the_top_level_names_are_the_sub_packages_own():
    assert set(keras_transformer.__all__) == set(TOP_LEVEL) | {"layers"}
    assert set(keras_transformer.__all__) <= set(dir(keras_transformer))
    for name, package in TOP_LEVEL.items():
        module = importlib.import_module(f"keras_transformer.{package}")
        assert getattr(keras_transformer, name) is getattr(module, name), name
    assert keras_transformer.layers is importlib.import_module("keras_transformer.layers")
    assert keras_transformer.layers.TransformerEncoder.__name__ == "TransformerEncoder"
    with pytest.raises(AttributeError, match="no attribute 'get_strategy'"):
        keras_transformer.get_strategy  # noqa: B018
    namespace = {}
    exec("from keras_transformer import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(keras_transformer.__all__)


def test_import_and_config_errors_do_not_load_tensorflow(tmp_path):
    """`import keras_transformer` is cheap, and `load_config` refuses a bad config before
    TensorFlow loads; the submodules still import as before."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  d_ff: 0\n")
    code = (
        "import sys, keras_transformer as kt\n"
        "from keras_transformer import errors\n"
        "assert 'load_config' in dir(kt) and kt.__version__\n"
        "try:\n"
        f"    kt.load_config({str(bad)!r})\n"
        "except errors.ConfigError as e:\n"
        "    print(e)\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'\n"
        "assert 'keras' not in sys.modules, 'keras was imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "model.d_ff must be in [1, 262144], got 0\n"
