"""Translation of a dev set by a model in Python and its quality with sacreBLEU (BLEU and chrF on
detokenized text).

Checkpoint averaging lives with the checkpoints, in `keras_transformer.workdir`; the callback
that runs this at each epoch end is `keras_transformer.training.dev_evaluation.DevEvaluator`.
"""

import numpy as np
import sacrebleu
import tensorflow as tf

from keras_transformer import stopping
from keras_transformer.config import DecodingSettings
from keras_transformer.data.pipeline import encode_sources
from keras_transformer.decoding import translate_ids


def score_translations(hypotheses, references):
    """Corpus BLEU and chrF of `hypotheses` against one reference each.

    Returns a dict with `bleu`, `chrf` (floats) and the sacreBLEU `signature` strings, so that
    figures can be compared across papers and runs.
    """
    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: they must align"
        )
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": round(float(bleu_score.score), 2),
        "chrf": round(float(chrf_score.score), 2),
        "signature": {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())},
        "sentences": len(hypotheses),
    }


def translate_sentences(
    model, tokenizer, sources, data_config, settings=None, _cache=None, stop_phase=None
):
    """Translates a list of strings with `model` (in Python, for evaluation during training).

    Sentences are sorted by length and decoded `settings.batch_size` at a time with
    `keras_transformer.decoding.translate_ids` compiled by `tf.function`; `settings` is a
    `DecodingSettings` (None: greedy search, the cheap choice during training). With
    `stop_phase`, each batch is a safe point of that phase (`stopping.check`: a SIGTERM stops
    there); without it (the dev evaluation inside `fit`) a signal is acted on afterwards.

    Returns:
        The list of detokenized translations, in the order of `sources`.
    """
    if not sources:
        return []
    settings = DecodingSettings(beam_size=1) if settings is None else settings
    key = (id(model), settings)
    cache = _cache if _cache is not None else {}
    if key not in cache:
        # translate_ids has no tensor-dependent Python control flow: no AutoGraph needed.
        @tf.autograph.experimental.do_not_convert
        def decode_batch(ids):
            return translate_ids(model, ids, settings, max_length=data_config.max_target_length).ids

        cache[key] = tf.function(decode_batch)
    decode = cache[key]
    batch_size = min(settings.batch_size, len(sources))
    ragged = encode_sources(
        tokenizer, tf.constant(sources, dtype=tf.string), data_config.max_source_length, ragged=True
    )
    lengths = ragged.row_lengths().numpy()
    # One padded length for the whole set (a multiple of 8) and full batches: static shapes, so
    # the decoder is traced once. Sorting by length lets short batches stop early.
    width = -(-int(lengths.max()) // 8) * 8
    padded = ragged.to_tensor(0, shape=[None, width])
    order = np.argsort(lengths, kind="stable")
    outputs = [None] * len(sources)
    for start in range(0, len(order), batch_size):
        if stop_phase is not None:
            stopping.check(stop_phase)
        chunk = order[start : start + batch_size]
        ids = tf.gather(padded, chunk)
        # Full batches only (padded with one-EOS sentences): static shapes, one trace per length.
        rows = int(ids.shape[0])
        if rows < batch_size:
            filler = tf.concat(
                [
                    tf.fill([batch_size - rows, 1], tf.constant(settings.eos_id, ids.dtype)),
                    tf.zeros([batch_size - rows, int(ids.shape[1]) - 1], ids.dtype),
                ],
                axis=1,
            )
            ids = tf.concat([ids, filler], axis=0)
        out = decode(ids).numpy()[:rows]
        # Everything from the first EOS on is dropped before detokenizing.
        after_eos = np.cumsum(out == settings.eos_id, axis=1) > 0
        out = np.where(after_eos, 0, out).astype("int32")
        texts = tokenizer.detokenize(tf.constant(out)).numpy()
        for i, text in zip(chunk, texts):
            outputs[i] = text.decode("utf-8", errors="replace")
    return outputs


def evaluate_bleu(
    model, tokenizer, pairs, data_config, settings=None, _cache=None, stop_phase=None
):
    """sacreBLEU/chrF of `model` on `pairs` `[(source, reference), ...]`, translated with the
    `DecodingSettings` `settings` (None: greedy search); `stop_phase`: see `translate_sentences`.

    Returns:
        `(scores, hypotheses)`: `evaluation.score_translations`'s dict and the translations.
    """
    hypotheses = translate_sentences(
        model, tokenizer, [s for s, _ in pairs], data_config, settings, _cache, stop_phase
    )
    return score_translations(hypotheses, [t for _, t in pairs]), hypotheses
