"""The `keras-transformer` command: thin argument parsing over `keras_transformer.commands`.

Subcommands: prepare, train, distill, translate, evaluate, score, info, export, shortlist. This
module only parses (types, choices) and turns errors into messages; what the flags mean together
is checked by the commands (`commands/flags.py`). Exit code 0 on success, 2 with a one-line message
on bad usage or bad input (no traceback for user errors). TensorFlow's start-up log is kept off
the terminal unless `--verbose` is given (whatever `TF_CPP_MIN_LOG_LEVEL` says), whichever module
imports it first (`commands.startup.quiet_tensorflow_import`).
"""

import argparse
import contextlib
import sys

from keras_transformer import commands, stopping
from keras_transformer.commands import startup
from keras_transformer.config.formats import export_format, format_names, precisions, quantizations
from keras_transformer.errors import (
    PREEMPTED_EXIT_CODE,
    KerasTransformerError,
    Preempted,
    first_line,
    write_refused,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # argparse's default prints the usage block; keep it to one line, exit code 2.
        self.exit(2, f"{self.prog}: error: {message}\n")


def _add_config_arguments(parser, set_example):
    """--config, --workdir and --set: how `train` and `prepare` name an experiment."""
    parser.add_argument("--config", required=True, help="YAML config file (see configs/)")
    parser.add_argument("--workdir", help="output directory (default: workdirs/<config name>)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a config key, e.g. --set {set_example} (repeatable)",
    )


def _sampling_flags(parser, note):
    """`--sampling-topk`, `--temperature`, `--top-p` (the `decode.sampling_*` settings)."""
    parser.add_argument(
        "--sampling-topk", type=int, metavar="K",
        help=f"sample among the K most likely tokens (translate_sample signature; {note})",
    )  # fmt: skip
    parser.add_argument(
        "--temperature", dest="sampling_temperature", type=float, metavar="T",
        help="sampling: logits divided by T",
    )  # fmt: skip
    parser.add_argument(
        "--top-p", dest="sampling_topp", type=float, metavar="P",
        help="sampling: only the most likely tokens holding probability P",
    )  # fmt: skip


class _Version(argparse.Action):
    """argparse's own version action re-wraps the line; this prints it as it is."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())  # on stdout, as argparse's own
        parser.exit(0)


def version_line():
    """`keras-transformer --version`: which distribution this is, as the unrelated
    `keras-transformer` distribution installs a package of the same import name."""
    import os

    import keras_transformer

    where = os.path.dirname(os.path.abspath(keras_transformer.__file__))
    return (
        f"{keras_transformer.__distribution__} {keras_transformer.__version__} "
        f"(import package keras_transformer in {where})"
    )


def build_parser():
    parser = _Parser(
        prog="keras-transformer",
        description='Train, export and run the Transformer of "Attention Is All You Need".',
    )
    parser.add_argument(
        "--version", action=_Version, nargs=0, help="print the distribution, version and path"
    )
    # Every subcommand takes --verbose.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--verbose", action="store_true", help="show TensorFlow's start-up and device logs"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_training_commands(sub, common)
    _add_model_commands(sub, common)
    _add_export_command(sub, common)
    _add_shortlist_command(sub, common)
    return parser


def _add_training_commands(sub, common):
    """`train` and `prepare`: from a config to a workdir."""
    p = sub.add_parser(
        "train",
        parents=[common],
        help="train, evaluate on the dev set and export a SavedModel",
        epilog=(
            "On SIGTERM or SIGINT (a preemption, Ctrl-C) training finishes its step, saves its "
            "resume state and a step checkpoint and exits with code "
            f"{PREEMPTED_EXIT_CODE} (EX_TEMPFAIL): run the same command again to resume exactly. "
            "Every other phase (prepare, the dev-set choice, scoring, the export) stops at a safe "
            f"point with nothing half-written and exits {PREEMPTED_EXIT_CODE} too. "
            "Other exit codes: 0 done, 2 bad input. The workdir may be on any TensorFlow "
            "filesystem (gs://bucket/run)."
        ),
    )
    _add_config_arguments(p, "train.steps=200")
    p.add_argument(
        "--init-from",
        metavar="PATH",
        help="fine-tune: start from a trained workdir (its last checkpoint) or a step checkpoint "
        "(ckpt-<step>.weights.h5), its weights and vocabulary, in a new workdir (train.init_from)",
    )
    p.set_defaults(func=commands.train_command, stops_safely=True)

    p = sub.add_parser(
        "prepare",
        parents=[common],
        help="stream the training corpus once into a vocabulary and tokenized shards",
        description="Reads data.train once as a stream, trains the SentencePiece vocabulary "
        "on a bounded sample and writes tokenized TFRecord shards with a manifest to "
        "WORKDIR/prepared (train does this itself when needed). On SIGTERM or SIGINT it "
        f"stops at a safe point, keeps the trained vocabulary and exits {PREEMPTED_EXIT_CODE}: "
        "the same command goes on from there.",
    )
    _add_config_arguments(p, "data.train=text:train.en,train.de")
    p.set_defaults(func=commands.prepare_command, stops_safely=True)
    _add_distill_command(sub, common)


def _add_distill_command(sub, common):
    """`distill`: a teacher's translations of the training corpus, then a student trained on
    them."""
    p = sub.add_parser(
        "distill",
        parents=[common],
        help="sequence-level distillation: a teacher translates data.train, a student trains on it",
        description="The teacher's export translates the sources of the student's data.train "
        "with its beam search into WORKDIR/distilled (resumable; complete or absent), the "
        "teacher's vocabulary is copied to WORKDIR/spm.model, and the student trains on the "
        "distilled pairs (plus the original ones with distill.keep_original) as train does. "
        "With --shard I --num-shards N a worker translates only the lines whose index is I "
        "modulo N and stops; the same command with --num-shards N and no --shard then merges "
        "the N shards (a missing one is refused) and trains.",
        epilog="On SIGTERM or SIGINT the translation stops after its chunk and exits with code "
        f"{PREEMPTED_EXIT_CODE}; training stops as train does. Run the same command again to "
        "continue in the phase it stopped in. Other exit codes: 0 done, 2 bad input.",
    )
    _add_config_arguments(p, "distill.keep_original=true")
    p.add_argument(
        "--teacher",
        required=True,
        metavar="PATH",
        help="the teacher: a trained workdir (its export and spm.model) or an export directory "
        "(with --teacher-vocabulary)",
    )
    p.add_argument(
        "--teacher-vocabulary",
        metavar="FILE",
        help="the teacher's SentencePiece model, when --teacher is an export (default: the "
        "teacher workdir's spm.model)",
    )
    p.add_argument(
        "--shard",
        type=int,
        metavar="I",
        help="translate only shard I (the lines whose index is I modulo --num-shards) and stop "
        "(default: JOB_COMPLETION_INDEX of a Kubernetes indexed job, or SLURM_ARRAY_TASK_ID)",
    )
    p.add_argument(
        "--num-shards",
        type=int,
        metavar="N",
        help="the number of shards (default: SLURM_ARRAY_TASK_COUNT, else 1); without --shard: "
        "merge the N translated shards and train",
    )
    p.set_defaults(func=commands.distill_command, stops_safely=True)


def _add_translate_command(sub, common):
    """`translate`: TEXT arguments, stdin lines or a file through an exported SavedModel."""
    p = sub.add_parser(
        "translate",
        parents=[common],
        help="translate TEXT arguments, stdin lines or an --input file",
    )
    p.add_argument(
        "--model",
        required=True,
        help="SavedModel directory (or its parent), or a LiteRT export's directory (run "
        "without TensorFlow)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="sentences per call (default 32)")
    p.add_argument(
        "--n-best",
        type=int,
        default=None,
        metavar="K",
        help="K lines 'SCORE<TAB>TRANSLATION' per input, best first (translate_nbest signature; "
        "K at most the exported n-best)",
    )
    p.add_argument("--input", metavar="FILE", help="translate this file (streamed) into --output")
    p.add_argument(
        "--output",
        metavar="FILE",
        help="with --input: the translations, written as it goes; run the same command again "
        "after a kill to continue (progress in FILE.progress until it is complete)",
    )
    p.add_argument(
        "--chunk-lines",
        type=int,
        default=None,
        metavar="N",
        help="with --input: lines read, translated (length-sorted) and saved at a time "
        "(default 4096)",
    )
    p.add_argument(
        "--prefix",
        default=None,
        metavar="TEXT",
        help="every translation starts with TEXT, the search continuing after it "
        "(translate_prefix signature)",
    )
    _sampling_flags(p, "must equal the exported value")
    p.add_argument(
        "--seed", type=int, help="sampling: seed of the run (default 0); same seed, same output"
    )
    _glossary_flags(p)
    _alignment_flags(p)
    p.add_argument("text", nargs="*", help="sentences; stdin lines when none are given")
    p.set_defaults(func=commands.translate_command)


def _glossary_flags(p):
    """`translate --constraints` (hard) and `--glossary` (soft)."""
    p.add_argument(
        "--constraints",
        default=None,
        metavar="FILE",
        help="terms the translations must hold: one line per input (TEXT or stdin line), its "
        "terms separated by tabs (translate_constrained signature)",
    )
    p.add_argument(
        "--glossary",
        metavar="FILE",
        help="soft glossary: a TSV file of 'source term<TAB>target term' lines that annotate "
        "every source (translate_glossary signature: a model prepared with data.terminology)",
    )


def _alignment_flags(p):
    """`translate --alignments` and `--markup` (serving_default's alignment output)."""
    p.add_argument(
        "--alignments",
        action="store_true",
        help="after each translation a tab and its word alignment, Moses-style 'i-j' pairs "
        "(source word i, target word j; serving_default's alignment output)",
    )
    p.add_argument(
        "--markup",
        choices=("html", "xml"),
        default=None,
        help="the inputs carry HTML or XML tags: the plain text is translated and the tags put "
        "back around the aligned words (malformed markup: plain text and a warning)",
    )


def _add_model_commands(sub, common):
    """`translate`, `evaluate`, `score` and `info`: an exported SavedModel through its
    signatures and its model card."""
    _add_translate_command(sub, common)
    p = sub.add_parser(
        "evaluate", parents=[common], help="BLEU and chrF (sacreBLEU) of an export on a test set"
    )
    p.add_argument(
        "--model",
        required=True,
        help="SavedModel directory (or its parent), or a LiteRT export's directory (run "
        "without TensorFlow)",
    )
    p.add_argument("--source", required=True, help="source sentences, one per line")
    p.add_argument("--reference", required=True, help="reference translations, one per line")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per call (default 32)")
    p.set_defaults(func=commands.evaluate_command)

    p = sub.add_parser(
        "score", parents=[common], help="log-probability of each target given its source"
    )
    p.add_argument(
        "--model",
        required=True,
        help="SavedModel directory (or its parent); a LiteRT export has no score function",
    )
    p.add_argument("--source", required=True, help="source sentences, one per line")
    p.add_argument("--target", required=True, help="target sentences to score, one per line")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per call (default 32)")
    p.set_defaults(func=commands.score_command)

    p = sub.add_parser("info", parents=[common], help="print an export's model card")
    p.add_argument(
        "--model",
        required=True,
        help="SavedModel directory (or its parent), or a LiteRT export's directory (run "
        "without TensorFlow)",
    )
    p.set_defaults(func=commands.info_command)


def _add_export_command(sub, common):
    """`export`: a training workdir to a SavedModel or a CTranslate2 model."""
    p = sub.add_parser(
        "export", parents=[common], help="export a SavedModel from a training workdir"
    )
    p.add_argument("--workdir", required=True, help="training workdir")
    p.add_argument("--average", type=int, default=None, help="average the last N checkpoints")
    p.add_argument(
        "--select-on-dev",
        action="store_true",
        help="export the candidate (the last checkpoint, averages of the last 2, 3 and "
        "train.keep_checkpoints, the train.keep_best ones; x alpha 0.6 and 1.0 unless --alpha) "
        "with the best dev BLEU; the default where the config says auto",
    )
    p.add_argument(
        "--output",
        help="base directory of the named model (default from config); with --format "
        "ctranslate2 or litert, the model directory (default BASE_DIR/NAME-ctranslate2, "
        "BASE_DIR/NAME-litert-QUANTIZATION)",
    )
    p.add_argument(
        "--name",
        help="model name: BASE_DIR/NAME/VERSION (default: export.name, else the workdir's "
        "last part)",
    )
    _export_decoding_flags(p)
    p.add_argument(
        "--jit-compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile the SavedModel's search with XLA, or not (default: the workdir's "
        "export.jit_compile; TF Serving then needs --xla_cpu_compilation_enabled=true on a CPU)",
    )
    _export_format_flags(p)
    p.add_argument(
        "--shortlist",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="decode over a vocabulary shortlist (WORKDIR/shortlist.npz, built when missing or "
        "built for another vocabulary; see the shortlist command), or not (default: the "
        "workdir's export.shortlist; when null, a SavedModel without --jit-compile decodes over "
        "it where it can be built); litert and ctranslate2 hold it for their runtimes to use "
        "when asked (shortlist=True, use_vmap; default with export.shortlist null: ctranslate2 "
        "when the workdir has one, litert not)",
    )
    _export_constraints_flag(p)
    _export_alignment_flag(p)
    _export_precision_flag(p)
    p.set_defaults(func=commands.export_command, stops_safely=True)


def _export_format_flags(p):
    """`export --format` and `--quantization`: the registry's (`config.formats`)."""
    p.add_argument(
        "--format",
        choices=format_names(),
        default="saved_model",
        help="; ".join(f"{name}: {export_format(name).summary}" for name in format_names()),
    )
    p.add_argument(
        "--quantization",
        choices=quantizations(),
        help="the weight type: "
        + "; ".join(
            f"{name} takes {', '.join(export_format(name).quantizations)}"
            for name in format_names()
            if name != "saved_model"
        )
        + " (litert's dynamic_int8: int8 weights, activations quantized at run time; "
        "default: float32 as trained; a SavedModel takes --precision)",
    )


def _export_decoding_flags(p):
    """`export`'s decoding settings fixed in the SavedModel."""
    p.add_argument("--beam-size", type=int, help="beam size fixed in the SavedModel")
    p.add_argument("--alpha", type=float, help="length-penalty exponent fixed in the SavedModel")
    p.add_argument(
        "--n-best", type=int, help="hypotheses per input of translate_nbest (<= beam size)"
    )
    p.add_argument("--max-extra-length", type=int, help="outputs stop at source length + this")
    _sampling_flags(p, "adds the translate_sample signature; default decode.sampling_*")


def _export_constraints_flag(p):
    """`export --constraints`: the LiteRT export's constrained step."""
    p.add_argument(
        "--constraints",
        action="store_true",
        help="litert: also the constrained decoder step, for translate --constraints (hard "
        "lexical constraints; one more copy of the step's weights, two with --shortlist: the "
        "constrained shortlist step too); the SavedModel always "
        "has them (translate_constrained)",
    )


def _export_alignment_flag(p):
    """`export --alignments`: serving_default's alignment output, or a LiteRT export's
    alignment graph (`export.alignments`)."""
    p.add_argument(
        "--alignments",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serving_default also returns the word alignment (litert: the export also holds "
        "the alignment graph), for translate --alignments and --markup (one more forward pass "
        "per request), or not (default: the workdir's export.alignments, off); not with "
        "--format ctranslate2",
    )


def _export_precision_flag(p):
    """`export --precision`: the dtype of the SavedModel's weights and products
    (`export.precision`)."""
    p.add_argument(
        "--precision",
        choices=precisions(),
        default=None,
        help="the dtype the SavedModel holds and runs the model in (default: the workdir's "
        "export.precision, float32); bfloat16 decodes faster on CPUs with AVX512-BF16 or AMX, "
        "its answers within bfloat16's rounding; --format saved_model only",
    )


def _add_shortlist_command(sub, common):
    """`shortlist`: a prepared workdir's lexical table for the vocabulary shortlist."""
    p = sub.add_parser(
        "shortlist",
        parents=[common],
        help="build a prepared workdir's vocabulary shortlist (lexical table)",
        description="Counts which target pieces co-occur with each source piece in the "
        "prepared training pairs and writes, for each source piece, the K target pieces of the "
        "highest Dice coefficient, and the M most frequent target pieces, to "
        "WORKDIR/shortlist.npz (replacing it), with the sha256 of the SentencePiece model it "
        "was built for. An export with --shortlist (export.shortlist) decodes each batch over "
        "their union, and rebuilds a table built for another vocabulary.",
    )
    p.add_argument("--workdir", required=True, help="a prepared training workdir")
    p.add_argument("--k", type=int, help="target pieces kept per source piece (default 100)")
    p.add_argument("--m", type=int, help="most frequent target pieces always kept (default 100)")
    p.set_defaults(func=commands.shortlist_command)


def cli_reference():
    """Markdown: every subcommand's usage and a table of its flags, rendered from `build_parser()`
    (docs/reference/cli.md; `tests/test_docs.py` keeps the page in sync). Imports no TensorFlow."""
    parser = build_parser()
    lines = [
        "## `keras-transformer`", "", _text(parser.description), "",
        *_usage_block(parser), *_flag_table(parser),
    ]  # fmt: skip
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {action.dest: action.help for action in sub._choices_actions}
    for name, command in sub.choices.items():
        lines += [f"## `keras-transformer {name}`", "", _sentence(helps[name]), ""]
        if command.description:
            lines += [_text(command.description), ""]
        lines += [*_usage_block(command), *_flag_table(command)]
        if command.epilog:
            lines += [_text(command.epilog), ""]
    return "\n".join(lines)


def _text(text):
    """A help text as Markdown: a `|` or `[a][b]` escaped (`config.table_cell`), and `<name>`,
    which Markdown would take for an HTML tag, written as text."""
    from keras_transformer.config import table_cell

    parts = table_cell(text).split("`")
    for i in range(0, len(parts), 2):  # outside backticks
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def _sentence(text):
    """A subcommand's one-line help as a sentence."""
    return _text(text[0].upper() + text[1:] + ("" if text.endswith(".") else "."))


def _usage_block(parser):
    # A fixed width: the page must not depend on the terminal that generated it.
    formatter = argparse.HelpFormatter(parser.prog, width=100)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return ["```text", formatter.format_help().strip(), "```", ""]


def _flag_table(parser):
    """`| flag | value | default | meaning |`, a row per argument (`--help` left out)."""
    rows = ["| flag | value | default | meaning |", "|---|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.dest}`"
        value = ""
        if action.choices is not None:
            value = ", ".join(f"`{choice}`" for choice in action.choices)
        elif action.nargs != 0:
            value = f"`{action.metavar or action.dest.upper()}`"
            value += " ..." if action.nargs in ("*", "+") or action.default == [] else ""
        if action.required and action.nargs not in ("?", "*"):
            default = "required"
        elif action.default in (None, False, []):
            default = ""
        else:
            default = f"`{action.default}`"
        cells = [names, value, default, _text(action.help or "")]
        rows.append("| " + " | ".join(cells) + " |")
    return [*rows, ""]


def main(argv=None):
    args = build_parser().parse_args(argv)
    # Before any command code runs: whichever module imports TensorFlow first, its C++ start-up
    # log stays off the terminal (unless --verbose).
    startup.quiet_tensorflow_import(getattr(args, "verbose", False))
    # train, prepare and export stop at a safe point of their phase on SIGTERM/SIGINT (exit 75).
    safe = stopping.catching() if getattr(args, "stops_safely", False) else contextlib.nullcontext()
    try:
        with safe:
            args.func(args)
    except Preempted as e:
        print(f"keras-transformer {args.command}: {e}", file=sys.stderr, flush=True)
        return PREEMPTED_EXIT_CODE
    except Exception as e:
        # A refused write (a full disk, a file-size limit, a read-only file system, a failing
        # device), whichever writer met it, is the user's to fix: one line, not a traceback.
        error = e if isinstance(e, (KerasTransformerError, FileNotFoundError)) else write_refused(e)
        if error is None:
            raise
        message = first_line(error)
        print(f"keras-transformer {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"keras-transformer {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
