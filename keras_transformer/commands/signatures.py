"""An exported SavedModel's signatures as Python functions, called exactly as TF Serving calls
them: `load_signature` (one signature by name: `score` for `keras-transformer score`) and
`load_serving_function` (the translation signature that a `translate` request names).

The checks of a request against the export (an n-best above the exported one, a sampling
setting other than the exported one) are made here, where the export is read.
"""

import hashlib
import json
import os
import sys

from keras_transformer.commands.flags import SAMPLING_FLAGS
from keras_transformer.errors import UsageError, first_line

_EXPORT_AGAIN = " (exported before this version of keras-transformer? export it again)"
_NO_SAMPLING = "{path} was exported without sampling: export it with --sampling-topk K"


def load_signature(model_path, key=None, missing=None):
    """The loaded SavedModel at `model_path` (a version directory or the model's base directory,
    where the highest version is taken) and one of its signatures.

    Args:
        model_path: the directory.
        key: the signature (None: `serving_default`).
        missing: the message (a format string of `path`) when the export has no such
            signature; by default it names the signature and, unless it is `serving_default`,
            suggests exporting again.

    Returns:
        `(loaded, path, concrete function)`; keep `loaded` alive while the function is used.
    """
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops the graph uses)

    from keras_transformer.export.saved_model import SIGNATURE_KEY, resolve_model_dir

    path = resolve_model_dir(model_path)
    try:
        loaded = tf.saved_model.load(path)
    except Exception as e:  # a broken or foreign directory: a user error, not a traceback
        raise UsageError(f"cannot load the SavedModel in {path}: {first_line(e)}") from None
    key = key or SIGNATURE_KEY
    function = loaded.signatures.get(key)
    if function is None:
        if missing is None:
            hint = _EXPORT_AGAIN if key != SIGNATURE_KEY else ""
            raise UsageError(f"{path} has no '{key}' signature{hint}")
        raise UsageError(missing.format(path=path))
    return loaded, path, function


def load_serving_function(model_path, n_best=None, prefix=None, sampling=None, constraints=None):
    """`texts -> (translations, scores)` through the translation signature a request names (at
    most one of `n_best`, `prefix`, `sampling`, `constraints`; the flags are checked by
    `flags.translate_request`).

    - No request: `serving_default`, a translation and its score per text.
    - `n_best`: `translate_nbest`; per text, a list of its first `n_best` translations and
      one of their scores, best first (`n_best` at most the number exported).
    - `prefix`: `translate_prefix`, every translation starting with `prefix`.
    - `sampling` (`{setting: value}`, `flags.sampling_request`): `translate_sample`. Each
      line's seed is a hash of `--seed` and its text, so a run repeats exactly (the same line
      twice in a run gets the same sample). The sampling settings are fixed at export:
      `sampling` must name the exported ones.
    - `constraints` (a list of terms per input line, in order): `translate_constrained`; each
      call takes the next rows, and a line whose terms cannot be met is said on stderr.

    The function's `loaded` attribute keeps the SavedModel alive as long as it is used.
    """
    import tensorflow as tf

    if sampling is not None:
        loaded, path, signature = load_signature(model_path, "translate_sample", _NO_SAMPLING)
        _check_sampling(path, sampling)
    else:
        key = None  # serving_default
        if n_best is not None:
            key = "translate_nbest"
        elif prefix is not None:
            key = "translate_prefix"
        elif constraints is not None:
            key = "translate_constrained"
        loaded, path, signature = load_signature(model_path, key)
    if n_best is not None:
        _check_n_best(path, signature, n_best)
    seed = (sampling or {}).get("seed", 0)
    terms = None if constraints is None else _Terms(constraints)

    def translate(texts):
        inputs = {"text": tf.constant(texts, dtype=tf.string)}
        if prefix is not None:
            inputs["prefix"] = tf.constant([prefix] * len(texts), dtype=tf.string)
        if sampling is not None:
            inputs["seed"] = tf.constant([_line_seed(seed, text) for text in texts], tf.int64)
        if constraints is not None:
            inputs["constraints"] = terms.next_rows(len(texts))
        outputs = signature(**inputs)
        if constraints is not None:
            terms.say_unmet(outputs["constraints_met"].numpy())
        if n_best is None:
            return _decoded(outputs["translation"].numpy()), outputs["score"].numpy().tolist()
        translations = [_decoded(row)[:n_best] for row in outputs["translations"].numpy()]
        return translations, [row[:n_best] for row in outputs["scores"].numpy().tolist()]

    translate.loaded = loaded
    return translate


def load_aligning_function(model_path, alignments=False, markup=None):
    """`texts -> (lines, scores)` through `serving_default` and its `alignment` output: with
    `alignments`, each line `TRANSLATION<TAB>i-j i-j ...` (Moses' word alignment, source word
    i, target word j); with `markup` ("html" or "xml"), the texts' tags carried into the
    translations by the `translate_markup` signature (`keras_transformer.markup.markup_answer`
    on `serving_default` for an export made before it; a malformed text's warning is one line
    on stderr)."""
    import tensorflow as tf

    loaded, path, signature = load_signature(model_path)
    if "alignment" not in signature.structured_outputs:
        raise UsageError(
            f"{path} was exported without word alignments (serving_default has no alignment "
            "output): export it with --alignments (export.alignments: true)"
        )

    from keras_transformer import markup as markups
    from keras_transformer.export.texts import aligned_values, marked_values

    def plain(texts):
        return aligned_values(signature(text=tf.constant(texts, dtype=tf.string)))

    def answer(texts):
        if markup is None:
            out = plain(texts)
        elif "translate_markup" in loaded.signatures:
            out = marked_values(loaded.signatures["translate_markup"], texts, markup)
        else:  # exported before the signature
            out = markups.markup_answer(plain, texts, markup, True)
        return out["translation"], out["score"], out["alignment"]

    translate = _aligning(answer, alignments, markup is not None)
    translate.loaded = loaded
    return translate


def load_litert_aligning_function(model_path, alignments=False, markup=None):
    """`load_aligning_function` for a LiteRT export made with its alignment graph
    (`LiteRTTranslator.translate(texts, alignments=True, markup=...)`), with no TensorFlow
    loaded."""
    translator = _litert_translator(model_path)
    if not translator.metadata.get("alignments"):
        raise UsageError(
            f"{model_path} was exported without word alignments (a LiteRT export without "
            "its alignment graph): export it with --alignments (export.alignments: true)"
        )

    def answer(texts):
        out = translator.translate(texts, alignments=True, markup=markup)
        return out["translation"], [float(score) for score in out["score"]], out["alignment"]

    return _aligning(answer, alignments, markup is not None)


def _aligning(answer, alignments, marked):
    """`texts -> (lines, scores)` (`load_aligning_function`) from `answer(texts) ->
    (translations, scores, alignments)` (an alignment per translation: its `(source word,
    target word)` pairs); with `marked`, each warning of malformed markup one line on stderr."""
    import sys
    import warnings

    from keras_transformer.alignment import format_pairs

    def translate(texts):
        if not marked:
            translations, scores, pairs = answer(texts)
        else:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                translations, scores, pairs = answer(texts)
            for warning in caught:
                print(f"warning: {warning.message}", file=sys.stderr)
        if alignments:
            translations = [
                f"{translation}\t{format_pairs(row)}"
                for translation, row in zip(translations, pairs)
            ]
        return translations, list(scores)

    return translate


def _litert_translator(model_path):
    """The `LiteRTTranslator` of `model_path`; `UsageError` for one that cannot load."""
    from keras_transformer.litert import LiteRTError, load

    try:
        return load(model_path)
    except (LiteRTError, OSError, ValueError) as e:
        raise UsageError(
            f"cannot load the LiteRT export in {model_path}: {first_line(e)}"
        ) from None


def load_litert_function(model_path, n_best=None, prefix=None, sampling=None, constraints=None):
    """`load_serving_function` for a LiteRT export (`keras_transformer.litert`): the same
    `texts -> (translations, scores)`, with no TensorFlow loaded (`constraints`: through
    `translate_constrained`, which needs an export made with its constrained step)."""
    if sampling is not None:
        raise UsageError(f"{model_path} is a LiteRT export: it searches and cannot sample")
    translator = _litert_translator(model_path)
    exported = int(translator.settings["n_best"])
    if n_best is not None and n_best > exported:
        raise UsageError(
            f"--n-best {n_best}: {model_path} was exported with {exported} hypotheses per input "
            "(export it again with --n-best, at most its --beam-size)"
        )
    if constraints is not None and not translator.metadata.get("constraints"):
        raise UsageError(
            f"--constraints: {model_path} is a LiteRT export without the constrained step "
            "(export it again with --constraints)"
        )
    terms = None if constraints is None else _Terms(constraints)

    def translate(texts):
        if constraints is not None:
            out = translator.translate_constrained(texts, terms.next_lists(len(texts)))
            terms.say_unmet(out["constraints_met"])
            return out["translation"], out["score"].tolist()
        if n_best is not None:
            out = translator.translate_nbest(texts)
            scores = [row[:n_best] for row in out["scores"].tolist()]
            return [row[:n_best] for row in out["translations"]], scores
        if prefix is not None:
            out = translator.translate_prefix(texts, [prefix] * len(texts))
        else:
            out = translator.translate(texts)
        return out["translation"], out["score"].tolist()

    translate.loaded = translator
    return translate


class _Terms:
    """`--constraints`' rows handed out in input order, and the lines whose terms were not met
    said on stderr."""

    def __init__(self, rows):
        self.rows = iter(rows)
        self.line = 0

    def next_lists(self, n):
        """The next `n` rows, lists of terms."""
        rows = [next(self.rows, None) for _ in range(n)]
        if any(row is None for row in rows):
            raise UsageError("--constraints: the file has fewer lines than the input")
        return [list(row) for row in rows]

    def next_rows(self, n):
        """The next `n` rows as tf.string `[n, C]`, padded with ""."""
        import tensorflow as tf

        rows = self.next_lists(n)
        width = max([1] + [len(row) for row in rows])
        return tf.constant([row + [""] * (width - len(row)) for row in rows], tf.string, [n, width])

    def say_unmet(self, met):
        for ok in met:
            self.line += 1
            if not ok:
                print(
                    f"keras-transformer: line {self.line}: its terms cannot be met; the "
                    "translation is unconstrained",
                    file=sys.stderr,
                )


def _decoded(texts):
    """The signature's UTF-8 strings as `str` (an invalid byte becomes U+FFFD)."""
    return [text.decode("utf-8", errors="replace") for text in texts]


def _check_n_best(path, signature, n_best):
    exported = signature.structured_outputs["translations"].shape[-1]
    if n_best > exported:
        raise UsageError(
            f"--n-best {n_best}: {path} was exported with {exported} hypotheses per input "
            "(export it again with --n-best, at most its --beam-size)"
        )


def _check_sampling(path, sampling):
    """`UsageError` unless each sampling flag given names the exported setting."""
    import tensorflow as tf

    with tf.io.gfile.GFile(os.path.join(path, "assets.extra", "keras_transformer.json")) as f:
        exported = json.load(f)
    for key, flag in SAMPLING_FLAGS.items():
        if key in sampling and sampling[key] != exported[key]:
            raise UsageError(
                f"{flag} {sampling[key]}: {path} samples with {flag} {exported[key]} (fixed at "
                f"export; export again with {flag} {sampling[key]})"
            )


def _line_seed(seed, text):
    """A line's int64 seed: a hash of `--seed` and the line's text, so that a line's sample
    depends on neither its position nor its batch (file translation sorts and resumes)."""
    digest = hashlib.blake2b(f"{seed}\0{text}".encode("utf-8", "replace"), digest_size=8)
    return int.from_bytes(digest.digest(), "little") >> 1
