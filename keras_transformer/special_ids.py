"""The special token ids every SentencePiece model of ours is trained with, which the masks,
the data pipeline and the searches rely on. Imports nothing: the layers, the config and the
LiteRT runtime (without TensorFlow or Keras) read them here."""

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
