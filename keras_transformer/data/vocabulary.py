"""The vocabulary of `prepare`: the workdir's own, one a stopped preparation trained, or one
trained now on a bounded, seeded sample of the corpus.

The sample is drawn while the corpus streams by (reservoir sampling: at most
`data.spm_max_sentences` sentences are ever held), both sides of every pair, so memory does not
grow with the corpus. A trained vocabulary is kept in the workdir until the shards are complete
(`kept_vocabulary`): a stopped preparation goes on from it.
"""

import os
import random
import time

from keras_transformer import local_files, stopping
from keras_transformer.data import corpora, kept_vocabulary
from keras_transformer.data.manifest import vocabulary_settings
from keras_transformer.data.statistics import Progress, log
from keras_transformer.data.tokenizer import copy_model

# What `stopping.check` names while the sample is drawn.
_SAMPLING = "prepare (sampling sentences for the vocabulary)"


def install_or_train(config, layout, vocabulary, verbose, pool, phases):
    """Installs the workdir's vocabulary at `vocabulary`, or trains one on a seeded sample of
    the corpus; returns `(pairs in the corpus or None, trained, sentences sampled)`.

    The vocabulary trains with as many SentencePiece threads as the machine has cores, whatever
    `data.prepare_workers` says: its threads split the sentences among them and sum their
    counts in floating point, so their number changes the vocabulary (slightly), and the
    prepared data must be the same whatever the number of workers. `pool` starts meanwhile.
    The seconds of sampling and training go into `phases`."""
    d, started = config.data, time.time()
    total = _known_size(d.train)
    if local_files.gfile().exists(layout.spm):
        log(f"preparing {d.train} with the existing vocabulary {layout.spm}", verbose)
        copy_model(layout.spm, vocabulary)
        return total, False, 0
    record = kept_vocabulary.restore(layout.root, vocabulary_settings(d), vocabulary)
    if record is not None:  # a preparation stopped after training it
        log(f"preparing {d.train} with the vocabulary a stopped preparation trained", verbose)
        phases.update(record["phase_seconds"])
        return record["pairs"], True, record["sample_sentences"]
    from keras_transformer.data.tokenizer import train_sentencepiece

    log(f"preparing {d.train}: sampling sentences for the vocabulary ...", verbose)
    counter = corpora.Counter(d.train)
    progress = Progress(total, verbose, "read for the vocabulary sample")
    sample = _reservoir_sample(_sentences(d.train, counter, progress), d.spm_max_sentences, d.seed)
    progress.update(counter.lines, 0, force=True)
    pool.start(counter.kept, max(1, d.subword_samples))
    phases["vocabulary_sample"], started = time.time() - started, time.time()
    train_sentencepiece(
        sample,
        vocabulary,
        vocab_size=d.vocab_size,
        model_type=d.spm_model_type,
        character_coverage=d.spm_character_coverage,
        max_sentences=max(1, len(sample)),
        seed=d.seed,
        num_threads=max(1, os.cpu_count() or 1),
        verbose=verbose,
        # Tagged back-translation reserves its tag: one piece, never split (only then, so
        # the vocabulary of every other config stays what it was).
        user_defined_symbols=_reserved_symbols(d),
    )
    phases["vocabulary_training"] = time.time() - started
    record = {"settings": vocabulary_settings(d), "pairs": counter.kept}
    record.update(sample_sentences=len(sample), phase_seconds=phases)
    kept_vocabulary.keep(layout.root, vocabulary, record)
    return counter.kept, True, len(sample)  # the count is now known exactly


def _reserved_symbols(d):
    """The pieces the vocabulary keeps whole: `corpora.TAG` with `bt:` corpora, the glossary
    tags with `data.terminology` (None without either, so other vocabularies stay as they were)."""
    symbols = [corpora.TAG] if corpora.is_tagged(d.train) else []
    if d.terminology:
        from keras_transformer import glossary

        symbols.extend(glossary.TAGS)
    return symbols or None


def _reservoir_sample(sentences, size, seed):
    """A uniform random sample of `size` items of an iterable of unknown length, holding no more
    than `size` of them (Vitter's algorithm R); all items, in order, when there are fewer."""
    rng = random.Random(seed)
    sample = []
    for seen, sentence in enumerate(sentences):
        if seen < size:
            sample.append(sentence)
        else:
            j = rng.randrange(seen + 1)
            if j < size:
                sample[j] = sentence
    return sample


def _sentences(spec, counter, progress):
    for source, target in corpora.iter_training_pairs(spec, counter, verbose=False):
        yield source.removeprefix(corpora.TAG_PREFIX)  # the sample holds real sentences
        yield target
        if counter.kept % 4096 == 0:
            progress.update(counter.lines, 0)
            stopping.check(_SAMPLING)


def _known_size(train):
    """Pairs `data.train` yields when known without reading it (synthetic, tfds metadata; each
    corpus times its copies), else None."""
    total = 0
    for spec, copies, _ in corpora.training_specs(train):
        size = _spec_size(spec)
        if size is None:
            return None
        total += size * copies
    return total


def _spec_size(spec):
    kind, rest = corpora.parse_spec(spec)
    if kind == "synthetic":
        from keras_transformer.data import synthetic

        return synthetic.spec_size(rest, spec)
    if kind == "tfds":
        return corpora.tfds_size(spec)
    return None
