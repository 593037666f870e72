"""Parallel corpora: reading `text:`, `tsv:`, `tfds:` and `synthetic:` corpus specs into pairs.

A corpus spec names where sentence pairs come from:

- `text:SRC_FILE,TGT_FILE`: two aligned plain-text files, one sentence per line.
- `tsv:FILE`: one pair per line, source TAB target (further TAB-separated columns are ignored,
  as in Tatoeba-style downloads that append attribution columns).
- `tfds:NAME[:SPLIT][,OPTION...]`: a TensorFlow Datasets translation dataset whose examples are
  dicts of two language strings, e.g. `tfds:wmt14_translate/de-en:train` or
  `tfds:ted_hrlr_translate/pt_to_en:validation`. SPLIT defaults to `train` and may use TFDS's
  slicing syntax (`train[:10%]`). The direction is the dataset's `supervised_keys` (for WMT and TED
  that is the order in the config name: `de-en` translates de -> en, `pt_to_en` pt -> en); the
  options `reverse` (swap it) or `src=KEY,tgt=KEY` choose another one, and `data_dir=DIR` sets
  the TFDS data directory.
- `synthetic:[OPTION=VALUE,...]`: the built-in generated corpus (see `synthetic.py`).

Cleaning is deliberate, never silent: lines are stripped of surrounding whitespace; a pair with an
empty side or with bytes that are not valid UTF-8 is skipped and counted, and one warning per
corpus reports the counts. Files with different numbers of lines raise `DataError` naming both
counts rather than pairing sentences that do not belong together. Lines are split on `\\n` only
(not on Unicode line separators such as U+2028, which `str.splitlines` would split on and so
misalign the two sides).
"""

import os
import sys
import warnings

from keras_transformer.errors import DataError, DataWarning

SPEC_KINDS = ("text", "tsv", "tfds", "synthetic")

# How often (in pairs) reading a large corpus reports progress.
_PROGRESS_EVERY = 200_000


def _progress(message, verbose):
    if verbose:
        print(message, file=sys.stderr, flush=True)


class _Counter:
    """Counts kept and skipped pairs of one corpus and reports them once."""

    def __init__(self, spec):
        self.spec = spec
        self.kept = 0
        self.empty = 0
        self.invalid_utf8 = 0
        self.malformed = 0

    @property
    def skipped(self):
        return self.empty + self.invalid_utf8 + self.malformed

    def add(self, source, target, pairs):
        """Appends the pair (both `bytes`) to `pairs` unless it must be skipped."""
        try:
            source = source.decode("utf-8").strip()
            target = target.decode("utf-8").strip()
        except UnicodeDecodeError:
            self.invalid_utf8 += 1
            return
        if not source or not target:
            self.empty += 1
            return
        pairs.append((source, target))
        self.kept += 1

    def report(self, verbose):
        _progress(f"read {self.kept} pairs from {self.spec} (skipped {self.skipped})", verbose)
        if self.skipped:
            details = [
                f"{count} {what}"
                for count, what in (
                    (self.empty, "with an empty side"),
                    (self.invalid_utf8, "with invalid UTF-8"),
                    (self.malformed, "without a TAB-separated target"),
                )
                if count
            ]
            warnings.warn(
                f"{self.spec}: skipped {self.skipped} of {self.kept + self.skipped} pairs "
                f"({', '.join(details)}); kept {self.kept}",
                DataWarning,
                stacklevel=3,
            )


def _read_lines(path):
    """The lines of a file as `bytes`, without line endings (a final newline adds no line)."""
    import tensorflow as tf  # gfile reads local paths and gs:// alike

    if not tf.io.gfile.exists(path):
        raise DataError(f"corpus file not found: {path}")
    if tf.io.gfile.isdir(path):
        raise DataError(f"corpus path is a directory, not a file: {path}")
    with tf.io.gfile.GFile(path, "rb") as f:
        data = f.read()
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark is not part of the text
        data = data[3:]
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def _split_text_files(rest, spec):
    """`SRC,TGT` -> (SRC, TGT); a comma inside a path is resolved by which files exist."""
    parts = rest.split(",")
    if len(parts) < 2 or not all(parts):
        raise DataError(f"corpus spec '{spec}' must look like text:SOURCE_FILE,TARGET_FILE")
    candidates = [(",".join(parts[:i]), ",".join(parts[i:])) for i in range(1, len(parts))]
    for source, target in candidates:
        if os.path.exists(source) and os.path.exists(target):
            return source, target
    return candidates[0] if len(candidates) == 1 else (parts[0], ",".join(parts[1:]))


def _read_text(rest, spec, verbose):
    source_path, target_path = _split_text_files(rest, spec)
    source_lines = _read_lines(source_path)
    target_lines = _read_lines(target_path)
    if len(source_lines) != len(target_lines):
        raise DataError(
            f"{spec}: the files have different numbers of lines: {source_path} has "
            f"{len(source_lines)}, {target_path} has {len(target_lines)}"
        )
    counter, pairs = _Counter(spec), []
    for source, target in zip(source_lines, target_lines):
        counter.add(source, target, pairs)
    counter.report(verbose)
    return pairs


def _read_tsv(rest, spec, verbose):
    if not rest:
        raise DataError(f"corpus spec '{spec}' must look like tsv:FILE")
    counter, pairs = _Counter(spec), []
    for line in _read_lines(rest):
        fields = line.split(b"\t")
        if len(fields) < 2:
            if line.strip():
                counter.malformed += 1
            else:
                counter.empty += 1
            continue
        counter.add(fields[0], fields[1], pairs)
    counter.report(verbose)
    return pairs


def _parse_tfds_spec(rest, spec):
    """`NAME[:SPLIT][,OPTION...]` -> (name, split, options)."""
    head, *option_texts = rest.split(",")
    name, _, split = head.partition(":")
    if not name:
        raise DataError(f"corpus spec '{spec}' must look like tfds:NAME[:SPLIT]")
    options = {}
    for text in option_texts:
        key, sep, value = text.partition("=")
        key = key.strip()
        if key == "reverse" and not sep:
            options["reverse"] = True
        elif key in ("src", "tgt", "data_dir") and sep and value:
            options[key] = value.strip()
        else:
            raise DataError(
                f"{spec}: unknown tfds option '{text}' (known: reverse, src=KEY, tgt=KEY, "
                "data_dir=DIR)"
            )
    return name, split or "train", options


def _tfds_keys(info, options, spec):
    """The (source, target) feature keys: options, else supervised_keys, else the only two."""
    features = list(info.features.keys()) if info.features is not None else []
    if "src" in options or "tgt" in options:
        if not ("src" in options and "tgt" in options):
            raise DataError(f"{spec}: give both src=KEY and tgt=KEY")
        keys = (options["src"], options["tgt"])
    elif info.supervised_keys and all(isinstance(k, str) for k in info.supervised_keys[:2]):
        keys = tuple(info.supervised_keys[:2])
    elif len(features) == 2:
        keys = tuple(features)
    else:
        raise DataError(f"{spec}: cannot tell the source and target features among {features}")
    missing = [k for k in keys if features and k not in features]
    if missing:
        raise DataError(f"{spec}: no feature named {missing[0]!r} (features: {features})")
    return keys[::-1] if options.get("reverse") else keys


def _read_tfds(rest, spec, verbose):
    name, split, options = _parse_tfds_spec(rest, spec)
    import tensorflow_datasets as tfds

    _progress(f"loading TensorFlow Datasets {name} split {split} ...", verbose)
    try:
        dataset, info = tfds.load(
            name, split=split, with_info=True, data_dir=options.get("data_dir")
        )
    except Exception as e:  # tfds raises many kinds; users need the message, not a traceback
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"{spec}: cannot load the TFDS dataset: {message}") from None
    source_key, target_key = _tfds_keys(info, options, spec)
    _progress(f"{name}: translating {source_key} -> {target_key}", verbose)
    counter, pairs = _Counter(spec), []
    for i, example in enumerate(dataset.as_numpy_iterator()):
        counter.add(example[source_key], example[target_key], pairs)
        if verbose and (i + 1) % _PROGRESS_EVERY == 0:
            _progress(f"  {i + 1} examples read ({counter.skipped} skipped) ...", verbose)
    counter.report(verbose)
    return pairs


def parse_spec(spec):
    """Splits a corpus spec into (kind, rest); raises `DataError` for an unknown kind."""
    if not isinstance(spec, str) or ":" not in spec:
        raise DataError(
            f"corpus spec {spec!r} must start with one of {', '.join(k + ':' for k in SPEC_KINDS)}"
        )
    kind, rest = spec.split(":", 1)
    if kind not in SPEC_KINDS:
        raise DataError(
            f"unknown corpus kind '{kind}' in '{spec}' (known: {', '.join(SPEC_KINDS)})"
        )
    return kind, rest.strip()


def read_pairs(spec, verbose=True):
    """Reads a corpus spec into a list of (source, target) sentence pairs.

    Args:
        spec: `text:SRC,TGT`, `tsv:FILE`, `tfds:NAME[:SPLIT][,OPTION...]` or `synthetic:...`
            (see the module docstring).
        verbose: print progress (counts of pairs read and skipped) to stderr.

    Returns:
        A list of `(source, target)` tuples of non-empty, stripped `str`.

    Raises:
        DataError: unknown spec kind, missing file, files with different line counts, TFDS
            dataset that cannot be loaded. Skipped pairs raise no error but one `DataWarning`.

    Example:
    >>> pairs = read_pairs("synthetic:split=dev,size=3")
    >>> len(pairs)
    3
    """
    kind, rest = parse_spec(spec)
    if kind == "text":
        return _read_text(rest, spec, verbose)
    if kind == "tsv":
        return _read_tsv(rest, spec, verbose)
    if kind == "tfds":
        return _read_tfds(rest, spec, verbose)
    from keras_transformer.data import synthetic

    pairs = synthetic.generate_from_spec(rest, spec)
    _progress(f"generated {len(pairs)} synthetic pairs ({spec})", verbose)
    return pairs
