"""What the encoder and decoder blocks and stacks share: constructor arguments, sub-layer
wiring (residual, LayerNorm, feed-forward) and config. Private: the public classes are in
`encoder.py` and `decoder.py`.

The blocks' arguments are `BLOCK_ARGUMENTS`: a block takes them, a stack takes them as its
own and passes them to each of its blocks, and both record them in their configs. Those that
are model hyper-parameters are declared, with their defaults, in
`keras_transformer.hyper_parameters` (the layers never see the config)."""

import keras

from keras_transformer import hyper_parameters
from keras_transformer.fast_paths import Kernels
from keras_transformer.layers._initializers import clone_initializer
from keras_transformer.layers._specs import CallTracedSpec
from keras_transformer.layers.attention import MultiHeadAttention, head_size
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.normalization import LayerNormalization

# Of every projection kernel of the blocks (Keras's default for `Dense`).
KERNEL_INITIALIZER = "glorot_uniform"

# The blocks' arguments (besides `kernels`), in the order of their configs: the model's block
# hyper-parameters, then `kernel_initializer`.
BLOCK_ARGUMENTS = hyper_parameters.BLOCK + ("kernel_initializer",)
DEFAULTS = {**hyper_parameters.DEFAULTS, "kernel_initializer": KERNEL_INITIALIZER}


def block_arguments(kwargs, **given):
    """Pops the block arguments from a constructor's `kwargs` (what is left is Keras's):
    `{name: value}` for each of `BLOCK_ARGUMENTS`, from `given`, `kwargs`, or the default
    (`hyper_parameters.DEFAULTS`; `KERNEL_INITIALIZER`)."""
    values = {**DEFAULTS, **given}
    values.update({name: kwargs.pop(name) for name in BLOCK_ARGUMENTS if name in kwargs})
    return {name: values[name] for name in BLOCK_ARGUMENTS}


class BlockBase(CallTracedSpec, keras.layers.Layer):
    """Shared constructor arguments, sub-layer wiring and config of the encoder/decoder blocks:
    `num_heads`, `d_ff`, then by keyword the rest of `BLOCK_ARGUMENTS` and `kernels`."""

    def __init__(self, num_heads, d_ff, *, kernels=None, **kwargs):
        given = block_arguments(kwargs, num_heads=num_heads, d_ff=d_ff)
        super().__init__(**kwargs)
        self.kernels = Kernels.get(kernels)
        self.num_heads = int(given["num_heads"])
        self.d_ff = int(given["d_ff"])
        self.dropout = float(given["dropout"])
        self.attention_dropout = float(given["attention_dropout"])
        self.activation_dropout = float(given["activation_dropout"])
        self.activation = keras.activations.get(given["activation"])
        self.norm_first = bool(given["norm_first"])
        self.layer_norm_epsilon = float(given["layer_norm_epsilon"])
        self.kernel_initializer = keras.initializers.get(given["kernel_initializer"])
        self.supports_masking = True

    def _attention(self, d_model, name):
        return MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=head_size(d_model, self.num_heads),
            dropout=self.attention_dropout,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            kernels=self.kernels,
            dtype=self.dtype_policy,
            name=name,
        )

    def _norm(self, name):
        return LayerNormalization(
            epsilon=self.layer_norm_epsilon,
            kernels=self.kernels,
            dtype=self.dtype_policy,
            name=name,
        )

    def _build_feed_forward(self, input_shape):
        self.feed_forward = PositionwiseFeedForward(
            self.d_ff,
            activation=self.activation,
            dropout=self.activation_dropout,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            kernels=self.kernels,
            dtype=self.dtype_policy,
            name="feed_forward",
        )
        self.feed_forward.build(input_shape)
        self.feed_forward_norm = self._norm("feed_forward_norm")
        self.feed_forward_norm.build(input_shape)
        self.residual_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def _residual(self, norm, x, sublayer, training):
        """The residual connection around a sub-layer (section 5.4): post-norm
        `LN(x + Dropout(f(x)))`, or pre-norm `x + Dropout(f(LN(x)))`. `sublayer` maps its input
        to `(f(input), *extras)`; returns `(output, *extras)` (attention scores, a cache)."""
        y, *extras = sublayer(norm(x) if self.norm_first else x)
        y = x + self.residual_dropout(y, training=training)
        return (y if self.norm_first else norm(y), *extras)

    def _feed_forward_sublayer(self, x, training):
        """`FFN` with its residual connection."""
        feed_forward = lambda h: (self.feed_forward(h, training=training),)  # noqa: E731
        return self._residual(self.feed_forward_norm, x, feed_forward, training)[0]

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config.update({name: getattr(self, name) for name in BLOCK_ARGUMENTS})
        config.update(
            activation=keras.activations.serialize(self.activation),
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            kernels=self.kernels.to_config(),
        )
        return config


class StackBase(CallTracedSpec, keras.layers.Layer):
    """Shared constructor and config of the encoder/decoder stacks: `num_layers`, then the
    blocks' arguments (`BLOCK_ARGUMENTS`, with the same defaults, and `kernels`), passed to
    every block."""

    block_class = None

    def __init__(self, num_layers, num_heads, d_ff, *, kernels=None, **kwargs):
        block_kwargs = block_arguments(kwargs, num_heads=num_heads, d_ff=d_ff)
        # The initializer as an object, made here once per stack (as Keras makes any default
        # seed): the same seed stream, so the same weights for a given global seed, as before.
        initializer = keras.initializers.get(block_kwargs["kernel_initializer"])
        block_kwargs["kernel_initializer"] = initializer
        super().__init__(**kwargs)
        if num_layers <= 0:
            raise ValueError(f"num_layers must be positive, got {num_layers}")
        self.num_layers = int(num_layers)
        # The blocks' arguments, serializable (activations and initializers by name or config).
        self.block_kwargs = {
            name: value
            if isinstance(value, (str, int, float, bool, type(None)))
            else keras.saving.serialize_keras_object(value)
            for name, value in block_kwargs.items()
        }
        # The fast paths, chosen here once for all the blocks (recorded by name).
        self.block_kwargs["kernels"] = Kernels.get(kernels).to_config()
        self.supports_masking = True

    def build(self, input_shape, *args, **kwargs):
        self.blocks = []
        for i in range(self.num_layers):
            block = self.block_class(
                **self.block_kwargs, dtype=self.dtype_policy, name=f"layer_{i}"
            )
            self._build_block(block, input_shape)
            self.blocks.append(block)
        # Pre-norm stacks end with a LayerNorm so the output is normalised like the post-norm one.
        self.final_norm = None
        if self.blocks[0].norm_first:
            self.final_norm = LayerNormalization(
                epsilon=self.blocks[0].layer_norm_epsilon,
                kernels=self.blocks[0].kernels,
                dtype=self.dtype_policy,
                name="final_norm",
            )
            self.final_norm.build(input_shape)
        self.built = True

    def _build_block(self, block, input_shape):
        block.build(input_shape)

    def _finish(self, x):
        return self.final_norm(x) if self.final_norm is not None else x

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"num_layers": self.num_layers, **self.block_kwargs})
        return config
