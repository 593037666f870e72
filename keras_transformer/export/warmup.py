"""`assets.extra/tf_serving_warmup_requests`: TF Serving replays these requests at load time.

The file is a TFRecord of `tensorflow.serving.PredictionLog` protos (the `tensorflow-serving-api`
package), one `PredictRequest` per signature and source-length bucket, so that a fresh server has
run every signature at every padded length before its first real request.
"""

import os

import tensorflow as tf

WARMUP_FILE = "tf_serving_warmup_requests"


def bucket_lengths(max_source_length):
    """The serving source-length buckets (tokens, EOS included), up to the max length: what the
    XLA export pads a chunk's sources to (`Translator.length_buckets`), and so the lengths the
    warmup requests run. The training data's `bucket_boundaries` do not enter: they shape
    training batches, not requests."""
    from keras_transformer.data.pipeline import bucket_boundaries

    lengths = bucket_boundaries(max_source_length)
    lengths = sorted({int(b) for b in lengths if 0 < int(b) < max_source_length})
    return lengths + [int(max_source_length)]


def sentence_of_length(spm_proto, length):
    """A text that SentencePiece cuts into `length - 1` pieces (plus EOS: `length` tokens),
    made of the vocabulary's own word pieces (fewer if the vocabulary cannot make them)."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=spm_proto)
    words = [
        processor.id_to_piece(i).lstrip("\u2581")
        for i in range(processor.get_piece_size())
        if not processor.is_control(i) and not processor.is_unknown(i)
    ]
    words = [w for w in words if w.isalpha()] or ["a"]
    text = " ".join(words[i % len(words)] for i in range(max(0, length - 1)))
    return processor.decode(processor.encode(text)[: max(0, length - 1)])


def warmup_requests(signatures, texts):
    """PredictionLog protos: each signature called with each text (one sentence a request).

    Args:
        signatures: `{signature key: [input names]}`; inputs named `prefix` get the text's first
            word, `seed` (int64) the seed 0, `glossary_*` (`[1, 1]`) the first word as the one
            term of a glossary, `constraints` (`[1, 1]`) its last word, `markup` "html", the
            others the text itself.
        texts: the sentences, one per length bucket.
    """
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    logs = []
    for key, inputs in signatures.items():
        for text in texts:
            request = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(signature_name=key))
            for name in inputs:
                value = text.split(" ")[0] if name == "prefix" else text
                proto = tf.make_tensor_proto([value.encode("utf-8")])
                if name == "seed":
                    proto = tf.make_tensor_proto([0], dtype=tf.int64)
                if name.startswith("glossary_"):  # [batch, terms]: the first word as a term
                    word = text.split(" ")[0].encode("utf-8")
                    proto = tf.make_tensor_proto([[word]])
                if name == "constraints":  # [batch, terms]: the last word as a term
                    proto = tf.make_tensor_proto([[text.split(" ")[-1].encode("utf-8")]])
                if name == "markup":
                    proto = tf.make_tensor_proto([b"html"])
                request.inputs[name].CopyFrom(proto)
            logs.append(
                prediction_log_pb2.PredictionLog(
                    predict_log=prediction_log_pb2.PredictLog(request=request)
                )
            )
    return logs


def write_warmup(export_dir, logs):
    """Writes the records to `export_dir/assets.extra/tf_serving_warmup_requests`."""
    extra = os.path.join(export_dir, "assets.extra")
    tf.io.gfile.makedirs(extra)
    path = os.path.join(extra, WARMUP_FILE)
    with tf.io.TFRecordWriter(path) as writer:
        for log in logs:
            writer.write(log.SerializeToString())
    return path
