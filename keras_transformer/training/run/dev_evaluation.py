"""Dev-set sacreBLEU during training: the epoch-end callback around `evaluation.evaluate_bleu`,
and `KeepBest`, which keeps the checkpoints of the best dev BLEU.

It stays in `training/run/` because it is a Keras callback on the training model that swaps in
the EMA weights (`callbacks.averaged_weights`) and logs at the optimizer step; the same on either
backend (TensorBoard's files where TensorFlow is installed).
"""

import json
import os
import time

import keras

from keras_transformer import local_files
from keras_transformer.evaluation import evaluate_bleu
from keras_transformer.final_model import BEST_SCORES, read_best
from keras_transformer.integrity import remove_with_checksum
from keras_transformer.training.run.callbacks import (
    averaged_weights,
    optimizer_step,
    tensorboard,
    writes_in_the_batch_loop,
)
from keras_transformer.workdir import (
    checkpoint_path,
    join,
    list_checkpoints,
    save_model_weights,
    write_atomically,
)


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
        self._scored = None  # (step, (scores, hypotheses), seconds) of the last evaluation
        self.history = []  # (step, bleu)

    def skips(self, step):
        """True when no evaluation is due at `step` (no pairs, or the final step reached)."""
        return not self.pairs or (self.skip_at_step is not None and step >= self.skip_at_step)

    def score(self, step):
        """`(scores, hypotheses)` of the model at optimizer step `step` (decoded once per step:
        `KeepBest` and the epoch end share it)."""
        if self._scored and self._scored[0] == step:
            return self._scored[1]
        start = time.perf_counter()
        with averaged_weights(self.model):
            scored = evaluate_bleu(
                self.model,
                self.tokenizer,
                self.pairs,
                self.data_config,
                self.settings,
                _cache=self._cache,
            )
        self._scored = (step, scored, time.perf_counter() - start)
        return scored

    def on_epoch_end(self, epoch, logs=None):
        step = optimizer_step(self.model)
        if self.skips(step):
            return
        scores, hypotheses = self.score(step)
        seconds = self._scored[2]
        self.history.append((step, scores["bleu"]))
        if logs is not None:
            logs["dev_bleu"] = scores["bleu"]
            logs["dev_chrf"] = scores["chrf"]
        print(
            f"step {step}: dev BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f} "
            f"({len(self.pairs)} sentences, {seconds:.1f}s)",
            flush=True,
        )
        summary = tensorboard() if self.enabled and self.logdir else None
        if summary is None:
            return
        if self._writer is None:
            self._writer = summary.create_file_writer(os.path.join(self.logdir, "dev"))
        with self._writer.as_default(step=step):
            summary.scalar("dev_bleu", scores["bleu"])
            summary.scalar("dev_chrf", scores["chrf"])
            samples = [
                f"**source:** {src}  \n**reference:** {ref}  \n**model:** {hyp}"
                for (src, ref), hyp in zip(self.pairs, hypotheses)
            ][: self.num_samples]
            if samples:
                summary.text("sample_translations", samples)
        self._writer.flush()


class KeepBest(keras.callbacks.Callback):
    """Keeps the `keep` checkpoints of the best dev BLEU in `directory` (`WORKDIR/best/`), as
    Marian's `--keep-best` and OpenNMT-tf's `export_on_best` do: every `every` optimizer steps
    the model is scored by `evaluator` (a `DevEvaluator`: greedy, its dev subset; shared with
    its epoch-end evaluation when the steps coincide) and saved there if among the best.

    `directory/scores.json` (written last, atomically) holds the BLEU of every step scored and
    the steps kept, best first (a tie keeps the earlier step); a resumed run reads it back, so
    the kept files are those of an uninterrupted run. The files are step checkpoints
    (`ckpt-<step>.weights.h5` with their checksums), which `final_model` adds to the candidates
    of `export.average_checkpoints: auto`.
    """

    def __init__(self, evaluator, directory, keep, every):
        super().__init__()
        self.evaluator = evaluator
        self.directory = directory
        self.keep = int(keep)
        self.every = int(every)
        self.scores = {}

    def on_train_begin(self, logs=None):
        self.scores, _ = read_best(self.directory)

    @writes_in_the_batch_loop
    def on_train_batch_end(self, batch, logs=None):
        step = optimizer_step(self.model)
        if step % self.every or step in self.scores or self.evaluator.skips(step):
            return
        scores, _ = self.evaluator.score(step)
        self.scores[step] = scores["bleu"]
        kept = sorted(self.scores, key=lambda s: (-self.scores[s], s))[: self.keep]
        local_files.gfile().makedirs(self.directory)
        if step in kept:
            with averaged_weights(self.model):
                save_model_weights(self.model, checkpoint_path(self.directory, step))
        state = {"scores": {str(s): b for s, b in sorted(self.scores.items())}, "kept": kept}
        write_atomically(join(self.directory, BEST_SCORES), json.dumps(state, indent=1))
        for old_step, path in list_checkpoints(self.directory):
            if old_step not in kept:
                remove_with_checksum(path)
