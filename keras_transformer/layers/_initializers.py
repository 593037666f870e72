"""Initializer helpers shared by the layers."""

import keras


def clone_initializer(initializer):
    """A fresh copy of `initializer` (an identifier or an instance), so that every sub-layer draws
    its own values: one seeded initializer object reused by several weights would give them all
    the same values."""
    initializer = keras.initializers.get(initializer)
    return initializer.__class__.from_config(initializer.get_config())
