"""`Translator`: strings in, strings out, everything in one TensorFlow graph.

The module holds the model's variables and an in-graph SentencePiece tokenizer (tensorflow-text,
built from the SentencePiece model proto), so a SavedModel of it needs no Python code of ours:
TF Serving, or any process importing `tensorflow` and `tensorflow_text`, can run it.
"""

import dataclasses

import keras
import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text
from keras import ops

from keras_transformer import glossary as glossaries
from keras_transformer import search_rules
from keras_transformer.config import UNK_ID, DecodingSettings, precisions
from keras_transformer.data.pipeline import encode_sources, valid_utf8
from keras_transformer.decoding.search import translate_ids
from keras_transformer.export import alignment_graph, markup_graph
from keras_transformer.export.warmup import bucket_lengths
from keras_transformer.fast_paths import Kernels
from keras_transformer.translating import TranslatorInterface, refusal

# The confidence's map before any calibration: sigmoid(1 + 2 * score), 0.5 at a score of -0.5
# (`set_calibration` replaces it with one fitted on a dev set).


# `translate_constrained`'s constraints: serving signatures take no ragged input, so a row of
# fewer terms is padded with "".
CONSTRAINTS = tf.TensorSpec([None, None], tf.string, name="constraints")
# `translate_markup`'s kind of markup of each text: "html" or "xml".
MARKUP = tf.TensorSpec([None], tf.string, name="markup")


def _graph(function, *specs):
    """`function` as a tf.function of these input specs (a signature)."""
    return tf.function(function, input_signature=list(specs), autograph=False)


def _fold_seeds(seeds):
    """int64 `[c]` -> int32 `[c]`: the high half XOR-ed into the low half."""
    folded = tf.bitwise.bitwise_xor(seeds, tf.bitwise.right_shift(seeds, 32))
    return tf.cast(tf.bitwise.bitwise_and(folded, 0xFFFFFFFF) - (1 << 31), tf.int32)


def _bucket(boundaries, value):
    """The smallest of the increasing ints `boundaries` that is at least `value` (an int32
    scalar tensor), or `value` itself beyond the last one."""
    boundaries = tf.constant(boundaries, tf.int32)
    index = tf.minimum(tf.searchsorted(boundaries, [value])[0], tf.size(boundaries) - 1)
    return tf.maximum(boundaries[index], value)


def _check_arguments(max_source_length, compiled_shortlist=False):
    """`Translator`'s refusals: another backend than TensorFlow, no source length, a shortlist
    under XLA (its width depends on the batch's words: no static shape)."""
    if compiled_shortlist:
        raise ValueError("a vocabulary shortlist does not compile with XLA yet (jit_compile)")
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            "exporting a Translator needs the TensorFlow backend (KERAS_BACKEND=tensorflow), "
            f"not {keras.backend.backend()!r}"
        )
    if int(max_source_length) < 1:
        raise ValueError(f"max_source_length must be at least 1, got {max_source_length}")


class _ShortlistTable(tf.Module):
    """A lexical table's `translations` and `frequent` as variables of the SavedModel (what
    `translate_ids`' `shortlist` reads), how it was built (`settings`) and the glossary tags'
    ids (`glossary_ids`, or None)."""

    def __init__(self, table, model, glossary_ids=None):
        super().__init__(name="shortlist")
        # `(<trans>, </term>)`'s ids where the vocabulary keeps the glossary tags: the pieces
        # between them in a source are its soft glossary's, which its row's shortlist holds.
        self.glossary_ids = glossary_ids
        translations = np.asarray(table.translations, np.int32)
        source_vocab_size = int(model.source_embedding.embeddings.shape[0])
        if translations.shape[0] != source_vocab_size:
            raise ValueError(
                f"the shortlist table has {translations.shape[0]} source rows, the model's "
                f"source vocabulary {source_vocab_size} pieces: built for another vocabulary"
            )
        self.translations = tf.Variable(translations, trainable=False, name="translations")
        self.frequent = tf.Variable(
            np.asarray(table.frequent, np.int32), trainable=False, name="frequent"
        )
        settings = dict(getattr(table, "settings", {}) or {})
        settings.update(k=int(translations.shape[1]), m=int(table.frequent.size))
        # In key order: a table built in this process and one read from its file (written
        # with sorted keys) give the same metadata.
        self.settings = _Untracked(dict(sorted(settings.items())))


def _shortlist_table(table, model, model_proto):
    """The `_ShortlistTable` of a lexical table (None: None), knowing the glossary tags' ids of
    the vocabulary `model_proto` where it keeps them: a soft glossary's target pieces enter
    its row's shortlist (`translate_ids`)."""
    if table is None:
        return None
    tags = glossary_tag_ids(model_proto)
    glossary_ids = None if tags is None else (tags[glossaries.SEPARATOR], tags[glossaries.END])
    return _ShortlistTable(table, model, glossary_ids)


class _Untracked:
    """Holds an object without making it part of the saved object graph."""

    def __init__(self, value):
        self.value = value


def reads_glossaries(model_proto):
    """Whether a SentencePiece model keeps the glossary tags (`keras_transformer.glossary.TAGS`)
    whole: the vocabulary of a model prepared with `data.terminology`."""
    return glossary_tag_ids(model_proto) is not None


def glossary_tag_ids(model_proto):
    """`{tag: id}` of the glossary tags (`keras_transformer.glossary.TAGS`) in a SentencePiece
    model, None where it does not keep each one whole."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=model_proto)
    ids = {tag: processor.piece_to_id(tag) for tag in glossaries.TAGS}
    return None if processor.unk_id() in ids.values() else ids


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


class Translator(tf.Module, TranslatorInterface):
    """A `Transformer` with its tokenizer and beam search as one string-to-string function, and
    `keras_transformer.translating.TranslatorInterface` (its requests by its signatures).

    Calling it (or its `serve` tf.function, the SavedModel's `serving_default` signature):
    1. replaces invalid UTF-8 with U+FFFD, so no input makes the graph fail;
    2. tokenizes with SentencePiece, truncates to `max_source_length - 1` tokens and appends EOS
       (the training layout);
    3. sorts the batch by length and decodes it in chunks of `batch_size` sentences (each chunk
       padded only to its own longest sentence, memory bounded for large requests);
    4. takes the log-probability of each output piece (`token_scores`), tracked with the
       hypotheses during the search (one forced-decoding pass over the outputs with the fast
       path `tracked_token_scores` off), and maps the score and the n-best margin to the
       calibrated `confidence` (never higher for a hypothesis ranked lower);
    5. detokenizes the best hypothesis of each input, and returns it with its scores in the
       original order.

    Args:
        model: a trained `keras_transformer.models.Transformer` (TensorFlow backend).
        tokenizer: the SentencePiece model as bytes, or an object with `.model_proto` (such as
            `keras_transformer.data.Tokenizer`).
        settings: the `keras_transformer.decoding.DecodingSettings` fixed in the graph (None:
            the defaults): beam size, length penalty, `n_best` (hypotheses of
            `translate_nbest`), `batch_size` (sentences decoded together inside the graph),
            sampling, special ids.
        max_source_length: longest source in tokens, EOS included (longer inputs are truncated).
        max_length: optional cap on the output length.
        jit_compile: compile the search (ids in, ids out; the string ops stay outside) with XLA.
            Faster decoding on CPUs (`docs/guides/performance.md`), but XLA compiles once per
            new chunk shape (sentences x longest source), and TF Serving runs XLA on a CPU only
            with `--xla_cpu_compilation_enabled=true`. Off by default.
        kernels: the search's fast paths (`keras_transformer.fast_paths.Kernels` or a setting;
            None: the model's `kernels`), chosen here once.
        shortlist: optional vocabulary shortlist's lexical table (`keras_transformer.data.
            shortlist.LexicalTable`): the searching signatures (`serving_default`,
            `translate_nbest`, `translate_prefix`, `translate_sample`) project and normalise
            over each chunk's shortlist only (`translate_ids`' `shortlist`), so their scores
            are log-probabilities over the shortlist; `score` keeps the whole vocabulary. Held
            in the SavedModel as two variables. Not with `jit_compile` (the shortlist's width
            is the batch's: no static shape). None (the default): the whole vocabulary.
        alignments: `serving_default` also returns each translation's word `alignment`
            (`export.alignment_graph`), at the cost of one more teacher-forced forward pass
            (encoder and decoder) per request, and the `translate_markup` signature; needed
            by `translate(alignments=..., markup=...)`. Off by default: `serving_default`
            then runs the search alone.
        alignment_layer: the decoder layer whose cross-attention gives the `alignment` (an
            index, negative from the end; -2, the default, is the second-to-last layer, the
            first one in a one-layer decoder).
        precision: the dtype the model is held and run in, one of `config.precisions()`: "float32"
            (the default) runs the model as given, with its own dtype policy; "bfloat16"
            decodes with `model.with_dtype("bfloat16")`, a copy whose weights are cast once to
            bfloat16 (half the bytes in the SavedModel and read at each step) and whose matrix
            products run in bfloat16: faster on CPUs with AVX512-BF16 or AMX (elsewhere
            TensorFlow emulates them: not measured, likely slower), and every signature's
            answers differ from float32's by bfloat16's rounding (scores and
            log-probabilities are still float32 tensors). Speed and BLEU:
            `docs/guides/export-serving.md`.
        **changes: fields of `settings` to replace (e.g. `beam_size=1`).

    Call arguments:
        text: tf.string `[batch]`.

    Returns:
        `{"translation": tf.string [batch], "score": tf.float32 [batch], "token_scores":
        tf.float32 [batch, length], "confidence": tf.float32 [batch]}` (and with `alignments`,
        "alignment": tf.int32 [batch, words]); the score is the
        length-normalised log-probability of the translation, `token_scores` the log-probability
        of each of its pieces and then of EOS (0-padded to the request's longest output; their
        sum is the score times the length penalty), `confidence` the calibrated estimate in
        [0, 1] of its quality (`set_calibration`), `alignment` for each word of the
        translation the index of the source word it came from (`export.alignment_graph`; -1
        padded to the request's most words, and -1 for a word aligned to nothing).

    More tf.functions become the SavedModel's other signatures (`signatures` lists all):
    - `translate_nbest(text)`: `{"translations": tf.string [batch, n_best], "scores": tf.float32
      [batch, n_best], "token_scores": [batch, n_best, length], "confidence": [batch, n_best]}`,
      best first; the first column equals `serve`'s answer.
    - `translate_prefix(text, prefix)`: `{"translation", "score"}` as `serve`, each translation
      starting with its prefix's pieces (forced, then the search continues; cut to leave room
      for EOS); the score is the continuation's (the prefix's log-probabilities are not
      counted); an empty prefix gives `serve`'s answer. Sizes that differ raise
      `InvalidArgumentError`.
    - `score(source, target)`: `{"log_probability": tf.float32 [batch], "length": tf.int32
      [batch]}`: the target's log-probability under the model (tokens and EOS, one forced-
      decoding pass) and its token count; sizes that differ raise `InvalidArgumentError`.
    - `translate_constrained(text, constraints)`: `{"translation", "score", "constraints_met"}`
      as `serve`, each translation holding every target-side term of its row of `constraints`
      (tf.string `[batch, C]`: serving signatures take no ragged input, so a row with fewer
      terms is padded with ""; "" is no term) as it tokenizes (SentencePiece, no BOS/EOS),
      found by a constrained beam search (`decoding.constraints`). `constraints_met` (bool) is
      False where they cannot be met (e.g. a term longer than the longest output): that
      translation is `serve`'s. Invalid UTF-8 in a term becomes U+FFFD; a term with a piece
      unknown to the vocabulary is unmeetable, so flagged. Row counts that differ raise
      `InvalidArgumentError`.
      `translate(texts, constraints=...)` calls it from Python.
    - `translate_sample(text, seed)`, only with `settings.sampling_topk > 0`: `{"translation",
      "score"}` as `serve`, each translation sampled (top-k, top-p, temperature fixed in the
      graph) with its row's int64 `seed`: the same text and seed give the same translation.
      Otherwise a function refusing in one line (`translating.refusal`), as `translate_glossary`
      is where the vocabulary keeps no glossary tags (`reads_glossaries`): saving traces every
      tf.function the translator holds.
    - `translate_markup(text, markup)`, only with `alignments`: `{"translation", "score",
      "alignment", "markup_valid"}` for texts with markup (`markup` tf.string `[batch]`,
      "html" or "xml" per text; anything else raises `InvalidArgumentError`, as sizes that
      differ do): the plain text of each (tags out, entities decoded) translated as `serve`
      translates it, then the tags put back around the target words aligned to the words they
      wrapped (`export.markup_graph`: the grammar and rules of `keras_transformer.markup`,
      whose Python answers it gives). `alignment` is over the plain words; `markup_valid` is
      False where the markup is malformed: that text is translated as plain text, its tags
      dropped. `translate(texts, markup=...)` calls it from Python.

    Example:
    ```python
    translator = Translator(model, tokenizer, DecodingSettings(beam_size=5))
    translator(tf.constant(["Guten Morgen."]))["translation"]
    tf.saved_model.save(translator, path, signatures=translator.signatures)
    ```
    """

    # The interface's requests: the signatures' tf.functions (or refusals), set in `__init__`.
    translate_nbest = translate_prefix = translate_constrained = score = None
    translate_glossary = translate_sample = None

    def __init__(
        self,
        model,
        tokenizer,
        settings=None,
        max_source_length=128,
        max_length=None,
        jit_compile=False,
        name=None,
        kernels=None,
        shortlist=None,
        alignments=False,
        alignment_layer=-2,
        precision="float32",
        **changes,
    ):
        super().__init__(name=name)
        _check_arguments(max_source_length, jit_compile and shortlist is not None)
        if precision not in precisions():
            choices = ", ".join(precisions())
            raise ValueError(f"precision must be one of {choices}, got {precision!r}")
        self.precision = precision
        if precision != "float32":
            model = model.with_dtype(precision)
        self._model = _Untracked(model)
        # Tracked so that the SavedModel holds them; the graph reads them through the model.
        self.model_variables = list(model.variables)
        # The SentencePiece op is created inside the traced graph (see `_tokenizer`), so the
        # model proto travels as an attribute of that op in the SavedModel.
        self._spm_proto = _model_proto(tokenizer)
        settings = DecodingSettings() if settings is None else settings
        self.settings = dataclasses.replace(settings, **changes) if changes else settings
        self.max_source_length = int(max_source_length)
        self.max_length = None if max_length is None else int(max_length)
        self.jit_compile = bool(jit_compile)
        self.kernels = Kernels.get(getattr(model, "kernels", None) if kernels is None else kernels)
        self.shortlist = _shortlist_table(shortlist, model, self._spm_proto)
        self.alignments = bool(alignments)
        self.alignment_layer = alignment_graph.alignment_layer(model, alignment_layer)
        # The search alone, compiled by XLA when asked: a nested function of every signature,
        # untracked (saving would trace it again per input structure and store those copies).
        search = tf.function(self._search_ids, jit_compile=self.jit_compile, autograph=False)
        self._search = _Untracked(search)
        # The confidence's map (see `set_calibration`); read as constants when a signature is
        # traced, so it must be set before the first call.
        self.calibration = dict(search_rules.DEFAULT_CALIBRATION)
        text_spec = tf.TensorSpec([None], tf.string, name="text")
        self.serve = tf.function(self._translate, input_signature=[text_spec], autograph=False)
        self.translate_prefix = _graph(
            self._translate_prefix, text_spec, tf.TensorSpec([None], tf.string, name="prefix")
        )
        self.translate_nbest = _graph(self._translate_nbest, text_spec)
        strings = [tf.TensorSpec([None], tf.string, name=name) for name in ("source", "target")]
        self.score = _graph(self._score, *strings)
        self.translate_constrained = _graph(self._translate_constrained, text_spec, CONSTRAINTS)
        self._optional_signatures(text_spec)

    def _optional_signatures(self, text_spec):
        """The signatures only some translators serve. One this translator does not serve is a
        refusal (`translate_markup`: None), no tf.function: saving traces every tf.function it
        holds, so it holds none that no signature runs."""
        seed_spec = tf.TensorSpec([None], tf.int64, name="seed")
        self.translate_sample = (
            _graph(self._translate_sample, text_spec, seed_spec)
            if self.settings.sampling
            else refusal("sampling is not served by this SavedModel; export one with "
                         "--sampling-topk K (decode.sampling_topk)")
        )  # fmt: skip
        # Markup rides on the alignments.
        self.markup_tables = markup_graph.Tables() if self.alignments else None
        self.translate_markup = (
            _graph(self._translate_markup, text_spec, MARKUP) if self.alignments else None
        )
        # Soft glossaries: only a vocabulary trained with data.terminology keeps their tags.
        self.reads_glossaries = reads_glossaries(self._spm_proto)
        self.translate_glossary = (
            self._glossary_function(text_spec)
            if self.reads_glossaries
            else refusal("soft glossaries are not served by this SavedModel (no glossary tags in "
                         "its vocabulary); export a SavedModel of a workdir prepared with "
                         "data.terminology")
        )  # fmt: skip

    def _glossary_function(self, text_spec):
        """The `translate_glossary` tf.function (`_translate_glossary`)."""
        return tf.function(
            self._translate_glossary,
            input_signature=[
                text_spec,
                tf.TensorSpec([None, None], tf.string, name="glossary_source"),
                tf.TensorSpec([None, None], tf.string, name="glossary_target"),
            ],
            autograph=False,
        )

    @property
    def signatures(self):
        """`{signature key: tf.function}` of every signature, for `tf.saved_model.save`."""
        signatures = {
            "serving_default": self.serve,
            "translate_nbest": self.translate_nbest,
            "translate_prefix": self.translate_prefix,
            "score": self.score,
            "translate_constrained": self.translate_constrained,
        }
        if self.settings.sampling:
            signatures["translate_sample"] = self.translate_sample
        if self.reads_glossaries:
            signatures["translate_glossary"] = self.translate_glossary
        if self.alignments:
            signatures["translate_markup"] = self.translate_markup
        return signatures

    def set_calibration(self, score_weight, margin_weight, bias):
        """Sets the confidence's map `sigmoid(bias + score_weight * score + margin_weight *
        n-best margin)` (weights >= 0: monotone in both, so along an n-best list, where both
        fall, the confidence never rises). Call it before the signatures are first traced
        (before calling or saving the translator)."""
        if score_weight < 0 or margin_weight < 0:
            raise ValueError("calibration weights must be >= 0 (a monotone map)")
        self.calibration = {
            "score_weight": float(score_weight),
            "margin_weight": float(margin_weight),
            "bias": float(bias),
        }

    @property
    def length_buckets(self):
        """The source lengths (tokens, EOS included) that the XLA export pads a chunk to, and
        that the warmup requests run (`export.warmup.bucket_lengths`)."""
        return bucket_lengths(self.max_source_length)

    @property
    def max_target_length(self):
        """The longest target (EOS included) that `score` reads: the longest output the model
        can produce."""
        longest_output = self.max_source_length + self.settings.max_extra_length
        return longest_output if self.max_length is None else min(self.max_length, longest_output)

    @property
    def model(self):
        return self._model.value

    def __call__(self, text):
        return self.serve(tf.convert_to_tensor(text, tf.string))

    def translate(self, texts, glossary=None, constraints=None, alignments=False, markup=None):
        """Translates a list of str; returns `{"translation": [str], "score": [float]}`.

        Args:
            texts: the sentences (a single str is one sentence; the answer still holds lists).
            glossary: None (`serve`), or a soft glossary for every text: one mapping `{source
                term: target term}` (or `(source, target)` pairs) for all, or a list of them,
                one per text. The `translate_glossary` signature annotates the sources with it
                (`keras_transformer.glossary`); the answer also holds `annotated` (bool per
                text: the annotation was used). An empty glossary answers as `serve`.
            constraints: None (`serve`), or hard constraints: one list of target-side terms
                per text (`[["term", ...], ...]`, `[]` for none) that its translation must
                hold (`translate_constrained`); the answer also holds `constraints_met` (bool
                per text: false where they could not all be met, and the translation is then
                the unconstrained one).
            alignments: the answer also holds `alignment`: per text, its word alignment as
                `(source word, target word)` pairs (Moses' `i-j`), words being those of the
                (plain) source and of the translation as SentencePiece reads them
                (`keras_transformer.word_rules`).
                Needs a Translator built with `alignments=True`.
            markup: "html" or "xml": the texts carry markup; the plain text is translated
                and the tags put back by the alignment (`keras_transformer.markup`). Malformed
                markup is translated as plain text with a `MarkupWarning`. Needs a
                Translator built with `alignments=True`.

        Raises:
            ValueError: a glossary with a model whose vocabulary lacks the glossary tags (not
                prepared with `data.terminology`); a glossary with constraints (annotate the
                texts with `keras_transformer.glossary.annotate` to use both); alignments or
                markup with either, or of a Translator built without `alignments`.
            keras_transformer.glossary.GlossaryError: a term refused (see `check_term`).
        """
        from keras_transformer.export import texts as python_values

        return python_values.translate(self, texts, glossary, constraints, alignments, markup)

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
        text = valid_utf8(text)
        return encode_sources(
            tokenizer, text, self.max_source_length, ragged=True, eos_id=self.settings.eos_id
        )

    def _search_chunk(self, source, prefix=None, seeds=None, constraints=None):
        """Ragged int32 `[c, (tokens)]` (and prefixes, or int64 `[c]` sampling seeds, or
        int32 `[c, C, P]` constraints) -> (int32 `[c, K, T]` hypotheses, EOS then padding,
        float32 `[c, K]` scores, float32 `[c, K, T]` log p of each token, and with constraints
        bool `[c]` whether they are met), best first; `K` = the beam size (1 when sampling). The
        token scores are tracked during the search (fast path `tracked_token_scores`), else None:
        `_token_log_probs` computes them by forced decoding."""
        pad_id = self.settings.pad_id
        tracked = self.kernels.uses("tracked_token_scores")
        inputs = (
            source.to_tensor(default_value=pad_id),  # [c, s_len]
            None if prefix is None else prefix.to_tensor(default_value=pad_id),
            None if seeds is None else _fold_seeds(seeds),
            constraints,
        )
        found = self._search.value(*self._shape_buckets(*inputs))
        outputs = [tf.convert_to_tensor(x) for x in found]
        if self.jit_compile:  # drop the padding rows' answers
            outputs = [x[: tf.shape(inputs[0])[0]] for x in outputs]
        ids, scores, token_scores = outputs[:3]
        return (ids, scores, (token_scores if tracked else None), *outputs[3:])

    def _shape_buckets(self, source, prefix, seed, constraints=None):
        """Under `jit_compile`, the chunk padded to a few shapes, so that XLA compiles a few
        programs: sources to the next source-length bucket (`length_buckets`, the lengths the
        warmup requests run) with padding (masked: the answers do not change), rows
        to the next power of two up to `batch_size` with copies of the first row (their answers
        are dropped). Otherwise the chunk as it is."""
        if not self.jit_compile:
            return source, prefix, seed, constraints
        sizes = [1]
        while sizes[-1] < self.settings.batch_size:
            sizes.append(min(2 * sizes[-1], self.settings.batch_size))
        width, rows = tf.shape(source)[1], tf.shape(source)[0]
        width_pad = _bucket(self.length_buckets, width) - width
        source = tf.pad(source, [[0, 0], [0, width_pad]], constant_values=self.settings.pad_id)
        extra = _bucket(sizes, rows) - rows

        def padded(x):
            return None if x is None else tf.concat([x, tf.repeat(x[:1], extra, axis=0)], 0)

        return padded(source), padded(prefix), padded(seed), padded(constraints)

    def _search_ids(self, source, prefix, seed, constraints=None):
        """`translate_ids`'s `DecodingResult` on padded int32 ids (`seed` None: search, else
        sample; with `constraints`, its `ConstrainedResult`)."""
        # Only `translate_sample` samples; the other signatures search.
        settings = self.settings if seed is not None else self.settings.without_sampling()
        return translate_ids(
            self.model,
            source,
            settings,
            max_length=self.max_length,
            return_all=True,
            prefix_ids=prefix,
            seed=0 if seed is None else seed,
            kernels=self.kernels,
            shortlist=self.shortlist,
            constraints=constraints,
        )

    def _token_log_probs(self, source, ids):
        """Forced decoding of the hypotheses: `source` ragged `[c, (tokens)]`, `ids` int32
        `[c, k, T]` -> float32 `[c, k, T]` log p of each output token (EOS included, 0 after)."""
        c, k, width = tf.shape(ids)[0], tf.shape(ids)[1], tf.shape(ids)[2]
        flat = tf.reshape(ids, [-1, width])  # [c * k, T]
        bos, pad_id = tf.fill([c * k, 1], self.settings.bos_id), self.settings.pad_id
        logits = self.model(
            {
                "source_ids": tf.repeat(source.to_tensor(default_value=pad_id), k, axis=0),
                "target_ids": tf.concat([bos, flat[:, :-1]], axis=1),
            },
            training=False,
        )  # [c * k, T, vocab]
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
        picked = tf.gather(log_probs, flat, axis=2, batch_dims=2)  # [c * k, T]
        picked = tf.where(tf.not_equal(flat, pad_id), picked, 0.0)
        return tf.reshape(picked, [c, k, width])

    def _margins(self, scores, keep):
        """float32 `[c, keep]`: the first `keep` hypotheses' n-best margins
        (`search_rules.nbest_margins`)."""
        return search_rules.nbest_margins(ops, scores)[:, :keep]

    def _confidence(self, scores, margins):
        """The calibrated confidence (`set_calibration`, `search_rules.confidence`)."""
        return search_rules.confidence(ops, self.calibration, scores, margins)

    def _decode_chunk(
        self, tokenizer, source, keep, prefix=None, seeds=None, constraints=None, alignments=False
    ):
        """Ragged int32 `[c, (tokens)]` -> `(text [c, keep], score [c, keep], token_scores
        [c, keep, W], margin [c, keep], length [c, keep])` of the `keep` best hypotheses;
        `W = max_target_length` (the widest output), token scores 0-padded; with `constraints`
        also `met` bool `[c]`; with `alignments`, `alignment_chunk`'s `(alignment [c, keep, W],
        words [c, keep])` last."""
        ids, scores, token_scores, *met = self._search_chunk(source, prefix, seeds, constraints)
        ids = ids[:, :keep]  # [c, keep, T]
        lengths = tf.reduce_sum(tf.cast(tf.not_equal(ids, self.settings.pad_id), tf.int32), -1)
        if token_scores is None:  # the plain form: one forced-decoding pass
            token_scores = self._token_log_probs(source, ids)  # [c, keep, T]
        else:
            token_scores = token_scores[:, :keep]  # [c, keep, T]
        width = self.max_target_length
        token_scores = tf.pad(token_scores, [[0, 0], [0, 0], [0, width - tf.shape(ids)[2]]])
        # Outputs hold tokens, EOS, then padding; only the tokens are text.
        flat = tf.reshape(ids, [-1, tf.shape(ids)[-1]])  # [c * keep, T]
        special = (self.settings.pad_id, self.settings.eos_id)
        is_text = tf.logical_and(tf.not_equal(flat, special[0]), tf.not_equal(flat, special[1]))
        text = tf.reshape(tokenizer.detokenize(tf.ragged.boolean_mask(flat, is_text)), [-1, keep])
        outputs = (text, scores[:, :keep], token_scores, self._margins(scores, keep), lengths)
        outputs += tuple(met)
        if alignments:
            outputs += alignment_graph.alignment_chunk(self, tokenizer, source, ids)
        return outputs

    def _in_chunks(self, run_chunk, inputs, lengths, shapes):
        """Runs `run_chunk` on `batch_size` rows of `inputs` at a time, similar lengths together.

        Args:
            run_chunk: `(*chunk_inputs) -> tuple of tensors`, each with the chunk's rows first.
            inputs: tuple of (ragged) tensors with `n` rows.
            lengths: int `[n]`, the sort key (less padding per chunk).
            shapes: `((dtype, row_shape), ...)` of `run_chunk`'s outputs (`row_shape` without
                the leading row dimension).

        Returns:
            The outputs for all `n` rows, in the original order.
        """
        n = tf.shape(lengths, out_type=tf.int32)[0]
        order = tf.argsort(lengths, stable=True)  # [n]
        inputs = tuple(tf.gather(x, order) for x in inputs)
        chunk = self.settings.batch_size
        num_chunks = (n + chunk - 1) // chunk

        def body(i, arrays):
            start = i * chunk
            outputs = run_chunk(*(x[start : start + chunk] for x in inputs))
            return i + 1, tuple(a.write(i, out) for a, out in zip(arrays, outputs))

        arrays = tuple(
            tf.TensorArray(dtype, size=num_chunks, infer_shape=False, element_shape=[None, *row])
            for dtype, row in shapes
        )
        _, arrays = tf.while_loop(lambda i, _: i < num_chunks, body, (tf.constant(0), arrays))
        inverse = tf.math.invert_permutation(order)
        results = []
        for array, (dtype, row) in zip(arrays, shapes):
            # An empty request has no chunk; concat() of an empty TensorArray needs a known shape.
            values = tf.cond(n > 0, array.concat, lambda: tf.zeros([0, *row], dtype))
            results.append(tf.ensure_shape(tf.gather(values, inverse), [None, *row]))
        return results

    def _hypotheses(self, text, keep, prefix=None, seeds=None, constraints=None, alignments=False):
        """`{text, score, token_scores, margin, length, confidence}` of the `keep` best
        hypotheses of every input, `[n, keep, ...]`; token scores cut to the longest output of
        the request. `seeds` (int64 `[n]`) samples instead of searching; `constraints`
        (tf.string `[n, C]`) constrains the search and adds `constraints_met` bool `[n]`. With
        `alignments`, also `alignment` `[n, keep, words]` (`alignment_chunk`), cut to the most
        words."""
        tokenizer = self._tokenizer()
        source = self._source_ids(tokenizer, text)  # [n, (tokens)]
        extra = {}  # the chunks' other inputs, rows sorted and cut as the sources
        if prefix is not None:
            extra["prefix"] = self._prefix_ids(tokenizer, prefix)
        if seeds is not None:
            extra["seeds"] = seeds
        met_shape = ()
        if constraints is not None:
            extra["constraints"] = self._constraint_ids(tokenizer, constraints)
            met_shape = ((tf.bool, []),)
        inputs = (source, *extra.values())
        width = self.max_target_length
        shapes = (
            (tf.string, [keep]),
            (tf.float32, [keep]),
            (tf.float32, [keep, width]),
            (tf.float32, [keep]),
            (tf.int32, [keep]),
            *met_shape,
        )
        if alignments:
            shapes += ((tf.int32, [keep, width]), (tf.int32, [keep]))
        text, score, token_scores, margin, lengths, *more = self._in_chunks(
            lambda *part: self._decode_chunk(
                tokenizer, part[0], keep, **dict(zip(extra, part[1:])), alignments=alignments
            ),
            inputs,
            source.row_lengths(),
            shapes,
        )
        longest = tf.reduce_max(tf.concat([tf.reshape(lengths, [-1]), [0]], 0))
        token_scores = token_scores[:, :, :longest]
        out = {
            "text": text,
            "score": score,
            "token_scores": token_scores,
            "margin": margin,
            "length": lengths,
            "confidence": self._confidence(score, margin),
        }
        met, aligned = (more[:1], more[1:]) if constraints is not None else ([], more)
        if met:
            out["constraints_met"] = met[0]
        if alignments:
            alignment, words = aligned
            most = tf.reduce_max(tf.concat([tf.reshape(words, [-1]), [0]], 0))
            out["alignment"] = alignment[:, :, :most]
        return out

    def _translate(self, text):
        out = self._hypotheses(text, 1, alignments=self.alignments)
        names = {"translation": "text", "score": "score", "token_scores": "token_scores"}
        names["confidence"] = "confidence"
        if self.alignments:
            names["alignment"] = "alignment"
        return {key: out[name][:, 0] for key, name in names.items()}

    def _translate_nbest(self, text):
        out = self._hypotheses(text, self.settings.hypotheses)
        return {
            "translations": out["text"],
            "scores": out["score"],
            "token_scores": out["token_scores"],
            "confidence": out["confidence"],
        }

    def _prefix_ids(self, tokenizer, prefix):
        """tf.string `[n]` -> int32 ragged `[n, (pieces)]`, cut so that EOS still fits."""
        prefix = valid_utf8(prefix)
        room = self.settings.max_extra_length
        if self.max_length is not None:
            room = min(room, self.max_length - 1)
        return tokenizer.tokenize(prefix)[:, : max(room, 0)]

    def _constraint_ids(self, tokenizer, constraints):
        """tf.string `[n, C]` -> int32 `[n, C', P]`, each constraint's pieces 0-padded (`C'`,
        `P` at least 1). Invalid UTF-8 becomes U+FFFD; a constraint with a piece unknown to the
        vocabulary is unmeetable; "" is no constraint. A constraint is cut to
        `max_target_length` pieces: one that long is unmeetable all the same (EOS must fit)."""
        constraints = valid_utf8(constraints)
        shape = tf.shape(constraints)  # [n, C]
        pieces = tokenizer.tokenize(tf.reshape(constraints, [-1]))  # [n * C, (pieces)]
        # A piece the vocabulary lacks never appears in an output: BOS, which is never
        # generated either, makes its constraint unmeetable (flagged, answered unconstrained).
        pieces = tf.ragged.map_flat_values(
            lambda x: tf.where(tf.equal(x, UNK_ID), self.settings.bos_id, x), pieces
        )
        pieces = pieces[:, : self.max_target_length].to_tensor(default_value=0)  # [n * C, P]
        ids = tf.reshape(pieces, [shape[0], shape[1], -1])
        at_least_one = tf.maximum(1 - tf.shape(ids), 0)  # C' and P at least 1
        return tf.pad(ids, [[0, 0], [0, at_least_one[1]], [0, at_least_one[2]]])

    @staticmethod
    def _same_size(signature, text, other, name, what):
        """`text`, once checked to have as many rows as `other`: unequal sizes are the caller's
        error (INVALID_ARGUMENT, as in `score`)."""
        sizes_match = tf.debugging.Assert(
            tf.equal(tf.size(text), tf.size(other)),
            [f"{signature}: text has", tf.size(text), f"strings but {name} has",
             tf.size(other), f"{what}; they must be the same"],
        )  # fmt: skip
        with tf.control_dependencies([sizes_match]):
            return tf.identity(text)

    def _translate_prefix(self, text, prefix):
        text = self._same_size("translate_prefix", text, prefix, "prefix", "strings")
        out = self._hypotheses(text, 1, prefix)
        return {"translation": out["text"][:, 0], "score": out["score"][:, 0]}

    def _translate_constrained(self, text, constraints):
        rows = tf.debugging.Assert(
            tf.equal(tf.size(text), tf.shape(constraints)[0]),
            ["translate_constrained: text has", tf.size(text), "strings but constraints has",
             tf.shape(constraints)[0], "rows; they must be the same"],
        )  # fmt: skip
        with tf.control_dependencies([rows]):
            text = tf.identity(text)
        out = self._hypotheses(text, 1, constraints=constraints)
        return {
            "translation": out["text"][:, 0],
            "score": out["score"][:, 0],
            "constraints_met": out["constraints_met"],
        }

    def _translate_markup(self, text, markup):
        """`translate_markup` (the class docstring): `markup_graph.translate_markup` around
        `serve`'s search and alignments."""
        text = self._same_size("translate_markup", text, markup, "markup", "kinds")

        def translate(plain):
            out = self._hypotheses(plain, 1, alignments=True)
            return out["text"][:, 0], out["score"][:, 0], out["alignment"][:, 0]

        return markup_graph.translate_markup(translate, text, markup, self.markup_tables)

    def _translate_sample(self, text, seed):
        text = self._same_size("translate_sample", text, seed, "seed", "seeds")
        out = self._hypotheses(text, 1, seeds=seed)
        return {"translation": out["text"][:, 0], "score": out["score"][:, 0]}

    def _translate_glossary(self, text, glossary_source, glossary_target):
        """`serve`'s translation and score of each text annotated with its row of the glossary
        (`glossary.annotate_graph`), and `annotated`: whether its annotation changed it and
        fits the source length limit (else the text is translated as it is)."""
        rows = tf.zeros(tf.shape(glossary_source)[:1], tf.int8)
        text = self._same_size("translate_glossary", text, rows, "glossary_source", "rows")
        sizes_match = tf.debugging.assert_equal(
            tf.shape(glossary_source), tf.shape(glossary_target),
            message="translate_glossary: glossary_source and glossary_target differ in shape",
        )  # fmt: skip

        with tf.control_dependencies([sizes_match]):
            text = valid_utf8(text)
        annotated = glossaries.annotate_graph(
            text, valid_utf8(glossary_source), valid_utf8(glossary_target)
        )
        # An annotation the source length limit would cut: the text as it is (flag false).
        pieces = self._tokenizer().tokenize(annotated).row_lengths()
        fits = pieces <= self.max_source_length - 1
        used = tf.logical_and(fits, tf.not_equal(annotated, text))
        out = self._hypotheses(tf.where(fits, annotated, text), 1)
        return {
            "translation": out["text"][:, 0],
            "score": out["score"][:, 0],
            "annotated": used,
        }

    # ------------------------------------------------------------------ scoring

    def _target_ids(self, tokenizer, text):
        """tf.string `[n]` -> (decoder inputs BOS + pieces, labels pieces + EOS), int32 ragged
        `[n, (tokens)]`: the training layout, pieces truncated to `max_target_length - 1`."""
        text = valid_utf8(text)
        pieces = tokenizer.tokenize(text)[:, : self.max_target_length - 1]
        column = tf.ones([pieces.nrows(), 1], tf.int32)
        bos = tf.RaggedTensor.from_tensor(column * self.settings.bos_id)
        eos = tf.RaggedTensor.from_tensor(column * self.settings.eos_id)
        return tf.concat([bos, pieces], axis=1), tf.concat([pieces, eos], axis=1)

    def _score_chunk(self, source, decoder_input, labels):
        """Ragged chunks -> (float32 `[c]` summed label log-probabilities, int32 `[c]` lengths)."""
        logits = self.model(
            {
                "source_ids": source.to_tensor(default_value=self.settings.pad_id),
                "target_ids": decoder_input.to_tensor(default_value=self.settings.pad_id),
            },
            training=False,
        )  # [c, t_len, vocab]
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
        label_ids = labels.to_tensor(default_value=self.settings.pad_id)  # [c, t_len]
        picked = tf.gather(log_probs, label_ids, axis=2, batch_dims=2)  # [c, t_len]
        # Ragged -> dense padded with pad_id; the row lengths say which positions are real.
        lengths = tf.cast(labels.row_lengths(), tf.int32)  # [c]
        real = tf.sequence_mask(lengths, tf.shape(label_ids)[1], dtype=tf.float32)
        return tf.reduce_sum(picked * real, axis=1), lengths

    def _score(self, source, target):
        # A request with unequal sizes is the caller's error: TF Serving answers it with an
        # INVALID_ARGUMENT status naming both sizes, and keeps serving.
        num_sources, num_targets = tf.size(source), tf.size(target)
        sizes_match = tf.debugging.Assert(
            tf.equal(num_sources, num_targets),
            ["score: source has", num_sources, "strings but target has", num_targets,
             "strings; they must be the same"],
        )  # fmt: skip
        with tf.control_dependencies([sizes_match]):
            source = tf.identity(source)
        tokenizer = self._tokenizer()
        source_ids = self._source_ids(tokenizer, source)  # [n, (tokens)]
        decoder_input, labels = self._target_ids(tokenizer, target)  # [n, (tokens)] each
        log_probability, length = self._in_chunks(
            self._score_chunk,
            (source_ids, decoder_input, labels),
            source_ids.row_lengths() + decoder_input.row_lengths(),
            ((tf.float32, []), (tf.int32, [])),
        )
        return {"log_probability": log_probability, "length": length}
