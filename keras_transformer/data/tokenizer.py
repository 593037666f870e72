"""A shared SentencePiece vocabulary: training it, and applying it inside TensorFlow graphs.

The vocabulary is trained with the `sentencepiece` library on both sides of the training text
(one vocabulary for source and target, as the paper's shared embedding needs) with fixed special
ids: pad 0, unk 1, bos 2, eos 3. It is applied with tensorflow-text's `SentencepieceTokenizer`, so
tokenization runs in tf.data and in the exported SavedModel from the same serialized model proto.
"""

import io
import random
import re
import sys
import warnings

from keras_transformer import local_files
from keras_transformer.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from keras_transformer.errors import DataError, DataWarning, first_line
from keras_transformer.workdir import Workdir, write_atomically

_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


def _spm_train(
    sentences, vocab_size, model_type, character_coverage, seed, num_threads, symbols=()
):
    import sentencepiece as spm

    # Reserved pieces (e.g. a tag), only when asked: without, the trainer's arguments and so
    # its model are those of every vocabulary made before.
    extra = {"user_defined_symbols": list(symbols)} if symbols else {}
    model = io.BytesIO()
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        pad_piece="<pad>",
        unk_piece="<unk>",
        bos_piece="<s>",
        eos_piece="</s>",
        # A small corpus cannot fill a large vocabulary; take what it has instead of failing.
        hard_vocab_limit=False,
        # Sentences are sampled by us (seeded); sentencepiece must not sample them again.
        input_sentence_size=0,
        shuffle_input_sentence=False,
        # Long sentences (up to 16k bytes) still count; the default 4192 drops some WMT lines.
        max_sentence_length=16384,
        num_threads=num_threads,
        minloglevel=2,  # its per-iteration log is long; we print our own progress line
        **extra,
    )
    return model.getvalue()


def train_sentencepiece(
    sentences,
    model_path,
    vocab_size,
    model_type="unigram",
    character_coverage=1.0,
    max_sentences=1_000_000,
    seed=1234,
    num_threads=None,
    verbose=True,
    user_defined_symbols=None,
):
    """Trains a SentencePiece model on `sentences` and writes it to `model_path`.

    Args:
        sentences: iterable of `str` (give both sides of a parallel corpus for a shared vocabulary).
        model_path: where the model proto is written (local path or any `tf.io.gfile` URL); the
            file appears atomically (written next to it, then renamed), with the pieces and
            scores in `<model_path without .model>.vocab` for people to read.
        vocab_size: wanted number of pieces, the four special ones included. When the text is
            too small for it, the largest size the text supports is used with a `DataWarning`;
            when it is too small for the text's characters, it is raised to their number.
        model_type: `unigram` or `bpe`.
        character_coverage: share of characters covered by the vocabulary (1.0: all).
        max_sentences: at most this many sentences train it (a seeded random sample).
        seed: seed of the sample and of sentencepiece.
        num_threads: trainer threads (default: the number of CPUs).
        verbose: print a progress line to stderr.
        user_defined_symbols: pieces reserved whole, each one id that text containing it is
            always encoded with (e.g. the `<BT>` tag of tagged back-translation).

    Returns:
        The `model_path`.

    Raises:
        DataError: no sentences, or sentencepiece rejects the settings.

    Example:
    ```python
    path = train_sentencepiece(["ein Haus", "a house"] * 50, "/tmp/spm.model", 30)
    Tokenizer(path).vocab_size <= 30
    # -> True
    ```
    """
    import os

    sentences = [s for s in sentences if s]
    if not sentences:
        raise DataError("cannot train a SentencePiece vocabulary on an empty corpus")
    if len(sentences) > max_sentences:
        sentences = random.Random(seed).sample(sentences, max_sentences)
    if verbose:
        print(
            f"training SentencePiece vocabulary of {vocab_size} ({model_type}) on "
            f"{len(sentences)} sentences ...",
            file=sys.stderr,
            flush=True,
        )
    num_threads = num_threads or max(1, os.cpu_count() or 1)
    proto = _spm_train_fitting(
        sentences, vocab_size, model_type, character_coverage, seed, num_threads,
        tuple(user_defined_symbols or ()),
    )  # fmt: skip

    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=proto)
    actual = processor.get_piece_size()
    if actual != vocab_size:
        reason = "too little text for more" if actual < vocab_size else "the text has more chars"
        warnings.warn(
            f"SentencePiece vocabulary has {actual} pieces instead of the {vocab_size} asked "
            f"for ({reason})",
            DataWarning,
            stacklevel=2,
        )
    _write_model(proto, processor, model_path)
    if verbose:
        print(f"wrote {model_path} ({actual} pieces)", file=sys.stderr, flush=True)
    return model_path


def _spm_train_fitting(
    sentences, vocab_size, model_type, character_coverage, seed, num_threads, symbols=()
):
    """`_spm_train` at `vocab_size` or, where sentencepiece refuses it (more pieces than the text
    supports, fewer than its characters), at the size its message names."""
    size = vocab_size
    for _ in range(3):
        try:
            return _spm_train(
                sentences, size, model_type, character_coverage, seed, num_threads, symbols
            )
        except RuntimeError as e:
            too_high, too_low = _TOO_HIGH.search(str(e)), _TOO_LOW.search(str(e))
            if too_high:
                size = int(too_high.group(2))
            elif too_low:
                size = int(too_low.group(2))
            else:
                raise DataError(f"SentencePiece training failed: {first_line(e)}") from None
    raise DataError(f"SentencePiece training failed for vocab_size={vocab_size}")


def _write_model(proto, processor, model_path):
    """Writes the model proto to `model_path` atomically (beside it, then renamed) and its pieces
    and scores to the readable `.vocab` file."""
    import os

    import tensorflow as tf

    directory = os.path.dirname(model_path)
    if directory:
        tf.io.gfile.makedirs(directory)
    temporary = f"{model_path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(temporary, "wb") as f:
        f.write(proto)
    tf.io.gfile.rename(temporary, model_path, overwrite=True)
    with tf.io.gfile.GFile(vocab_path(model_path), "w") as f:
        for i in range(processor.get_piece_size()):
            f.write(f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}\n")


def vocab_path(model_path):
    """The readable pieces-and-scores file beside a model: `spm.model` -> `spm.vocab`."""
    stem = model_path[: -len(".model")] if model_path.endswith(".model") else model_path
    return stem + ".vocab"


def copy_model(source, destination, proto=None):
    """Writes the model `source` to `destination` atomically (`workdir.write_atomically`), and
    its `.vocab` beside it where `source` has one; returns the model's bytes.

    Args:
        source: a model path (any filesystem).
        destination: where the copy goes (any filesystem).
        proto: the bytes of `source` when already read (not read again).
    """
    gfile = local_files.gfile()
    if proto is None:
        with gfile.GFile(source, "rb") as f:
            proto = f.read()
    write_atomically(destination, proto)
    if gfile.exists(vocab_path(source)):
        with gfile.GFile(vocab_path(source), "rb") as f:
            write_atomically(vocab_path(destination), f.read())
    return proto


def adopt_model(source, destination):
    """Makes `destination` the model `source` (`copy_model`, its `.vocab` included), or leaves it
    where it is that model already; returns False, copying nothing, where `destination` holds
    another model (a workdir whose vocabulary a parent or teacher must not replace).
    `destination`'s directory must exist."""
    gfile = local_files.gfile()
    with gfile.GFile(source, "rb") as f:
        proto = f.read()
    if gfile.exists(destination):
        with gfile.GFile(destination, "rb") as f:
            return f.read() == proto
    copy_model(source, destination, proto)
    return True


class Tokenizer:
    """A SentencePiece model applied in the TensorFlow graph (tensorflow-text).

    Args:
        model_path: path (or `tf.io.gfile` URL) of a SentencePiece model trained with pad 0,
            unk 1, bos 2, eos 3 (as `train_sentencepiece` does).
        model_proto: the serialized model instead of a path.

    Attributes:
        vocab_size: number of pieces.
        pad_id, unk_id, bos_id, eos_id: 0, 1, 2, 3.
        model_proto: the serialized model (bytes), e.g. for an exported in-graph tokenizer.
        model_path: where it was read from (None when built from a proto).

    Example:
    ```python
    tokenizer = Tokenizer("workdir/spm.model")
    ids = tokenizer.tokenize(tf.constant(["Grüße 😀"]))  # int32 RaggedTensor [1, None]
    tokenizer.detokenize(ids)  # tf.string [1], the same text back
    ```
    """

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, model_path=None, model_proto=None):
        import sentencepiece as spm

        if (model_path is None) == (model_proto is None):
            raise ValueError("give exactly one of model_path and model_proto")
        if model_path is not None:
            gfile = local_files.gfile()  # read without TensorFlow too (the JAX engine's runs)
            if not gfile.exists(model_path):
                raise DataError(f"SentencePiece model not found: {model_path}")
            with gfile.GFile(model_path, "rb") as f:
                model_proto = f.read()
        self.model_path = model_path
        self.model_proto = bytes(model_proto)
        try:
            processor = spm.SentencePieceProcessor(model_proto=self.model_proto)
        except RuntimeError:
            raise DataError(f"not a SentencePiece model: {model_path or 'model_proto'}") from None
        special = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        if special != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise DataError(
                f"SentencePiece model {model_path or ''} has pad/unk/bos/eos ids {special}; "
                f"keras-transformer needs {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}"
            )
        self.vocab_size = processor.get_piece_size()
        self._processor = processor
        self._eager_tokenizer = None

    def _sentencepiece(self):
        """The tensorflow-text tokenizer to use in the current context.

        tensorflow-text's SentencePiece resource is owned by the kernel that created it. An
        eagerly created one dies when TensorFlow clears its eager kernel cache, which
        `tf.random.set_seed` (hence `keras.utils.set_random_seed`) does; a tf.data pipeline or a
        tf.function holding its handle would then fail with "Resource ... does not exist". So
        inside a graph (tf.data map functions, tf.function) each trace builds its own resource
        op, owned by that graph's kernel, and the eager one is rebuilt when it has gone.
        """
        import tensorflow as tf
        import tensorflow_text as tf_text

        def build():
            return tf_text.SentencepieceTokenizer(
                model=self.model_proto, out_type=tf.int32, add_bos=False, add_eos=False
            )

        if not tf.executing_eagerly():
            return build()
        if self._eager_tokenizer is None:
            self._eager_tokenizer = build()
        return self._eager_tokenizer

    def _run(self, method, value):
        import tensorflow as tf

        try:
            return getattr(self._sentencepiece(), method)(value)
        except tf.errors.NotFoundError:
            if not tf.executing_eagerly():
                raise
            self._eager_tokenizer = None  # its resource was cleared; build it again
            return getattr(self._sentencepiece(), method)(value)

    def tokenize(self, texts):
        """Strings -> ids.

        Args:
            texts: `tf.string` tensor (or list of str) of shape [N] (or a scalar).

        Returns:
            int32 `RaggedTensor` [N, None] of piece ids without BOS/EOS (a 1-D tensor for a
            scalar input).
        """
        import tensorflow as tf

        return self._run("tokenize", tf.convert_to_tensor(texts, tf.string))

    def detokenize(self, ids):
        """Ids -> strings; ids after the first EOS and padding ids (0) are ignored.

        Args:
            ids: int `RaggedTensor` [N, None] or dense tensor [N, T] padded with 0 (a 1-D
                sequence gives a scalar string). BOS/EOS/pad pieces produce no text.

        Returns:
            `tf.string` tensor [N] (or a scalar).
        """
        import tensorflow as tf

        if isinstance(ids, tf.RaggedTensor):
            dense = ids.to_tensor(default_value=PAD_ID)
        else:
            dense = tf.convert_to_tensor(ids)
        dense = tf.cast(dense, tf.int32)
        scalar = dense.shape.rank == 1
        if scalar:
            dense = dense[tf.newaxis]
        # Keep positions before the first EOS that are not padding.
        before_eos = tf.math.cumsum(tf.cast(dense == EOS_ID, tf.int32), axis=1, exclusive=True)
        keep = tf.logical_and(tf.equal(before_eos, 0), tf.not_equal(dense, PAD_ID))
        keep = tf.logical_and(keep, tf.not_equal(dense, EOS_ID))
        texts = self._run("detokenize", tf.ragged.boolean_mask(dense, keep))
        return texts[0] if scalar else texts

    def encode(self, text):
        """One Python string -> list of ids (no BOS/EOS), with the Python sentencepiece library."""
        return self._processor.encode(text)

    def decode(self, ids):
        """A sequence of ids -> one Python string, with the Python sentencepiece library: as
        `detokenize`, the ids from the first EOS on and the padding ids make no text."""
        ids = [int(i) for i in ids]
        if EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID)]
        return self._processor.decode([i for i in ids if i not in (PAD_ID, BOS_ID)])

    def id_to_piece(self, i):
        return self._processor.id_to_piece(int(i))

    def __repr__(self):
        return f"Tokenizer({self.model_path or '<proto>'}, vocab_size={self.vocab_size})"


def get_or_train_tokenizer(data_config, pairs, workdir, verbose=True):
    """The tokenizer of `workdir/spm.model`, trained on `pairs` first if it does not exist.

    Args:
        data_config: `keras_transformer.config.DataConfig` (vocab_size, spm_model_type,
            spm_character_coverage, spm_max_sentences, seed).
        pairs: training `(source, target)` pairs; both sides train the shared vocabulary.
        workdir: the experiment directory.
        verbose: print progress to stderr.

    Returns:
        A `Tokenizer`.
    """
    import tensorflow as tf

    path = Workdir(workdir).spm
    if tf.io.gfile.exists(path):
        if verbose:
            print(f"using the SentencePiece vocabulary in {path}", file=sys.stderr, flush=True)
        return Tokenizer(path)
    sentences = [side for pair in pairs for side in pair]
    train_sentencepiece(
        sentences,
        path,
        vocab_size=data_config.vocab_size,
        model_type=data_config.spm_model_type,
        character_coverage=data_config.spm_character_coverage,
        max_sentences=data_config.spm_max_sentences,
        seed=data_config.seed,
        verbose=verbose,
    )
    return Tokenizer(path)
