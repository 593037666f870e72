"""The requests a translator answers, declared once: `TranslatorInterface`, which the SavedModel's
`keras_transformer.export.Translator` and the LiteRT runtime's
`keras_transformer.litert.LiteRTTranslator` both implement.

Each method either answers or refuses in one line (`refusal`: a `ValueError`) naming the export
that serves the feature: a LiteRT export has no soft glossary, no sampling and no `score`; a
SavedModel built without sampling, or whose vocabulary has no glossary tags, refuses those.

Example:
```python
for translator in (Translator(model, spm_bytes), litert.load("saved_models/copy-litert")):
    assert isinstance(translator, TranslatorInterface)
    translator.translate(["Guten Morgen."])["translation"]
```
"""

import abc


def refusal(message):
    """A function that refuses every call: `ValueError(message)` (one line)."""

    def refuse(*args, **kwargs):
        raise ValueError(message)

    return refuse


class TranslatorInterface(abc.ABC):
    """What a translator of an export answers, whatever the export. Texts are a list of str;
    the answers are dicts of per-text values (lists, numpy arrays or, from a SavedModel
    `Translator`'s signatures, tensors), in the request's order. A row's answer is its own.

    The SavedModel `Translator` serves each method but `translate` as the tf.function of the
    signature of that name (texts may be a tf.string tensor, as TF Serving sends them).
    """

    @abc.abstractmethod
    def translate(self, texts, glossary=None, constraints=None, alignments=False, markup=None):
        """`serving_default`: `{"translation", "score", ...}` of each text, its features asked
        by keyword: `glossary` (a soft glossary, SavedModel only), `constraints` (target-side
        terms per text), `alignments` (word alignment pairs), `markup` ("html" or "xml")."""

    @abc.abstractmethod
    def translate_nbest(self, texts):
        """`{"translations": [n][n_best], "scores", "token_scores", "confidence"}`, best
        first; the first column is `translate`'s answer."""

    @abc.abstractmethod
    def translate_prefix(self, texts, prefixes):
        """`{"translation", "score"}`, each translation starting with its prefix's pieces (an
        empty prefix: `translate`'s answer)."""

    @abc.abstractmethod
    def translate_constrained(self, texts, constraints):
        """`{"translation", "score", "constraints_met"}`: each translation holds every term of
        its row of `constraints` (target-side terms, rows padded with "", "" is no term) where
        `constraints_met`, else it is the unconstrained one."""

    @abc.abstractmethod
    def translate_glossary(self, texts, glossary_source, glossary_target):
        """`{"translation", "score", "annotated"}`: each source annotated with its row of the
        soft glossary (`glossary_source[i][j]` -> `glossary_target[i][j]`, rows padded with
        ""), for a vocabulary prepared with `data.terminology`."""

    @abc.abstractmethod
    def translate_sample(self, texts, seeds):
        """`{"translation", "score"}`, each translation sampled with its row's int64 seed (the
        same text and seed: the same translation), for an export made with sampling."""

    @abc.abstractmethod
    def score(self, sources, targets):
        """`{"log_probability", "length"}`: each target's log-probability under the model
        (its pieces and EOS, forced decoding) and its piece count."""

    @property
    @abc.abstractmethod
    def max_target_length(self):
        """The longest output (EOS included)."""
