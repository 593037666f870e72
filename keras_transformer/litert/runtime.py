"""Translating with a LiteRT export (`keras_transformer.export.litert`) with the LiteRT
interpreter, SentencePiece and numpy alone: no TensorFlow, no Keras.

It answers as the SavedModel's `Translator` does, step by step: invalid UTF-8 replaced with
U+FFFD; SentencePiece pieces truncated to `max_source_length - 1`, then EOS; the request sorted
by length and decoded in chunks of `batch_size` sentences, each padded to its longest; the same
search (`keras_transformer.litert.search`); the best hypotheses detokenized without padding and
EOS, with their scores, token scores and calibrated confidence, in the request's order.

Threads: one translator may serve many threads at once (a web server's workers). A request's
search lives in the input buffers of its interpreters (the caches, the shapes), so each request
borrows a set of its own, an encoder and a step interpreter, from a pool and gives it back when
answered: a set is made when a request finds none idle, up to `interpreters` sets (default
`min(4, os.cpu_count())`); further requests wait for one. Each set holds its own copy of the
weights as XNNPACK packs them (about the size of the `.tflite` files) and runs `num_threads`
threads, so a pool of 4 costs up to 4 times the memory and threads of one; a translator used
by one thread at a time only ever makes one.

Cache length: the step's self-attention reads every position of its caches (`k * T` keys per
hypothesis, `keras_transformer.export.litert_graphs`), written or not. So the caches start
`cache_bucket` positions long (`CACHE_BUCKET` by default) and grow when the next position
would not fit: to twice their length, or to the chunk's longest output (its source length plus
`max_extra_length`, at most `max_length`) where less than a bucket would be left; each growth
copies the written positions into the longer layout and resizes the step (about a step's
cost). `cache_bucket=0` sizes them for the longest output at once. The answers are the same.

Vocabulary shortlist: an export made with one (`export_litert(shortlist=...)`) decodes over it
when loaded with `shortlist=True`: each chunk's shortlist is the lexical table's translations of
its source pieces, the table's frequent pieces, the special ids and the chunk's prefix and
constraint pieces (`keras_transformer.lexical_table.batch_shortlist`, padded to a bucket, the
graph search's rule), and the shortlist step
projects onto those columns alone, so no other piece can be chosen and the scores are
log-probabilities over the shortlist (as the SavedModel's `Translator(shortlist=...)`).

Lexical constraints: an export made with its constrained step (`export_litert(constraints=
True)`) answers `translate_constrained` (and `translate(texts, constraints=...)`) as the
SavedModel's signature does: the constraints tokenized as it tokenizes them, the constrained
beam search of `keras_transformer.litert.search` (`keras_transformer.constraint_rules`' rules,
the graph's own), and a chunk whose constraints some input could not meet searched again
without them, that input taking the unconstrained answer (`constraints_met` False). The
constrained step is made the first time a request needs it. With `shortlist=True` the search runs
over the chunk's shortlist (which holds every constraint piece) with the export's constrained
shortlist step (made when it has both), each wanted piece given as its shortlist column.

Word alignments: an export made with its alignment graph (`export_litert(alignments=True)`)
answers `translate(texts, alignments=True)` as the SavedModel's `Translator.translate(texts,
alignments=True)` does: after each chunk's search, one pass of the alignment graph over the
sources and their translations gives the source piece each target piece attends to most, and
`alignment_rules.numpy_word_alignment` (the graph's own rules, on numpy) maps pieces
to words. The alignment graph is made the first time a request needs it. Markup
(`translate(texts, markup="html"|"xml")`) is carried by those alignments as the SavedModel's
`Translator.translate(texts, markup=...)` carries it (`keras_transformer.markup`).
"""

import contextlib
import functools
import json
import os
import queue
import threading

import numpy as np

from keras_transformer.alignment_rules import numpy_word_alignment, piece_flags, word_pairs
from keras_transformer.litert.search import NEG_INF, search
from keras_transformer.markup import markup_answer
from keras_transformer.special_ids import UNK_ID

MIN_SCORE, MAX_MARGIN = -50.0, 20.0  # keras_transformer.export.calibration
METADATA_FILE = "keras_transformer.json"
CACHE_BUCKET = 16  # the self-attention caches' first length (module docstring)


class LiteRTError(ValueError):
    """A directory that is not a LiteRT export this version can run."""


def is_litert_export(path):
    """True when `path` is a directory holding a LiteRT export's metadata."""
    metadata = os.path.join(str(path), METADATA_FILE)
    if not os.path.isfile(metadata):
        return False
    try:
        with open(metadata, encoding="utf-8") as f:
            return json.load(f).get("format") == "litert"
    except (OSError, ValueError):
        return False


def _interpreter(path, num_threads):
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise LiteRTError(
            'the LiteRT runtime is not installed: pip install "keras-nmt-transformer[litert]" '
            "(or ai-edge-litert)"
        ) from None
    return Interpreter(model_path=path, num_threads=num_threads)


def load(path, num_threads=None, interpreters=None, shortlist=False, cache_bucket=None):
    """The `LiteRTTranslator` of the export in the directory `path` (its arguments)."""
    return LiteRTTranslator(path, num_threads, interpreters, shortlist, cache_bucket)


def default_interpreters():
    """How many interpreter sets a translator makes at most by default: `min(4, CPUs)`."""
    return min(4, os.cpu_count() or 1)


def _as_text(text):
    """A request's string as valid `str`: bytes decoded as UTF-8 with each invalid sequence
    replaced by U+FFFD, exactly as the SavedModel's `unicode_transcode` replaces them. A `str`
    holding lone surrogates (undecodable bytes that Python smuggled in with `surrogateescape`,
    e.g. from `sys.argv`) becomes those bytes again first, so it gets the same answer."""
    if not isinstance(text, bytes):
        text = str(text)
        try:
            text = text.encode("utf-8", errors="surrogateescape")
        except UnicodeEncodeError:  # a surrogate no byte was escaped into
            text = text.encode("utf-8", errors="surrogatepass")
    return text.decode("utf-8", errors="replace")


class LiteRTTranslator:
    """A LiteRT export as string-to-string functions (the SavedModel's signatures, in numpy).

    Safe to call from several threads at once: each request borrows its own interpreters
    (module docstring).

    Args:
        path: the export's directory.
        num_threads: each interpreter's threads (None: LiteRT's default).
        interpreters: the most interpreter sets (an encoder and a step) made for requests
            running at once (None: `default_interpreters()`); made when needed, kept once made.
        shortlist: decode over each chunk's vocabulary shortlist (module docstring); the
            export must hold one (`LiteRTError` otherwise).
        cache_bucket: the self-attention caches' first length, grown as the output grows
            (module docstring); 0: sized for the longest output at once. None:
            `CACHE_BUCKET`.

    Example:
    ```python
    from keras_transformer import litert
    translator = litert.load("saved_models/quickstart-litert")
    translator.translate(["Guten Morgen."])["translation"]
    ```
    """

    def __init__(
        self, path, num_threads=None, interpreters=None, shortlist=False, cache_bucket=None
    ):
        import sentencepiece

        if not is_litert_export(path):
            raise LiteRTError(
                f"{path} is not a LiteRT export (no {METADATA_FILE} of format litert)"
            )
        with open(os.path.join(path, METADATA_FILE), encoding="utf-8") as f:
            self.metadata = meta = json.load(f)
        self.path = path
        self.settings = meta["decoding"]
        self.max_source_length = int(meta["max_source_length"])
        self.max_length = meta.get("max_length")
        self.calibration = meta["calibration"]
        self.shortlist = _shortlist_table(path, meta) if shortlist else None
        with open(os.path.join(path, meta["tokenizer"]), "rb") as f:
            self._spm = sentencepiece.SentencePieceProcessor(model_proto=f.read())
        self.num_threads = num_threads
        self.interpreters = default_interpreters() if interpreters is None else int(interpreters)
        if self.interpreters < 1:
            raise ValueError(f"interpreters must be at least 1, got {interpreters}")
        self.cache_bucket = CACHE_BUCKET if cache_bucket is None else int(cache_bucket)
        if self.cache_bucket < 0:
            raise ValueError(f"cache_bucket must be at least 0, got {cache_bucket}")
        self._idle = queue.LifoQueue()  # the sets no request holds; the last returned first
        self._made, self._making = 1, threading.Lock()
        self._idle.put(self._new_interpreters())  # the first now: a broken export fails here
        self._piece_flags = None  # the vocabulary's word-marker flags, for alignments

    def _new_interpreters(self):
        meta, path = self.metadata, self.path
        encoder = _interpreter(os.path.join(path, meta["encoder"]), self.num_threads)
        encoder = _Encoder(encoder, meta["outputs"]["encoder"])
        if self.shortlist is None:
            step = _interpreter(os.path.join(path, meta["decoder_step"]), self.num_threads)
            step = _Step(step, meta, bucket=self.cache_bucket)
            return [encoder, step, None]  # the constrained step: when needed
        listed = meta["shortlist"]["decoder_step"]
        step = _interpreter(os.path.join(path, listed), self.num_threads)
        outputs = meta["outputs"]["decoder_step_shortlist"]
        return [encoder, _Step(step, meta, outputs, self.cache_bucket), None]

    def _constrained_step(self, engines):
        """The constrained step of the borrowed set `engines` (over a shortlist with
        `shortlist=True`), made on first use."""
        if engines[2] is None:
            meta = self.metadata
            listed = self.shortlist is not None
            name = meta["constraints"]["shortlist_step" if listed else "decoder_step"]
            name = os.path.join(self.path, name)
            outputs = meta["outputs"][f"decoder_step_{'shortlist_' if listed else ''}constrained"]
            step = _interpreter(name, self.num_threads)
            engines[2] = _Step(step, meta, outputs, self.cache_bucket)
        return engines[2]

    @contextlib.contextmanager
    def _borrowed(self):
        """`[encoder, step, constrained step or None]` (and the alignment graph's `_Aligner`,
        once a request needed it) for one request's use alone: an idle set, else a new one
        while fewer than `interpreters` exist, else the first one given back."""
        try:
            engines = self._idle.get_nowait()
        except queue.Empty:
            with self._making:
                make = self._made < self.interpreters
                self._made += make
            if not make:
                engines = self._idle.get()
            else:
                try:
                    engines = self._new_interpreters()
                except BaseException:
                    with self._making:
                        self._made -= 1
                    raise
        try:
            yield engines
        finally:
            self._idle.put(engines)

    @property
    def max_target_length(self):
        """The longest output (EOS included), as `Translator.max_target_length`."""
        longest = self.max_source_length + self.settings["max_extra_length"]
        return longest if self.max_length is None else min(int(self.max_length), longest)

    # ----------------------------------------------------------------- the signatures

    def translate(self, texts, constraints=None, alignments=False, markup=None):
        """`serving_default`: `{"translation": [n] str, "score": float32 [n], "token_scores":
        float32 [n, longest], "confidence": float32 [n]}`; with `constraints` (a list of
        target-side terms per text), `translate_constrained`'s answer. With `alignments`, also
        `"alignment"`: per text, its word alignment as `Translator.translate(alignments=True)`
        gives it, a list of `(source word, target word)` pairs (words: whitespace-separated).
        With `markup` ("html" or "xml"), `Translator.translate(texts, markup=...)`'s answer
        (`keras_transformer.markup.markup_answer`: lists, the tags carried into the
        translations by the alignments, malformed markup translated as plain text with a
        `MarkupWarning`). Alignments and markup need an export made with the alignment graph
        (module docstring)."""
        if alignments or markup is not None:
            if constraints is not None:
                raise ValueError("alignments come from translate alone: not with constraints")
            if not self.metadata.get("alignments"):
                raise LiteRTError(
                    f"{self.path} was exported without word alignments: export it with "
                    "--alignments (export.alignments: true)"
                )
        if markup is not None:
            plain = functools.partial(self.translate, alignments=True)
            return markup_answer(plain, texts, markup, alignments)
        if constraints is not None:
            return self.translate_constrained(texts, constraints)
        out = self._hypotheses(texts, 1, alignments=alignments)
        answer = {
            "translation": [row[0] for row in out["text"]],
            "score": out["score"][:, 0],
            "token_scores": out["token_scores"][:, 0],
            "confidence": out["confidence"][:, 0],
        }
        if alignments:
            answer["alignment"] = [word_pairs(row) for row in out["alignment"].tolist()]
        return answer

    def translate_nbest(self, texts):
        """`translate_nbest`: `{"translations": [n][n_best] str, "scores", "token_scores",
        "confidence"}`, best first."""
        out = self._hypotheses(texts, int(self.settings["n_best"]))
        return {
            "translations": out["text"],
            "scores": out["score"],
            "token_scores": out["token_scores"],
            "confidence": out["confidence"],
        }

    def translate_prefix(self, texts, prefixes):
        """`translate_prefix`: `{"translation", "score"}`, each translation starting with its
        prefix's pieces (an empty prefix: `translate`'s answer)."""
        if len(texts) != len(prefixes):
            raise ValueError(
                f"translate_prefix: text has {len(texts)} strings but prefix has "
                f"{len(prefixes)} strings; they must be the same"
            )
        out = self._hypotheses(texts, 1, prefixes)
        return {"translation": [row[0] for row in out["text"]], "score": out["score"][:, 0]}

    def translate_constrained(self, texts, constraints):
        """`translate_constrained`: `{"translation", "score", "constraints_met": bool [n]}`,
        each translation holding every term of its row of `constraints` (a list of target-side
        terms per text, str or bytes; "" is no term) where `constraints_met`, else the
        unconstrained translation (a term longer than the output can be, or with pieces the
        vocabulary lacks). Needs an export made with the constrained step (module docstring)."""
        texts, rows = list(texts), [list(row) for row in constraints]
        if len(texts) != len(rows):
            raise ValueError(
                f"translate_constrained: text has {len(texts)} strings but constraints has "
                f"{len(rows)} rows; they must be the same"
            )
        if not self.metadata.get("constraints"):
            raise LiteRTError(
                f"{self.path} has no constrained step: export it with constraints=True to "
                "translate with lexical constraints"
            )
        if self.shortlist is not None and "shortlist_step" not in self.metadata["constraints"]:
            raise LiteRTError(
                f"{self.path} has no constrained shortlist step: export it again with both "
                "constraints and a shortlist, or load it without shortlist=True"
            )
        out = self._hypotheses(texts, 1, constraints=self._constraint_ids(rows))
        return {
            "translation": [row[0] for row in out["text"]],
            "score": out["score"][:, 0],
            "constraints_met": out["constraints_met"],
        }

    # ----------------------------------------------------------------- the pieces

    def _source_ids(self, texts):
        eos = self.settings["eos_id"]
        cut = self.max_source_length - 1
        return [self._spm.encode(_as_text(t))[:cut] + [eos] for t in texts]

    def _prefix_ids(self, prefixes):
        room = self.settings["max_extra_length"]
        if self.max_length is not None:
            room = min(room, int(self.max_length) - 1)
        return [self._spm.encode(_as_text(p))[: max(room, 0)] for p in prefixes]

    def _constraint_ids(self, rows):
        """Rows of terms -> int32 `[n, C, P]`, each term's pieces 0-padded (`C`, `P` at least
        1), as the SavedModel's `_constraint_ids`: invalid UTF-8 becomes U+FFFD, a piece the
        vocabulary lacks becomes BOS (never generated: the term is unmeetable), "" is no
        term, a term is cut to `max_target_length` pieces."""
        bos, cut = self.settings["bos_id"], self.max_target_length
        pieces = [
            [[bos if i == UNK_ID else i for i in self._spm.encode(_as_text(t))][:cut] for t in row]
            for row in rows
        ]
        c = max([1] + [len(row) for row in pieces])
        p = max([1] + [len(term) for row in pieces for term in row])
        ids = np.zeros((len(rows), c, p), "int32")
        for i, row in enumerate(pieces):
            for j, term in enumerate(row):
                ids[i, j, : len(term)] = term
        return ids

    def _hypotheses(self, texts, keep, prefixes=None, constraints=None, alignments=False):
        """The `keep` best hypotheses of every text (`constraints`: int32 `[n, C, P]`, also
        `constraints_met`; `alignments`: also the best's `alignment` int32 `[n, W]`,
        `keras_transformer.alignment_rules.word_alignment`'s: -1 past its words)."""
        texts = list(texts)
        n, width = len(texts), self.max_target_length
        sources = self._source_ids(texts)
        prefix_ids = None if prefixes is None else self._prefix_ids(list(prefixes))
        order = np.argsort([len(s) for s in sources], kind="stable")
        text = [None] * n
        score = np.zeros((n, keep), "float32")
        token_scores = np.zeros((n, keep, width), "float32")
        lengths = np.zeros((n, keep), "int32")
        margins = np.zeros((n, keep), "float32")
        met = np.ones(n, bool)
        aligned = np.full((n, width), -1, "int32")
        chunk = int(self.settings["batch_size"])
        with self._borrowed() as engines:
            for start in range(0, n, chunk):
                rows = order[start : start + chunk]
                prefix = None if prefix_ids is None else [prefix_ids[i] for i in rows]
                terms = None if constraints is None else constraints[rows]
                found = self._search_chunk(engines, [sources[i] for i in rows], prefix, terms)
                ids, s, t = found[:3]
                if constraints is not None:
                    met[rows] = found[3]
                ids, t = ids[:, :keep], t[:, :keep]
                for j, i in enumerate(rows):
                    text[i] = [self._detokenize(h) for h in ids[j]]
                score[rows], margins[rows] = s[:, :keep], _margins(s)[:, :keep]
                token_scores[rows, :, : t.shape[2]] = t
                lengths[rows] = (ids != self.settings["pad_id"]).sum(-1)
                if alignments:
                    chosen = [sources[i] for i in rows]
                    aligned[rows] = self._align(engines, chosen, ids[:, 0])
        longest = int(lengths.max()) if n else 0
        out = {
            "text": text,
            "score": score,
            "token_scores": token_scores[:, :, :longest],
            "length": lengths,
            "margin": margins,
            "confidence": self._confidence(score, margins),
        }
        if constraints is not None:
            out["constraints_met"] = met
        if alignments:
            out["alignment"] = aligned
        return out

    def _align(self, engines, sources, ids):
        """`alignment` int32 `[c, max_target_length]` of the translations `ids` `[c, T]`
        of `sources` (module docstring), through the alignment graph of the set `engines`
        (made on first use)."""
        aligner = next((e for e in engines if isinstance(e, _Aligner)), None)
        if aligner is None:  # kept with the set, after its other interpreters
            name = os.path.join(self.path, self.metadata["alignments"]["graph"])
            aligner = _Aligner(_interpreter(name, self.num_threads))
            engines.append(aligner)
        if self._piece_flags is None:
            size = self._spm.get_piece_size()
            self._piece_flags = piece_flags([self._spm.id_to_piece(i) for i in range(size)])
        s = self.settings
        source, ids = _padded(sources, s["pad_id"]), np.asarray(ids, "int32")
        pieces = aligner(source, ids)
        return numpy_word_alignment(
            pieces, source, ids, self._piece_flags, (s["pad_id"], s["eos_id"]),
            self.max_target_length, self.max_source_length,
        )[0]  # fmt: skip

    def _search_chunk(self, engines, sources, prefix, constraints=None):
        """Padded ids of one chunk through the interpreters of `engines` and the search:
        `(ids [c, K, T], scores [c, K], token scores [c, K, T])`, best first; with
        `constraints` (int32 `[c, C, P]`), also `met` bool `[c]`, the unmet inputs answered by
        the unconstrained search of the chunk (as `translate_ids` answers them)."""
        s, (encoder, step) = self.settings, engines[:2]
        source = _padded(sources, s["pad_id"])
        c, s_len = source.shape
        buffer = s_len + s["max_extra_length"]
        if self.max_length is not None:
            buffer = min(buffer, int(self.max_length))
        caps = np.minimum(np.array([len(x) for x in sources]) + s["max_extra_length"], buffer)
        prefix_matrix = None
        if prefix is not None and any(prefix):
            prefix_matrix = _padded(prefix, 0)
        columns = None
        if self.shortlist is not None:
            columns = _shortlist_columns(self.shortlist, source, prefix_matrix, constraints)
        cross = encoder(source)
        if constraints is None:
            step.start(cross, source != s["pad_id"], buffer, columns)
            return search(
                step, c, s["beam_size"], buffer, caps, s["alpha"], s["eos_id"], s["bos_id"],
                prefix=prefix_matrix, return_all=True,
            )  # fmt: skip
        step = self._constrained_step(engines)
        step.start(cross, source != s["pad_id"], buffer, columns, wanted=constraints.shape[1])
        found = search(
            step, c, s["beam_size"], buffer, caps, s["alpha"], s["eos_id"], s["bos_id"],
            return_all=True, constraints=constraints,
        )  # fmt: skip
        met = found[3]
        if met.all():
            return found
        plain = self._search_chunk(engines, sources, None)
        rows = met[:, None, None]
        ids, scores = np.where(rows, found[0], plain[0]), np.where(met[:, None], found[1], plain[1])
        return ids, scores, np.where(rows, found[2], plain[2]), met

    def _detokenize(self, ids):
        special = (self.settings["pad_id"], self.settings["eos_id"])
        return self._spm.decode([int(i) for i in ids if i not in special])

    def _confidence(self, scores, margins):
        cal = self.calibration
        logit = (
            cal["bias"]
            + cal["score_weight"] * np.maximum(scores, MIN_SCORE)
            + cal["margin_weight"] * margins
        )
        return (1.0 / (1.0 + np.exp(-np.clip(logit, -60, 60)))).astype("float32")


def _shortlist_table(path, meta):
    """The export's lexical table (`keras_transformer.lexical_table`), read without TensorFlow."""
    from keras_transformer.lexical_table import read_lexical_table
    from keras_transformer.local_files import LocalGfile

    listed = meta.get("shortlist")
    if not listed:
        raise LiteRTError(
            f"{path} holds no vocabulary shortlist: export it with one (export --format litert "
            "--shortlist) to decode with shortlist=True"
        )
    return read_lexical_table(os.path.join(path, listed["table"]), gfile=LocalGfile)


def _shortlist_columns(table, source, *extra):
    """The step's `{"output_ids", "output_mask"}` for a chunk's `source` `[c, S]` and the ids
    of `extra` (the prefixes `[c, p]`, the constraints `[c, C, P]`; None skipped): its
    shortlist (`lexical_table.batch_shortlist`), the padding columns masked."""
    from keras_transformer.lexical_table import batch_shortlist

    extra = np.concatenate([np.ravel(x) for x in extra if x is not None] + [np.zeros(0, "int32")])
    ids, real = batch_shortlist(table.translations, table.frequent, source, extra_ids=extra)
    return {"output_ids": ids, "output_mask": np.where(real, 0.0, NEG_INF).astype("float32")}


def _margins(scores):
    """float32 `[c, K]`: each hypothesis's score minus the best score of the others (0 for
    greedy search), clipped, as `Translator._margins`."""
    width = scores.shape[1]
    if width == 1:
        return np.zeros_like(scores)
    others = np.where(np.eye(width, dtype=bool), np.float32(NEG_INF), scores[:, None, :])
    margin = scores - others.max(axis=-1)
    return np.clip(margin, -MAX_MARGIN, MAX_MARGIN).astype("float32")


def _output_indices(interpreter, names):
    """`{name: tensor index}` of the interpreter's outputs, named in order by `names` (the
    export's metadata: the converted model keeps no output names)."""
    details = interpreter.get_output_details()
    if len(details) != len(names):
        raise LiteRTError(
            f"the LiteRT model has {len(details)} outputs, its metadata names {len(names)}"
        )
    return {name: d["index"] for name, d in zip(names, details)}


def _padded(rows, fill):
    """int32 `[len(rows), longest]`: the id lists `rows`, each padded with `fill`."""
    matrix = np.full((len(rows), max(len(row) for row in rows)), fill, "int32")
    for i, row in enumerate(rows):
        matrix[i, : len(row)] = row
    return matrix


def _resize(interpreter, indices, shapes):
    for name, shape in shapes.items():
        interpreter.resize_tensor_input(indices[name], shape, strict=False)
    interpreter.allocate_tensors()


class _Encoder:
    """`encoder.tflite`: int32 source ids `[c, S]` -> `{cross_keys_l: [c, H, S, d], ...}`."""

    def __init__(self, interpreter, names):
        self.interpreter = interpreter
        self.input = interpreter.get_input_details()[0]["index"]
        self.outputs = _output_indices(interpreter, names)
        self.shape = None

    def __call__(self, source):
        it = self.interpreter
        if self.shape != source.shape:
            _resize(it, {"source_ids": self.input}, {"source_ids": source.shape})
            self.shape = source.shape
        it.set_tensor(self.input, source)
        it.invoke()
        return {name: it.get_tensor(index) for name, index in self.outputs.items()}


class _Aligner:
    """`alignment.tflite`: source ids `[c, S]`, target ids `[c, T]` -> the attended source
    piece of each target piece, int32 `[c, T]`."""

    def __init__(self, interpreter):
        self.interpreter = interpreter
        self.inputs = {d["name"]: d["index"] for d in interpreter.get_input_details()}
        self.output = interpreter.get_output_details()[0]["index"]
        self.shapes = None

    def __call__(self, source, target):
        it, values = self.interpreter, {"source_ids": source, "target_ids": target}
        shapes = {name: value.shape for name, value in values.items()}
        if shapes != self.shapes:
            _resize(it, self.inputs, shapes)
            self.shapes = shapes
        for name, value in values.items():
            it.set_tensor(self.inputs[name], value)
        it.invoke()
        return it.get_tensor(self.output)


class _Step:
    """`decoder_step.tflite` as the search's step (`keras_transformer.litert.search`).

    The self-attention caches are the interpreter's own input buffers, one slot per beam
    (`keras_transformer.export.litert_graphs`): each call writes the step's new keys and values
    into them through numpy views, and `reorder` only permutes `history`, which records for
    each hypothesis the slot holding its key at each position. Nothing is copied per step but
    the step's own inputs and outputs.

    With `bucket` > 0 the caches start `bucket` positions long (at most the chunk's
    `positions`) and grow when a step's position would not fit: to twice their length, or to
    `positions` where less than a bucket would be left, each slot's written positions copied
    into the longer layout (`_grow`). A chunk of 33 positions and a bucket of 16 resizes once.
    """

    def __init__(self, interpreter, meta, outputs=None, bucket=0):
        self.interpreter = interpreter
        self.inputs = {d["name"]: d["index"] for d in interpreter.get_input_details()}
        outputs = meta["outputs"]["decoder_step"] if outputs is None else outputs
        self.outputs = _output_indices(interpreter, outputs)
        self.layers, self.heads = int(meta["num_layers"]), int(meta["num_heads"])
        self.head_dim, self.beams = int(meta["head_dim"]), int(meta["decoding"]["beam_size"])
        self.shapes, self.columns, self.wanted = None, None, None
        self.bucket = int(bucket)

    def start(self, cross, source_mask, positions, columns=None, wanted=None):
        """Readies the step for a chunk: the encoder's `cross` keys/values, the source mask
        `[c, S]` and `positions` cache positions at most (the first `bucket` of them, grown
        when needed); the caches start empty. `columns`: the shortlist step's
        `{"output_ids", "output_mask"}` `[n]` for the chunk; `wanted`: the constrained step's
        wanted ids per row (`W`; given to a step with `columns` as their columns)."""
        c = source_mask.shape[0]
        bias = np.where(source_mask, 0.0, NEG_INF).astype("float32")[:, None, None, :]
        values = {**cross, "cross_bias": bias, **(columns or {})}
        self.columns = None if columns is None else len(columns["output_ids"])
        if columns is not None:  # the shortlist's real ids, increasing: a wanted id's column
            self.listed = columns["output_ids"][columns["output_mask"] == 0]
        self.wanted = wanted
        self.limit = positions
        length = positions if self.bucket <= 0 else min(self.bucket, positions)
        self._layout(c, source_mask.shape[1], length, values)
        self.history = np.zeros((c, self.beams, length), "int32")  # the slot of each key
        self.live = np.arange(c)  # the sentences still searched (`keep`), in the batch

    def _layout(self, c, s_len, positions, values, zero_caches=True):
        """The interpreter's inputs sized for `c` sentences, `s_len` source tokens and
        `positions` cache positions, with the inputs in `values` set (resized only when a
        size changed; the self-attention caches then zeroed: never read unwritten, since
        masked, but they must be finite)."""
        k, heads, size = self.beams, self.heads, self.head_dim
        shapes = {"ids": [c * k], "position": [1], "self_bias": [c, 1, k, k * positions]}
        shapes["cross_bias"] = [c, 1, 1, s_len]
        if self.columns is not None:
            shapes["output_ids"] = shapes["output_mask"] = [self.columns]
        if self.wanted is not None:
            shapes["wanted_ids"] = [c * k, self.wanted]
        for i in range(self.layers):
            shapes[f"self_keys_{i}"] = shapes[f"self_values_{i}"] = [c, heads, k * positions, size]
            shapes[f"cross_keys_{i}"] = shapes[f"cross_values_{i}"] = [c, heads, s_len, size]
        it = self.interpreter
        if shapes != self.shapes:
            _resize(it, self.inputs, shapes)
            self.shapes = shapes
            if zero_caches:
                for name in self._self_caches():
                    it.tensor(self.inputs[name])().fill(0.0)
        for name, value in values.items():
            it.set_tensor(self.inputs[name], value)
        self.rows, self.positions = c * k, positions

    def _self_caches(self):
        return [f"self_{n}_{i}" for i in range(self.layers) for n in ("keys", "values")]

    def keep(self, sentences):
        """Only `sentences` (indices into the live ones) go on. The batch is compacted to them
        once at most half of it is live (a resize costs about a step; until then the settled
        sentences' rows are computed and ignored)."""
        self.live = self.live[np.asarray(sentences, "int64")]
        if len(self.live) and len(self.live) <= self.rows // self.beams // 2:
            self._compact()

    def _held(self, sentences):
        """The inputs that live across steps (the caches, the cross bias, the shortlist's
        columns), the batch's at `sentences`: what a resize must set again."""
        it = self.interpreter
        names = self._self_caches() + [
            f"cross_{n}_{i}" for i in range(self.layers) for n in ("keys", "values")
        ]
        values = {name: it.get_tensor(self.inputs[name])[sentences] for name in names}
        values["cross_bias"] = it.get_tensor(self.inputs["cross_bias"])[sentences]
        if self.columns is not None:  # resized inputs lose their values
            for name in ("output_ids", "output_mask"):
                values[name] = it.get_tensor(self.inputs[name])
        return values

    def _compact(self):
        live = self.live
        values = self._held(live)
        s_len = values["cross_bias"].shape[-1]
        self._layout(len(live), s_len, self.positions, values, zero_caches=False)
        self.history = self.history[live]
        self.live = np.arange(len(live))

    def _grow(self, index):
        """Longer caches, for a step at `index` (`index >= positions`): twice as long, or all
        `limit` positions where less than a bucket would be left; each slot's positions keep
        their keys and values, the new ones zeroed, and `history` grows alike."""
        old = self.positions
        length = max(2 * old, index + 1)
        if self.limit - length < max(self.bucket, 1):
            length = self.limit
        c, k = self.rows // self.beams, self.beams
        values = self._held(slice(None))
        for name in self._self_caches():
            cache = np.zeros((c, self.heads, k, length, self.head_dim), "float32")
            cache[:, :, :, :old] = values[name].reshape(c, self.heads, k, old, self.head_dim)
            values[name] = cache.reshape(c, self.heads, k * length, self.head_dim)
        s_len = values["cross_bias"].shape[-1]
        self._layout(c, s_len, length, values, zero_caches=False)
        self.history = np.pad(self.history, ((0, 0), (0, 0), (0, length - old)))

    def _live_rows(self):
        k = self.beams
        return (self.live[:, None] * k + np.arange(k)).reshape(-1)

    def _self_bias(self, index):
        """`[c, 1, k, k * T]`: 0 where a hypothesis's own keys are (positions before `index`
        in the slots its history names), NEG_INF elsewhere."""
        k = self.beams
        own = self.history[:, :, None, :] == np.arange(k)[None, None, :, None]  # [c, k, k, T]
        own &= np.arange(self.positions) < index
        bias = np.where(own, np.float32(0.0), np.float32(NEG_INF))
        return bias.reshape(-1, 1, k, k * self.positions)

    def __call__(self, ids, index, wanted=None):
        if index >= self.positions:
            self._grow(index)
        it, k = self.interpreter, self.beams
        rows = self._live_rows()
        all_ids = np.zeros(self.rows, "int32")  # settled sentences' rows: computed, ignored
        all_ids[rows] = ids
        it.set_tensor(self.inputs["ids"], all_ids)
        if wanted is not None:  # the constrained step's
            all_wanted = np.zeros((self.rows, self.wanted), "int32")
            listed = self.columns is not None  # every wanted id is in the shortlist
            all_wanted[rows] = np.searchsorted(self.listed, wanted) if listed else wanted
            it.set_tensor(self.inputs["wanted_ids"], all_wanted)
        it.set_tensor(self.inputs["position"], np.array([index], "int32"))
        it.set_tensor(self.inputs["self_bias"], self._self_bias(index))
        it.invoke()
        c = self.rows // k
        for i in range(self.layers):
            for name in ("keys", "values"):
                new = it.get_tensor(self.outputs[f"new_{name}_{i}"])  # [c, H, k, d]
                cache = it.tensor(self.inputs[f"self_{name}_{i}"])()
                cache.reshape(c, self.heads, k, self.positions, self.head_dim)[:, :, :, index] = new
                del cache  # no reference to the interpreter's buffers may outlive this
        self.history[:, :, index] = np.arange(k)
        names = ("top_log_probs", "top_ids", "eos_log_probs")
        names += () if wanted is None else ("wanted_log_probs",)
        return tuple(it.get_tensor(self.outputs[name])[rows] for name in names)

    def reorder(self, origin):
        """The live hypotheses of each sentence follow their origins (flat live rows)."""
        rows = self._live_rows()
        flat = self.history.reshape(self.rows, self.positions)
        flat[rows] = flat[rows[np.asarray(origin)]]
