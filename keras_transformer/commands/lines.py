"""The lines the SavedModel commands read and write: `read_lines` (an input file, whole) and the
one writer of output lines, `output_rows` (what each input becomes: its translation, its n-best
lines or its score), which `output_lines` applies batch by batch."""

import os

from keras_transformer.errors import UsageError


def read_lines(path, what):
    """The lines of a UTF-8 text file (line ends stripped); a one-line error naming `what`
    if it is missing or unreadable."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} file not found: {path}")
    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            return [line.rstrip("\r\n") for line in f.read().splitlines()]
    except OSError as e:
        raise UsageError(f"cannot read {what} file {path}: {e.strerror}") from None


def output_rows(translations, scores, n_best=None):
    """The output lines of each input (a list per input), as `translate` prints them and
    writes them to a file, and as `score` prints them.

    Args:
        translations: a translation per input; with `n_best`, a list of them per input, best
            first; None for `score`.
        scores: their scores (`score`: the log-probabilities).
        n_best: set for `translate --n-best`.

    Returns:
        Per input: `[translation]`; with `n_best`, a line `SCORE<TAB>TRANSLATION` per
        hypothesis; without translations, `[SCORE]`. Scores are written with six decimals.
    """
    if translations is None:
        return [[f"{score:.6f}"] for score in scores]
    if n_best is None:
        return [[translation] for translation in translations]
    return [
        [f"{score:.6f}\t{text}" for score, text in zip(row_scores, row)]
        for row, row_scores in zip(translations, scores)
    ]


def output_lines(translate, texts, batch_size, n_best=None):
    """The output lines of `texts` (`output_rows`), translated by `translate` (a
    `signatures.load_serving_function`) in batches of `batch_size`, in order."""
    for start in range(0, len(texts), batch_size):
        for row in output_rows(*translate(texts[start : start + batch_size]), n_best):
            yield from row
