"""The models' hyper-parameters: keyword arguments named as the keys of the config's `model:`
section (`keras_transformer.config.ModelConfig`, where each is declared once, with its default),
kept in `model.hyper_parameters`, read as attributes (`model.d_model`) and saved as the model's
config, from which `from_config` builds the model again (not from its graph)."""

import dataclasses

import keras

from keras_transformer.config.sections import ModelConfig

# The keys of the `model:` section, in its order.
MODEL_SECTION = tuple(f.name for f in dataclasses.fields(ModelConfig))


def take(kwargs, names=MODEL_SECTION):
    """Pops the hyper-parameters `names` (keys of `ModelConfig`) from a constructor's `kwargs`:
    `{name: the given value, or ModelConfig's default}`, in the order of `names`. What is left
    in `kwargs` (`name`, `trainable`) is Keras's."""
    section = ModelConfig(**{name: kwargs.pop(name) for name in names if name in kwargs})
    return {name: getattr(section, name) for name in names}


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
