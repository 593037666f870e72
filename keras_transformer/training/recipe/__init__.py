"""The training recipe: what one optimizer step computes, on any backend (no TensorFlow needed).

- `losses`: the masked, label-smoothed cross-entropy (`MaskedSparseCrossEntropy`);
- `metrics`: masked accuracy, perplexity, token counts;
- `schedules`: the paper's learning rate (`TransformerSchedule`) and the budget's
  (`BudgetSchedule`);
- `optimizers`: `FusedAdam` (Keras's Adam, one kernel on TensorFlow);
- `compile`: `make_optimizer` and `compile_model`, the recipe put together for `model.fit`
  (re-exported here).
"""

from keras_transformer.training.recipe.compile import compile_model, make_optimizer

__all__ = ["compile_model", "make_optimizer"]
