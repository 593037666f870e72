"""Translation of a big text file, streamed and resumable (`keras-transformer translate --input
FILE --output FILE`).

The input is read one chunk of lines at a time, never whole. Each chunk is translated in batches
of similar length (sorted by characters: little padding) and written in input order, one output
line per input line (K with n-best). After each chunk the output is flushed (and fsync'ed on a
local disk), then a small progress file, `OUTPUT.progress`, is replaced atomically: the lines done,
the output's size and what is translated (input path and size, model, lines per input). It is
removed once the output is complete.

Run again after a kill, the command checks that the progress file describes the same input and
model, keeps every complete output line (also those written after the last record), cuts a partly
written last line, skips as many input lines and goes on: no written line is translated twice and
the output ends complete. An output with no progress file is refused (a finished translation or
someone else's file): never overwritten, never taken as done.

Paths go through `tf.io.gfile` (any TensorFlow filesystem). On remote filesystems, where a flush
uploads the whole object again (gs://), the output and its record are saved at most once a minute.
"""

import itertools
import json
import os
import sys
import time

from keras_transformer import stopping
from keras_transformer.errors import Preempted, UsageError

# Input lines read, translated and written at a time (`--chunk-lines`).
CHUNK_LINES = 4096
PROGRESS_SUFFIX = ".progress"
# Seconds between saves on remote filesystems (each flush there re-uploads the whole output).
_REMOTE_SAVE_SECONDS = 60.0
# Seconds between progress updates: redrawn in place on a terminal, one line each in a log.
_TTY_SECONDS = 0.5
_LOG_SECONDS = 30.0
_BAR_WIDTH = 24


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def _is_local(path):
    return "://" not in path


def _canonical(path):
    return os.path.realpath(path) if _is_local(path) else path


def check_paths(input_path, output_path):
    """Raises `UsageError` (one line) unless `input_path` is a file and `output_path` can be
    written: its directory exists and it is neither a directory nor the input."""
    gfile = _gfile()
    if not gfile.exists(input_path) or gfile.isdir(input_path):
        raise UsageError(f"input file not found: {input_path}")
    directory = os.path.dirname(output_path)
    if directory and not gfile.isdir(directory):
        raise UsageError(f"output directory not found: {directory}")
    if gfile.isdir(output_path):
        raise UsageError(f"--output {output_path} is a directory")
    if _canonical(input_path) == _canonical(output_path):
        raise UsageError(f"--output {output_path} is the input file")


def _fsync(path):
    """Forces a local file's data to disk (fsync on any descriptor of a file syncs the file)."""
    if _is_local(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _save_progress(output_path, record):
    """Replaces `OUTPUT.progress` atomically (written beside it, then renamed over it)."""
    gfile = _gfile()
    path = output_path + PROGRESS_SUFFIX
    with gfile.GFile(path + ".tmp", "w") as f:
        f.write(json.dumps(record))
    _fsync(path + ".tmp")
    gfile.rename(path + ".tmp", path, overwrite=True)


def _read_progress(output_path, identity):
    """The progress record of `output_path` (None if there is none); `UsageError` if it
    describes another translation."""
    gfile = _gfile()
    path = output_path + PROGRESS_SUFFIX
    if not gfile.exists(path):
        if gfile.exists(output_path) and gfile.stat(output_path).length:
            raise UsageError(
                f"{output_path} exists and has no {path} (a finished translation, or another "
                "file): remove it or choose another --output"
            )
        return None
    try:
        with gfile.GFile(path, "r") as f:
            record = json.loads(f.read())
        record["lines"], record["output_bytes"] = int(record["lines"]), int(record["output_bytes"])
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"{path} is not a progress file: remove it and {output_path}") from None
    for key, value in identity.items():
        if record.get(key) != value:
            raise UsageError(
                f"{path} records {key} {record.get(key)!r}, this run has {value!r}: resume with "
                f"the same input and model, or remove {output_path} and {path}"
            )
    return record


def _truncate(path, size):
    """Cuts `path` to its first `size` bytes (remote files: a copy of the prefix renamed over)."""
    if _is_local(path):
        os.truncate(path, size)
        return
    gfile = _gfile()
    with gfile.GFile(path, "rb") as source, gfile.GFile(path + ".tmp", "wb") as target:
        while size > 0:
            block = source.read(min(size, 1 << 24))
            if not block:
                break
            target.write(block)
            size -= len(block)
    gfile.rename(path + ".tmp", path, overwrite=True)


def resume_point(output_path, identity):
    """`(input lines done, output bytes kept)` for a translation into `output_path`, repairing a
    killed run's output: the complete groups of `identity["lines_per_input"]` lines written after
    its last record are kept; a partly written group at the end is cut off.

    Args:
        output_path: the output file.
        identity: what is translated (`input`, `input_bytes`, `model`, `lines_per_input`);
            a progress record of another translation is refused with `UsageError`.
    """
    gfile = _gfile()
    record = _read_progress(output_path, identity)
    if record is None:
        return 0, 0
    size = gfile.stat(output_path).length if gfile.exists(output_path) else 0
    offset = record["output_bytes"]
    if size < offset:
        raise UsageError(
            f"{output_path} is shorter than {output_path}{PROGRESS_SUFFIX} records: it was "
            "changed; remove both to start again"
        )
    tail = b""  # what was written after the last record: about one chunk at most
    if size > offset:
        with gfile.GFile(output_path, "rb") as f:
            f.seek(offset)
            tail = f.read()
    per_input = identity["lines_per_input"]
    complete = tail.count(b"\n") // per_input
    kept = sum(len(line) + 1 for line in tail.split(b"\n")[: complete * per_input])
    if offset + kept < size:
        _truncate(output_path, offset + kept)
    return record["lines"] + complete, offset + kept


def _decode(raw):
    # Line ends: LF or CRLF (gfile's readline already drops CRs; not every reader does).
    return raw.rstrip(b"\n").rstrip(b"\r").decode("utf-8", errors="replace")


def _one_line(text):
    # An output line per hypothesis, whatever the detokenizer produced.
    return text.replace("\r", " ").replace("\n", " ")


def translate_chunk(translate, lines, batch_size, lines_per_input=1):
    """The UTF-8 output of `lines`, in input order, translated in batches of similar length.

    Args:
        translate: `texts -> [[output line, ...] per text]`, `lines_per_input` lines each.
        lines: the input lines (str).
        batch_size: sentences per `translate` call.
        lines_per_input: output lines per input line.

    Returns:
        The output bytes: `lines_per_input` newline-terminated lines per input line.
    """
    order = sorted(range(len(lines)), key=lambda i: len(lines[i]))  # by length: little padding
    outputs = [None] * len(lines)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        for i, result in zip(batch, translate([lines[i] for i in batch])):
            if len(result) != lines_per_input:
                raise ValueError(f"expected {lines_per_input} output lines, got {len(result)}")
            outputs[i] = result
    text = "".join(_one_line(line) + "\n" for result in outputs for line in result)
    return text.encode("utf-8")


class Progress:
    """Lines done, lines/s, percent and ETA on `stream` (stderr): redrawn in place on a terminal
    every half second, one line every 30 s otherwise (a log). The total is estimated from the
    input's size and the bytes per line read so far, so the input is read only once."""

    def __init__(self, total_bytes, lines, read_bytes, stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval = _TTY_SECONDS if self.tty else _LOG_SECONDS
        self.start = self.last = time.monotonic()
        self.total_bytes, self.first, self.lines = total_bytes, lines, lines
        self.read_lines, self.read_bytes = lines, read_bytes

    def read(self, lines, nbytes):
        self.read_lines += lines
        self.read_bytes += nbytes

    def finish(self):
        self.read_bytes = self.total_bytes  # gfile's readline drops CRs: counts fall short
        self.update(0, force=True)

    def update(self, lines, force=False):
        self.lines += lines
        now = time.monotonic()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        rate = (self.lines - self.first) / max(now - self.start, 1e-9)
        fraction = self.read_bytes / self.total_bytes if self.total_bytes else 1.0
        total = self.read_lines / fraction if fraction else 0
        share = min(1.0, self.lines / total) if total else 1.0
        bar = "#" * round(share * _BAR_WIDTH)
        line = f"[{bar:.<{_BAR_WIDTH}}] {100 * share:3.0f}% {self.lines:,} lines"
        line += f", {rate:,.0f} lines/s"
        if rate and share < 1:
            line += f", ETA {max(0.0, total - self.lines) / rate / 60:.1f} min"
        end = "\n" if not self.tty or force else ""
        self.stream.write(("\r" + line.ljust(79) if self.tty else line) + end)
        self.stream.flush()


def _identity(input_path, model, lines_per_input):
    return {
        "input": _canonical(input_path),
        "input_bytes": _gfile().stat(input_path).length,
        "model": model,
        "lines_per_input": lines_per_input,
    }


def _input_lines(f, skip):
    """`(raw lines iterator, bytes skipped)` of an open binary file, past its first `skip` lines."""
    lines = iter(f.readline, b"")
    skipped = sum(len(line) for line in itertools.islice(lines, skip))
    return lines, skipped


def translate_file(
    translate, input_path, output_path, batch_size=32, chunk_lines=CHUNK_LINES, model="",
    lines_per_input=1, stream=None, stop_phase=None,
):  # fmt: skip
    """Translates `input_path` into `output_path` as it streams, resuming a killed run.

    Args:
        translate: `texts -> [[output line, ...] per text]`, `lines_per_input` lines each.
        input_path: the input text file (UTF-8, one sentence per line; any gfile path).
        output_path: the output file; `OUTPUT.progress` lies beside it until it is complete.
        batch_size: sentences per `translate` call.
        chunk_lines: input lines read, translated and saved at a time.
        model: what translates (the SavedModel's path), recorded so a resume uses the same one.
        lines_per_input: output lines per input line (K with n-best).
        stream: where the progress goes (default stderr).
        stop_phase: the phase `stopping.check` names at each chunk boundary, once the chunk is
            saved (`errors.Preempted` then leaves a translation the same call resumes); None:
            no stop there (`translate`, which is not run inside `stopping.catching()`).

    Returns:
        `{"lines", "resumed_after", "translated", "seconds"}`: input lines in all, lines done by
        an earlier run, lines translated by this one, and its seconds.
    """
    gfile = _gfile()
    check_paths(input_path, output_path)
    identity = _identity(input_path, model, lines_per_input)
    done, written = resume_point(output_path, identity)
    record = dict(identity, lines=done, output_bytes=written)
    _save_progress(output_path, record)  # before the output exists: no output lacks a record
    if not gfile.exists(output_path):
        with gfile.GFile(output_path, "wb") as out:
            out.write(b"")  # GFile opens on the first write: an empty input has an output too
    start, first = time.monotonic(), done
    with gfile.GFile(input_path, "rb") as source, gfile.GFile(output_path, "ab") as out:
        lines, skipped = _input_lines(source, done)
        progress = Progress(identity["input_bytes"], done, skipped, stream)
        saved, counted = time.monotonic(), _counted(translate, progress)
        while chunk := list(itertools.islice(lines, chunk_lines)):
            progress.read(len(chunk), sum(map(len, chunk)))
            texts = [_decode(raw) for raw in chunk]
            data = translate_chunk(counted, texts, batch_size, lines_per_input)
            out.write(data)
            record["lines"] += len(chunk)
            record["output_bytes"] += len(data)
            if _is_local(output_path) or time.monotonic() - saved >= _REMOTE_SAVE_SECONDS:
                _save(out, output_path, record)
                saved = time.monotonic()
            _stop_point(stop_phase, out, output_path, record)
    _fsync(output_path)
    gfile.remove(output_path + PROGRESS_SUFFIX)
    progress.finish()
    seconds = time.monotonic() - start
    translated = record["lines"] - first
    return dict(lines=record["lines"], resumed_after=first, translated=translated, seconds=seconds)


def _save(out, output_path, record):
    """The output flushed (fsync'ed on a local disk), then its progress record."""
    out.flush()
    _fsync(output_path)
    _save_progress(output_path, record)


def _stop_point(phase, out, output_path, record):
    """A safe point between two chunks: on a stop request the output and its record are saved
    (also on a remote filesystem, where saves are otherwise a minute apart), then
    `errors.Preempted` goes up."""
    if phase is None:
        return
    try:
        stopping.check(phase, done=f"{record['lines']:,} lines translated are kept")
    except Preempted:
        _save(out, output_path, record)
        raise


def _counted(translate, progress):
    """`translate` that reports each batch's lines to `progress`."""

    def counted(texts):
        results = translate(texts)
        progress.update(len(texts))
        return results

    return counted
