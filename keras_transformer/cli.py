"""The `keras-transformer` command: thin argument parsing over `keras_transformer.commands`.

Subcommands: prepare, train, translate, evaluate, export. Exit code 0 on success, 2 with a one-line
message on bad usage or bad input (no traceback for user errors).
"""

import argparse
import os
import sys

from keras_transformer import commands
from keras_transformer.errors import KerasTransformerError


def _quiet_tensorflow():
    # C++ log lines (oneDNN, CUDA probing) are noise for CLI users; errors still show.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # argparse's default prints the usage block; keep it to one line, exit code 2.
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser():
    parser = _Parser(
        prog="keras-transformer",
        description='Train, export and run the Transformer of "Attention Is All You Need".',
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("train", help="train, evaluate on the dev set and export a SavedModel")
    p.add_argument("--config", required=True, help="YAML config file (see configs/)")
    p.add_argument("--workdir", help="output directory (default: workdirs/<config name>)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set train.steps=200 (repeatable)",
    )
    p.set_defaults(func=commands.train_command)

    p = sub.add_parser(
        "prepare",
        help="stream the training corpus once into a vocabulary and tokenized shards",
        description="Reads data.train once as a stream, trains the SentencePiece vocabulary "
        "on a bounded sample and writes tokenized TFRecord shards with a manifest to "
        "WORKDIR/prepared (train does this itself when needed).",
    )
    p.add_argument("--config", required=True, help="YAML config file (see configs/)")
    p.add_argument("--workdir", help="output directory (default: workdirs/<config name>)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set data.train=text:train.en,train.de (repeatable)",
    )
    p.set_defaults(func=commands.prepare_command)

    p = sub.add_parser("translate", help="translate TEXT arguments or stdin lines")
    p.add_argument("--model", required=True, help="SavedModel directory (or its parent)")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per call (default 32)")
    p.add_argument("text", nargs="*", help="sentences; stdin lines when none are given")
    p.set_defaults(func=commands.translate_command)

    p = sub.add_parser("evaluate", help="sacreBLEU and chrF of a SavedModel on a test set")
    p.add_argument("--model", required=True, help="SavedModel directory (or its parent)")
    p.add_argument("--source", required=True, help="source sentences, one per line")
    p.add_argument("--reference", required=True, help="reference translations, one per line")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per call (default 32)")
    p.set_defaults(func=commands.evaluate_command)

    p = sub.add_parser("export", help="export a SavedModel from a training workdir")
    p.add_argument("--workdir", required=True, help="training workdir")
    p.add_argument("--average", type=int, default=None, help="average the last N checkpoints")
    p.add_argument("--output", help="base directory of the named model (default from config)")
    p.set_defaults(func=commands.export_command)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    _quiet_tensorflow()
    try:
        args.func(args)
    except (KerasTransformerError, FileNotFoundError) as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"keras-transformer {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"keras-transformer {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
