"""Recipes behind conftest.py's shared fixtures (`toy_spm_path`, `copy_model`,
`exported_copy_model`): a tiny SentencePiece model and a tiny Transformer trained on a toy copy
task (a few hundred steps, a few seconds on a CPU); plus the numpy references the inference
tests compare with (`encode_sources`, `decode_outputs`) and `assert_same_answers` for two
signatures' outputs. Tests use the fixtures.
"""

import atexit
import functools
import os
import random
import shutil
import tempfile

import numpy as np

WORDS = "red green blue black white apple pear plum cat dog bird fish".split()
PAD, UNK, BOS, EOS = 0, 1, 2, 3
MAX_SOURCE_LENGTH = 16


@functools.lru_cache(maxsize=None)
def work_dir():
    path = tempfile.mkdtemp(prefix="kt-inference-tests-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def toy_sentences(n, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5))) for _ in range(n)]


# The directory every pytest-xdist worker of this run shares (`shared_runs.run_root`, set by
# tests/conftest.py): the vocabulary and the trained copy model are made there once per run.
SHARED_ROOT = None


def _shared(name, build):
    """`build(directory)` once per test run (every worker reads the same files), or in this
    process's own directory outside pytest."""
    if SHARED_ROOT is None:
        directory = os.path.join(work_dir(), name)
        os.makedirs(directory, exist_ok=True)
        build(directory)
        return directory
    from shared_runs import shared_directory

    return str(shared_directory(SHARED_ROOT, name, lambda path: build(str(path))))


def glossary_spm_proto(prefix):
    """The bytes of a 40-piece SentencePiece model of the toy sentences that keeps the glossary
    tags (`keras_transformer.glossary.TAGS`) whole, trained at `prefix` (a path without
    `.model`)."""
    import sentencepiece as spm

    from keras_transformer import glossary

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(toy_sentences(300)), model_prefix=prefix, vocab_size=40,
        pad_id=0, unk_id=1, bos_id=2, eos_id=3, user_defined_symbols=list(glossary.TAGS),
        minloglevel=2,
    )  # fmt: skip
    with open(prefix + ".model", "rb") as f:
        return f.read()


@functools.lru_cache(maxsize=None)
def spm_model_path():
    """A SentencePiece model with pad 0, unk 1, bos 2, eos 3 trained on the toy sentences."""
    return os.path.join(_shared("toy_spm", _train_spm), "spm.model")


def _train_spm(directory):
    import sentencepiece as spm

    prefix = os.path.join(directory, "spm")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(toy_sentences(2000, seed=1)),
        model_prefix=prefix,
        vocab_size=40,
        model_type="unigram",
        pad_id=PAD,
        unk_id=UNK,
        bos_id=BOS,
        eos_id=EOS,
        hard_vocab_limit=False,
        minloglevel=2,
    )


@functools.lru_cache(maxsize=None)
def spm_processor():
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=spm_model_path())


def assert_same_answers(out, reference, atol=1e-4):
    """Two outputs of an exported signature (`{name: tensor}`) agree: the same names, the same
    strings, and the numbers to `atol`."""
    assert set(out) == set(reference)
    for key, value in out.items():
        if value.dtype.name == "string":
            np.testing.assert_array_equal(value.numpy(), reference[key].numpy())
        else:
            np.testing.assert_allclose(value.numpy(), reference[key].numpy(), atol=atol)


def encode_sources(texts, max_source_length=MAX_SOURCE_LENGTH):
    """Python reference of the training layout: tokens + EOS, truncated keeping EOS, 0-padded."""
    sp = spm_processor()
    rows = [sp.encode(t)[: max_source_length - 1] + [EOS] for t in texts]
    width = max(len(r) for r in rows)
    return np.array([r + [PAD] * (width - len(r)) for r in rows], dtype="int32")


def decode_outputs(ids):
    """Output ids (EOS then 0s) -> strings."""
    sp = spm_processor()
    texts = []
    for row in np.asarray(ids).tolist():
        tokens = []
        for t in row:
            if t in (PAD, EOS):
                break
            tokens.append(t)
        texts.append(sp.decode(tokens))
    return texts


MODEL_KWARGS = dict(num_layers=1, d_model=32, num_heads=2, d_ff=64, dropout=0.0)

# The decoding settings of the exported copy model (conftest.py's `exported_copy_model`).
EXPORT_DECODE = {"beam_size": 3, "alpha": 0.6, "max_extra_length": 8, "batch_size": 4}
EXPORT_DATA = {"max_source_length": MAX_SOURCE_LENGTH}


def export_plan(**changes):
    """The `ExportPlan` of the exported copy model (`EXPORT_DECODE`, `EXPORT_DATA`), with
    `changes` (its other fields)."""
    from keras_transformer.config import DecodingSettings
    from keras_transformer.export.plan import ExportPlan

    fields = {"settings": DecodingSettings(**EXPORT_DECODE), "data": EXPORT_DATA, **changes}
    return ExportPlan(**fields)


LITERT_QUANTIZATIONS = ("float32", "dynamic_int8")


def litert_shortlist_exports(root, name, model, spm_bytes, beam_size=EXPORT_DECODE["beam_size"]):
    """`{quantization: directory}`: `model` exported to LiteRT in each of `LITERT_QUANTIZATIONS`
    with a shortlist table of every piece and its constrained steps, built once per run as
    `shared_runs.shared_directory(root, name, ...)`. The shortlist tests and the row tests read
    the beam-3 one by the same name, so one builder makes it for both."""
    from _shortlist_tables import full_table
    from shared_runs import shared_directory

    from keras_transformer.config import DecodingSettings
    from keras_transformer.export.litert import export_litert

    settings = DecodingSettings(**{**EXPORT_DECODE, "beam_size": beam_size})
    table = full_table(model.vocab_size)

    def export(base):
        for q in LITERT_QUANTIZATIONS:
            plan = export_plan(quantization=q, settings=settings, shortlist=table, constraints=True)
            export_litert(model, spm_bytes, str(base / q), plan)

    base = shared_directory(root, name, export)
    return {q: str(base / q) for q in LITERT_QUANTIZATIONS}


# Sentences of the copy-task vocabulary, and inputs every signature must answer all the same.
NORMAL = ["red apple cat", "dog dog fish bird", "blue", "plum pear white black green"]
HOSTILE = [
    "",
    "   \t  ",
    " ".join(["red green blue"] * 400),  # far longer than the max source length
    b"red \xff\xfe apple \xc3",  # invalid UTF-8
    "\u00e9t\u00e9 \u2603 \U0001f600",  # valid UTF-8 outside the vocabulary
]


def dev_pairs(n=64, seed=7):
    """Dev pairs for the exported copy model's calibration: the copy task's references, some
    of them (a third) with their words reversed so that sentence chrF varies."""
    rng = random.Random(seed)
    sources = toy_sentences(n, seed=seed)
    return [(s, " ".join(s.split()[::-1]) if rng.random() < 1 / 3 else s) for s in sources]


@functools.lru_cache(maxsize=None)
def trained_model(steps=600):
    """A tiny Transformer trained with `model.fit` to copy its input (target = source): trained
    by the first worker that asks, and its weights loaded by the others."""
    from keras_transformer.models import Transformer

    trained = {}

    def train(directory):
        trained["model"] = _train_copy_model(steps)
        weights = trained["model"].get_weights()  # in order: Keras's layer names may differ
        np.savez(os.path.join(directory, "weights.npz"), *weights)

    directory = _shared(f"copy_model_{steps}", train)
    if "model" in trained:
        return trained["model"]
    model = Transformer(vocab_size=spm_processor().get_piece_size(), **MODEL_KWARGS)
    model({"source_ids": np.ones((1, 2), "int32"), "target_ids": np.ones((1, 2), "int32")})
    with np.load(os.path.join(directory, "weights.npz")) as saved:
        model.set_weights([saved[f"arr_{i}"] for i in range(len(saved.files))])
    _compile(model)
    return model


def _compile(model):
    import keras

    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


def _train_copy_model(steps):
    import keras

    from keras_transformer.models import Transformer

    keras.utils.set_random_seed(0)
    sp = spm_processor()
    texts = toy_sentences(2048, seed=2)
    pieces = [sp.encode(t)[: MAX_SOURCE_LENGTH - 1] for t in texts]
    width = MAX_SOURCE_LENGTH

    def pad(rows):
        return np.array([r + [PAD] * (width - len(r)) for r in rows], dtype="int32")

    source = pad([p + [EOS] for p in pieces])
    target_in = pad([[BOS] + p for p in pieces])
    labels = pad([p + [EOS] for p in pieces])
    weights = (labels != PAD).astype("float32")
    model = Transformer(vocab_size=sp.get_piece_size(), **MODEL_KWARGS)
    _compile(model)
    batch = 64
    epochs = max(1, steps * batch // len(texts))
    model.fit(
        {"source_ids": source, "target_ids": target_in},
        labels,
        sample_weight=weights,
        batch_size=batch,
        epochs=epochs,
        verbose=0,
    )
    return model


def concurrent_requests(threads=8, per_thread=50, seed=5):
    """`[thread][request]` lists of 1 to 7 sentences (a hostile input now and then): what the
    concurrency tests send from each of `threads` threads at once."""
    rng = random.Random(seed)
    pool = toy_sentences(200, seed=seed) + NORMAL + HOSTILE
    return [
        [[rng.choice(pool) for _ in range(rng.randint(1, 7))] for _ in range(per_thread)]
        for _ in range(threads)
    ]


def run_concurrently(call, requests):
    """`call(request)` for each request of `requests[i]` in thread `i`, all threads released at
    once: the answers, `[thread][request]`. A thread's exception is raised here."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    start = threading.Barrier(len(requests))

    def work(mine):
        start.wait()
        return [call(request) for request in mine]

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(work, requests))


def assert_concurrent_answers_are_the_answers_alone(answer, requests, atol=1e-5):
    """`answer(request)` -> `(translations, scores)` gives, from every thread of `requests` at
    once (`run_concurrently`), what each request gets alone."""
    alone = [[answer(request) for request in mine] for mine in requests]
    together = run_concurrently(answer, requests)
    for mine, theirs in zip(alone, together):
        for (text, score), (text_together, score_together) in zip(mine, theirs):
            assert text_together == text
            np.testing.assert_allclose(score_together, score, atol=atol)
