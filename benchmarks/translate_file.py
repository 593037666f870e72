"""Lines/s translating a file: `keras-transformer translate --input/--output` against
CTranslate2's `Translator.translate_file`, on the same exported model.

Usage (from the repository root, PYTHONPATH=$PWD), with a trained workdir (the quickstart's:
`keras-transformer train --config configs/quickstart.yaml`, a few minutes):
    python benchmarks/translate_file.py --workdir workdirs/quickstart            # 100k lines
    python benchmarks/translate_file.py --workdir workdirs/quickstart --jit-compile  # XLA export
    python benchmarks/translate_file.py --model saved_models/quickstart \\
        --ct2-model saved_models/quickstart-ctranslate2 --input FILE --threads 2

With `--workdir`, the workdir is exported twice into a temporary directory (`keras-transformer
export`, and `export --format ctranslate2`, float32), so both systems run the same weights;
otherwise `--model` and `--ct2-model` name the two exports of one model. The input is `--input`
or `--lines` sentences of the built-in synthetic corpus (the quickstart's language, test split).

Both systems read the file in chunks of `--chunk-lines` lines (CTranslate2's `read_batch_size`),
sort each chunk by length, translate batches of `--batch-size` sentences with the SavedModel's
beam size and length penalty (its `assets.extra/keras_transformer.json`) and write the outputs
in input order; both get `--threads` threads (TensorFlow's intra- and inter-op pools; CTranslate2's
`intra_threads`, one batch at a time). CTranslate2 tokenizes with the export's `spm.model` in
Python (`source_tokenize_fn`, truncated as our graph does) and stops at `max_source_length +
max_extra_length` tokens. The figure is end to end, from the command's start (model loading
included) to the last line written: lines / seconds. The CTranslate2 line also gives the share of
output lines identical to ours (a check that both run the same model and settings; the
length limits differ slightly, so a few lines may too).

Prints one JSON line per system (`system`: keras-transformer, ctranslate2); `BENCH_LABEL=...`
appends them to results/translate_file.jsonl.
"""

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import emit  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="training workdir to export both ways")
    parser.add_argument("--model", help="our SavedModel (instead of --workdir)")
    parser.add_argument("--ct2-model", help="its CTranslate2 export (with --model)")
    parser.add_argument("--input", help="source file (default: --lines synthetic sentences)")
    parser.add_argument("--lines", type=int, default=100_000, help="synthetic lines (100000)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads per system")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch (32)")
    parser.add_argument("--chunk-lines", type=int, default=4096, help="lines sorted at a time")
    parser.add_argument("--systems", default="keras-transformer,ctranslate2")
    parser.add_argument(
        "--jit-compile", action="store_true",
        help="with --workdir: export our SavedModel with export.jit_compile=true (XLA's search)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if bool(args.workdir) == bool(args.model and args.ct2_model):
        parser.error("give --workdir, or --model and --ct2-model")
    return args


def export_both(workdir, directory, jit_compile=False):
    """`(SavedModel dir, CTranslate2 dir)` exported from `workdir` into `directory`."""
    from keras_transformer import cli

    saved, ct2 = os.path.join(directory, "saved_models"), os.path.join(directory, "ct2")
    ours = ["--output", saved] + (["--jit-compile"] if jit_compile else [])
    for extra in (ours, ["--output", ct2, "--format", "ctranslate2"]):
        if cli.main(["export", "--workdir", workdir, *extra]) != 0:
            sys.exit("export failed")
    (name,) = os.listdir(saved)
    return os.path.join(saved, name), ct2


def write_synthetic(path, lines):
    from keras_transformer.data.synthetic import iter_generate

    with open(path, "w", encoding="utf-8") as f:
        for source, _ in iter_generate("test", size=lines, seed=7):
            f.write(source + "\n")


def card(model):
    from keras_transformer.export.saved_model import METADATA_FILE, resolve_model_dir

    with open(os.path.join(resolve_model_dir(model), "assets.extra", METADATA_FILE)) as f:
        return json.load(f)


def run_ours(args, model, source, output):
    from keras_transformer import cli

    argv = ["translate", "--model", model, "--input", source, "--output", output]
    argv += ["--batch-size", str(args.batch_size), "--chunk-lines", str(args.chunk_lines)]
    start = time.perf_counter()
    if cli.main(argv) != 0:
        sys.exit("keras-transformer translate failed")
    return time.perf_counter() - start


def run_ctranslate2(args, ct2_model, settings, source, output):
    import ctranslate2
    import sentencepiece as spm

    start = time.perf_counter()
    sp = spm.SentencePieceProcessor(model_file=os.path.join(ct2_model, "spm.model"))
    max_source = settings["max_source_length"]
    translator = ctranslate2.Translator(
        ct2_model, device="cpu", inter_threads=1, intra_threads=args.threads
    )
    translator.translate_file(
        source, output, max_batch_size=args.batch_size, read_batch_size=args.chunk_lines,
        beam_size=settings["beam_size"], length_penalty=settings["alpha"],
        max_decoding_length=max_source + settings["max_extra_length"],
        source_tokenize_fn=lambda text: sp.encode(text, out_type=str)[: max_source - 1],
        target_detokenize_fn=sp.decode,
    )  # fmt: skip
    return time.perf_counter() - start


def same_share(path_a, path_b):
    with open(path_a, encoding="utf-8") as a, open(path_b, encoding="utf-8") as b:
        pairs = list(zip(a.read().splitlines(), b.read().splitlines()))
    return round(sum(x == y for x, y in pairs) / max(len(pairs), 1), 4)


def _rate(lines, seconds):
    return dict(seconds=round(seconds, 2), lines_per_second=round(lines / seconds, 1))


def main(argv=None):
    args = parse_args(argv)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="translate-file-bench-") as directory:
        model, ct2_model = args.model, args.ct2_model
        if args.workdir:
            model, ct2_model = export_both(args.workdir, directory, args.jit_compile)
        source = args.input or os.path.join(directory, "source.txt")
        if not args.input:
            write_synthetic(source, args.lines)
        with open(source, "rb") as f:
            lines = sum(1 for _ in f)
        settings = card(model)
        common = dict(what="translate_file", lines=lines, batch_size=args.batch_size,
                      chunk_lines=args.chunk_lines, beam_size=settings["beam_size"],
                      intra_threads=args.threads, load=os.getloadavg()[0],
                      jit_compile=bool(settings.get("jit_compile")))  # fmt: skip
        ours = os.path.join(directory, "ours.txt")
        systems = args.systems.split(",")
        if "keras-transformer" in systems:
            seconds = run_ours(args, model, source, ours)
            emit(system="keras-transformer", **_rate(lines, seconds), **common)
        if "ctranslate2" in systems:
            theirs = os.path.join(directory, "ctranslate2.txt")
            seconds = run_ctranslate2(args, ct2_model, settings, source, theirs)
            same = same_share(ours, theirs) if os.path.exists(ours) else None
            emit(system="ctranslate2", **_rate(lines, seconds), same_as_ours=same, **common)


if __name__ == "__main__":
    main()
