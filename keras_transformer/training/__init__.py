"""Training: `train(config)`, and `compile_model` for your own `model.fit` with the same recipe.

The parts (loss, metrics, schedules, optimizer, callbacks, strategies) are importable from their
modules: `training.losses`, `training.metrics`, `training.schedules`, `training.optimizers`,
`training.callbacks`, `training.run_state`, `training.distribute`.

Example:
```python
from keras_transformer.config import load_config
from keras_transformer.training import train
result = train(load_config("configs/quickstart.yaml"))
```
"""

from keras_transformer.training.trainer import compile_model, train

__all__ = ["compile_model", "train"]
