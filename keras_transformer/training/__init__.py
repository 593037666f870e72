"""Training: `train(config)`, and `compile_model` for your own `model.fit` with the same recipe.

Three places, by job:

- `training.run`: the one training run, the same on either backend: its outline
  (`run.outline.train`), set-up (`run.setup`), `fit` and its callbacks (`run.fitting`,
  `run.callbacks`, `run.run_state`, `run.preemption`, `run.dev_evaluation`, `run.end_reserve`,
  `run.visuals`), fine-tuning (`run.init_from`) and its end (`run.finish`: the final model,
  scores, export, `result.json`);
- `training.engines`: what differs between the backends, behind one small interface
  (`engines.engine_for`): TensorFlow's `tf.distribute` strategies, `tf.data` batches and
  checkpoint resume state (`engines.strategies`, `engines.tf_state`, `engines.distribute`,
  `engines.replica_batches`, `engines.worker_batches`, `engines.precision`), and JAX's numpy
  batches, npz resume state and `keras.distribution` (`engines.jax_engine`);
- `training.recipe`: what a step computes, on any backend: the loss (`recipe.losses`), metrics
  (`recipe.metrics`), learning-rate schedules (`recipe.schedules`), the optimizer
  (`recipe.optimizers`) and `compile_model` / `make_optimizer` (`recipe.compile`).

`train` runs on the backend Keras runs (`KERAS_BACKEND=jax`: no TensorFlow needed once the data
is prepared). Names are loaded on first use, so `training.recipe` and the JAX engine import
without TensorFlow.

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
    `keras_transformer.training.run.outline.train`."""
    from keras_transformer.training.run import outline

    return outline.train(config)


def compile_model(model, config, jit_compile=False, steps_per_execution=1):
    """`keras_transformer.training.recipe.compile_model` (the loss, optimizer and metrics of
    `train(config)` for your own `model.fit`; on any backend)."""
    from keras_transformer.training.recipe import compile_model as compile_

    return compile_(model, config, jit_compile, steps_per_execution)
