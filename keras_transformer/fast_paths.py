"""The one setting that chooses the fast paths, and the scope of in-place decoding-cache writes.

The layers and the loss read as the paper's formulas; where a measurably faster computation of
the same numbers exists, their code has one dispatch line that asks the private kernel modules
(`layers/_fast_paths.py`, `training/_fast_paths.py`) for it. Those kernels run only where they
apply (most are TensorFlow-only and step aside under XLA or on other backends) and only when
enabled here. `tests/test_fast_paths.py` proves every one equal to its plain form, and
`docs/guides/performance.md` has the measurements that made each one the default.

- `fused_projections`: query/key/value (or key/value) projections as one matmul over the
  concatenated kernels.
- `scatter_cache_writes`: a decoding step's keys/values scattered into the cache instead of
  written with `slice_update`.
- `inplace_cache_writes`: inside `inplace_cache_writes()`, in TF graphs outside XLA, written into
  the cache's own buffer.
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

The setting: the environment variable `KERAS_TRANSFORMER_FAST_PATHS` read at import (`all`, the
default; `none`; or a comma-separated list of names, e.g. `fused_loss,fused_adam`), or
`set_fast_paths(...)` / the `fast_paths(...)` context manager at run time. It applies when a
function is traced, so set it before building and compiling the model.

Example:
```python
from keras_transformer.fast_paths import fast_paths
with fast_paths("none"):  # the plain formulas everywhere, e.g. to compare
    reference = model(inputs)
```
"""

import contextlib
import os
import threading

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


_CACHE_OWNER = threading.local()


@contextlib.contextmanager
def inplace_cache_writes():
    """Decoding-cache writes traced inside update the cache's buffer instead of copying it.

    For callers that own their caches, as `decoding.translate_ids` does: the cache passed to
    `decode_step` is then changed in place, so it must not be read again, and it must be a tensor
    of its own, never a constant (`layers._fast_paths.fresh_zeros` makes one). TensorFlow graphs
    only (eagerly, under XLA and on other backends writes are unchanged), and only while the
    `inplace_cache_writes` fast path is enabled. Beam-4 decoding at the base shapes runs faster
    than with the scatter's copies (figures in docs/guides/performance.md). Per thread: the scope
    covers the tracing done by the thread that entered it.
    """
    previous = getattr(_CACHE_OWNER, "on", False)
    _CACHE_OWNER.on = True
    try:
        yield
    finally:
        _CACHE_OWNER.on = previous


def inside_inplace_cache_writes():
    """True inside `inplace_cache_writes()` (in this thread)."""
    return getattr(_CACHE_OWNER, "on", False)
