"""`keras-transformer distill`: sequence-level knowledge distillation (Kim & Rush 2016). A trained
teacher (its export's beam search) translates the sources of the student's `data.train`; the
student, with the teacher's vocabulary, trains on those pairs (and on the original ones with
`distill.keep_original`) through the same run as `keras-transformer train`.

Phases, each resumed by running the same command again: the corpus's translation (in shards
that workers translate apart with `--shard I --num-shards N`: `keras_transformer.distillation`),
their merge into `WORKDIR/distilled/`, the student's training (`train_command`).
"""

import dataclasses
import os
import sys
import types

from keras_transformer import distillation, local_files
from keras_transformer.commands import flags, startup
from keras_transformer.commands.lines import output_rows
from keras_transformer.commands.train import load_command_config, train_command
from keras_transformer.data.tokenizer import adopt_model
from keras_transformer.errors import UsageError
from keras_transformer.workdir import Workdir, join, read_json


@dataclasses.dataclass(frozen=True)
class Teacher:
    """The teacher of a distillation.

    Attributes:
        export: its SavedModel (a version directory or the named model's base path).
        vocabulary: its SentencePiece model, which the student uses as is.
    """

    export: str
    vocabulary: str


def resolve_teacher(path, vocabulary=None):
    """The `Teacher` that `--teacher PATH` names: a trained workdir (its `spm.model` and the
    export its `result.json` names) or an export directory (with `--teacher-vocabulary`).
    `UsageError` (one line) where either is missing."""
    gfile = local_files.gfile()
    if not gfile.isdir(path):
        raise UsageError(f"--teacher {path}: no such workdir or export directory")
    layout, export = Workdir(path), path
    if gfile.exists(layout.config):  # a training workdir
        export = (read_json(layout.result) or {}).get("saved_model")
        if not export:
            raise UsageError(
                f"--teacher {path}: the workdir has no export yet (its result.json names none): "
                "let its training finish, or give the export directory and --teacher-vocabulary"
            )
        vocabulary = vocabulary or layout.spm
    elif vocabulary is None:
        raise UsageError(
            f"--teacher {path} is an export: give its SentencePiece model with "
            "--teacher-vocabulary (the teacher workdir's spm.model)"
        )
    if not gfile.exists(vocabulary):
        raise UsageError(f"the teacher's vocabulary {vocabulary} is missing")
    return Teacher(export, vocabulary)


def install_vocabulary(teacher, layout):
    """Copies the teacher's vocabulary to the student's `WORKDIR/spm.model` (where `prepare`
    takes an existing one as is: the teacher's shortlist and tokenization carry over); refuses
    a workdir that holds another vocabulary."""
    local_files.gfile().makedirs(layout.root)
    if not adopt_model(teacher.vocabulary, layout.spm):
        raise UsageError(
            f"{layout.spm} is not the teacher's vocabulary ({teacher.vocabulary}): use another "
            "--workdir"
        )


def teacher_translation(teacher, beam_size, verbose=False):
    """`(translate, identity)`: `texts -> [[translation] per text]` through the teacher's
    `serving_default` signature (its beam search), and what a resumed translation must match.
    `UsageError` where `distill.beam_size` is not the export's."""
    startup.import_tensorflow(verbose)
    from keras_transformer.commands.signatures import load_serving_function
    from keras_transformer.export.saved_model import METADATA_FILE, resolve_model_dir

    model = resolve_model_dir(teacher.export)
    exported = (read_json(join(model, "assets.extra", METADATA_FILE)) or {}).get("beam_size")
    if beam_size is not None and exported != beam_size:
        raise UsageError(
            f"distill.beam_size is {beam_size}, the teacher's export {model} searches with beam "
            f"{exported}: export the teacher with --beam-size {beam_size}, or set "
            "distill.beam_size=null"
        )
    translate = load_serving_function(model)

    def rows(texts):
        return output_rows(*translate(texts))

    rows.loaded = translate
    return rows, f"{os.path.realpath(model)} (beam {exported})"


def student_train(config, corpus):
    """The student's `data.train`: the distilled corpus, then (`distill.keep_original`) the
    original corpora as given."""
    distilled = f"text:{_where(corpus['source'])},{_where(corpus['target'])}"
    if not config.distill.keep_original:
        return [distilled]
    original = config.data.train
    return [distilled, *([original] if isinstance(original, str) else original)]


def distill_command(args):
    """`keras-transformer distill --teacher PATH --config FILE [--workdir DIR] [--set KEY=VALUE
    ...] [--shard I --num-shards N]`: with `--shard`, translates that shard and stops; else
    merges the shards (translating the corpus itself first when there is one) and trains the
    student."""
    config = load_command_config(args)
    request = flags.shard_request(args, os.environ)
    teacher = resolve_teacher(args.teacher, getattr(args, "teacher_vocabulary", None))
    layout = Workdir.of(config)
    install_vocabulary(teacher, layout)
    corpus = _distilled_corpus(args, config, layout, teacher, request)
    if corpus is None:  # a shard worker: its shard is done
        return
    print(f"{corpus['source']}, {corpus['target']}: {corpus['lines']:,} distilled pairs")
    sys.stdout.flush()
    trained = [*args.set, ("data.train", student_train(config, corpus))]
    train_command(
        types.SimpleNamespace(
            config=args.config, workdir=args.workdir, set=trained, init_from=None,
            verbose=getattr(args, "verbose", False),
        )
    )  # fmt: skip


def _distilled_corpus(args, config, layout, teacher, request):
    """The merged corpus's manifest (translated and merged here where needed), or None after a
    shard worker translated its shard."""
    record = {"teacher": _where(teacher.export), "data.train": config.data.train}
    corpus = distillation.distilled_corpus(layout.root)
    if corpus is not None:
        for key, value in record.items():
            if corpus.get(key) != value:
                raise UsageError(
                    f"{layout.root}/{distillation.CORPUS} was distilled with {key} "
                    f"{corpus.get(key)!r}, this run has {value!r}: use another --workdir"
                )
        return corpus
    d = config.distill

    def load():
        return teacher_translation(teacher, d.beam_size, getattr(args, "verbose", False))

    if request.index is not None or request.count == 1:
        shard = distillation.Shard(layout.root, request.index or 0, request.count)
        result = distillation.translate_shard(
            config.data.train, shard, load, d.batch_size, d.chunk_lines
        )
        done = f"{result['translated']:,} lines translated" if result else "translated before"
        print(f"{shard.target}: {shard.name} complete ({done})")
        if request.index is not None:
            return None
    return distillation.merge_shards(layout.root, request.count, record)


def _where(path):
    """A local path made absolute (as the manifest records it), another filesystem's as is."""
    return os.path.abspath(path) if "://" not in path else path
