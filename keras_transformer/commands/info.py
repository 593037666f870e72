"""`keras-transformer info`: an export's model card."""

import os
import sys

from keras_transformer.commands import startup
from keras_transformer.errors import UsageError


def info_command(args):
    """`keras-transformer info --model DIR`: prints the export's model card (Markdown)."""
    from keras_transformer.litert.runtime import is_litert_export

    if is_litert_export(args.model):
        with open(os.path.join(args.model, "model_card.md"), encoding="utf-8") as f:
            sys.stdout.write(f.read())
        return
    startup.import_tensorflow(getattr(args, "verbose", False))
    from keras_transformer.export.card import read_card_markdown
    from keras_transformer.export.saved_model import resolve_model_dir

    path = resolve_model_dir(args.model)
    try:
        card = read_card_markdown(path)
    except FileNotFoundError:
        raise UsageError(
            f"{path} has no model card (assets.extra/model_card.md): exported before "
            "keras-transformer wrote one? export it again"
        ) from None
    sys.stdout.write(card)
