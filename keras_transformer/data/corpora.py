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

`data.train` may also be a list of specs (`training_specs`), each optionally led by a number of
copies and a tag: `[N*][bt:]SPEC`. `N*` repeats the corpus N times in the stream (oversampling a
small corpus beside a large one; `2*text:a.en,a.de`); `bt:` marks synthetic (back-translated)
pairs, whose sources are led by the reserved tag `<BT>` (Caswell et al. 2019, "Tagged
Back-Translation"): one SentencePiece piece (a user-defined symbol of a vocabulary trained on
such a list), so the model tells synthetic sources from real ones. Text to translate never
carries the tag: real input is untagged, as the real pairs were in training.

Cleaning is deliberate, never silent: lines are stripped of surrounding whitespace; a pair with an
empty side or with bytes that are not valid UTF-8 is skipped and counted, and one warning per
corpus reports the counts. Files with different numbers of lines raise `DataError` naming both
counts rather than pairing sentences that do not belong together. Lines are split on `\\n` only
(not on Unicode line separators such as U+2028, which `str.splitlines` would split on and so
misalign the two sides).
"""

import os
import re
import sys
import warnings

from keras_transformer.errors import DataError, DataWarning, first_line

SPEC_KINDS = ("text", "tsv", "tfds", "synthetic")
# Tagged back-translation: the prefix of a tagged spec in data.train, and the reserved piece that
# leads the sources of its pairs (`iter_training_pairs` yields them as `TAG_PREFIX + source`).
TAGGED = "bt:"
TAG = "<BT>"
TAG_PREFIX = TAG + " "
_COPIES = re.compile(r"^([0-9]+)\*(.*)$", re.DOTALL)

# How often (in pairs) reading a large corpus reports progress.
_PROGRESS_EVERY = 200_000


def _progress(message, verbose):
    if verbose:
        print(message, file=sys.stderr, flush=True)


class Counter:
    """Counts kept and skipped pairs of one corpus and reports them once.

    Attributes:
        spec: the corpus spec.
        lines: input lines (pairs) seen, kept or not.
        kept, empty, invalid_utf8, malformed: pairs kept, and skipped by reason.
    """

    def __init__(self, spec):
        self.spec = spec
        self.lines = 0
        self.kept = 0
        self.empty = 0
        self.invalid_utf8 = 0
        self.malformed = 0

    @property
    def skipped(self):
        return self.empty + self.invalid_utf8 + self.malformed

    def skipped_by_reason(self):
        """`{"empty": n, "invalid_utf8": n, "malformed": n}`."""
        return {"empty": self.empty, "invalid_utf8": self.invalid_utf8, "malformed": self.malformed}

    def clean(self, source, target):
        """The pair (both `bytes`) decoded and stripped, or None when it must be skipped."""
        self.lines += 1
        try:
            source = source.decode("utf-8").strip()
            target = target.decode("utf-8").strip()
        except UnicodeDecodeError:
            self.invalid_utf8 += 1
            return None
        if not source or not target:
            self.empty += 1
            return None
        self.kept += 1
        return source, target

    def report(self, verbose, stacklevel=3):
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
                stacklevel=stacklevel,
            )


def _iter_lines(path):
    """Yields the lines of a file as `bytes`, without line endings, one at a time (the file is
    never held in memory). Lines are split on `\\n` only; a final newline adds no line."""
    import tensorflow as tf  # gfile reads gs:// and other remote paths

    if "://" in path:
        if not tf.io.gfile.exists(path):
            raise DataError(f"corpus file not found: {path}")
        if tf.io.gfile.isdir(path):
            raise DataError(f"corpus path is a directory, not a file: {path}")
        opened = tf.io.gfile.GFile(path, "rb")
    else:
        # Python's own buffered reader is several times faster than GFile line by line.
        if not os.path.exists(path):
            raise DataError(f"corpus file not found: {path}")
        if os.path.isdir(path):
            raise DataError(f"corpus path is a directory, not a file: {path}")
        opened = open(path, "rb")
    with opened as f:
        first = True
        for line in f:
            if first:
                first = False
                if line.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark is not text
                    line = line[3:]
            if line.endswith(b"\n"):
                line = line[:-1]
            if line.endswith(b"\r"):
                line = line[:-1]
            yield line


def _iter_text(rest, spec, counter):
    source_path, target_path = _split_text_files(rest, spec)
    source_lines, target_lines = _iter_lines(source_path), _iter_lines(target_path)
    read = 0
    while True:
        source = next(source_lines, None)
        target = next(target_lines, None)
        if source is None or target is None:
            break
        read += 1
        pair = counter.clean(source, target)
        if pair:
            yield pair
    if source is not None or target is not None:
        # One file ended first: count the rest of the other to name both lengths.
        source_total = read + (source is not None) + sum(1 for _ in source_lines)
        target_total = read + (target is not None) + sum(1 for _ in target_lines)
        raise DataError(
            f"{spec}: the files have different numbers of lines: {source_path} has "
            f"{source_total}, {target_path} has {target_total}"
        )


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


def _iter_tsv(rest, spec, counter):
    if not rest:
        raise DataError(f"corpus spec '{spec}' must look like tsv:FILE")
    for line in _iter_lines(rest):
        fields = line.split(b"\t", 2)
        if len(fields) < 2:
            counter.lines += 1
            if line.strip():
                counter.malformed += 1
            else:
                counter.empty += 1
            continue
        pair = counter.clean(fields[0], fields[1])
        if pair:
            yield pair


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


def _iter_tfds(rest, spec, counter, verbose):
    name, split, options = _parse_tfds_spec(rest, spec)
    import tensorflow_datasets as tfds

    _progress(f"loading TensorFlow Datasets {name} split {split} ...", verbose)
    try:
        dataset, info = tfds.load(
            name, split=split, with_info=True, data_dir=options.get("data_dir")
        )
    except Exception as e:  # tfds raises many kinds; users need the message, not a traceback
        raise DataError(f"{spec}: cannot load the TFDS dataset: {first_line(e)}") from None
    source_key, target_key = _tfds_keys(info, options, spec)
    _progress(f"{name}: translating {source_key} -> {target_key}", verbose)
    # Only the two text features, so tf.data streams no more than it must.
    dataset = dataset.map(lambda example: (example[source_key], example[target_key]))
    for i, (source, target) in enumerate(dataset.as_numpy_iterator()):
        pair = counter.clean(source, target)
        if pair:
            yield pair
        if verbose and (i + 1) % _PROGRESS_EVERY == 0:
            _progress(f"  {i + 1} examples read ({counter.skipped} skipped) ...", verbose)


def tfds_size(spec):
    """The number of examples of a `tfds:` spec's split from its metadata, or None."""
    kind, rest = parse_spec(spec)
    if kind != "tfds":
        return None
    name, split, options = _parse_tfds_spec(rest, spec)
    try:
        import tensorflow_datasets as tfds

        builder = tfds.builder(name, data_dir=options.get("data_dir"))
        return int(builder.info.splits[split].num_examples) or None
    except Exception:  # metadata is a nicety (an ETA); reading reports the real errors
        return None


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


def iter_pairs(spec, counter=None, verbose=True):
    """Streams a corpus spec pair by pair: text and tsv files line by line, tfds through its
    tf.data API, synthetic from its generator; memory does not grow with the corpus.

    Args:
        spec: `text:SRC,TGT`, `tsv:FILE`, `tfds:NAME[:SPLIT][,OPTION...]` or `synthetic:...`
            (see the module docstring).
        counter: a `Counter` (from `Counter(spec)`) that counts kept and skipped pairs by reason
            as the stream goes; None: a private one.
        verbose: print progress to stderr.

    Yields:
        `(source, target)` tuples of non-empty, stripped `str`, in corpus order.

    Raises:
        DataError: as `read_pairs` (two text files of different lengths are detected when the
            shorter one ends, so after the pairs before it were yielded).

    Example:
    >>> counter = Counter("synthetic:split=dev,size=3")
    >>> sum(1 for _ in iter_pairs(counter.spec, counter)), counter.kept
    (3, 3)
    """
    kind, rest = parse_spec(spec)
    counter = counter if counter is not None else Counter(spec)
    if kind == "text":
        yield from _iter_text(rest, spec, counter)
    elif kind == "tsv":
        yield from _iter_tsv(rest, spec, counter)
    elif kind == "tfds":
        yield from _iter_tfds(rest, spec, counter, verbose)
    else:
        from keras_transformer.data import synthetic

        for source, target in synthetic.iter_from_spec(rest, spec):
            counter.lines += 1
            counter.kept += 1
            yield source, target


def read_pairs(spec, verbose=True):
    """Reads a corpus spec into a list of (source, target) sentence pairs.

    For corpora too large for memory, `iter_pairs` streams the same pairs and
    `keras_transformer.data.prepare` writes them tokenized to sharded files.

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
    counter = Counter(spec)
    pairs = list(iter_pairs(spec, counter, verbose))
    if parse_spec(spec)[0] == "synthetic":
        _progress(f"generated {len(pairs)} synthetic pairs ({spec})", verbose)
    else:
        counter.report(verbose)
    return pairs


def training_specs(train):
    """The corpora of `data.train`: `[(spec, copies, tagged), ...]`.

    Args:
        train: one spec, or a list of them, each `[N*][bt:]SPEC` (see the module docstring).

    Raises:
        DataError: an empty list, a bad number of copies or an unknown kind, naming the item.

    Example:
    >>> training_specs(["2*text:a.en,a.de", "bt:text:b.en,b.de"])
    [('text:a.en,a.de', 2, False), ('text:b.en,b.de', 1, True)]
    """
    items = [train] if isinstance(train, str) else list(train)
    if not items:
        raise DataError("data.train: the list of corpora is empty")
    corpora = []
    for item in items:
        text, copies = str(item).strip(), 1
        match = _COPIES.match(text)
        if match:
            copies, text = int(match.group(1)), match.group(2).strip()
            if copies < 1:
                raise DataError(f"data.train: {item!r} repeats its corpus {copies} times")
        tagged = text.startswith(TAGGED)
        text = text[len(TAGGED) :].strip() if tagged else text
        parse_spec(text)
        corpora.append((text, copies, tagged))
    return corpora


def is_tagged(train):
    """Whether `data.train` holds a `bt:` corpus (its vocabulary then reserves `TAG`)."""
    return any(tagged for _, _, tagged in training_specs(train))


def iter_training_pairs(train, counter=None, verbose=True):
    """Streams the pairs of `data.train` (one spec or a list, see `training_specs`): each
    corpus in turn, `N*` ones N times, the sources of `bt:` ones as `TAG_PREFIX + source`.

    Yields:
        `(source, target)` as `iter_pairs` (one plain spec yields exactly its pairs).
    """
    counter = counter if counter is not None else Counter(train)
    for spec, copies, tagged in training_specs(train):
        for _ in range(copies):
            for source, target in iter_pairs(spec, counter, verbose):
                yield (TAG_PREFIX + source if tagged else source), target
