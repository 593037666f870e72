"""What `prepare` measures and reports: progress lines, the counts and length statistics that
the manifest records, and the summary line.

Everything goes to stderr, and only when `verbose`.
"""

import sys
import time

# Seconds between progress lines.
_PROGRESS_SECONDS = 10.0


def log(message, verbose):
    """Prints `message` to stderr when `verbose`."""
    if verbose:
        print(message, file=sys.stderr, flush=True)


class Progress:
    """Prints lines/s, pairs written and an ETA every few seconds."""

    def __init__(self, total, verbose, what="pairs written"):
        self.total, self.verbose, self.what = total, verbose, what
        self.start = self.last = time.time()

    def update(self, lines, written, force=False):
        now = time.time()
        if not self.verbose or (not force and now - self.last < _PROGRESS_SECONDS):
            return
        self.last = now
        rate = lines / max(now - self.start, 1e-9)
        line = f"  {lines:,} lines, {rate:,.0f} lines/s"
        if written:
            line += f", {written:,} {self.what}"
        elif not self.what.endswith(" written"):
            line += f" ({self.what})"
        if self.total:
            eta = max(0.0, (self.total - lines) / max(rate, 1e-9))
            line += f", {100 * lines / self.total:.0f}%, ETA {eta / 60:.1f} min"
        log(line, self.verbose)


def merge(total, chunk, every_reading=False):
    """Adds a chunk's counts (an `encoding.Chunk`) to `total` (pairs are counted in the first
    reading only, unless `every_reading`: a segment's counts, which keep their reading)."""
    if chunk.reading == 0 or every_reading:
        total.too_long += chunk.too_long
        total.truncated += chunk.truncated
        total.written += chunk.written
        total.annotated += chunk.annotated
    total.source_tokens += chunk.source_tokens
    total.target_tokens += chunk.target_tokens
    total.source_hist.update(chunk.source_hist)
    total.target_hist.update(chunk.target_hist)
    total.longer_hist.update(chunk.longer_hist)


def length_stats(histogram):
    """Mean and percentiles of a histogram {length: count}."""
    total = sum(histogram.values())
    if not total:
        return {"mean": 0, "p50": 0, "p90": 0, "p99": 0, "max": 0}
    stats = {"mean": round(sum(k * v for k, v in histogram.items()) / total, 2)}
    cumulative, marks = 0, {"p50": 0.5, "p90": 0.9, "p99": 0.99}
    for length in sorted(histogram):
        cumulative += histogram[length]
        for name, share in list(marks.items()):
            if cumulative >= share * total:
                stats[name] = length
                del marks[name]
    stats["max"] = max(histogram)
    return stats


def summary(manifest, layout, verbose):
    """Prints the one-line summary of a finished preparation."""
    counts, tokens = manifest["counts"], manifest["tokens"]
    skipped = ", ".join(f"{k} {v:,}" for k, v in counts["skipped"].items() if v) or "none"
    size = sum(s["bytes"] for s in manifest["shards"])
    sampled = ""
    if counts.get("segmentations", 1) > 1:
        sampled = f" x {counts['segmentations']} sampled segmentations"
    if counts.get("directions", 1) > 1:
        sampled += f" x {counts['directions']} directions"
    if sampled:
        sampled += f" ({counts['records']:,} records)"
    log(
        f"prepared {counts['written']:,} pairs{sampled} of {counts['lines']:,} lines in "
        f"{manifest['seconds']:.0f} s (skipped: {skipped}; truncated {counts['truncated']:,}): "
        f"{len(manifest['shards'])} shards, {size / 1e6:,.1f} MB, {tokens['source']:,} source "
        f"and {tokens['target']:,} target tokens, vocabulary {manifest['vocabulary']['pieces']} "
        f"pieces -> {layout.prepared}",
        verbose,
    )
