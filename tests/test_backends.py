"""The layers use keras.ops only: their test modules must also pass on the JAX backend."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pytest_on_jax(*arguments):
    pytest.importorskip("jax")
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *arguments],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "failed" not in result.stdout


@pytest.mark.scenario(slow="three test modules run again in a JAX-backend pytest process")
def test_layers_and_decoder_only_pass_on_jax_backend():
    """The layer tests, the decoder-only tests (causality, no cross-attention weights,
    mismatched calls, `.keras`, fit and generation, cached equal to uncached) and KerasHub's
    layer test of the decoders in both modes, in one JAX-backend pytest process."""
    pytest.importorskip("keras_hub")
    _pytest_on_jax(
        "tests/test_layers.py", "tests/test_decoder_only.py", "tests/test_layers_keras_hub.py",
        "-k", "not test_layers_keras_hub or Decoder",
    )  # fmt: skip
