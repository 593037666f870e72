"""The LiteRT (TFLite) export's runtime: translation with LiteRT, SentencePiece and numpy, without
TensorFlow or Keras (issue #51). `search` holds the greedy and beam search in numpy."""
