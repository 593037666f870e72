"""Lexical tables of a vocabulary shortlist built by hand, for the shortlist tests of every
road (the graph search, the LiteRT runtime, the CTranslate2 vmap)."""

import numpy as np

from keras_transformer.lexical_table import LexicalTable


def table(translations, frequent=()):
    """A `LexicalTable` of these rows and frequent pieces."""
    return LexicalTable(np.asarray(translations, np.int32), np.asarray(frequent, np.int32))


def full_table(vocab):
    """Every piece in every shortlist."""
    return table(np.zeros((vocab, 1)), np.arange(vocab))


def identity_table(vocab, without=()):
    """Each source piece translates into itself (the copy task), except the pieces `without`."""
    rows = np.arange(vocab)[:, None].copy()
    rows[list(without)] = 0
    return table(rows)
