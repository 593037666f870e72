"""Dev-set sacreBLEU during training: the epoch-end callback around `evaluation.evaluate_bleu`.

It stays in `training/` because it is a Keras callback on the training model that swaps in the
EMA weights (`callbacks.averaged_weights`) and logs at the optimizer step.
"""

import os
import time

import keras
import tensorflow as tf

from keras_transformer.evaluation import evaluate_bleu
from keras_transformer.training.callbacks import averaged_weights, optimizer_step


class DevEvaluator(keras.callbacks.Callback):
    """Dev-set sacreBLEU at the end of each epoch (greedy by default), logged as `dev_bleu`;
    with EMA on, of the averaged weights (`averaged_weights`).

    Adds `dev_bleu` and `dev_chrf` to the epoch logs (progress line, History) and writes them,
    with a few sample translations as text, to TensorBoard under `logdir/dev` at the optimizer
    step. The epoch that ends training is skipped when `skip_at_step` is reached (the trainer
    evaluates the final model itself, with the configured beam).

    Args:
        pairs: dev `[(source, reference), ...]` (already limited to the sentences to decode).
        tokenizer: the run's `keras_transformer.data.Tokenizer`.
        data_config: the `data` config section (max lengths).
        logdir: TensorBoard log directory; None writes nothing.
        settings: the `DecodingSettings`; None: greedy search, cheap during training.
        num_samples: sample translations written as text.
        skip_at_step: no evaluation when the optimizer step has reached this.
        enabled: False on the non-chief workers (no TensorBoard writes).
    """

    def __init__(
        self,
        pairs,
        tokenizer,
        data_config,
        logdir=None,
        settings=None,
        num_samples=3,
        skip_at_step=None,
        enabled=True,
    ):
        super().__init__()
        self.pairs = list(pairs)
        self.tokenizer = tokenizer
        self.data_config = data_config
        self.logdir = logdir
        self.settings = settings
        self.num_samples = num_samples
        self.skip_at_step = skip_at_step
        self.enabled = enabled
        self._writer = None
        self._cache = {}
        self.history = []  # (step, bleu)

    def on_epoch_end(self, epoch, logs=None):
        step = optimizer_step(self.model)
        if not self.pairs or (self.skip_at_step is not None and step >= self.skip_at_step):
            return
        start = time.perf_counter()
        with averaged_weights(self.model):
            scores, hypotheses = evaluate_bleu(
                self.model,
                self.tokenizer,
                self.pairs,
                self.data_config,
                self.settings,
                _cache=self._cache,
            )
        self.history.append((step, scores["bleu"]))
        if logs is not None:
            logs["dev_bleu"] = scores["bleu"]
            logs["dev_chrf"] = scores["chrf"]
        print(
            f"step {step}: dev BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f} "
            f"({len(self.pairs)} sentences, {time.perf_counter() - start:.1f}s)",
            flush=True,
        )
        if not (self.enabled and self.logdir):
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self.logdir, "dev"))
        with self._writer.as_default(step=step):
            tf.summary.scalar("dev_bleu", scores["bleu"])
            tf.summary.scalar("dev_chrf", scores["chrf"])
            samples = [
                f"**source:** {src}  \n**reference:** {ref}  \n**model:** {hyp}"
                for (src, ref), hyp in zip(self.pairs, hypotheses)
            ][: self.num_samples]
            if samples:
                tf.summary.text("sample_translations", tf.constant(samples))
        self._writer.flush()
