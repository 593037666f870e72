"""`Translator.translate`: Python strings in, Python values out, through the signatures (the
one road of the Python API; the graph does the work)."""

import warnings

import tensorflow as tf

from keras_transformer import glossary as glossaries
from keras_transformer.alignment_rules import word_pairs


def translate(translator, texts, glossary=None, constraints=None, alignments=False, markup=None):
    """`Translator.translate` (its docstring)."""
    texts = [texts] if isinstance(texts, str) else [str(t) for t in texts]
    if glossary is not None and constraints is not None:
        raise ValueError(
            "give a glossary or constraints, not both (for both: annotate the texts with "
            "keras_transformer.glossary.annotate, then pass the constraints)"
        )
    aligned = alignments or markup is not None
    if aligned and (glossary is not None or constraints is not None):
        raise ValueError("alignments and markup come from serving_default: not with a "
                         "glossary or constraints")  # fmt: skip
    if aligned:
        return _aligned(translator, texts, alignments, markup)
    if constraints is not None:
        return _constrained(translator, texts, constraints)
    if glossary is None:
        return _values(translator(texts), "translation", "score")
    if not translator.reads_glossaries:
        raise ValueError(
            "this model's vocabulary has no glossary tags "
            f"{' '.join(glossaries.TAGS)}: it was not prepared with data.terminology"
        )
    one_per_text = isinstance(glossary, (list, tuple)) and bool(glossary)
    one_per_text = one_per_text and all(hasattr(g, "items") for g in glossary)
    per_text = list(glossary) if one_per_text else [glossary] * len(texts)
    if len(per_text) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(per_text)} glossaries")
    sources, targets = glossaries.padded(per_text)
    width = max((len(row) for row in sources), default=0)
    shape = [len(texts), width]
    out = translator.translate_glossary(
        tf.constant(texts, tf.string),
        tf.reshape(tf.constant(sources, tf.string), shape),
        tf.reshape(tf.constant(targets, tf.string), shape),
    )
    answer = _values(out, "translation", "score", "annotated")
    skipped = glossaries.not_used(texts, per_text, answer["annotated"])
    if skipped:
        warnings.warn(glossaries.too_long_warning(skipped), stacklevel=3)  # the caller's
    return answer


def _aligned(translator, texts, alignments, markup):
    """`translate(texts, alignments=..., markup=...)` through `serving_default`'s
    `alignment` output (markup: the `translate_markup` signature)."""
    if not translator.alignments:
        raise ValueError(
            "this Translator has no word alignments: build it with alignments=True (an "
            "export: keras-transformer export --alignments, or export.alignments: true)"
        )

    if markup is not None:
        return _marked(translator, texts, markup, alignments)
    return aligned_values(translator(texts))  # alignments alone


def _marked(translator, texts, kind, alignments):
    """`translate(texts, markup=kind)` by the `translate_markup` signature."""
    from keras_transformer.markup import check_kind

    check_kind(kind)
    values = marked_values(translator.translate_markup, texts, kind)
    return values if alignments else {k: values[k] for k in ("translation", "score")}


def marked_values(translate_markup, texts, kind):
    """`{"translation", "score", "alignment"}` (Python values; the alignments as `(source
    word, target word)` pairs) of the `translate_markup` function or signature for `texts`
    with markup of `kind`, and a `MarkupWarning` for each malformed text
    (`markup.plain_text`'s): `Translator.translate(markup=...)` and `translate --markup`."""
    from keras_transformer import markup

    out = translate_markup(
        text=tf.constant(texts, tf.string), markup=tf.constant([kind] * len(texts), tf.string)
    )
    for text, valid in zip(texts, out["markup_valid"].numpy()):
        if not valid:
            markup.plain_text(text, kind)  # warns why
    return aligned_values(out)


def aligned_values(outputs):
    """`{"translation", "score", "alignment"}` of a signature's outputs as Python values, the
    alignments as `(source word, target word)` pairs (`alignment_rules.word_pairs`)."""
    values = _values(outputs, "translation", "score", "alignment")
    values["alignment"] = [word_pairs(row) for row in values["alignment"]]
    return values


def _constrained(translator, texts, constraints):
    """`translate(texts, constraints=...)`: `translate_constrained` on the rows padded."""
    rows = [list(row) for row in constraints]
    if len(rows) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(rows)} rows of constraints")
    width = max([1] + [len(row) for row in rows])
    padded = [row + [""] * (width - len(row)) for row in rows]
    out = translator.translate_constrained(
        tf.constant(texts, tf.string), tf.constant(padded, tf.string, [len(rows), width])
    )
    return _values(out, "translation", "score", "constraints_met")


def _values(out, *names):
    """A signature's outputs `names` as Python lists, the translations decoded to str."""
    values = {name: out[name].numpy().tolist() for name in names}
    if "translation" in values:
        values["translation"] = [t.decode("utf-8", "replace") for t in values["translation"]]
    return values
