"""Our public layers pass KerasHub's own layer test (`TestCase.run_layer_test`): serialization,
build, symbolic and eager calls, an XLA-compiled `fit` step and, under mixed_float16,
mixed_bfloat16 and bfloat16, output specs, weights and sub-layers in the policy's dtypes.

Skipped when `keras_hub` (the `test` extra) is not installed.
"""

import numpy as np
import pytest

test_case = pytest.importorskip("keras_hub.src.tests.test_case")

from keras_transformer.layers import (  # noqa: E402
    MultiHeadAttention,
    PositionwiseFeedForward,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    TransformerDecoder,
    TransformerDecoderBlock,
    TransformerEncoder,
    TransformerEncoderBlock,
)
from keras_transformer.layers.normalization import LayerNormalization  # noqa: E402

X = np.random.default_rng(0).normal(size=(2, 3, 8)).astype("float32")
IDS = np.array([[3, 7, 1, 0], [5, 2, 0, 0]], "int32")
PAIR = {"inputs": X, "encoder_output": X}
BLOCK = dict(num_heads=2, d_ff=16)

# name: (class, constructor arguments, input, output shape, trainable weights, seed
# generators: one per residual dropout). The decoders in both modes: encoder-decoder (called
# with an encoder sequence) and decoder-only (without: no cross-attention weights).
CASES = {
    "MultiHeadAttention": (
        MultiHeadAttention,
        dict(num_heads=2, key_dim=4),
        {"query": X, "value": X},
        (2, 3, 8),
        8,
        0,
    ),
    "PositionwiseFeedForward": (PositionwiseFeedForward, dict(d_ff=16), X, (2, 3, 8), 4, 0),
    "SinusoidalPositionalEncoding": (SinusoidalPositionalEncoding, {}, X, (2, 3, 8), 0, 0),
    "TokenEmbedding": (TokenEmbedding, dict(vocab_size=20, d_model=8), IDS, (2, 4, 8), 1, 0),
    "LayerNormalization": (LayerNormalization, dict(epsilon=1e-6), X, (2, 3, 8), 2, 0),
    "TransformerEncoderBlock": (TransformerEncoderBlock, BLOCK, X, (2, 3, 8), 16, 1),
    "TransformerDecoderBlock": (
        TransformerDecoderBlock,
        dict(BLOCK, norm_first=True),
        PAIR,
        (2, 3, 8),
        26,
        1,
    ),
    "TransformerDecoderBlock decoder-only": (
        TransformerDecoderBlock,
        dict(BLOCK, norm_first=True),
        X,
        (2, 3, 8),
        16,
        1,
    ),
    "TransformerEncoder": (
        TransformerEncoder,
        dict(BLOCK, num_layers=2, norm_first=True),
        X,
        (2, 3, 8),
        34,
        2,
    ),
    "TransformerDecoder": (TransformerDecoder, dict(BLOCK, num_layers=2), PAIR, (2, 3, 8), 52, 2),
    "TransformerDecoder decoder-only": (
        TransformerDecoder,
        dict(BLOCK, num_layers=2, norm_first=True),
        X,
        (2, 3, 8),
        34,
        2,
    ),
}


class _KerasHubTest(test_case.TestCase):
    __test__ = False  # a helper, not a test class of its own

    def runTest(self):  # unittest wants one; the test below calls run_layer_test itself
        pass


@pytest.mark.scenario
@pytest.mark.parametrize("name", list(CASES))
def test_public_layer_passes_keras_hub_run_layer_test(name):
    cls, init_kwargs, data, shape, trainable, seed_generators = CASES[name]
    _KerasHubTest().run_layer_test(
        cls,
        init_kwargs=dict(init_kwargs),
        input_data=data,
        expected_output_shape=shape,
        expected_num_trainable_weights=trainable,
        expected_num_non_trainable_variables=seed_generators,
    )


def test_every_public_layer_is_covered():
    import keras

    import keras_transformer.layers as layers

    public = {
        getattr(layers, name)
        for name in layers.__all__
        if isinstance(getattr(layers, name), type)
        and issubclass(getattr(layers, name), keras.layers.Layer)
    }
    # LayerNormalization is no public name (the blocks use it); it is tested like them.
    assert public | {LayerNormalization} == {case[0] for case in CASES.values()}
