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

Vocabulary shortlist: an export made with one (`ExportPlan(shortlist=...)`) decodes over it
when loaded with `shortlist=True`: each chunk's shortlist is the lexical table's translations of
its source pieces, the table's frequent pieces, the special ids and the chunk's prefix and
constraint pieces (`keras_transformer.lexical_table.batch_shortlist`), and no other piece can be
chosen: the scores are log-probabilities over the shortlist (as the SavedModel's
`Translator(shortlist=...)`). The projection covers the shortlist's columns alone, gathered
once for the chunk from the export's `shortlist_output.npz` (the shortlist padded to a
bucket, the graph search's rule); how depends on the export (`export.litert.shortlist_head`):
a float export's step takes the columns as an input (`output_columns`); a `dynamic_int8`
export's step gives its decoder output, which the int8 product of the columns' rows, a model
made for the chunk (`keras_transformer.litert.projection`, `gathered_columns`), projects
before `shortlist_head.tflite` scores it (`graphs.GatheredHead`). Its constrained step, and
the step of an int8 export made before the gathered head, take an `output_mask` over the
vocabulary (0 at the shortlist's pieces, NEG_INF elsewhere) added to their own product's
logits.

A row's answer is its own: the chunk's columns are the union of its sentences' shortlists
(`keras_transformer.lexical_table.row_shortlists`), and each hypothesis (rows sentence-major,
a sentence's beams beside each other) is masked to its own sentence's columns before the
log-softmax and the top ones, so each sentence gets the translation, score, token scores and
n-best it gets alone, whatever the other sentences of its chunk carry (as the SavedModel's
search, `decoding.search`). How, per step: the float "columns" step takes its `output_bias`
as `[rows, n]` (the graph's ADD broadcasts), NEG_INF outside each row's own columns; the
gathered head's projection model (`keras_transformer.litert.projection`) adds a `row_bias`
input `[rows, n]` to the columns' logits; the masked step takes `output_mask` `[rows, vocab]`
where the export says so (`"row_mask"` in its metadata's `shortlist`; an export made before it
still takes the chunk's `[vocab]` mask, every row decoded over the chunk's union as before).
Each is set once per chunk (and again when the step's inputs are resized), never per step,
and follows the live rows when settled sentences are dropped (`graphs.DecoderStep.keep`).

Lexical constraints: an export made with its constrained step (`ExportPlan(constraints=
True)`) answers `translate_constrained` (and `translate(texts, constraints=...)`) as the
SavedModel's signature does: the constraints tokenized as it tokenizes them, the constrained
beam search of `keras_transformer.litert.search` (`keras_transformer.constraint_rules`' rules,
the graph's own), and a chunk whose constraints some input could not meet searched again
without them, that input taking the unconstrained answer (`constraints_met` False). The
constrained step is made the first time a request needs it. With `shortlist=True` the search runs
over the chunk's shortlist (which holds every constraint piece) with the export's constrained
shortlist step (made when it has both), each wanted piece given as its shortlist column (as
itself over a mask).

Word alignments: an export made with its alignment graph (`ExportPlan(alignments=True)`)
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

from keras_transformer import search_rules
from keras_transformer.alignment_rules import numpy_word_alignment, piece_flags, word_pairs
from keras_transformer.constraint_rules import NUMPY
from keras_transformer.litert.graphs import (
    Aligner,
    DecoderStep,
    Encoder,
    GatheredHead,
    LiteRTError,
)
from keras_transformer.litert.search import NEG_INF, Settings, search
from keras_transformer.markup import markup_answer
from keras_transformer.special_ids import UNK_ID
from keras_transformer.translating import TranslatorInterface, refusal

METADATA_FILE = "keras_transformer.json"
CACHE_BUCKET = 16  # the self-attention caches' first length (module docstring)


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


def _interpreter(path, num_threads, content=None):
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise LiteRTError(
            'the LiteRT runtime is not installed: pip install "keras-nmt-transformer[litert]" '
            "(or ai-edge-litert)"
        ) from None
    if content is not None:
        return Interpreter(model_content=content, num_threads=num_threads)
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


class LiteRTTranslator(TranslatorInterface):
    """A LiteRT export as string-to-string functions (the SavedModel's signatures, in numpy):
    `keras_transformer.translating.TranslatorInterface`, less what only a SavedModel serves
    (a soft glossary, sampling, `score`: refused in one line naming it).

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
        self.settings = s = meta["decoding"]
        self._search_settings = Settings(s["beam_size"], s["alpha"], s["eos_id"], s["bos_id"])
        self.max_source_length = int(meta["max_source_length"])
        self.max_length = meta.get("max_length")
        self.calibration = meta["calibration"]
        self.shortlist = _shortlist_table(path, meta) if shortlist else None
        self._head = meta["shortlist"].get("head", "columns") if shortlist else None
        self._output_rows = None  # the projection's rows, the shortlist's columns taken from
        if self._head in ("columns", "gathered"):
            self._output_rows = _output_rows(path, meta)
            # the steps' blocked top-k: at least K blocks of columns
            top_k = max(int(meta["top_k"]), int(meta.get("constraints", {}).get("top_k", 0)))
            block = int(meta["shortlist"]["column_block"])
            self._column_layout = {"block": block, "minimum": top_k * block}
            if self._head == "gathered":  # out of the top ones, in the normaliser
                banned = (self.settings["pad_id"], self.settings["bos_id"])
                self._column_layout["banned"] = banned
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
        encoder = Encoder(encoder, meta["outputs"]["encoder"])
        if self.shortlist is None:
            step = _interpreter(os.path.join(path, meta["decoder_step"]), self.num_threads)
            step = DecoderStep(step, meta, bucket=self.cache_bucket)
            return [encoder, step, None]  # the constrained step: when needed
        listed = meta["shortlist"]["decoder_step"]
        step = _interpreter(os.path.join(path, listed), self.num_threads)
        outputs = meta["outputs"]["decoder_step_shortlist"]
        head = None
        if self._head == "gathered":
            with open(os.path.join(path, meta["shortlist"]["head_graph"]), "rb") as f:
                graph = f.read()
            head = GatheredHead(graph, meta["outputs"]["shortlist_head"], self._projection)
        return [encoder, DecoderStep(step, meta, outputs, self.cache_bucket, head), None]

    def _projection(self, model):
        """An interpreter of the model `model` (bytes) a gathered head makes per chunk
        (`keras_transformer.litert.projection`)."""
        return _interpreter(None, self.num_threads, content=model)

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
            engines[2] = DecoderStep(step, meta, outputs, self.cache_bucket)
        return engines[2]

    @contextlib.contextmanager
    def _borrowed(self):
        """`[encoder, step, constrained step or None]` (and the alignment graph's `Aligner`,
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

    translate_glossary = refusal(
        "soft glossaries are not served by the LiteRT export; export a SavedModel of a "
        "workdir prepared with data.terminology (its translate_glossary signature)"
    )
    translate_sample = refusal(
        "sampling is not served by the LiteRT export; export a SavedModel with --sampling-topk K"
    )
    score = refusal(
        "scoring is not served by the LiteRT export; export a SavedModel (its score signature: "
        "keras-transformer score)"
    )

    def translate(self, texts, constraints=None, alignments=False, markup=None, glossary=None):
        """`serving_default`: `{"translation": [n] str, "score": float32 [n], "token_scores":
        float32 [n, longest], "confidence": float32 [n]}`; with `constraints` (a list of
        target-side terms per text), `translate_constrained`'s answer. With `alignments`, also
        `"alignment"`: per text, its word alignment as `Translator.translate(alignments=True)`
        gives it, a list of `(source word, target word)` pairs (words: whitespace-separated).
        With `markup` ("html" or "xml"), `Translator.translate(texts, markup=...)`'s answer
        (`keras_transformer.markup.markup_answer`: lists, the tags carried into the
        translations by the alignments, malformed markup translated as plain text with a
        `MarkupWarning`). Alignments and markup need an export made with the alignment graph
        (module docstring). A `glossary` is refused (`translate_glossary`)."""
        if glossary is not None:
            self.translate_glossary()
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
                margin = search_rules.nbest_margins(NUMPY, s)
                score[rows], margins[rows] = s[:, :keep], margin[:, :keep]
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
        aligner = next((e for e in engines if isinstance(e, Aligner)), None)
        if aligner is None:  # kept with the set, after its other interpreters
            name = os.path.join(self.path, self.metadata["alignments"]["graph"])
            aligner = Aligner(_interpreter(name, self.num_threads))
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
        s_len, settings = source.shape[1], self._search_settings
        buffer = s_len + s["max_extra_length"]
        if self.max_length is not None:
            buffer = min(buffer, int(self.max_length))
        caps = np.minimum(np.array([len(x) for x in sources]) + s["max_extra_length"], buffer)
        prefix_matrix = None
        if prefix is not None and any(prefix):
            prefix_matrix = _padded(prefix, 0)
        columns, beams = None, int(s["beam_size"])
        masked = self._head == "mask" or (self._head == "gathered" and constraints is not None)
        if masked:  # the step's own product masked (a gathered head's constrained step too)
            vocab = int(self.metadata["vocab_size"])
            # a mask per row where the export's masked step takes one (module docstring): a
            # gathered head's constrained step, made with "row_mask"; never an older "mask" step
            per_row = self._head == "gathered" and self.metadata["shortlist"].get("row_mask")
            rows = beams if per_row else None
            columns = _shortlist_mask(
                self.shortlist, vocab, source, prefix_matrix, constraints, beams=rows
            )
        elif self.shortlist is not None:
            columns = _shortlist_columns(
                self.shortlist, self._output_rows, source, prefix_matrix, constraints,
                **self._column_layout, beams=beams,
            )  # fmt: skip
        cross = encoder(source)
        if constraints is None:
            step.start(cross, source != s["pad_id"], buffer, columns)
            return search(step, settings, buffer, caps, prefix=prefix_matrix, return_all=True)
        step = self._constrained_step(engines)
        step.start(cross, source != s["pad_id"], buffer, columns, wanted=constraints.shape[1])
        found = search(step, settings, buffer, caps, return_all=True, constraints=constraints)
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
        return search_rules.confidence(NUMPY, self.calibration, scores, margins)


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
    old_columns = "column_block" not in listed or meta["quantization"] == "dynamic_int8"
    if listed.get("head", "columns") == "columns" and old_columns:
        raise LiteRTError(
            f"{path} was exported with a shortlist step this version does not run: export it "
            "again to decode with shortlist=True"
        )
    return read_lexical_table(os.path.join(path, listed["table"]), gfile=LocalGfile)


def _output_rows(path, meta):
    """`shortlist_output.npz`'s arrays (`export.litert_graphs.shortlist_output_rows`)."""
    with np.load(os.path.join(path, meta["shortlist"]["output"]), allow_pickle=False) as f:
        return {name: f[name] for name in f.files}


def _listed_ids(table, source, extra):
    """`(ids, real, member)` of `lexical_table.row_shortlists` for a chunk's `source` `[c, S]`
    and its rows' `extra` ids (`[c, ...]` each, None skipped): the chunk's columns and each
    sentence's own among them."""
    from keras_transformer.lexical_table import row_shortlists

    return row_shortlists(table.translations, table.frequent, source, extras=extra)


def _row_marks(member, beams):
    """`member` bool `[c, n]` (each sentence's own columns) as float32 `[c * beams, n]`: 0 at
    each hypothesis's own columns, NEG_INF elsewhere (rows sentence-major, as the search's)."""
    return np.repeat(np.where(member, np.float32(0.0), np.float32(NEG_INF)), beams, axis=0)


def _shortlist_mask(table, vocab, source, *extra, beams=None):
    """The masked shortlist step's `{"output_mask"}` for a chunk's `source` `[c, S]` and its
    rows' `extra` ids (the prefixes, the constraints; None skipped): float32 `[vocab]`, 0 at
    the chunk's shortlist's ids (`lexical_table.batch_shortlist`), NEG_INF elsewhere; with
    `beams`, float32 `[c * beams, vocab]`, each hypothesis's row 0 at its own sentence's
    shortlist alone (`lexical_table.row_shortlists`)."""
    ids, real, member = _listed_ids(table, source, extra)
    if beams is None:
        mask = np.full(vocab, np.float32(NEG_INF), "float32")
        mask[ids[real]] = 0.0
        return {"output_mask": mask}
    mask = np.full((len(member), vocab), np.float32(NEG_INF), "float32")
    sentence, column = np.nonzero(member)
    mask[sentence, ids[column]] = 0.0
    return {"output_mask": np.repeat(mask, beams, axis=0)}


def _shortlist_columns(table, rows, source, *extra, block=1, minimum=0, banned=(), beams=None):
    """The shortlist step's `{"output_ids", "output_kernel", "output_bias"}` for a chunk's
    `source` `[c, S]` and its rows' `extra` ids (the prefixes `[c, p]`, the constraints `[c, C,
    P]`; None skipped): its shortlist (`lexical_table.batch_shortlist`), padded with masked
    columns to a multiple of `block` and at least `minimum` columns (what the step's blocked
    top-k needs), the projection's columns of it from `rows` (`_output_rows`), made once for the
    chunk, and their biases, the padding columns masked (NEG_INF). With `beams`, the biases
    are float32 `[c * beams, n]`, each hypothesis's also NEG_INF at the columns outside its
    own sentence's shortlist (`lexical_table.row_shortlists`): each row's log-softmax and top
    ones over its own shortlist alone (a gathered head's: `"row_bias"`, the same marks)."""
    from keras_transformer.lexical_table import PAD_ID

    ids, real, member = _listed_ids(table, source, extra)
    more = max(-(-len(ids) // block) * block, minimum) - len(ids)
    if more > 0:
        ids = np.concatenate([ids, np.full(more, PAD_ID, ids.dtype)])
        real = np.concatenate([real, np.zeros(more, bool)])
        member = np.concatenate([member, np.zeros((len(member), more), bool)], axis=1)
    if rows["rows"].dtype == np.int8:  # a gathered head's (`graphs.GatheredHead.start`)
        columns = gathered_columns(rows, ids, real, banned)
        if beams is not None:
            columns["row_bias"] = _row_marks(member, beams)
        return columns
    kernel, bias = output_columns(rows, ids, real)
    if beams is not None:
        bias = bias + _row_marks(member, beams)  # [c * beams, n]
    return {"output_ids": ids, "output_kernel": kernel, "output_bias": bias}


def gathered_columns(rows, output_ids, real, banned=()):
    """A gathered head's columns (`graphs.GatheredHead.start`) for the batch shortlist
    `output_ids` (`real`: its columns that are not padding; `banned`: the ids never chosen,
    padding and BOS, every shortlist's) from a `dynamic_int8` export's int8 projection rows and
    their scales (`_output_rows`): `{"output_ids" int32 [n], "products": [(rows int8 [n,
    d_model], scales [n], bias [n]), (the banned ids' rows, scales, biases)]}`, the first
    product's biases NEG_INF at the padding and at the banned ids (the head's `banned`
    logits), the second's their own (its `special` logits)."""
    ids = np.asarray(output_ids, "int64")
    biases = rows["bias"] if "bias" in rows else np.zeros(len(rows["rows"]), "float32")
    bias = np.where(real & ~np.isin(ids, banned), biases[ids], np.float32(NEG_INF))
    special = np.asarray(banned, "int64")
    return {
        "output_ids": np.asarray(output_ids, "int32"),
        "products": [
            (rows["rows"][ids], rows["scales"][ids], bias.astype("float32")),
            (rows["rows"][special], rows["scales"][special], biases[special].astype("float32")),
        ],
    }


def output_columns(rows, output_ids, real):
    """`(output_kernel float32 [d_model, n], output_bias float32 [n])`: the shortlist step's
    inputs for the batch shortlist `output_ids` int `[n]` (`real` bool `[n]`: its columns that
    are not padding) from the projection's rows (`_output_rows`, float16 or float32)."""
    ids = np.asarray(output_ids, "int64")
    columns = rows["rows"][ids].astype("float32")
    bias = rows["bias"][ids] if "bias" in rows else np.zeros(len(ids), "float32")
    bias = np.where(real, bias, np.float32(NEG_INF)).astype("float32")
    return np.ascontiguousarray(columns.T), bias


def _padded(rows, fill):
    """int32 `[len(rows), longest]`: the id lists `rows`, each padded with `fill`."""
    matrix = np.full((len(rows), max(len(row) for row in rows)), fill, "int32")
    for i, row in enumerate(rows):
        matrix[i, : len(row)] = row
    return matrix
