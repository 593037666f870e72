"""`keras-transformer shortlist`: a prepared workdir's vocabulary shortlist (its lexical table,
`keras_transformer.data.shortlist`) written to `WORKDIR/shortlist.npz` with the fingerprint of
the SentencePiece model it was built for; and the table an export with `export.shortlist` uses
(`workdir_shortlist`: read, or built when missing or built for another SentencePiece model)."""

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


def workdir_shortlist(workdir, required=True):
    """The lexical table of `workdir` (a path) for an export: `data.shortlist.export_shortlist`
    (None where it cannot be built and is not `required`), its errors one line."""
    from keras_transformer.data import shortlist

    try:
        return shortlist.export_shortlist(Workdir(workdir), required)
    except DataError as e:
        raise UsageError(f"the export's shortlist: {e}") from None
