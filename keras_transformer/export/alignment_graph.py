"""Word alignments in the graph: the `alignment` output of a `Translator` built with
`alignments=True` (`serving_default`), from one teacher-forced pass over its translations."""

import tensorflow as tf

from keras_transformer.models.guided_alignment import resolve_alignment_layer


def alignment_layer(model, layer):
    """The non-negative index of the decoder layer `layer` (negative: from the end; -2 in a
    one-layer decoder: its only layer) whose cross-attention gives the alignments (the layer
    that guided alignment trains: `models.guided_alignment.resolve_alignment_layer`)."""
    return resolve_alignment_layer(len(model.decoder.blocks), layer)


def word_indices(tokenizer, ids, is_text):
    """int32 `[r, L]` piece ids (`is_text`: the pieces that are text) -> `(word [r, L],
    starts [r, L])`: the index of the whitespace-separated word of the detokenized text that
    each piece belongs to (-1 for a piece that is not text), and whether it begins that
    word. A piece begins a word when it starts with SentencePiece's word marker "▁" (or
    follows a lone "▁", or is the first); a lone "▁" belongs to the word before."""
    marker = "▁".encode()
    pieces = tokenizer.id_to_string(ids)  # tf.string [r, L]
    lone = tf.equal(pieces, marker)
    marked = tf.equal(tf.strings.substr(pieces, 0, len(marker)), marker)
    after_lone = tf.concat([tf.ones_like(lone[:, :1]), lone[:, :-1]], axis=1)
    text = tf.logical_and(is_text, tf.logical_not(lone))
    first = tf.logical_and(
        text, tf.equal(tf.cumsum(tf.cast(text, tf.int32), axis=1), 1)
    )  # the first text piece always begins a word
    starts = tf.logical_and(text, tf.logical_or(first, tf.logical_or(marked, after_lone)))
    word = tf.maximum(tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1, 0)
    return tf.where(is_text, word, -1), starts


def alignment_chunk(translator, tokenizer, source, ids):
    """Word alignments of the hypotheses `ids` int32 `[c, k, T]` of the sources `source`
    (ragged `[c, (tokens)]`) -> `(alignment [c, k, W], words [c, k])`.

    One teacher-forced pass over each hypothesis (`Transformer.attention_scores`, the same
    attention the model computes) gives the cross-attention of the translator's
    `alignment_layer`; averaged over heads, each target piece is aligned to the source text
    piece it attends to most (EOS and padding excluded). Pieces map to words (`word_indices`) on
    both sides, and each target word gets the source word that most of its pieces are aligned to
    (a tie: its first piece's). `alignment[..., j]` is target word `j`'s source word, -1 past
    the `words` words of the translation (`W = max_target_length`)."""
    c, k, width = tf.shape(ids)[0], tf.shape(ids)[1], tf.shape(ids)[2]
    settings = translator.settings
    flat = tf.reshape(ids, [-1, width])  # [r = c * k, T]
    source_ids = tf.repeat(source.to_tensor(default_value=settings.pad_id), k, axis=0)
    bos = tf.fill([c * k, 1], settings.bos_id)
    target_in = tf.concat([bos, flat[:, :-1]], axis=1)
    scores = translator.model.attention_scores(source_ids, target_in)["decoder_cross_attention"]
    cross = scores[translator.alignment_layer]  # [r, heads, T, S]
    attention = tf.reduce_mean(tf.cast(cross, tf.float32), axis=1)  # [r, T, S]

    def text_pieces(x):
        return tf.logical_and(tf.not_equal(x, settings.pad_id), tf.not_equal(x, settings.eos_id))

    source_text = text_pieces(source_ids)  # [r, S]
    attention = tf.where(source_text[:, None, :], attention, -1.0)
    source_word, _ = word_indices(tokenizer, source_ids, source_text)  # [r, S]
    piece = tf.argmax(attention, axis=-1, output_type=tf.int32)  # [r, T]
    aligned = tf.gather(source_word, piece, batch_dims=1)  # [r, T]: -1 without source text
    target_word, starts = word_indices(tokenizer, flat, text_pieces(flat))  # [r, T]
    words_out, words_in = translator.max_target_length, translator.max_source_length
    target_hot = tf.one_hot(target_word, words_out)  # [r, T, W]; -1 -> zeros
    source_hot = tf.one_hot(aligned, words_in)  # [r, T, S']
    votes = tf.einsum("rtw,rts->rws", target_hot, source_hot)
    # Half a vote more for the first piece's source word: a tie goes to it.
    first = source_hot * tf.cast(starts, tf.float32)[:, :, None]
    votes += 0.5 * tf.einsum("rtw,rts->rws", target_hot, first)
    best = tf.argmax(votes, axis=-1, output_type=tf.int32)  # [r, W]
    alignment = tf.where(tf.reduce_max(votes, axis=-1) > 0, best, -1)
    words = tf.reduce_sum(tf.cast(starts, tf.int32), axis=1)  # [r]
    return tf.reshape(alignment, [c, k, words_out]), tf.reshape(words, [c, k])
