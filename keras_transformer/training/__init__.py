"""Training: `train(config)`, and `compile_model` for your own `model.fit` with the same recipe.

The parts (loss, metrics, schedules, optimizer, callbacks, strategies) are importable from their
modules: `training.losses`, `training.metrics`, `training.schedules`, `training.optimizers`,
`training.callbacks`, `training.run_state`, `training.distribute` (the strategy chosen by name),
`training.strategies` (what differs between strategies: one input object per kind).

`train` runs on the backend Keras runs: `training.trainer` on TensorFlow (tf.data, tf.distribute
strategies), `training.jax_trainer` on JAX (`KERAS_BACKEND=jax`: numpy batches, one device or
`keras.distribution.DataParallel` over all local devices). Names are loaded on first use, so
`training.losses`, `training.recipe` and the JAX trainer import without TensorFlow.

Example:
```python
from keras_transformer.config import load_config
from keras_transformer.training import train
result = train(load_config("configs/quickstart.yaml"))
```
"""

__all__ = ["compile_model", "train"]


def train(config):
    """Trains, evaluates and exports the model of `config` on the current Keras backend: see
    `keras_transformer.training.trainer.train` (TensorFlow) and
    `keras_transformer.training.jax_trainer.train` (JAX)."""
    import keras

    if keras.backend.backend() == "jax":
        from keras_transformer.training import jax_trainer

        return jax_trainer.train(config)
    from keras_transformer.training import trainer

    return trainer.train(config)


def compile_model(model, config, jit_compile=False, steps_per_execution=1):
    """`keras_transformer.training.recipe.compile_model` (the loss, optimizer and metrics of
    `train(config)` for your own `model.fit`; on any backend)."""
    from keras_transformer.training.recipe import compile_model as compile_

    return compile_(model, config, jit_compile, steps_per_execution)
