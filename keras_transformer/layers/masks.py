"""Boolean attention masks (True = may attend)."""

from keras import ops

from keras_transformer.special_ids import PAD_ID


def padding_mask(ids, pad_id=PAD_ID):
    """`[batch, length]`: True at real tokens, False at padding."""
    return ops.not_equal(ids, pad_id)


def key_padding_mask(key_mask):
    """`[batch, 1, k_len]` attention mask from a `[batch, k_len]` token mask (None stays None).

    It broadcasts over queries: every query may attend every real key. Padded queries thus keep
    finite (ignored) outputs.
    """
    if key_mask is None:
        return None
    return ops.expand_dims(ops.cast(key_mask, "bool"), 1)


def causal_mask(length):
    """`[length, length]` lower-triangular: position i sees positions <= i."""
    rows = ops.expand_dims(ops.arange(length), 1)
    cols = ops.expand_dims(ops.arange(length), 0)
    return ops.greater_equal(rows, cols)
