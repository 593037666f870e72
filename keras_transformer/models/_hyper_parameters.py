"""The models' hyper-parameters: keyword arguments named and defaulted as declared in
`keras_transformer.hyper_parameters` (the keys of the config's `model:` section), kept in
`model.hyper_parameters`, read as attributes (`model.d_model`) and saved as the model's config,
from which `from_config` builds the model again (not from its graph)."""

import keras

from keras_transformer import hyper_parameters


def take(kwargs, names=hyper_parameters.ALL):
    """Pops the hyper-parameters `names` from a constructor's `kwargs`: `{name: the given
    value, or its declared default}`, in the order of `names`. What is left in `kwargs`
    (`name`, `trainable`) is Keras's."""
    return {name: kwargs.pop(name, hyper_parameters.DEFAULTS[name]) for name in names}


class HyperParameters:
    """Mixin of the functional models that keep their hyper-parameters in a dict,
    `self.hyper_parameters`: they read as attributes, and the config is them, the layers'
    dtype policy (the decoder's: the model's own is Keras's default) and the fast paths the
    model was built with (`self.kernels`)."""

    def __getattr__(self, name):
        # Only for names that are not attributes: `model.d_model` is a hyper-parameter.
        hyper_parameters = self.__dict__.get("hyper_parameters", {})
        if name in hyper_parameters:
            return hyper_parameters[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            **self.hyper_parameters,
            "dtype": keras.dtype_policies.serialize(self.decoder.dtype_policy),
            "kernels": self.kernels.to_config(),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)

    def with_dtype(self, dtype):
        """A copy of the model whose layers keep their weights and compute in `dtype` (a dtype
        policy such as `"bfloat16"`), its weights this model's cast once; logits stay float32.

        What `Translator(precision="bfloat16")` decodes with: weights of half the bytes, read
        at every decoding step, and matrix products in bfloat16 (faster on CPUs with
        AVX512-BF16 or AMX). This model is not changed.
        """
        copy = type(self).from_config({**self.get_config(), "dtype": dtype})
        copy.set_weights(self.get_weights())  # each value cast to its variable's dtype
        return copy
