"""`keras-transformer shortlist`: a prepared workdir's vocabulary shortlist (its lexical table,
`keras_transformer.data.shortlist`) written to `WORKDIR/shortlist.npz` with the fingerprint of
the SentencePiece model it was built for (an export reads it, or builds it when missing or
built for another SentencePiece model: `export.plan`)."""

from keras_transformer.errors import DataError, UsageError
from keras_transformer.workdir import Workdir


def _check_sizes(k, m):
    if k is not None and k < 1:
        raise UsageError(f"--k must be a positive integer, got {k}")
    if m is not None and m < 0:
        raise UsageError(f"--m must be 0 or more, got {m}")


def shortlist_command(args):
    """`keras-transformer shortlist --workdir DIR [--k K] [--m M]`."""
    from keras_transformer import local_files
    from keras_transformer.data import shortlist

    _check_sizes(args.k, args.m)
    if not local_files.gfile().isdir(args.workdir):
        raise UsageError(f"workdir not found: {args.workdir}")
    k = shortlist.DEFAULT_K if args.k is None else args.k
    m = shortlist.DEFAULT_M if args.m is None else args.m
    layout = Workdir(args.workdir)
    try:
        table = shortlist.build_workdir_shortlist(layout, k, m)
    except DataError as e:
        raise UsageError(str(e)) from None
    print(
        f"{layout.shortlist}: the {k} most likely target pieces of each of "
        f"{table.vocab_size} source pieces and the {table.frequent.size} most frequent, "
        f"from {table.settings['pairs']} pairs"
    )
