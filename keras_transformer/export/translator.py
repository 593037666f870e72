"""`Translator`: strings in, strings out, everything in one TensorFlow graph.

The module holds the model's variables and an in-graph SentencePiece tokenizer (tensorflow-text,
built from the SentencePiece model proto), so a SavedModel of it needs no Python code of ours:
TF Serving, or any process importing `tensorflow` and `tensorflow_text`, can run it.
"""

import keras
import tensorflow as tf
import tensorflow_text as tf_text

from keras_transformer.data.pipeline import encode_sources
from keras_transformer.decoding.search import translate_ids


class _Untracked:
    """Holds an object without making it part of the saved object graph."""

    def __init__(self, value):
        self.value = value


def _model_proto(tokenizer):
    if isinstance(tokenizer, (bytes, bytearray)):
        return bytes(tokenizer)
    proto = getattr(tokenizer, "model_proto", None)
    if proto is None and getattr(tokenizer, "model_path", None):
        with open(tokenizer.model_path, "rb") as f:
            proto = f.read()
    if proto is None:
        raise ValueError("tokenizer must be SentencePiece model bytes or have .model_proto")
    return bytes(proto)


class Translator(tf.Module):
    """A `Transformer` with its tokenizer and beam search as one string-to-string function.

    Calling it (or its `serve` tf.function, the SavedModel's `serving_default` signature):
    1. replaces invalid UTF-8 with U+FFFD, so no input makes the graph fail;
    2. tokenizes with SentencePiece, truncates to `max_source_length - 1` tokens and appends EOS
       (the training layout);
    3. sorts the batch by length and decodes it in chunks of `batch_size` sentences (each chunk
       padded only to its own longest sentence, memory bounded for large requests);
    4. detokenizes the best hypothesis of each input, and returns it with its score in the
       original order.

    Args:
        model: a trained `keras_transformer.models.Transformer` (TensorFlow backend).
        tokenizer: the SentencePiece model as bytes, or an object with `.model_proto` (such as
            `keras_transformer.data.Tokenizer`).
        beam_size: beams per sentence (1 = greedy); fixed in the graph.
        alpha: length-penalty exponent; fixed in the graph.
        max_extra_length: outputs stop at the source length plus this.
        max_source_length: longest source in tokens, EOS included (longer inputs are truncated).
        batch_size: sentences decoded together inside the graph.
        max_length: optional cap on the output length.
        bos_id, eos_id, pad_id: special token ids (SentencePiece trained with them).

    Call arguments:
        text: tf.string `[batch]`.

    Returns:
        `{"translation": tf.string [batch], "score": tf.float32 [batch]}`; the score is the
        length-normalised log-probability of the translation.

    Example:
    ```python
    translator = Translator(model, tokenizer, beam_size=4, alpha=0.6)
    translator(tf.constant(["Guten Morgen."]))["translation"]
    tf.saved_model.save(translator, path, signatures={"serving_default": translator.serve})
    ```
    """

    def __init__(
        self,
        model,
        tokenizer,
        beam_size=4,
        alpha=0.6,
        max_extra_length=50,
        max_source_length=128,
        batch_size=32,
        max_length=None,
        bos_id=2,
        eos_id=3,
        pad_id=0,
        name=None,
    ):
        super().__init__(name=name)
        if keras.backend.backend() != "tensorflow":
            raise RuntimeError(
                "exporting a Translator needs the TensorFlow backend (KERAS_BACKEND=tensorflow), "
                f"not {keras.backend.backend()!r}"
            )
        if int(max_source_length) < 1:
            raise ValueError(f"max_source_length must be at least 1, got {max_source_length}")
        self._model = _Untracked(model)
        # Tracked so that the SavedModel holds them; the graph reads them through the model.
        self.model_variables = list(model.variables)
        # The SentencePiece op is created inside the traced graph (see `_tokenizer`), so the
        # model proto travels as an attribute of that op in the SavedModel.
        self._spm_proto = _model_proto(tokenizer)
        self.beam_size = int(beam_size)
        self.alpha = float(alpha)
        self.max_extra_length = int(max_extra_length)
        self.max_source_length = int(max_source_length)
        self.batch_size = max(1, int(batch_size))
        self.max_length = None if max_length is None else int(max_length)
        self.bos_id, self.eos_id, self.pad_id = int(bos_id), int(eos_id), int(pad_id)
        self.serve = tf.function(
            self._translate,
            input_signature=[tf.TensorSpec([None], tf.string, name="text")],
            autograph=False,
        )

    @property
    def model(self):
        return self._model.value

    def __call__(self, text):
        return self.serve(tf.convert_to_tensor(text, tf.string))

    # ------------------------------------------------------------------ graph pieces

    def _tokenizer(self):
        """A tensorflow-text SentencePiece tokenizer built in the graph being traced.

        Its resource belongs to the graph's own kernel. One created eagerly would belong to the
        eager context and vanish when TensorFlow clears its kernel cache (`tf.random.set_seed`,
        hence `keras.utils.set_random_seed`, does), breaking the traced function.
        """
        return tf_text.SentencepieceTokenizer(model=self._spm_proto, out_type=tf.int32)

    def _source_ids(self, tokenizer, text):
        """tf.string `[n]` -> int32 ragged `[n, (tokens)]`, each ending in EOS."""
        text = tf.strings.unicode_transcode(
            text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
        )
        return encode_sources(
            tokenizer, text, self.max_source_length, ragged=True, eos_id=self.eos_id
        )

    def _decode_chunk(self, tokenizer, source):
        """Ragged int32 `[c, (tokens)]` -> (tf.string `[c]`, float32 `[c]`)."""
        source_ids = source.to_tensor(default_value=self.pad_id)  # [c, s_len]
        ids, scores = translate_ids(
            self.model,
            source_ids,
            beam_size=self.beam_size,
            alpha=self.alpha,
            max_extra_length=self.max_extra_length,
            bos_id=self.bos_id,
            eos_id=self.eos_id,
            max_length=self.max_length,
            pad_id=self.pad_id,
        )
        ids = tf.convert_to_tensor(ids)
        # Outputs hold tokens, EOS, then padding; only the tokens are text.
        keep = tf.logical_and(tf.not_equal(ids, self.pad_id), tf.not_equal(ids, self.eos_id))
        text = tokenizer.detokenize(tf.ragged.boolean_mask(ids, keep))
        return tf.reshape(text, [-1]), tf.reshape(tf.convert_to_tensor(scores), [-1])

    def _translate(self, text):
        tokenizer = self._tokenizer()
        source = self._source_ids(tokenizer, text)  # [n, (tokens)]
        n = source.nrows(out_type=tf.int32)
        # Similar lengths together: less padding per chunk.
        order = tf.argsort(source.row_lengths(), stable=True)  # [n]
        source = tf.gather(source, order)
        chunk = self.batch_size
        num_chunks = (n + chunk - 1) // chunk

        def body(i, texts, scores):
            start = i * chunk
            part_text, part_scores = self._decode_chunk(tokenizer, source[start : start + chunk])
            return i + 1, texts.write(i, part_text), scores.write(i, part_scores)

        texts = tf.TensorArray(tf.string, size=num_chunks, infer_shape=False, element_shape=[None])
        scores = tf.TensorArray(
            tf.float32, size=num_chunks, infer_shape=False, element_shape=[None]
        )
        _, texts, scores = tf.while_loop(
            lambda i, *_: i < num_chunks, body, (tf.constant(0), texts, scores)
        )
        # An empty request has no chunk; concat() of an empty TensorArray needs a known shape.
        texts = tf.cond(n > 0, lambda: texts.concat(), lambda: tf.zeros([0], tf.string))
        scores = tf.cond(n > 0, lambda: scores.concat(), lambda: tf.zeros([0], tf.float32))
        inverse = tf.math.invert_permutation(order)
        return {
            "translation": tf.ensure_shape(tf.gather(texts, inverse), [None]),
            "score": tf.ensure_shape(tf.gather(scores, inverse), [None]),
        }
