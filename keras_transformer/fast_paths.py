"""The fast paths: the setting that chooses them, and the `Kernels` a model is built with.

The layers and the loss read as the paper's formulas; where a measurably faster computation of
the same numbers exists, their code has one dispatch line that asks the private kernel modules
(`layers/_fast_paths.py`, `training/recipe/_fast_paths.py`) for it, passing the `Kernels` the
layer (or loss, optimizer, search, export) was built with. Those kernels run only where they
apply (most are TensorFlow-only and step aside under XLA or on other backends) and only when chosen.
`tests/test_fast_paths.py` proves every one equal to its plain form, and
`docs/guides/performance.md` has the measurements that made each one the default.

- `fused_projections`: query/key/value (or key/value) projections as one matmul over the
  concatenated kernels.
- `scatter_cache_writes`: a decoding step's keys/values scattered into the cache instead of
  written with `slice_update`.
- `inplace_cache_writes`: the search's own caches (`layers.attention.OwnedCache`, made by
  `translate_ids`), in TF graphs outside XLA, written into the cache's own buffer.
- `fused_layer_norm`: LayerNormalization with a hand-written TensorFlow gradient.
- `fused_loss`: label-smoothed cross-entropy with its gradient formed in the forward pass (TF).
- `fused_adam`: Adam's update as TensorFlow's one-kernel `ResourceApplyAdam`.
- `tracked_token_scores`: the exported `Translator`'s per-token scores (`token_scores`, the
  confidence) tracked with the hypotheses during the search instead of a second, forced-decoding
  pass over the model.
- `shared_beam_caches`: beam search's decoding caches held once per input for all its beams
  (`decoding.beam_cache.BeamCache`), each beam attending to its own positions through a mask: no
  cache is repeated per beam or reordered with the beams at every step.
- `projection_gradients`: in training, a Dense projection's input gradient `g @ kernel^T`
  computed as an einsum (oneDNN runs the transposed-operand matmul of TensorFlow's own MatMul
  gradient up to a quarter slower), with the forward matmul, bias and ReLU left for TensorFlow
  to fuse into one oneDNN kernel.
- `flat_dense`: outside training, in TF graphs outside XLA, a Dense layer's (or the output
  projection's) product over a `[batch, length, d]` input as one 2-D matmul that TensorFlow
  fuses with its bias and ReLU, instead of Keras's `tensordot` (a dozen shape ops around the
  matmul, the bias added apart): decoding steps run a third fewer ops.

The choice is made once, when a model, layer, loss, optimizer, search or `Translator` is built:
its `kernels=` argument (a `Kernels`, a setting such as `"none"`, or None for the current
setting), kept as its `kernels` attribute and recorded in its config, so a model saved with some
kernels loads with the same ones. The current setting (the default of `kernels=None`): the
environment variable `KERAS_TRANSFORMER_FAST_PATHS` read at import (`all`, the default; `none`;
or a comma-separated list of names, e.g. `fused_loss,fused_adam`), or `set_fast_paths(...)` /
the `fast_paths(...)` context manager at run time. Nothing reads the setting while a graph is
traced: set it before building the model, or pass `kernels=`.

Example:
```python
from keras_transformer.fast_paths import fast_paths
with fast_paths("none"):  # the plain formulas everywhere, e.g. to compare
    reference_model = Transformer.from_preset("transformer_tiny", vocab_size=100)
reference_model.set_weights(model.get_weights())
```
"""

import contextlib
import dataclasses
import os

NAMES = (
    "fused_projections",
    "scatter_cache_writes",
    "inplace_cache_writes",
    "fused_layer_norm",
    "fused_loss",
    "fused_adam",
    "tracked_token_scores",
    "shared_beam_caches",
    "projection_gradients",
    "flat_dense",
)


def _parse(spec):
    """`"all"`, `"none"`, a comma-separated string or an iterable of names -> frozenset."""
    if isinstance(spec, str):
        text = spec.strip().lower()
        if text in ("", "all"):
            return frozenset(NAMES)
        if text == "none":
            return frozenset()
        spec = [part.strip() for part in text.split(",") if part.strip()]
    names = frozenset(spec)
    unknown = sorted(names - set(NAMES))
    if unknown:
        raise ValueError(f"unknown fast path {unknown[0]!r} (known: {', '.join(NAMES)}, all, none)")
    return names


class _Settings:
    # One object, read by every thread: tf.distribute traces each replica in a thread of its own,
    # and all replicas must take the same paths.
    enabled = _parse(os.environ.get("KERAS_TRANSFORMER_FAST_PATHS", "all"))


def enabled(name):
    """True when the fast path `name` (one of `NAMES`) is switched on."""
    if name not in NAMES:
        raise ValueError(f"unknown fast path {name!r} (known: {', '.join(NAMES)})")
    return name in _Settings.enabled


def enabled_names():
    """The names switched on, in `NAMES` order."""
    return [name for name in NAMES if name in _Settings.enabled]


def set_fast_paths(spec):
    """Switches fast paths on: `"all"`, `"none"`, or the names to enable (the others go off)."""
    _Settings.enabled = _parse(spec)


@contextlib.contextmanager
def fast_paths(spec):
    """`set_fast_paths(spec)` for the body of a `with` statement, then the previous setting."""
    previous = _Settings.enabled
    _Settings.enabled = _parse(spec)
    try:
        yield
    finally:
        _Settings.enabled = previous


@contextlib.contextmanager
def without(*names):
    """The current setting less `names`, for the body of a `with` statement."""
    with fast_paths(_Settings.enabled - _parse(list(names))):
        yield


@dataclasses.dataclass(frozen=True)
class Kernels:
    """The fast paths one model, layer, loss, optimizer, search or export was built with.

    Chosen once, when the object that uses them is built (its `kernels=` argument; None takes
    the current setting: `KERAS_TRANSFORMER_FAST_PATHS`, `set_fast_paths`, `fast_paths(...)`),
    kept by that object and recorded in its config; nothing reads the setting while a graph is
    traced. Each kernel returns the same numbers as the plain formula it replaces
    (`tests/test_fast_paths.py`).

    Example:
    ```python
    plain = Kernels.get("none")
    model = Transformer.from_preset("transformer_tiny", vocab_size=100, kernels=plain)
    model.kernels.uses("fused_layer_norm")  # False
    ```
    """

    names: frozenset = frozenset(NAMES)

    def __post_init__(self):
        names = self.names if isinstance(self.names, str) else list(self.names)
        object.__setattr__(self, "names", _parse(names))

    @classmethod
    def get(cls, kernels=None):
        """`kernels` as `Kernels`: None -> the current setting, a `Kernels` as it is, or a
        setting (`"all"`, `"none"`, names as a comma-separated string or a list)."""
        if kernels is None:
            return cls(_Settings.enabled)
        if isinstance(kernels, cls):
            return kernels
        return cls(_parse(kernels))

    def uses(self, name):
        """True when the kernel `name` (one of `NAMES`) is chosen."""
        if name not in NAMES:
            raise ValueError(f"unknown fast path {name!r} (known: {', '.join(NAMES)})")
        return name in self.names

    def without(self, *names):
        """These kernels less `names`."""
        return Kernels(self.names - _parse(list(names)))

    def to_config(self):
        """The chosen names in `NAMES` order (what configs record)."""
        return [name for name in NAMES if name in self.names]
