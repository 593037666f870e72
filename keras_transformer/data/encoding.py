"""Pairs of sentences into records: SentencePiece ids packed as the shards store them.

Records: one per pair, the raw little-endian integers `[len(source), *source, *target]`
(uint16 when the vocabulary has at most 65,536 pieces, else int32): SentencePiece ids without
BOS/EOS, which the pipeline adds. Reading them is one `tf.io.decode_raw`, several times cheaper
than parsing `tf.train.Example` protos, and half the disk with uint16. With
`data.train_alignments` (guided alignment) a record also holds its piece links:
`[len(source), len(target), *source, *target, s0, t0, s1, t1, ...]` (`alignments`).

Overlong pairs (`data.long_pairs`): `drop` (the default, the paper's recipe of filtering by
length) leaves out the pairs whose source or target, with EOS, is longer than
`data.max_source_length` / `data.max_target_length` and counts them as `too_long`; `truncate`
keeps them whole in the shards (the pipeline cuts them, EOS kept) and counts them as `truncated`.

`ChunkEncoder` turns a chunk of pairs into its records and their counts (a `Chunk`), the same in
any process. `data.subword_samples` writes sampled segmentations, `data.both_directions` each
pair reversed too (see `shards.write_shards`), and the sources of `bt:` corpora are led by their
tag's id (`bt_tag`).
"""

import collections
import dataclasses
import sys
from array import array
from typing import Optional

from keras_transformer.data import alignments, corpora
from keras_transformer.errors import DataError

# Words whose pieces are remembered (about 200 bytes each): bounded, whatever the corpus size.
_WORD_CACHE_SIZE = 500_000
# Pairs of the first chunks (two of 4,096 pairs) also encoded whole, to check that words
# encode independently.
_CHECKED_PAIRS = 8192
# The `array` typecode of each record dtype.
_TYPECODES = {"uint16": "H", "int32": "i"}
# A stored side is cut at this many pieces (the uint16 length header; far beyond any max length).
_MAX_STORED = 65_535


class _WordCachedEncoder:
    """SentencePiece encoding with a cache of the pieces of each space-separated word.

    SentencePiece pieces never span a space (`split_by_whitespace`, the default, with which
    `train_sentencepiece` trains): a sentence's ids are the concatenation of its words' ids, so
    each distinct word is encoded once instead of at every occurrence: several times faster on
    natural text, whose words follow Zipf's law. The first pairs are also encoded whole and
    compared; any difference (a vocabulary trained otherwise) turns the cache off.
    """

    def __init__(self, processor, threads):
        self.processor, self.threads = processor, threads
        self.cache, self.enabled, self.checked = {}, True, 0

    def _encode_words(self, sentences):
        cache = self.cache
        missing = {w for sentence in sentences for w in sentence.split(" ") if w not in cache}
        missing.discard("")
        if missing:
            words = list(missing)
            ids = self.processor.encode(words, num_threads=self.threads)
            found = dict(zip(words, ids))
            for word in words[: max(0, _WORD_CACHE_SIZE - len(cache))]:
                cache[word] = found[word]
        else:
            found = {}
        encoded = []
        for sentence in sentences:
            pieces = []
            for word in sentence.split(" "):
                if word:
                    ids = cache.get(word)
                    pieces.extend(found[word] if ids is None else ids)
            encoded.append(pieces)
        return encoded

    def encode(self, sentences):
        if not self.enabled:
            return self.processor.encode(sentences, num_threads=self.threads)
        encoded = self._encode_words(sentences)
        if self.checked < 2 * _CHECKED_PAIRS:
            self.checked += len(sentences)
            if encoded != self.processor.encode(sentences, num_threads=self.threads):
                self.enabled = False
                return self.processor.encode(sentences, num_threads=self.threads)
        return encoded


def record_dtype(pieces):
    """The integers of the records of a vocabulary of `pieces` pieces: "uint16" or "int32"."""
    return "uint16" if pieces <= 65_536 else "int32"


@dataclasses.dataclass(frozen=True)
class Encoding:
    """What turning a chunk of pairs into records needs (sent to the worker processes)."""

    model_proto: bytes
    limit_source: int  # longest stored source without EOS
    limit_target: int
    drop: bool  # data.long_pairs == "drop"
    both_directions: bool
    subword_samples: int
    subword_alpha: float
    seed: int
    threads: int  # sentencepiece threads per encode call
    bt_tag: Optional[int] = None  # the id of corpora.TAG when data.train has bt: corpora
    terminology: tuple = ()  # data.terminology's (source term, target term) entries
    terminology_fraction: float = 0.0
    alignments: Optional[str] = None  # data.train_alignments: records hold piece links


@dataclasses.dataclass
class Chunk:
    """The records of one chunk of pairs and what the manifest counts of them."""

    reading: int = 0  # the pass over the corpus (data.subword_samples)
    records: list = dataclasses.field(default_factory=list)  # bytes, in the corpus's order
    too_long: int = 0
    truncated: int = 0
    written: int = 0
    annotated: int = 0  # pairs whose source holds glossary annotations (data.terminology)
    source_tokens: int = 0
    target_tokens: int = 0
    source_hist: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    target_hist: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    longer_hist: collections.Counter = dataclasses.field(default_factory=collections.Counter)


class ChunkEncoder:
    """Pairs -> packed records (see the module docstring), the same in any process: the encoding
    of a chunk depends on the chunk alone (sampling is seeded by the reading and chunk index)."""

    def __init__(self, encoding):
        import sentencepiece as spm

        self.e = encoding
        self.processor = spm.SentencePieceProcessor(model_proto=encoding.model_proto)
        self.typecode = _TYPECODES[record_dtype(self.processor.get_piece_size())]
        self.cached = _WordCachedEncoder(self.processor, threads=encoding.threads)
        self.tag = [self.processor.bos_id()]
        self.annotator = None
        if encoding.terminology:
            from keras_transformer.glossary import TermAnnotator

            self.annotator = TermAnnotator(encoding.terminology, encoding.terminology_fraction)

    def _encode(self, sentences, seed):
        if not self.e.subword_samples:
            return self.cached.encode(sentences)
        import sentencepiece as spm

        spm.set_random_generator_seed(seed)
        return self.processor.encode(
            sentences, enable_sampling=True, alpha=self.e.subword_alpha, nbest_size=-1,
            num_threads=1,
        )  # fmt: skip

    def _too_long(self, source, target):
        e = self.e
        if len(source) > e.limit_source or len(target) > e.limit_target:
            return True
        # The reversed record: the tag and the target as its source, the source as its target.
        return e.both_directions and (
            len(target) + 1 > e.limit_source or len(source) > e.limit_target
        )

    def _add(self, out, source, target, links=None):
        source, target = source[:_MAX_STORED], target[:_MAX_STORED]
        record = array(self.typecode, [len(source)])
        if links is not None:  # data.train_alignments: the target's length, then the links
            record.append(len(target))
        record.extend(source)
        record.extend(target)
        if links is not None:
            for s, t in links:
                if s < len(source) and t < len(target):
                    record.extend((s, t))
        if sys.byteorder == "big":
            record.byteswap()
        out.records.append(record.tobytes())
        n_source, n_target = len(source) + 1, len(target) + 1  # with EOS, as the model sees
        out.source_tokens += n_source
        out.target_tokens += n_target
        out.source_hist[n_source] += 1
        out.target_hist[n_target] += 1
        out.longer_hist[max(n_source, n_target)] += 1  # the length that picks the bucket

    def _piece_links(self, links, source, target, pair):
        """The piece links of a pair's word `links`, its sides encoded as `source` and
        `target` (`alignments.piece_links`)."""
        words = [
            alignments.word_of_pieces(self.processor.id_to_piece(list(ids)))
            for ids in (source, target)
        ]
        where = f"data.train_alignments, the pair {pair[0][:40]!r}"
        return alignments.piece_links(links, words[0], words[1], where)

    def _untag(self, pairs):
        """`(pairs, tags)`: the pairs without the text tag of `bt:` corpora, and the ids that
        lead each source (`[bt_tag]` or none)."""
        if self.e.bt_tag is None:
            return pairs, [[]] * len(pairs)
        prefix = corpora.TAG_PREFIX
        tags = [[self.e.bt_tag] if s.startswith(prefix) else [] for s, _ in pairs]
        return [(s.removeprefix(prefix), t) for s, t in pairs], tags

    def __call__(self, reading, index, pairs):
        seed = (self.e.seed * 1_000_003 + reading) * 1_000_003 + 2 * index
        word_links = None
        if self.e.alignments:  # `(source, target, word links)` (`alignments.with_alignments`)
            word_links = [links for _, _, links in pairs]
            pairs = [(s, t) for s, t, _ in pairs]
        pairs, tags = self._untag(pairs)
        out = Chunk(reading)
        reversed_sources = None
        if self.annotator is not None:  # seeded by the chunk: the same in any process
            if self.e.both_directions:  # the reversed records' targets stay unannotated
                reversed_sources = self._encode([s for s, _ in pairs], seed % (1 << 31))
            pairs, out.annotated = self.annotator(pairs, f"terminology:{seed}")
        sources = self._encode([s for s, _ in pairs], seed % (1 << 31))
        targets = self._encode([t for _, t in pairs], (seed + 1) % (1 << 31))
        if reversed_sources is None:
            reversed_sources = sources
        rows = zip(
            pairs, tags, sources, targets, reversed_sources, word_links or [None] * len(pairs)
        )
        for pair, tag, source, target, plain, links in rows:
            if self.e.subword_samples and self._too_long(tag + source, target):
                # A sample longer than the limits: the best segmentation instead, so that a pair
                # is kept or dropped whatever its samples.
                source, target = self.processor.encode(list(pair))
            if self._too_long(tag + source, target):
                if self.e.drop:
                    out.too_long += 1
                    continue
                out.truncated += 1
            pieces = None if links is None else self._piece_links(links, source, target, pair)
            # Truncated pairs are stored whole (links past a cut are dropped by the pipeline).
            self._add(out, tag + source, target, _shifted(pieces, len(tag)))
            if self.e.both_directions:
                reversed_links = None if pieces is None else [(t, s) for s, t in pieces]
                self._add(out, self.tag + target, plain, _shifted(reversed_links, len(self.tag)))
            out.written += 1
        return out


def _shifted(links, offset):
    """`links` with their source pieces moved `offset` places (the ids that lead a source)."""
    if links is None or not offset:
        return links
    return [(s + offset, t) for s, t in links]


def bt_tag(model_proto, train):
    """The id of the tag that leads the sources of `bt:` corpora, or None without any."""
    if not corpora.is_tagged(train):
        return None
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=model_proto)
    tag = processor.piece_to_id(corpora.TAG)
    if tag == processor.unk_id():
        raise DataError(
            f"data.train has bt: corpora but the vocabulary has no {corpora.TAG} piece (it was "
            "trained without them, e.g. a fine-tuning parent's): use a vocabulary trained with "
            "the bt: corpora"
        )
    return tag


def terminology_entries(model_proto, path):
    """`data.terminology`'s entries as a tuple of `(source term, target term)` (empty when it
    is null), once checked that the vocabulary keeps the glossary tags whole."""
    if not path:
        return ()
    from keras_transformer import glossary

    try:
        entries = glossary.load_glossary(path)
    except glossary.GlossaryError as e:
        raise DataError(f"data.terminology: {e}") from None
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=model_proto)
    missing = [tag for tag in glossary.TAGS if processor.piece_to_id(tag) == processor.unk_id()]
    if missing:
        raise DataError(
            f"data.terminology is set but the vocabulary has no {' '.join(missing)} piece (it "
            "was trained without data.terminology, e.g. a fine-tuning parent's): use a "
            "vocabulary trained with it"
        )
    return tuple(entries)


def terminology_record(data_config, annotated):
    """The manifest's `terminology`: the term list (path, sha256, entries), the fraction, the
    tags and the pairs annotated (before the length filter)."""
    import hashlib

    from keras_transformer import glossary

    with open(data_config.terminology, "rb") as f:
        data = f.read()
    return {
        "file": data_config.terminology,
        "sha256": hashlib.sha256(data).hexdigest(),
        "entries": len(glossary.load_glossary(data_config.terminology)),
        "fraction": data_config.terminology_fraction,
        "tags": list(glossary.TAGS),
        "annotated": annotated,
    }
