"""Word alignments in the graph: the `alignment` output of a `Translator` built with
`alignments=True` (`serving_default`), from one teacher-forced pass over its translations."""

import tensorflow as tf
from keras import ops

from keras_transformer import alignment_rules, word_rules
from keras_transformer.models.guided_alignment import resolve_alignment_layer


def alignment_layer(model, layer):
    """The non-negative index of the decoder layer `layer` (negative: from the end; -2 in a
    one-layer decoder: its only layer) whose cross-attention gives the alignments (the layer
    that guided alignment trains: `models.guided_alignment.resolve_alignment_layer`)."""
    return resolve_alignment_layer(len(model.decoder.blocks), layer)


def word_indices(tokenizer, ids, is_text, translation=False):
    """int32 `[r, L]` piece ids (`is_text`: the pieces that are text) -> `(word [r, L],
    starts [r, L])`: `keras_transformer.word_rules.word_indices` (the rule every engine and
    road shares) on the pieces' strings; `translation`: the pieces of a translation, whose
    unknown pieces are words of their own (detokenized " ⁇ ")."""
    marker = word_rules.WORD_MARKER.encode()
    pieces = tokenizer.id_to_string(ids)  # tf.string [r, L]
    lone = tf.equal(pieces, marker)
    marked = tf.equal(tf.strings.substr(pieces, 0, len(marker)), marker)
    unknown = tf.equal(pieces, word_rules.UNKNOWN_PIECE) if translation else None
    return word_rules.word_indices(ops, is_text, lone, marked, unknown)


def _text_pieces(ids, settings):
    """bool: the ids that are text (not padding, not EOS)."""
    return tf.logical_and(tf.not_equal(ids, settings.pad_id), tf.not_equal(ids, settings.eos_id))


def attended_pieces(model, layer, source_ids, ids, settings):
    """int32 `[r, T]`: for each piece of the hypotheses `ids` `[r, T]` (tokens, EOS, padding)
    of the sources `source_ids` `[r, S]` (padded), the index of the source text piece (not EOS,
    not padding) it attends to most in decoder layer `layer`'s cross-attention averaged over
    heads, from one teacher-forced pass (`Transformer.attention_scores`, the attention the model
    computes); 0 where the source has no text. The definition both the SavedModel's graph
    (`alignment_chunk`) and the LiteRT export's alignment graph (`export.litert`) run."""
    bos = tf.fill([tf.shape(ids)[0], 1], settings.bos_id)
    target_in = tf.concat([bos, ids[:, :-1]], axis=1)
    scores = model.attention_scores(source_ids, target_in)["decoder_cross_attention"]
    attention = tf.reduce_mean(tf.cast(scores[layer], tf.float32), axis=1)  # [r, T, S]
    source_text = _text_pieces(source_ids, settings)
    attention = tf.where(tf.expand_dims(source_text, 1), attention, -1.0)  # no new-axis slice
    return tf.argmax(attention, axis=-1, output_type=tf.int32)


def alignment_chunk(translator, tokenizer, source, ids):
    """Word alignments of the hypotheses `ids` int32 `[c, k, T]` of the sources `source`
    (ragged `[c, (tokens)]`) -> `(alignment [c, k, W], words [c, k])`.

    Each target piece is aligned to the source text piece it attends to most in the
    translator's `alignment_layer` (`attended_pieces`); pieces map to words (`word_indices`) on
    both sides, and each target word gets the source word that most of its pieces are aligned
    to (`alignment_rules.word_alignment`). `alignment[..., j]` is target word `j`'s
    source word, -1 past the `words` words of the translation (`W = max_target_length`)."""
    c, k, width = tf.shape(ids)[0], tf.shape(ids)[1], tf.shape(ids)[2]
    settings = translator.settings
    flat = tf.reshape(ids, [-1, width])  # [r = c * k, T]
    source_ids = tf.repeat(source.to_tensor(default_value=settings.pad_id), k, axis=0)
    model, layer = translator.model, translator.alignment_layer
    piece = attended_pieces(model, layer, source_ids, flat, settings)
    source_word, _ = word_indices(tokenizer, source_ids, _text_pieces(source_ids, settings))
    target_word, starts = word_indices(tokenizer, flat, _text_pieces(flat, settings), True)
    words_out, words_in = translator.max_target_length, translator.max_source_length
    aligned, words = alignment_rules.word_alignment(
        ops, piece, source_word, target_word, starts, words_out, words_in
    )
    return tf.reshape(aligned, [c, k, words_out]), tf.reshape(words, [c, k])
