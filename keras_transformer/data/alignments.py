"""Word alignments of the training pairs (`data.train_alignments`), for guided alignment
training (`train.guided_alignment_weight`).

The file is in the Pharaoh form of fast_align, eflomal and awesome-align: one line per line of
the training corpus, `i-j` pairs separated by spaces (source word `i`, target word `j`, from 0;
words being those of each side as SentencePiece's normaliser separates them,
`keras_transformer.word_rules`: its whitespace, not Python's); an empty line aligns nothing.
`prepare` reads it in step with the corpus (`with_alignments`), maps each word link to the
links of the words' SentencePiece pieces (`piece_links`: a piece belongs to the word it is in)
and stores them in the pair's record (`encoding`), so the batches, a resume's data position
included, carry each pair's links with it.
"""

from keras_transformer.errors import DataError
from keras_transformer.word_rules import WORD_MARKER, piece_words, text_words

__all__ = [
    "WORD_MARKER",
    "check_corpus",
    "has_links",
    "parse_line",
    "piece_links",
    "record",
    "with_alignments",
    "word_of_pieces",
]


def parse_line(line, where):
    """`[(i, j)]` of one Pharaoh line (`"0-0 1-2"`); `DataError` naming `where` for anything
    else."""
    links = []
    for item in line.split():
        i, sep, j = item.partition("-")
        if not (sep and i.isdigit() and j.isdigit()):
            raise DataError(f"{where}: expected 'i-j' word pairs (Pharaoh form), got {item!r}")
        links.append((int(i), int(j)))
    return links


def with_alignments(pairs, counter, path, spec):
    """`(source, target, links)` for each `(source, target)` of `pairs`, a corpus stream whose
    `counter` (`corpora.Counter`) counts its lines, `links` the word links of the pair's line of
    the alignment file `path` (its line numbers are the corpus's: a skipped corpus line skips
    its alignment line too). `DataError` (one line, naming it) for a line missing, malformed
    or with a word index out of range, and for a file longer than the corpus."""
    name = f"data.train_alignments {path}"
    try:
        file = open(path, "rb")
    except OSError as e:
        raise DataError(f"{name}: cannot read it: {e.strerror or e}") from None
    with file:
        number = 0
        for source, target in pairs:
            line = None
            while number < counter.lines:
                line = file.readline()
                number += 1
                if not line:
                    raise DataError(
                        f"{name} has {number - 1} lines but {spec} has a pair on line "
                        f"{counter.lines}: one alignment line per corpus line"
                    )
            where = f"{path}:{number}"
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{where}: invalid UTF-8") from None
            links = parse_line(text, where)
            words = len(text_words(source)), len(text_words(target))
            for i, j in links:
                if i >= words[0] or j >= words[1]:
                    raise DataError(
                        f"{where}: the link {i}-{j} is out of range: the pair on line "
                        f"{counter.lines} of {spec} has {words[0]} source and {words[1]} "
                        "target words"
                    )
            yield source, target, links
        if number < counter.lines:  # the corpus's last lines were skipped: theirs must exist
            for _ in range(counter.lines - number):
                if not file.readline():
                    raise DataError(f"{name} has fewer lines than {spec} ({counter.lines})")
                number += 1
        if file.readline().strip():
            raise DataError(
                f"{name} has more lines than {spec} ({counter.lines}): one alignment line per "
                "corpus line"
            )


def check_corpus(train):
    """Refuses, in one line, a `data.train` whose lines the alignment file cannot follow: a
    list of several corpora, copies of one (`N*`) or a tagged one (`bt:`)."""
    from keras_transformer.data.corpora import training_specs

    specs = training_specs(train)
    if len(specs) != 1 or specs[0][1] != 1 or specs[0][2]:
        raise DataError(
            "data.train_alignments follows the lines of one corpus: data.train must be a single "
            "corpus (no list, no N* copies, no bt: tag)"
        )
    return specs[0]


def word_of_pieces(pieces):
    """The word index of each piece of a sentence's SentencePiece pieces (strings):
    `keras_transformer.word_rules.piece_words`, the rule of the export's alignments (a piece
    starting with "▁" begins a word, a lone "▁" begins the word of the piece after it, and so
    does the first piece)."""
    return piece_words(pieces)


def piece_links(links, source_words, target_words, where):
    """Piece links `[(source piece, target piece)]` of word `links`, given the word index of
    each source and target piece (`word_of_pieces`): every piece of source word i with every
    piece of target word j. `DataError` naming `where` when the pieces hold another number of
    words than the text (a word that SentencePiece's normalization removed)."""
    by_word = []
    for side, words in (("source", source_words), ("target", target_words)):
        pieces = {}
        for k, w in enumerate(words):
            pieces.setdefault(w, []).append(k)
        by_word.append(pieces)
    out = []
    for i, j in links:
        if i not in by_word[0] or j not in by_word[1]:
            raise DataError(
                f"{where}: the link {i}-{j} names a word that has no piece after "
                "SentencePiece's normalization"
            )
        out.extend((s, t) for s in by_word[0][i] for t in by_word[1][j])
    return sorted(set(out))


def record(path):
    """The manifest's `alignments`: the file (path, sha256) whose links the records hold."""
    import hashlib

    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return {"file": path, "sha256": digest, "record": "source_length target_length pieces links"}


def has_links(manifest):
    """Whether a prepared manifest's records hold piece links (`data.train_alignments`)."""
    return bool(manifest.get("alignments"))
