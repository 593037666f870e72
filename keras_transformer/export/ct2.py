"""Conversion to CTranslate2 (OpenNMT's C++ inference engine): a model directory for
`ctranslate2.Translator`, with the SentencePiece model beside it.

The weights are mapped onto CTranslate2's public model specification
(`ctranslate2.specs.TransformerSpec`), which describes the same architecture: post-norm or pre-norm
blocks, ReLU feed-forward networks, embeddings scaled by sqrt(d_model), one embedding matrix for
the source, the target and the pre-softmax projection. Two details are ours and made explicit:

- Positions: our encoding interleaves sines and cosines (`PE(pos, 2i) = sin`, `PE(pos, 2i+1) =
  cos`, as in the paper); CTranslate2's built-in table puts all sines first. The spec therefore
  carries our table (`position_encodings.encodings`).
- Banned tokens: our search never generates padding or BOS. CTranslate2 has no such rule, so the
  converted projection gets a bias that is 0 except a large negative value at those two ids.

With a vocabulary shortlist's lexical table (`export_ctranslate2(shortlist=...)`, `export --format
ctranslate2 --shortlist`) the directory also holds `vmap.txt`, CTranslate2's own vocabulary map
(`vocabulary_map`), which it restricts the projection with when asked (`translate_batch(...,
use_vmap=True)`, `--use_vmap`): the same table the SavedModel and LiteRT exports decode with,
written as pieces.

The module is named `ct2` so that it never shadows the `ctranslate2` package, which is an
optional extra (`pip install "keras-transformer[ctranslate2]"`) imported only inside the
functions below.
"""

import json
import os
import shutil

import numpy as np

from keras_transformer import stopping
from keras_transformer.config import DecodingSettings
from keras_transformer.errors import UsageError
from keras_transformer.layers.embedding import positional_encoding
from keras_transformer.workdir import copy_tree, is_local, local_directory, staging_directory

INSTALL_HINT = 'pip install "keras-transformer[ctranslate2]" (or pip install "ctranslate2>=4.5,<5")'
METADATA_FILE = "keras_transformer.json"
SPM_FILE = "spm.model"
VMAP_FILE = "vmap.txt"  # the name CTranslate2 loads a vocabulary map from
PHASE = "the CTranslate2 conversion"  # what `stopping.check` names
# Large enough to never win a softmax, small enough for float16 logits (max 65504).
BANNED_LOGIT_BIAS = -1.0e4


def require_ctranslate2():
    """The `ctranslate2` module; raises `UsageError` with the install command without it."""
    try:
        import ctranslate2
    except ImportError:
        raise UsageError(
            f"--format ctranslate2 needs the optional ctranslate2 package: {INSTALL_HINT}"
        ) from None
    return ctranslate2


def _vocabulary(spm_bytes):
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=spm_bytes)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def vocabulary_map(table, pieces):
    """CTranslate2's vocabulary map (`vmap.txt`) of a lexical table (`data.shortlist.
    LexicalTable`), as text: one line per source piece with translations, the piece, a tab and
    its target pieces separated by spaces (best first, without repeats or padding), and first
    the line of an empty source, whose targets CTranslate2 always allows: the table's frequent
    pieces and our special ids (`data.shortlist.SPECIAL_IDS`). CTranslate2 allows a batch the
    union of its source pieces' lines, the always-allowed line, UNK, BOS, EOS and the target
    prefix's pieces, as our exports' `batch_shortlist` does. `pieces`: the vocabulary, id `i`'s
    piece at `pieces[i]` (SentencePiece pieces hold neither spaces nor tabs)."""
    from keras_transformer.data.shortlist import SPECIAL_IDS

    def names(ids):
        seen = dict.fromkeys(int(i) for i in ids)
        return " ".join(pieces[i] for i in seen)

    always = [*(int(i) for i in table.frequent), *SPECIAL_IDS]
    lines = ["\t" + names(always)]
    for source, row in enumerate(np.asarray(table.translations)):
        row = row[row != 0]
        if row.size:
            lines.append(f"{pieces[source]}\t{names(row)}")
    return "\n".join(lines) + "\n"


def _array(variable):
    return np.asarray(variable.numpy() if hasattr(variable, "numpy") else variable, np.float32)


def _linear(spec, kernels, biases):
    """Keras Dense kernels `[in, out]` (several: fused along `out`) -> CTranslate2 `[out, in]`."""
    spec.weight = np.ascontiguousarray(np.concatenate([_array(k) for k in kernels], axis=1).T)
    spec.bias = np.concatenate([_array(b) for b in biases])


def _norm(spec, layer):
    spec.gamma = _array(layer.gamma)
    spec.beta = _array(layer.beta)


def _attention(spec, layer, norm, fused_query):
    """Our `MultiHeadAttention` (query/key/value/attention_output Dense layers) -> CTranslate2's
    fused projections: `[Q; K; V]` for self-attention, `Q` and `[K; V]` for cross-attention."""
    q, k, v = layer.query_dense, layer.key_dense, layer.value_dense
    if fused_query:
        _linear(spec.linear[0], [q.kernel, k.kernel, v.kernel], [q.bias, k.bias, v.bias])
    else:
        _linear(spec.linear[0], [q.kernel], [q.bias])
        _linear(spec.linear[1], [k.kernel, v.kernel], [k.bias, v.bias])
    out = layer.output_dense
    _linear(spec.linear[-1], [out.kernel], [out.bias])
    _norm(spec.layer_norm, norm)


def _feed_forward(spec, block):
    ffn = block.feed_forward
    _linear(spec.linear_0, [ffn.inner.kernel], [ffn.inner.bias])
    _linear(spec.linear_1, [ffn.outer.kernel], [ffn.outer.bias])
    _norm(spec.layer_norm, block.feed_forward_norm)


def _check_supported(model):
    unsupported = []
    if not model.share_embeddings or not model.tie_output_projection:
        unsupported.append("untied embeddings")
    if str(model.activation).lower() != "relu":
        unsupported.append(f"activation {model.activation!r}")
    if unsupported:
        raise UsageError("cannot convert to CTranslate2: " + ", ".join(unsupported))


def transformer_spec(model, spm_bytes, num_positions=1024, settings=None):
    """A `ctranslate2.specs.TransformerSpec` holding `model`'s weights and vocabulary.

    Args:
        model: a trained `keras_transformer.models.Transformer` (shared, tied embeddings, ReLU).
        spm_bytes: the SentencePiece model (its pieces, in id order, are the vocabulary).
        num_positions: rows of the position table (the longest source or output it serves).
        settings: the `DecodingSettings` (None: the defaults) whose `pad_id` and `bos_id` must
            never be generated (as in our search).

    Returns:
        The spec, validated, not yet optimized (quantized) or saved.

    Example:
    ```python
    spec = transformer_spec(model, spm_bytes)
    spec.optimize(quantization="int8")
    spec.save("ct2_model")
    ```
    """
    require_ctranslate2()
    from ctranslate2.specs import common_spec
    from ctranslate2.specs import transformer_spec as ct2_transformer

    _check_supported(model)
    encoder_blocks, decoder_blocks = model.encoder.blocks, model.decoder.blocks
    spec = ct2_transformer.TransformerSpec.from_config(
        (len(encoder_blocks), len(decoder_blocks)),
        model.num_heads,
        pre_norm=model.norm_first,
        activation=common_spec.Activation.RELU,
    )
    # One array for the three uses: CTranslate2 then stores it once.
    embeddings = _array(model.target_embedding.embeddings)
    spec.encoder.embeddings[0].weight = embeddings
    spec.decoder.embeddings.weight = embeddings
    spec.decoder.projection.weight = embeddings
    bias = np.zeros(embeddings.shape[0], np.float32)
    settings = DecodingSettings() if settings is None else settings
    bias[[settings.pad_id, settings.bos_id]] = BANNED_LOGIT_BIAS
    spec.decoder.projection.bias = bias
    spec.encoder.scale_embeddings = True
    spec.decoder.scale_embeddings = True
    table = np.asarray(positional_encoding(np.arange(num_positions), model.d_model), np.float32)
    spec.encoder.position_encodings.encodings = table
    spec.decoder.position_encodings.encodings = table
    for block, layer in zip(encoder_blocks, spec.encoder.layer):
        _attention(layer.self_attention, block.self_attention, block.self_attention_norm, True)
        _feed_forward(layer.ffn, block)
    for block, layer in zip(decoder_blocks, spec.decoder.layer):
        _attention(layer.self_attention, block.self_attention, block.self_attention_norm, True)
        _attention(layer.attention, block.cross_attention, block.cross_attention_norm, False)
        _feed_forward(layer.ffn, block)
    if model.norm_first:  # pre-norm stacks end with a LayerNorm
        _norm(spec.encoder.layer_norm, model.encoder.final_norm)
        _norm(spec.decoder.layer_norm, model.decoder.final_norm)
    vocabulary = _vocabulary(spm_bytes)
    if len(vocabulary) != embeddings.shape[0]:
        raise UsageError(
            f"the SentencePiece model has {len(vocabulary)} pieces but the model's vocabulary "
            f"is {embeddings.shape[0]}"
        )
    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    spec.config.layer_norm_epsilon = float(model.layer_norm_epsilon)
    spec.config.add_source_eos = True  # as in training: source = pieces + EOS
    spec.validate()
    return spec


def export_ctranslate2(
    model, tokenizer, output_dir, quantization=None, data_config=None, settings=None,
    shortlist=None,
):  # fmt: skip
    """Converts `model` into a CTranslate2 model directory with its SentencePiece model.

    The directory holds CTranslate2's `model.bin`, `config.json` and vocabularies, plus
    `spm.model` (to tokenize) and `keras_transformer.json` (the source length the model was
    trained with, the quantization). It is written elsewhere and renamed into place; an existing
    non-empty `output_dir` is never overwritten.

    Args:
        model: a trained `Transformer` (TensorFlow or JAX backend).
        tokenizer: SentencePiece model bytes, or an object with `.model_proto` / `.model_path`.
        output_dir: the directory to create.
        quantization: CTranslate2 weight type (`int8`, `int8_float32`, `float16`, ...); None
            keeps float32 (CTranslate2 can still quantize when loading, `compute_type=`).
        data_config: `DataConfig` (or dict) for `max_source_length` / `max_target_length`.
        settings: the `DecodingSettings` (`config.decoding_settings(config, export=True)`; None:
            the defaults): the special ids, and the beam size, length penalty and extra length
            recorded in `keras_transformer.json` for CTranslate2's `translate_batch`.
        shortlist: a vocabulary shortlist's lexical table (`keras_transformer.data.shortlist.
            LexicalTable`, a row per piece of the model's vocabulary): written as CTranslate2's
            `vmap.txt` (`vocabulary_map`), used with `translate_batch(..., use_vmap=True)`.

    Returns:
        `output_dir`.

    Example:
    ```python
    export_ctranslate2(model, spm_bytes, "saved_models/quickstart-ctranslate2", "int8")
    translator = ctranslate2.Translator("saved_models/quickstart-ctranslate2")
    ```
    """
    from keras_transformer.export.translator import _model_proto

    spm_bytes = _model_proto(tokenizer)
    import tensorflow as tf

    gfile = tf.io.gfile
    if gfile.isdir(output_dir) and gfile.listdir(output_dir):
        raise UsageError(f"{output_dir} already exists and is not empty: choose another --output")
    files = {}  # more text files of the directory
    if shortlist is not None:
        if shortlist.vocab_size != model.vocab_size:
            raise UsageError(
                f"the shortlist table has {shortlist.vocab_size} source rows, the model's "
                f"vocabulary {model.vocab_size} pieces: build it again (keras-transformer "
                "shortlist)"
            )
        files[VMAP_FILE] = vocabulary_map(shortlist, _vocabulary(spm_bytes))
    max_source = int(_get(data_config, "max_source_length", 128))
    max_target = int(_get(data_config, "max_target_length", 128))
    # Room for any source and any output CTranslate2 is asked for by default (256 tokens).
    settings = DecodingSettings() if settings is None else settings
    spec = transformer_spec(model, spm_bytes, max(1024, max_source, max_target), settings)
    spec.optimize(quantization=quantization)
    metadata = {
        "format": "ctranslate2",
        "quantization": quantization or "float32",
        "max_source_length": max_source,
        "max_target_length": max_target,
        "norm_first": model.norm_first,
        "source": "pieces of spm.model truncated to max_source_length - 1; EOS is added",
        "decoding": {
            "beam_size": settings.beam_size,
            "alpha": settings.alpha,
            "max_extra_length": settings.max_extra_length,
        },
    }
    if shortlist is not None:
        metadata["vmap"] = {"file": VMAP_FILE, "shortlist": dict(shortlist.settings)}
    if not is_local(output_dir):
        # No atomic directory rename there: written locally, copied with model.bin last.
        with local_directory() as local:
            _write_ct2(spec, spm_bytes, local, metadata, files)
            stopping.check(PHASE)
            copy_tree(local, output_dir, last="model.bin")
        return output_dir
    tmp_dir = staging_directory(os.path.dirname(os.path.abspath(output_dir)), ".ct2-")
    try:
        _write_ct2(spec, spm_bytes, tmp_dir, metadata, files)
        stopping.check(PHASE)  # the last moment: the directory does not appear
        if os.path.isdir(output_dir):
            os.rmdir(output_dir)  # empty: checked above
        os.rename(tmp_dir, output_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return output_dir


def _write_ct2(spec, spm_bytes, directory, metadata, texts=None):
    """The CTranslate2 model's files in the local `directory` (and `texts`, `{name: str}`)."""
    spec.save(directory)
    for name, text in (texts or {}).items():
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            f.write(text)
    with open(os.path.join(directory, SPM_FILE), "wb") as f:
        f.write(spm_bytes)
    with open(os.path.join(directory, METADATA_FILE), "w", encoding="utf-8") as f:
        json.dump(metadata, f, indent=2)


def _get(config, key, default):
    if config is None:
        return default
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)
