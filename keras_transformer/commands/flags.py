"""The checks of what the subcommands' flags mean: value ranges and the flags that exclude each
other, each refused with a one-line `UsageError` (exit code 2) before anything slow starts.

`cli.py` only parses (types, choices). The checks that need what a flag is compared with are
made where that is read: an n-best or a sampling setting other than the export's in
`signatures.py`, a workdir without checkpoints in `export.py`; the decoding flags of `export`
are checked by the config's schema (`export_settings`, naming the flag).
"""

import dataclasses

from keras_transformer.config import decoding_settings
from keras_transformer.errors import ConfigError, UsageError
from keras_transformer.file_translation import CHUNK_LINES

# The sampling flags of `translate` and `export`, by the setting they name (`decode.sampling_*`).
SAMPLING_FLAGS = {
    "sampling_topk": "--sampling-topk",
    "sampling_temperature": "--temperature",
    "sampling_topp": "--top-p",
}


def batch_size_flag(args):
    """`--batch-size` (sentences per signature call) of `translate`, `evaluate` and `score`."""
    batch_size = getattr(args, "batch_size", 32)
    if batch_size is None or batch_size < 1:
        raise UsageError(f"--batch-size must be a positive integer, got {batch_size}")
    return batch_size


@dataclasses.dataclass(frozen=True)
class TranslateRequest:
    """What `translate` was asked, its flags checked.

    Attributes:
        batch_size: sentences per signature call.
        n_best: hypotheses per input (`translate_nbest`), or None.
        prefix: the start of every translation (`translate_prefix`), or None.
        sampling: `{setting: value}` of the sampling flags (`translate_sample`), or None.
        chunk_lines: lines per chunk of a file translation (`--input`/`--output`); None when
            the input is TEXT arguments or stdin.
        constraints: `--constraints FILE`'s terms, a list per input line
            (`translate_constrained`), or None.
    """

    batch_size: int
    n_best: int | None
    prefix: str | None
    sampling: dict | None
    chunk_lines: int | None
    constraints: list | None = None


def translate_request(args):
    """The `TranslateRequest` of `translate`'s flags; `UsageError` for a value out of range or
    flags that exclude each other."""
    batch_size = batch_size_flag(args)
    n_best = getattr(args, "n_best", None)
    prefix = getattr(args, "prefix", None)
    if n_best is not None and n_best < 1:
        raise UsageError(f"--n-best must be a positive integer, got {n_best}")
    if n_best is not None and prefix is not None:
        raise UsageError("--prefix and --n-best cannot be combined")
    sampling = sampling_request(args)
    to_file = getattr(args, "input", None) is not None or getattr(args, "output", None) is not None
    chunk_lines = _file_flags(args) if to_file else None
    constraints = _constraints_flag(args, n_best, prefix, sampling, to_file)
    return TranslateRequest(batch_size, n_best, prefix, sampling, chunk_lines, constraints)


def _constraints_flag(args, n_best, prefix, sampling, to_file):
    """`--constraints FILE`'s terms (a list of strings per line, split at tabs, "" dropped),
    once checked: not with the other requests, one line per TEXT argument."""
    path = getattr(args, "constraints", None)
    if path is None:
        return None
    if n_best is not None or prefix is not None or sampling is not None or to_file:
        raise UsageError(
            "--constraints applies to TEXT arguments and stdin, without --n-best, --prefix, "
            "sampling flags or --input"
        )
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            rows = [[t for t in line.rstrip("\r\n").split("\t") if t] for line in f]
    except OSError as e:
        raise UsageError(f"--constraints: cannot read {path}: {e.strerror}") from None
    if args.text and len(rows) != len(args.text):
        raise UsageError(
            f"--constraints: {path} has {len(rows)} lines for {len(args.text)} TEXT arguments "
            "(one line per input)"
        )
    return rows


def alignment_request(args):
    """`(alignments, markup)` of `translate --alignments/--markup` (False, None: neither);
    `UsageError` with the flags that pick another signature."""
    alignments, markup = bool(getattr(args, "alignments", False)), getattr(args, "markup", None)
    if alignments or markup is not None:
        others = {"--n-best": "n_best", "--prefix": "prefix", "--seed": "seed"}
        others.update({flag: key for key, flag in SAMPLING_FLAGS.items()})
        for flag, key in others.items():
            if getattr(args, key, None) is not None:
                asked = "--alignments" if alignments else "--markup"
                raise UsageError(f"{asked} cannot be combined with {flag} (serving_default only)")
    return alignments, markup


def _file_flags(args):
    """`--chunk-lines` of a file translation, once the flags that go with `--input` are
    checked."""
    if args.input is None or args.output is None:
        raise UsageError("--input and --output go together (translate a file into a file)")
    if args.text:
        raise UsageError("--input translates a file: give no TEXT arguments with it")
    if getattr(args, "prefix", None) is not None:
        raise UsageError("--prefix applies to TEXT arguments and stdin, not to --input")
    chunk_lines = CHUNK_LINES if args.chunk_lines is None else args.chunk_lines
    if chunk_lines < 1:
        raise UsageError(f"--chunk-lines must be a positive integer, got {chunk_lines}")
    return chunk_lines


def sampling_request(args):
    """`{setting: value}` of the sampling flags given to `translate` (`--seed` as `seed`), or
    None when none is: the flags that ask for the `translate_sample` signature."""
    asked = {key: getattr(args, key, None) for key in (*SAMPLING_FLAGS, "seed")}
    asked = {key: value for key, value in asked.items() if value is not None}
    if not asked:
        return None
    if getattr(args, "n_best", None) is not None or getattr(args, "prefix", None) is not None:
        raise UsageError("sampling flags cannot be combined with --n-best or --prefix")
    if not 0 <= asked.get("seed", 0) < 2**63:
        raise UsageError(f"--seed must be in [0, 2^63), got {asked['seed']}")
    return asked


def export_format(args):
    """`export --format`: `saved_model` (the default), `ctranslate2` or `litert`."""
    return getattr(args, "format", None) or "saved_model"


def check_export(args):
    """`UsageError` for `export` flags that exclude each other or a value out of range (the
    decoding flags are checked with the workdir's config: `export_settings`)."""
    _check_quantization(export_format(args), getattr(args, "quantization", None))
    if export_format(args) == "litert" and any(
        getattr(args, key, None) is not None for key in SAMPLING_FLAGS
    ):
        raise UsageError("a LiteRT export searches (beam or greedy): it takes no sampling flags")
    if getattr(args, "alignments", None) and export_format(args) == "ctranslate2":
        raise UsageError("--alignments applies to --format saved_model or litert")
    if getattr(args, "precision", None) and export_format(args) != "saved_model":
        raise UsageError(
            "--precision applies to --format saved_model (litert and ctranslate2 take "
            "--quantization)"
        )
    if getattr(args, "constraints", False) and export_format(args) != "litert":
        raise UsageError(
            "--constraints applies to --format litert (a SavedModel always has "
            "translate_constrained)"
        )
    average = getattr(args, "average", None)
    if getattr(args, "select_on_dev", False) and average is not None:
        raise UsageError("--average and --select-on-dev exclude each other")
    if average is not None and average < 1:
        raise UsageError(f"--average must be a positive integer, got {average}")


def _check_quantization(export_format, quantization):
    from keras_transformer.config.formats import check_quantization

    check_quantization(export_format, quantization)


def export_settings(config, args, chosen_alpha=None):
    """The export's `DecodingSettings`: the config with the command's flags applied (and the
    length penalty chosen on dev, `chosen_alpha`, unless `--alpha` fixes one); a value the
    config's schema refuses is a `UsageError` naming the flag."""
    flags = {key: "--" + key.replace("_", "-") for key in ("beam_size", "alpha", "n_best")}
    flags.update(max_extra_length="--max-extra-length", **SAMPLING_FLAGS)
    try:
        values = {key: getattr(args, key, None) for key in flags}
        values["alpha"] = chosen_alpha if values["alpha"] is None else values["alpha"]
        return decoding_settings(config, export=True, **values)
    except ConfigError as e:  # name the flag the user typed
        message = str(e)
        for key, flag in flags.items():
            section = "decode" if key in SAMPLING_FLAGS else "export"
            message = message.replace(f"{section}.{key}", flag)
        raise UsageError(message) from None


@dataclasses.dataclass(frozen=True)
class ShardRequest:
    """Which part of the distilled corpus a `distill` run translates.

    Attributes:
        index: the shard this worker translates, or None: the run merges the shards and trains
            (translating them itself first when `count` is 1).
        count: the number of shards.
    """

    index: int | None
    count: int


def shard_request(args, environ):
    """The `ShardRequest` of `distill --shard I --num-shards N`; without the flags, from the
    job's environment: `JOB_COMPLETION_INDEX` (a Kubernetes indexed job; `--num-shards` is its
    completions) or `SLURM_ARRAY_TASK_ID` and `SLURM_ARRAY_TASK_COUNT` (a Slurm array, counted
    from `SLURM_ARRAY_TASK_MIN`). `UsageError` for a shard outside `[0, N)`."""
    index, count = getattr(args, "shard", None), getattr(args, "num_shards", None)
    source = "--shard"
    if index is None and environ.get("JOB_COMPLETION_INDEX", "").strip():
        index, source = _environment_int(environ, "JOB_COMPLETION_INDEX"), "JOB_COMPLETION_INDEX"
    elif index is None and environ.get("SLURM_ARRAY_TASK_ID", "").strip():
        first = _environment_int(environ, "SLURM_ARRAY_TASK_MIN", 0)
        index = _environment_int(environ, "SLURM_ARRAY_TASK_ID") - first
        source = "SLURM_ARRAY_TASK_ID"
        if count is None:
            count = _environment_int(environ, "SLURM_ARRAY_TASK_COUNT", None)
    if count is None:
        if index is not None:
            raise UsageError(f"{source} {index} needs --num-shards (the number of shards)")
        count = 1
    if count < 1:
        raise UsageError(f"--num-shards must be a positive integer, got {count}")
    if index is not None and not 0 <= index < count:
        raise UsageError(f"{source} must be in [0, {count}) (--num-shards {count}), got {index}")
    return ShardRequest(index, count)


def _environment_int(environ, name, default=UsageError):
    """The integer in the environment variable `name` (`default` where it is unset)."""
    value = environ.get(name, "").strip()
    if not value and default is not UsageError:
        return default
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"{name} must be an integer, got {value!r}") from None
