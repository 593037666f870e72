"""Training: loss, metrics, schedule, callbacks, strategies and `train(config)`.

Example:
```python
from keras_transformer.config import load_config
from keras_transformer.training import train
result = train(load_config("configs/quickstart.yaml"))
```
"""

from keras_transformer.training.callbacks import (
    DevEvaluator,
    ResumeState,
    StepCheckpoint,
    StopAtStep,
    TrainingSummaries,
    averaged_weights,
    evaluate_bleu,
    translate_sentences,
)
from keras_transformer.training.distribute import (
    get_strategy,
    is_chief,
    resolve_jit_compile,
)
from keras_transformer.training.losses import MaskedSparseCrossEntropy, masked_token_cross_entropy
from keras_transformer.training.metrics import MaskedAccuracy, Perplexity, TokenCount
from keras_transformer.training.optimizers import FusedAdam
from keras_transformer.training.schedules import BudgetSchedule, TransformerSchedule
from keras_transformer.training.trainer import (
    compile_model,
    make_optimizer,
    resolve_workdir,
    train,
)
from keras_transformer.workdir import list_checkpoints

__all__ = [
    "BudgetSchedule",
    "DevEvaluator",
    "FusedAdam",
    "MaskedAccuracy",
    "MaskedSparseCrossEntropy",
    "Perplexity",
    "ResumeState",
    "StepCheckpoint",
    "StopAtStep",
    "TokenCount",
    "TrainingSummaries",
    "TransformerSchedule",
    "averaged_weights",
    "compile_model",
    "evaluate_bleu",
    "get_strategy",
    "is_chief",
    "list_checkpoints",
    "make_optimizer",
    "masked_token_cross_entropy",
    "resolve_jit_compile",
    "resolve_workdir",
    "train",
    "translate_sentences",
]
