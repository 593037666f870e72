"""keras-transformer: the Transformer of "Attention Is All You Need" for TensorFlow/Keras 3.

The names users call, importable from the package itself; each is loaded on first use
(PEP 562), so `import keras_transformer` and `keras_transformer.load_config(...)` do not start
TensorFlow: a config mistake fails before it loads.

Example:
```python
import keras_transformer as kt

config = kt.load_config("configs/quickstart.yaml", overrides=["train.steps=300"])
result = kt.train(config)  # trains, evaluates, exports; the dict of WORKDIR/result.json
model = kt.Transformer.from_preset("transformer_base", vocab_size=37000)
encoder = kt.layers.TransformerEncoder(num_layers=2, num_heads=4, d_ff=128)
```
"""

import importlib

# The one place the version is written (setup.py reads it), and the distribution that installs
# this package: `keras-transformer` on PyPI is an unrelated project with the same import name.
__version__ = "0.2.0"
__distribution__ = "keras-nmt-transformer"

# Public name -> the module that defines it (the sub-package that re-exports it).
_EXPORTS = {
    "Transformer": "keras_transformer.models",
    "load_config": "keras_transformer.config",
    "train": "keras_transformer.training",
    "Translator": "keras_transformer.export",
    "export_saved_model": "keras_transformer.export",
    "greedy_search": "keras_transformer.decoding",
    "beam_search": "keras_transformer.decoding",
}
_SUBMODULES = ("layers",)

__all__ = [*_EXPORTS, *_SUBMODULES]


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted({*globals(), *__all__})
