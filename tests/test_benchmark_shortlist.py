"""`benchmarks/serve_compare.py --shortlist`'s own parts: its random lexical table and the
ratios of the shortlist rows (the figures are only as good as they are)."""

import numpy as np
import pytest

from benchmarks import serve_compare as sc


def test_synthetic_table_is_a_table_of_the_word_vocabulary():
    table = sc.synthetic_table(600, 20, 30)
    assert table.translations.shape == (600, 20) and table.vocab_size == 600
    rows = table.translations[4:]
    assert rows.min() >= 4 and not (rows == 3).any()  # no special id, EOS comes in anyway
    assert all(len(set(row)) == 20 for row in rows.tolist())  # no repeats in a row
    assert not table.translations[:4].any()
    assert table.frequent.tolist() == list(range(4, 34))
    np.testing.assert_array_equal(sc.synthetic_table(600, 20, 30).translations, table.translations)


def test_a_larger_zipf_exponent_narrows_the_batchs_shortlist():
    cfg = dict(vocab=2000, src=8)
    spm_bytes = sc.word_vocabulary(cfg["vocab"])
    widths = [sc.shortlist_width(sc.synthetic_table(2000, 20, 50, zipf), spm_bytes, cfg)
              for zipf in (0.8, 1.1, 1.5)]  # fmt: skip
    assert widths[0] > widths[1] > widths[2] > 50 + 4


def test_shortlist_ratios():
    figures = {
        "ours_saved_model_signature": (100.0, 1.0),
        "ours_saved_model_shortlist": (150.0, 1.0),
        "ctranslate2_float32": (120.0, 1.0),
        "ctranslate2_int8": (200.0, 1.0),
        "ctranslate2_int8_vmap": (250.0, 1.0),
        "ours_litert_dynamic_int8": (240.0, 1.0),
        "ours_litert_dynamic_int8_shortlist": (300.0, 1.0),
    }
    ratios = sc.shortlist_ratios(figures, ("dynamic_int8",))
    assert ratios == pytest.approx({
        "ours_shortlist_over_ct2_float32": 1.25,
        "ours_shortlist_over_ct2_int8": 0.75,
        "ours_shortlist_over_ours": 1.5,
        "ct2_int8_vmap_over_ct2_int8": 1.25,
        "ours_litert_int8_shortlist_over_ct2_int8_vmap": 1.2,
        "ours_litert_int8_shortlist_over_ours_litert_int8": 1.25,
    })  # fmt: skip


def test_bfloat16_ratios():
    figures = {
        "ours_saved_model_signature": (100.0, 1.0),
        "ours_saved_model_shortlist": (150.0, 1.0),
        "ours_saved_model_bfloat16": (140.0, 1.0),
        "ours_saved_model_shortlist_bfloat16": (210.0, 1.0),
        "ctranslate2_float32": (120.0, 1.0),
        "ctranslate2_int8": (200.0, 1.0),
    }
    assert sc.bfloat16_ratios(figures) == pytest.approx({
        "ours_bfloat16_over_ct2_float32": 140 / 120,
        "ours_bfloat16_over_ct2_int8": 0.7,
        "ours_bfloat16_over_float32": 1.4,
        "ours_shortlist_bfloat16_over_ct2_float32": 1.75,
        "ours_shortlist_bfloat16_over_ct2_int8": 1.05,
        "ours_shortlist_bfloat16_over_float32": 1.4,
    }, abs=1e-3)  # fmt: skip
    del figures["ours_saved_model_shortlist_bfloat16"]  # --bfloat16 without --shortlist
    assert set(sc.bfloat16_ratios(figures)) == {
        "ours_bfloat16_over_ct2_float32", "ours_bfloat16_over_ct2_int8",
        "ours_bfloat16_over_float32",
    }  # fmt: skip
