"""Beam-4 decoding tokens/s: our SavedModel, our LiteRT exports, CTranslate2 and TF Model
Garden, in one run.

Usage (from the repository root, PYTHONPATH=$PWD):
    python benchmarks/serve_compare.py                       # small and base shapes
    python benchmarks/serve_compare.py --shapes small --runs 3 --no-peer
    python benchmarks/serve_compare.py --no-peer --beam-size 1  # greedy: our beam-1 export, CT2
    python benchmarks/serve_compare.py --no-peer --xla  # also the export with XLA's search
    python benchmarks/serve_compare.py --no-peer --shortlist  # also the vocabulary shortlist
    python benchmarks/serve_compare.py --no-peer --bfloat16  # also the bfloat16 SavedModel
    python benchmarks/serve_compare.py --no-peer --litert dynamic_int8 --cache-buckets 0

For each shape (../shared/bench/README.md: small, base) one model with random weights is
1. exported as our SavedModel and run through its `serving_default` signature, strings in and
   out, as TF Serving runs it (tokenization, beam search and detokenization in the graph);
2. converted with `keras_transformer.export.ct2.export_ctranslate2` and run by CTranslate2 with
   `compute_type` float32 and int8 (weights quantized when loading), 2 intra-op threads;
3. and TF Model Garden's `Seq2SeqTransformer` of the same shapes runs its own beam search
   (`/tmp/peers/mg/bin/python ../shared/bench/peer_modelgarden.py`, one training step first).

Same inputs for ours and CTranslate2: the first 32 of `batch` random sources of `src` tokens
(a word-level SentencePiece vocabulary `t4 .. t{vocab-1}`, so one word is one token), beam 4,
length penalty 0.6. Output lengths are pinned to `tgt` tokens: the EOS embedding row is zero, so
EOS never wins on random weights and our search runs to its length limit (`tgt` tokens, then the
forced EOS: one more decoder step than CTranslate2's `min_decoding_length =
max_decoding_length = tgt`); the script checks every output has `tgt` tokens. Output tokens/s =
32 * tgt * runs / seconds after one warm-up call, the best of `--rounds` rounds in which ours and
CTranslate2 take turns (the machine is shared: turns spread the other jobs' load evenly, and
the best round is the least disturbed). Prints one JSON line per figure, then one with the
ratios to CTranslate2 float32 and to Model Garden, and of our LiteRT exports (`--litert`, run by
`keras_transformer.litert` without TensorFlow) to CTranslate2 float32 and int8
(`ours_litert_int8_over_ct2_int8` for `dynamic_int8`); the machine's load (`os.getloadavg`) is in
every line. `--cache-buckets 0,8` also runs each LiteRT export with those `cache_bucket`
settings (0: caches sized for the whole output; `ours_litert_<quantization>_bucket<N>`), the
ratios line giving each over the runtime's default (`ours_litert_int8_bucket0_over_default`).

`--shortlist` adds the vocabulary shortlist, one lexical table (`synthetic_table`) for all:
the SavedModel exported with it (`ours_saved_model_shortlist`), each LiteRT export run with it
(`ours_litert_<quantization>_shortlist`, `litert.load(shortlist=True)`) and CTranslate2 int8
with the same table as its vocabulary map (`ctranslate2_int8_vmap`, `use_vmap=True`, the
sources given as their pieces so that the map's lines apply). The table is random, as the
weights are: each source piece's `k` translations are drawn by a Zipf law over the target
pieces (the frequent ones shared by many rows, as in a real table), so the batch's shortlist
width (`shortlist_width`, in the ratios line) is what the speed depends on; the ratios line
adds `ours_litert_int8_shortlist_over_ct2_int8_vmap` (the issue's target), the SavedModel with
it over CTranslate2 float32 and int8, and each engine with it over itself without.

`--bfloat16` adds the SavedModel exported with `precision="bfloat16"` (`export.precision`:
weights and products in bfloat16; `ours_saved_model_bfloat16`, and with `--shortlist` also
`ours_saved_model_shortlist_bfloat16`), the ratios line giving each over CTranslate2 float32
and int8 and over the float32 export (`ours_bfloat16_over_ct2_int8`, ...).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from benchmarks.common import BASE, SMALL, emit  # noqa: E402
from keras_transformer.data.shortlist import DEFAULT_K, DEFAULT_M  # noqa: E402

SHAPES = {"small": SMALL, "base": BASE}
PEER_PYTHON = "/tmp/peers/mg/bin/python"
PEER_SCRIPT = os.path.join(ROOT, "..", "shared", "bench", "peer_modelgarden.py")
SENTENCES = 32
SHORTLIST_ZIPF = 1.1  # the default exponent of `synthetic_table`'s Zipf law (not fitted)


def word_vocabulary(vocab):
    """A SentencePiece model proto whose pieces are `<pad> <unk> <s> </s> t4 ... t{vocab-1}`,
    one word each (model type WORD)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    piece = pb.ModelProto.SentencePiece
    for text, kind in (
        ("<pad>", piece.CONTROL),
        ("<unk>", piece.UNKNOWN),
        ("<s>", piece.CONTROL),
        ("</s>", piece.CONTROL),
    ):
        proto.pieces.add(piece=text, type=kind, score=0.0)
    for i in range(4, vocab):
        proto.pieces.add(piece=f"\u2581t{i}", type=piece.NORMAL, score=-1.0)
    proto.trainer_spec.model_type = pb.TrainerSpec.WORD
    proto.trainer_spec.vocab_size = vocab
    proto.trainer_spec.pad_id, proto.trainer_spec.unk_id = 0, 1
    proto.trainer_spec.bos_id, proto.trainer_spec.eos_id = 2, 3
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = True
    proto.normalizer_spec.escape_whitespaces = True
    return proto.SerializeToString()


def build_model(cfg):
    """Random weights; EOS can never be the best next token (its embedding row is zero)."""
    import keras

    from keras_transformer.models import Transformer

    keras.utils.set_random_seed(0)
    model = Transformer(
        vocab_size=cfg["vocab"], num_layers=cfg["layers"], d_model=cfg["d"],
        num_heads=cfg["heads"], d_ff=cfg["ff"], dropout=0.0,
    )  # fmt: skip
    model({"source_ids": np.ones((1, 2), "int32"), "target_ids": np.ones((1, 2), "int32")})
    embeddings = model.target_embedding.embeddings
    value = np.asarray(embeddings.numpy())
    value[3] = 0.0
    embeddings.assign(value)
    return model


def sources(cfg):
    rng = np.random.default_rng(1)
    ids = rng.integers(4, cfg["vocab"], (SENTENCES, cfg["src"]))
    return [" ".join(f"t{i}" for i in row) for row in ids]


def synthetic_table(vocab, k, m, zipf=SHORTLIST_ZIPF, seed=2):
    """A random lexical table (`data.shortlist.LexicalTable`) for the word vocabulary of
    `word_vocabulary`: the `m` frequent pieces are `t4 .. t{m+3}`; each source piece's `k`
    translations are drawn without repeats from the target pieces by a Zipf law (rank `r` of
    the pieces after the special ids with weight `1 / r ** zipf`, the ranks shuffled once), so
    rows share their common pieces as a real table's do: a larger `zipf` makes the batch's
    shortlist narrower (base shapes, m 100: 10,446 of 32,000 pieces at k 50 and zipf 1.1,
    16,419 at k 100, the default; 4,319 at k 50 and 1.5). EOS is never a translation (it is in
    every shortlist anyway)."""
    from keras_transformer.data.shortlist import LexicalTable

    rng = np.random.default_rng(seed)
    targets = rng.permutation(np.arange(4, vocab))
    weights = 1.0 / np.arange(1, targets.size + 1) ** zipf
    weights /= weights.sum()
    k = min(k, targets.size)
    translations = np.zeros((vocab, k), np.int32)
    for row in range(4, vocab):
        translations[row] = rng.choice(targets, size=k, replace=False, p=weights)
    frequent = np.arange(4, min(vocab, 4 + m), dtype=np.int32)
    settings = {"k": k, "m": int(m), "estimate": f"zipf {zipf} (serve_compare)"}
    return LexicalTable(translations, frequent, settings)


def shortlist_width(table, spm_bytes, cfg):
    """The width of the benchmark batch's shortlist (`data.shortlist.batch_shortlist`): the
    union's size, before padding to the bucket."""
    import sentencepiece as spm

    from keras_transformer.data.shortlist import batch_shortlist

    processor = spm.SentencePieceProcessor(model_proto=spm_bytes)
    ids = np.array([processor.encode(s) + [3] for s in sources(cfg)], np.int32)
    _, real = batch_shortlist(table.translations, table.frequent, ids)
    return int(real.sum())


def time_calls(fn, runs):
    start = time.perf_counter()
    for _ in range(runs):
        result = fn()
    return time.perf_counter() - start, result


def saved_model_decoder(
    model, spm_bytes, cfg, work, beam=4, jit_compile=False, shortlist=None, precision="float32"
):
    """Our SavedModel's `serving_default`, loaded as TF Serving loads it: `() -> lengths`
    (`jit_compile`: the export's search compiled with XLA, `export.jit_compile`; `shortlist`:
    a lexical table the export decodes over, `export.shortlist`; `precision`:
    `export.precision`)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    from keras_transformer.config import DecodingSettings
    from keras_transformer.export import ExportPlan, export_saved_model

    settings = DecodingSettings(beam_size=beam, alpha=0.6, batch_size=SENTENCES, n_best=1,
                                max_extra_length=cfg["tgt"] - cfg["src"])  # fmt: skip
    data = {"max_source_length": cfg["src"] + 1, "max_target_length": cfg["tgt"] + 1}
    name = "bench_xla" if jit_compile else "bench"
    name += ("" if shortlist is None else "_shortlist") + f"_{precision}"
    plan = ExportPlan(settings=settings, data=data, jit_compile=jit_compile, shortlist=shortlist,
                      quantization=precision)  # fmt: skip
    path = export_saved_model(model, spm_bytes, plan, work, name)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    text = tf.constant(sources(cfg))

    def decode_batch():
        return [len(t.split()) for t in serve(text=text)["translation"].numpy()]

    return decode_batch


def ctranslate2_decoders(model, spm_bytes, cfg, work, compute_types, beam=4, shortlist=None):
    """`{compute type: () -> lengths}` on the converted model, 2 intra-op threads; with a
    `shortlist` table, also `ctranslate2_int8_vmap`: int8 with the table as its vocabulary map."""
    import ctranslate2

    from keras_transformer.export.ct2 import export_ctranslate2

    data = {"max_source_length": cfg["src"] + 1, "max_target_length": cfg["tgt"] + 1}
    model_dir = export_ctranslate2(model, spm_bytes, os.path.join(work, "ct2"), None, data,
                                   shortlist=shortlist)  # fmt: skip
    batch = [s.split() for s in sources(cfg)]
    options = dict(beam_size=beam, length_penalty=0.6, max_decoding_length=cfg["tgt"],
                   min_decoding_length=cfg["tgt"], max_batch_size=0)  # fmt: skip
    decoders = {}
    for compute_type in compute_types:
        translator = ctranslate2.Translator(
            model_dir, device="cpu", compute_type=compute_type, intra_threads=2, inter_threads=1
        )

        def decode_batch(t=translator):
            return [len(r.hypotheses[0]) for r in t.translate_batch(batch, **options)]

        decoders[f"ctranslate2_{compute_type}"] = decode_batch
    if shortlist is not None:  # the map's lines are keyed by pieces: the sources as pieces
        pieces = [["\u2581" + word for word in words] for words in batch]
        translator = ctranslate2.Translator(
            model_dir, device="cpu", compute_type="int8", intra_threads=2, inter_threads=1
        )

        def decode_vmap(t=translator):
            results = t.translate_batch(pieces, use_vmap=True, **options)
            return [len(r.hypotheses[0]) for r in results]

        decoders["ctranslate2_int8_vmap"] = decode_vmap
    return decoders


def litert_decoders(
    model, spm_bytes, cfg, work, quantizations, beam=4, shortlist=None, buckets=()
):  # fmt: skip
    """`{"ours_litert_<quantization>": () -> lengths}`: our LiteRT exports run by
    `keras_transformer.litert` (no TensorFlow in the loop), 2 threads, the same settings as the
    SavedModel's; with a `shortlist` table, exported with it and also run over it
    (`"ours_litert_<quantization>_shortlist"`; the step without it is the same graph); each of
    `buckets` also runs the export with that `cache_bucket`
    (`"ours_litert_<quantization>_bucket<N>"`, 0: caches sized for the whole output)."""
    from keras_transformer import litert
    from keras_transformer.config import DecodingSettings
    from keras_transformer.export.litert import export_litert
    from keras_transformer.export.plan import ExportPlan

    settings = DecodingSettings(beam_size=beam, alpha=0.6, batch_size=SENTENCES, n_best=1,
                                max_extra_length=cfg["tgt"] - cfg["src"])  # fmt: skip
    data = {"max_source_length": cfg["src"] + 1, "max_target_length": cfg["tgt"] + 1}
    text = sources(cfg)
    decoders = {}
    for quantization in quantizations:
        path = os.path.join(work, f"litert-{quantization}")
        plan = ExportPlan(quantization=quantization, settings=settings, data=data,
                          shortlist=shortlist)  # fmt: skip
        export_litert(model, spm_bytes, path, plan)
        for listed in (False, True) if shortlist is not None else (False,):
            translator = litert.load(path, num_threads=2, shortlist=listed)

            def decode_batch(t=translator):
                return [len(x.split()) for x in t.translate(text)["translation"]]

            name = f"ours_litert_{quantization}" + ("_shortlist" if listed else "")
            decoders[name] = decode_batch
        for bucket in buckets:
            translator = litert.load(path, num_threads=2, cache_bucket=bucket)

            def decode_bucketed(t=translator):
                return [len(x.split()) for x in t.translate(text)["translation"]]

            decoders[f"ours_litert_{quantization}_bucket{bucket}"] = decode_bucketed
    return decoders


def measure(decoders, cfg, runs, rounds):
    """Best tokens/s of each decoder over `rounds` rounds, the decoders taking turns in each
    round (so a burst of load from the machine's other jobs hits them alike)."""
    best = {}
    for fn in decoders.values():
        assert sorted(set(fn())) == [cfg["tgt"]]  # warm-up; every output has tgt tokens
    for _ in range(rounds):
        for name, fn in decoders.items():
            seconds, _ = time_calls(fn, runs)
            tokens_per_s = SENTENCES * cfg["tgt"] * runs / seconds
            if tokens_per_s > best.get(name, (0.0, 0.0))[0]:
                best[name] = (tokens_per_s, seconds)
    return best


def bench_model_garden(cfg):
    if not (os.path.exists(PEER_PYTHON) and os.path.exists(PEER_SCRIPT)):
        return None
    shapes = {k: cfg[k] for k in ("vocab", "d", "layers", "heads", "ff", "batch", "src", "tgt")}
    shapes["steps"] = 1  # the peer trains first; only its decoding is compared here
    done = subprocess.run(
        [PEER_PYTHON, PEER_SCRIPT, json.dumps(shapes)], capture_output=True, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), timeout=1800,
    )  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith("{") and '"beam4_decode"' in line:
            return json.loads(line)["tokens_per_s"]
    print(done.stderr[-2000:], file=sys.stderr)
    return None


def run_shape(
    name, cfg, runs, rounds, peer, beam=4, xla=False, litert=(), shortlist=None, buckets=(),
    bfloat16=False,
):  # fmt: skip
    """`shortlist`: `(k, m, zipf)` of the `synthetic_table` the shortlist rows decode with, or
    None; `buckets`: the LiteRT runtime's `cache_bucket` settings run beside its default;
    `bfloat16`: also the SavedModel rows in bfloat16."""
    load = os.getloadavg()[0]
    model = build_model(cfg)
    spm_bytes = word_vocabulary(cfg["vocab"])
    table = None if shortlist is None else synthetic_table(cfg["vocab"], *shortlist)
    what = f"beam{beam}_decode"
    common = dict(shapes=name, beam=beam, sentences=SENTENCES, src=cfg["src"], tgt=cfg["tgt"],
                  runs=runs, rounds=rounds)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="kt-serve-compare-") as work:
        signature = saved_model_decoder(model, spm_bytes, cfg, work, beam)
        decoders = {"ours_saved_model_signature": signature}
        if table is not None:
            decoders["ours_saved_model_shortlist"] = saved_model_decoder(
                model, spm_bytes, cfg, work, beam, shortlist=table
            )
        if bfloat16:
            decoders["ours_saved_model_bfloat16"] = saved_model_decoder(
                model, spm_bytes, cfg, work, beam, precision="bfloat16"
            )
        if bfloat16 and table is not None:
            decoders["ours_saved_model_shortlist_bfloat16"] = saved_model_decoder(
                model, spm_bytes, cfg, work, beam, shortlist=table, precision="bfloat16"
            )
        if xla:
            decoders["ours_saved_model_xla"] = saved_model_decoder(
                model, spm_bytes, cfg, work, beam, jit_compile=True
            )
        decoders.update(
            ctranslate2_decoders(model, spm_bytes, cfg, work, ("float32", "int8"), beam, table)
        )
        if litert:
            decoders.update(
                litert_decoders(model, spm_bytes, cfg, work, litert, beam, table, buckets)
            )
        figures = measure(decoders, cfg, runs, rounds)
    for system, (tokens_per_s, seconds) in figures.items():
        emit(what=what, system=system, tokens_per_s=round(tokens_per_s, 1),
             seconds=round(seconds, 3), load1=load, **common)  # fmt: skip
    mg = bench_model_garden(cfg) if peer and beam == 4 else None
    if mg is not None:
        emit(what="beam4_decode", system="model_garden", tokens_per_s=round(mg, 1),
             load1=os.getloadavg()[0], **common)  # fmt: skip
    ours = figures["ours_saved_model_signature"][0]
    ct2_float32 = figures["ctranslate2_float32"][0]
    ratios = {
        "ours_over_ct2_float32": round(ours / ct2_float32, 3),
        "ct2_int8_over_ct2_float32": round(figures["ctranslate2_int8"][0] / ct2_float32, 3),
    }
    if xla:
        ratios["ours_xla_over_ct2_float32"] = round(
            figures["ours_saved_model_xla"][0] / ct2_float32, 3
        )
    ct2_int8 = figures["ctranslate2_int8"][0]
    for quantization in litert:
        ours_litert = figures[f"ours_litert_{quantization}"][0]
        short = "int8" if quantization == "dynamic_int8" else quantization  # the key
        ratios[f"ours_litert_{short}_over_ct2_float32"] = round(ours_litert / ct2_float32, 3)
        ratios[f"ours_litert_{short}_over_ct2_int8"] = round(ours_litert / ct2_int8, 3)
        for bucket in buckets:
            bucketed = figures[f"ours_litert_{quantization}_bucket{bucket}"][0]
            ratios[f"ours_litert_{short}_bucket{bucket}_over_default"] = round(
                bucketed / ours_litert, 3
            )
    if bfloat16:
        ratios.update(bfloat16_ratios(figures))
    if table is not None:
        ratios.update(shortlist_ratios(figures, litert))
        ratios["shortlist_width"] = shortlist_width(table, spm_bytes, cfg)
        ratios["shortlist_table"] = dict(table.settings)
    if mg is not None:
        ratios["ours_over_model_garden"] = round(ours / mg, 3)
        ratios["ct2_float32_over_model_garden"] = round(ct2_float32 / mg, 3)
    emit(what=what + "_ratios", load1_end=os.getloadavg()[0], **ratios, **common)


def bfloat16_ratios(figures):
    """The bfloat16 rows' ratios (module docstring) from `{system: (tokens/s, seconds)}`."""
    ratios = {}
    for suffix in ("", "_shortlist"):
        half = figures.get(f"ours_saved_model{suffix}_bfloat16")
        if half is None:
            continue
        full = figures[f"ours_saved_model{suffix}" if suffix else "ours_saved_model_signature"]
        key = f"ours{suffix}_bfloat16"
        ratios[f"{key}_over_ct2_float32"] = half[0] / figures["ctranslate2_float32"][0]
        ratios[f"{key}_over_ct2_int8"] = half[0] / figures["ctranslate2_int8"][0]
        ratios[f"{key}_over_float32"] = half[0] / full[0]
    return {key: round(value, 3) for key, value in ratios.items()}


def shortlist_ratios(figures, litert):
    """The shortlist rows' ratios (module docstring) from `{system: (tokens/s, seconds)}`."""
    speed = {name: value[0] for name, value in figures.items()}
    listed, vmap = speed["ours_saved_model_shortlist"], speed["ctranslate2_int8_vmap"]
    ratios = {
        "ours_shortlist_over_ct2_float32": listed / speed["ctranslate2_float32"],
        "ours_shortlist_over_ct2_int8": listed / speed["ctranslate2_int8"],
        "ours_shortlist_over_ours": listed / speed["ours_saved_model_signature"],
        "ct2_int8_vmap_over_ct2_int8": vmap / speed["ctranslate2_int8"],
    }
    for quantization in litert:
        short = "int8" if quantization == "dynamic_int8" else quantization
        ours = speed[f"ours_litert_{quantization}_shortlist"]
        ratios[f"ours_litert_{short}_shortlist_over_ct2_int8_vmap"] = ours / vmap
        ratios[f"ours_litert_{short}_shortlist_over_ours_litert_{short}"] = (
            ours / speed[f"ours_litert_{quantization}"]
        )
    return {key: round(value, 3) for key, value in ratios.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="small,base", help="comma-separated: small, base")
    parser.add_argument("--runs", type=int, default=2, help="timed calls per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the best one counts")
    parser.add_argument("--no-peer", action="store_true", help="skip TF Model Garden")
    parser.add_argument(
        "--beam-size", type=int, default=4,
        help="beam size of our export and CTranslate2 (1: greedy; Model Garden runs at 4 only)",
    )  # fmt: skip
    parser.add_argument(
        "--xla", action="store_true",
        help="also our export with its search compiled by XLA (export.jit_compile: true)",
    )  # fmt: skip
    parser.add_argument(
        "--litert", default="float32,dynamic_int8",
        help="comma-separated quantizations of our LiteRT export to add ('' for none)",
    )  # fmt: skip
    parser.add_argument(
        "--shortlist", action="store_true",
        help="also the vocabulary shortlist: the SavedModel, the LiteRT exports and "
        "CTranslate2 int8 (its vmap) with one random lexical table",
    )  # fmt: skip
    parser.add_argument(
        "--shortlist-k", type=int, default=DEFAULT_K, help="the table's translations"
    )
    parser.add_argument("--shortlist-m", type=int, default=DEFAULT_M, help="its frequent pieces")
    parser.add_argument(
        "--shortlist-zipf", type=float, default=SHORTLIST_ZIPF,
        help="the Zipf exponent its translations are drawn with (larger: narrower shortlists)",
    )  # fmt: skip
    parser.add_argument(
        "--bfloat16", action="store_true",
        help="also our SavedModel exported in bfloat16 (export.precision), with the shortlist "
        "too under --shortlist",
    )  # fmt: skip
    parser.add_argument(
        "--cache-buckets", default="",
        help="comma-separated cache_bucket settings (0: off) to run each LiteRT export with "
        "beside the runtime's default, e.g. 0,8",
    )  # fmt: skip
    args = parser.parse_args()
    litert = tuple(q for q in args.litert.split(",") if q)
    buckets = tuple(int(b) for b in args.cache_buckets.split(",") if b)
    shortlist = None
    if args.shortlist:
        shortlist = (args.shortlist_k, args.shortlist_m, args.shortlist_zipf)
    for name in args.shapes.split(","):
        run_shape(
            name,
            SHAPES[name],
            args.runs,
            args.rounds,
            not args.no_peer,
            args.beam_size,
            args.xla,
            litert,
            shortlist,
            buckets,
            args.bfloat16,
        )


if __name__ == "__main__":
    main()
