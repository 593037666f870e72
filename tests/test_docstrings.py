"""The `>>>` examples in the docstrings run and print what they show (other examples are
```python blocks: illustrations that need a trained model or a workdir)."""

import doctest
import importlib

import pytest

MODULES = [
    "keras_transformer.config",
    "keras_transformer.layers.attention",
    "keras_transformer.layers.embedding",
    "keras_transformer.layers.encoder",
    "keras_transformer.layers.decoder",
    "keras_transformer.layers.feed_forward",
    "keras_transformer.layers.normalization",
    "keras_transformer.data.corpora",
    "keras_transformer.data.pipeline",
    "keras_transformer.data.synthetic",
    "keras_transformer.workdir",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.attempted > 0, f"{name} has no >>> example"
    assert result.failed == 0
