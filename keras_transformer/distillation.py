"""The distilled corpus of sequence-level knowledge distillation (Kim & Rush 2016): the sources of
the training corpus translated by a teacher, in shards that workers translate apart, merged into
one corpus the student trains on (`keras-transformer distill`, `commands/distill.py`).

```
WORKDIR/                              the student's workdir
  distill/
    source-00000-of-00002.txt         shard 0's source lines: lines 0, 2, 4, ... of the corpus
    target-00000-of-00002.txt         their translations, once complete (renamed into place)
    target-00000-of-00002.txt.partial the translation under way, with .partial.progress
  distilled/
    source.txt  target.txt            the merged corpus: line i from shard i % N, in corpus order
    manifest.json                     written last: lines, shards, teacher, data.train
```

The sources are those of each corpus of `data.train` once, as the corpus readers yield them
(cleaned; `N*` repeats and `bt:` tags apply to the original pairs, not to the teacher's input).
Shard I of N holds the lines whose index is I modulo N, so N workers translate the corpus one
worker translates, and merging takes the shards' lines in turn: the same lines in the same order.

A shard's translation is `file_translation.translate_file` (resumable: a kill or a stop loses at
most one chunk) with a safe point between chunks (`stopping.check`). Its file and the merged
corpus are complete or absent: a shard is translated under a temporary name and renamed, the
merged corpus written into `distilled.partial/` and renamed to `distilled/` (on a local disk;
elsewhere in place, `manifest.json` last, which the reader looks for).
"""

import dataclasses
import json
import os

from keras_transformer import local_files, stopping
from keras_transformer.data import corpora
from keras_transformer.errors import UsageError
from keras_transformer.file_translation import translate_file
from keras_transformer.workdir import is_local, join, read_json, remove_tree, write_atomically

SHARDS = "distill"
CORPUS = "distilled"
MANIFEST = "manifest.json"
PARTIAL = ".partial"
# Corpus lines between two safe points while a shard's sources are read.
_CHECK_EVERY = 65536


@dataclasses.dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` of the corpus a student workdir distills.

    Args:
        root: the student's workdir.
        index: which shard, 0 to `count - 1`.
        count: the number of shards.
    """

    root: str
    index: int
    count: int

    def _path(self, side):
        return join(self.root, SHARDS, f"{side}-{self.index:05d}-of-{self.count:05d}.txt")

    @property
    def source(self):
        return self._path("source")

    @property
    def target(self):
        """The shard's translations; it exists only once complete."""
        return self._path("target")

    @property
    def name(self):
        return f"shard {self.index} of {self.count}"


def distilled_corpus(root):
    """The merged corpus's manifest in the workdir `root` (None until it is complete)."""
    manifest = read_json(join(root, CORPUS, MANIFEST))
    if manifest is None:
        return None
    return dict(manifest, source=join(root, CORPUS, "source.txt"),
                target=join(root, CORPUS, "target.txt"))  # fmt: skip


def _one_line(text):
    return text.replace("\r", " ").replace("\n", " ")


def _write_sources(train, shard):
    """Writes the shard's source lines (every `count`th of the corpus's, from `index`), whole:
    under a temporary name, then renamed."""
    gfile = local_files.gfile()
    gfile.makedirs(join(shard.root, SHARDS))
    temporary = shard.source + PARTIAL
    with gfile.GFile(temporary, "wb") as f:
        f.write(b"")  # an empty shard has a file too
        for i, (source, _) in enumerate(corpus_pairs(train)):
            if i % _CHECK_EVERY == 0:  # the temporary file is written again by the next run
                stopping.check(f"distill (reading the sources of {shard.name})")
            if i % shard.count == shard.index:
                f.write((_one_line(source) + "\n").encode("utf-8"))
    gfile.rename(temporary, shard.source, overwrite=True)


def corpus_pairs(train):
    """The pairs of each corpus of `data.train` once, untagged (`corpora.iter_pairs`): what the
    teacher translates (its sources) and what the merged corpus lines up with."""
    specs = dict.fromkeys(spec for spec, _, _ in corpora.training_specs(train))
    for spec in specs:
        yield from corpora.iter_pairs(spec, verbose=False)


def translate_shard(train, shard, teacher, batch_size, chunk_lines):
    """Translates one shard of the sources of `data.train` into `shard.target`, resuming a
    stopped or killed run; does nothing when it is complete.

    Args:
        train: `data.train` (one spec or a list).
        shard: the `Shard`.
        teacher: `() -> (translate, identity)`, called only when there is something to
            translate: `texts -> [[translation] per text]`, and what translates (recorded with
            the progress: a resume needs the same).
        batch_size: sentences per `translate` call.
        chunk_lines: lines translated and saved at a time; a stop request is honoured between
            two (`errors.Preempted`).

    Returns:
        `file_translation.translate_file`'s summary, or None when the shard was complete.
    """
    gfile = local_files.gfile()
    if gfile.exists(shard.target):
        return None
    partial = shard.target + PARTIAL
    if gfile.exists(partial) and not gfile.exists(partial + ".progress"):
        # Translated, not yet renamed: translate_file removes its record last.
        gfile.rename(partial, shard.target, overwrite=True)
        return None
    if not gfile.exists(shard.source):
        _write_sources(train, shard)
    translate, identity = teacher()
    result = translate_file(
        translate, shard.source, partial, batch_size, chunk_lines, identity,
        stop_phase=f"distill (translating {shard.name})",
    )  # fmt: skip
    gfile.rename(partial, shard.target, overwrite=True)
    return result


def missing_shard(root, count):
    """The first of the `count` shards of the workdir `root` not translated yet (None: none)."""
    gfile = local_files.gfile()
    for index in range(count):
        shard = Shard(root, index, count)
        if not gfile.exists(shard.target):
            return shard
    return None


def merge_shards(root, count, record):
    """Merges the `count` translated shards into the workdir's distilled corpus (its lines in
    the corpus's order), complete or absent, and returns its manifest.

    Args:
        root: the student's workdir.
        count: the number of shards.
        record: what the manifest records besides (the teacher, `data.train`).

    Raises:
        UsageError: a shard is not translated (named), or a shard's lines are not its sources'.
    """
    missing = missing_shard(root, count)
    if missing is not None:
        raise UsageError(
            f"the distilled corpus needs {missing.name}: {missing.target} is missing; run "
            f"keras-transformer distill with --shard {missing.index} --num-shards {count}"
        )
    gfile = local_files.gfile()
    final = join(root, CORPUS)
    directory = final + PARTIAL if is_local(root) else final
    remove_tree(directory)
    gfile.makedirs(directory)
    lines = _interleave(root, count, directory)
    manifest = dict(record, lines=lines, shards=count)
    write_atomically(join(directory, MANIFEST), json.dumps(manifest, indent=2))
    if directory != final:
        remove_tree(final)
        os.replace(directory, final)
    return distilled_corpus(root)


def _interleave(root, count, directory):
    """Writes `source.txt` and `target.txt` into `directory`, line i from shard i % count;
    returns the number of lines."""
    gfile = local_files.gfile()
    shards = [Shard(root, index, count) for index in range(count)]
    readers = [(gfile.GFile(s.source, "rb"), gfile.GFile(s.target, "rb")) for s in shards]
    lines = 0
    try:
        with (
            gfile.GFile(join(directory, "source.txt"), "wb") as sources,
            gfile.GFile(join(directory, "target.txt"), "wb") as targets,
        ):
            sources.write(b"")
            targets.write(b"")
            while True:
                shard = shards[lines % count]
                source, target = (reader.readline() for reader in readers[lines % count])
                if not source:
                    _check_ended(readers, shards)
                    break
                if not target:
                    raise UsageError(f"{shard.target} has fewer lines than {shard.source}")
                sources.write(source)
                targets.write(target)
                lines += 1
    finally:
        for pair in readers:
            for reader in pair:
                reader.close()
    return lines


def _check_ended(readers, shards):
    """Refuses shards cut from different corpora: once one ends, every one has ended."""
    for (source, _), shard in zip(readers, shards):
        if source.readline():
            raise UsageError(
                f"{shard.source} has more lines than the shards before it: the shards were cut "
                f"from different corpora; remove {os.path.dirname(shard.source)} and translate "
                "them again"
            )
