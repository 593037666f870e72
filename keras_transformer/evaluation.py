"""Translation of a dev set by a model in Python and its quality with sacreBLEU (BLEU and chrF on
detokenized text).

On either backend (the search is compiled by `tf.function` or `jax.jit`). Checkpoint averaging
lives with the checkpoints, in `keras_transformer.workdir`; the callback that runs this at each
epoch end is `keras_transformer.training.run.dev_evaluation.DevEvaluator`.
"""

import numpy as np
import sacrebleu

from keras_transformer import stopping
from keras_transformer.config import DecodingSettings
from keras_transformer.data.pipeline import encode_source
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


def compiled_search(model, settings, max_length=None, shortlist=None):
    """`ids -> output ids` (int32 numpy arrays `[batch, width]` -> `[batch, length]`):
    `decoding.translate_ids(model, ids, settings)` compiled once per shape on the backend Keras
    runs: a `tf.function` on TensorFlow; on JAX one `jax.jit` function of the model's variables'
    values (Keras's `StatelessScope`), given the values as they are at each call, so the same
    function follows a model that trains. `shortlist`: a vocabulary shortlist's lexical table
    (`data.shortlist.LexicalTable`) each batch decodes over (`translate_ids`' `shortlist`;
    TensorFlow only: its width depends on the batch, which `jax.jit` does not trace).

    Example:
    ```python
    search = compiled_search(model, decoding_settings(config))
    found = search(np.array([[5, 6, 3]], "int32"))  # [1, length] ids
    ```
    """
    import keras

    if keras.backend.backend() == "jax":
        import jax

        if shortlist is not None:
            raise ValueError("a vocabulary shortlist decodes on the TensorFlow backend only")

        def stateless(values, ids):
            with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
                return translate_ids(model, ids, settings, max_length=max_length).ids

        jitted = jax.jit(stateless)
        return lambda ids: np.asarray(jitted([v.value for v in model.variables], ids))
    import tensorflow as tf

    # translate_ids has no tensor-dependent Python control flow: no AutoGraph needed.
    @tf.autograph.experimental.do_not_convert
    def decode_batch(ids):
        return translate_ids(model, ids, settings, max_length=max_length, shortlist=shortlist).ids

    function = tf.function(decode_batch)
    return lambda ids: function(tf.constant(ids)).numpy()


def translate_sentences(
    model, tokenizer, sources, data_config, settings=None, _cache=None, stop_phase=None,
    shortlist=None,
):  # fmt: skip
    """Translates a list of strings with `model` (in Python, for evaluation during training and
    the final scores), on either backend.

    Sentences are encoded as in training (`data.pipeline.encode_source`), sorted by length and
    decoded `settings.batch_size` at a time by `compiled_search`; `settings` is a
    `DecodingSettings` (None: greedy search, the cheap choice during training). `tokenizer` needs
    Python `encode(text)` and `decode(ids)` (a `data.Tokenizer`, or a SentencePiece processor). With
    `stop_phase`, each batch is a safe point of that phase (`stopping.check`: a SIGTERM stops
    there); without it (the dev evaluation inside `fit`) a signal is acted on afterwards.
    `shortlist`: a lexical table each batch decodes over (`compiled_search`; the export's, so
    that the final scores are those of the search it serves; None: the whole vocabulary).

    Returns:
        The list of detokenized translations, in the order of `sources`.
    """
    if not sources:
        return []
    settings = DecodingSettings(beam_size=1) if settings is None else settings
    key = (id(model), settings, id(shortlist))
    cache = _cache if _cache is not None else {}
    if key not in cache:
        cache[key] = compiled_search(
            model, settings, data_config.max_target_length, shortlist=shortlist
        )
    decode = cache[key]
    batch_size = min(settings.batch_size, len(sources))
    rows = [
        encode_source(tokenizer, text, data_config.max_source_length, settings.eos_id)
        for text in sources
    ]
    lengths = np.array([len(row) for row in rows])
    # One padded length for the whole set (a multiple of 8) and full batches: static shapes, so
    # the decoder is traced once. Sorting by length lets short batches stop early.
    width = -(-int(lengths.max()) // 8) * 8
    order = np.argsort(lengths, kind="stable")
    outputs = [None] * len(sources)
    for start in range(0, len(order), batch_size):
        if stop_phase is not None:
            stopping.check(stop_phase)
        chunk = order[start : start + batch_size]
        # Full batches only (padded with one-EOS sentences): static shapes, one trace per length.
        ids = np.zeros((batch_size, width), np.int32)
        ids[len(chunk) :, 0] = settings.eos_id
        for i, index in enumerate(chunk):
            ids[i, : lengths[index]] = rows[index]
        out = decode(ids)[: len(chunk)]
        for i, found in zip(chunk, out.tolist()):
            # Everything from the first EOS on is dropped before detokenizing, and padding.
            found = found[: found.index(settings.eos_id)] if settings.eos_id in found else found
            outputs[i] = tokenizer.decode([piece for piece in found if piece])
    return outputs


def evaluate_bleu(
    model, tokenizer, pairs, data_config, settings=None, _cache=None, stop_phase=None,
    shortlist=None,
):  # fmt: skip
    """sacreBLEU/chrF of `model` on `pairs` `[(source, reference), ...]`, translated with the
    `DecodingSettings` `settings` (None: greedy search); `stop_phase` and `shortlist` (a
    lexical table to decode over): see `translate_sentences`.

    Returns:
        `(scores, hypotheses)`: `evaluation.score_translations`'s dict and the translations.
    """
    hypotheses = translate_sentences(
        model, tokenizer, [s for s, _ in pairs], data_config, settings, _cache, stop_phase,
        shortlist,
    )  # fmt: skip
    return score_translations(hypotheses, [t for _, t in pairs]), hypotheses
