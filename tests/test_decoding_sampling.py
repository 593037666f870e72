"""Sampling decoding: top-k, top-p and temperature against a reference distribution, seeded runs
that repeat, k = 1 equal to greedy search, and the export's `translate_sample` signature."""

import json
import os

import _inference_fixtures as fx
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_transformer import cli
from keras_transformer.decoding import DecodingSettings, greedy_search, translate_ids
from keras_transformer.decoding.sampling import sampling_picker, uniform_noise

EOS = 3
# One step's next-token distribution (EOS, id 3, is unlikely so that rows differ).
PROBS = np.array([0.02, 0.03, 0.05, 0.001, 0.35, 0.25, 0.15, 0.1, 0.049])


def _first_tokens(topk, temperature, topp, rows=20000):
    """The first token of `rows` sampled outputs of a fixed distribution (one seed per row)."""
    log_probs = np.log(PROBS / PROBS.sum()).astype("float32")

    def step_fn(ids, index, state):
        return ops.tile(log_probs[None], (ops.shape(ids)[0], 1)), state

    pick = sampling_picker(topk, temperature, topp, seeds=np.arange(rows, dtype="int32"))
    initial = np.full((rows,), 2, "int32")
    ids, _, _ = greedy_search(step_fn, initial, initial, max_length=2, eos_id=EOS, pick=pick)
    return np.asarray(ids)[:, 0]


def _expected(topk, temperature, topp):
    """The reference: p^(1/T) renormalised over the k most likely, then over their nucleus."""
    p = PROBS ** (1.0 / temperature)
    p = p / p.sum()
    order = np.argsort(-p)[:topk]
    top = p[order] / p[order].sum()
    kept = order[(np.cumsum(top) - top) < topp]
    expected = np.zeros_like(p)
    expected[kept] = p[kept] / p[kept].sum()
    return expected


@pytest.mark.parametrize(
    "topk, temperature, topp",
    [(9, 1.0, 1.0), (3, 1.0, 1.0), (9, 0.5, 1.0), (9, 2.0, 1.0), (9, 1.0, 0.7), (4, 1.5, 0.8)],
)
def test_samples_follow_the_reference_distribution(topk, temperature, topp):
    tokens = _first_tokens(topk, temperature, topp)
    frequencies = np.bincount(tokens, minlength=len(PROBS)) / len(tokens)
    expected = _expected(topk, temperature, topp)
    assert np.all(frequencies[expected == 0] == 0)  # outside the top k / the nucleus: never
    # 20000 draws: a standard error below 0.0035 for any probability.
    np.testing.assert_allclose(frequencies, expected, atol=0.015)


def _lowbias32(x):
    """The hash in unsigned 32-bit numpy arithmetic (the reference of the int32 ops version)."""
    x = x.astype(np.uint32)
    x ^= x >> 16
    x *= np.uint32(0x7FEB352D)
    x ^= x >> 15
    x *= np.uint32(0x846CA68B)
    return x ^ (x >> 16)


def test_noise_is_the_reference_hash():
    seeds = (np.arange(8) * 977 - 5).astype(np.int32)  # negative seeds too
    step = _lowbias32(_lowbias32(seeds.view(np.uint32)) ^ np.uint32(3))
    bits = _lowbias32(step[:, None] ^ np.arange(50, dtype=np.uint32)[None])
    expected = ((bits >> 8).astype(np.float32) + 0.5) / 2**24
    np.testing.assert_array_equal(uniform_noise(seeds, 3, 50), expected)


def test_noise_is_uniform_and_depends_on_seed_step_and_token():
    u = np.asarray(uniform_noise(np.arange(64, dtype="int32"), 5, 1000))  # [64, 1000]
    assert 0 < u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    other_step = np.asarray(uniform_noise(np.arange(64, dtype="int32"), 6, 1000))
    assert np.mean(u == other_step) < 0.01 and np.mean(u[0] == u[1]) < 0.01
    np.testing.assert_array_equal(u, uniform_noise(np.arange(64, dtype="int32"), 5, 1000))


@pytest.fixture(scope="module")
def source_ids():
    texts = ["red apple cat", "dog dog fish bird", "blue", "plum pear white black green", ""]
    return fx.encode_sources(texts)


def test_topk_1_is_greedy_search(model, source_ids):
    greedy_ids, greedy_scores, _ = translate_ids(model, source_ids, beam_size=1, max_extra_length=6)
    for seed, temperature in ((0, 1.0), (123, 3.0), (7, 0.3)):
        settings = DecodingSettings(
            beam_size=4, max_extra_length=6, sampling_topk=1, sampling_temperature=temperature
        )
        ids, scores, _ = translate_ids(model, source_ids, settings, seed=seed)
        np.testing.assert_array_equal(ids, greedy_ids)
        np.testing.assert_allclose(scores, greedy_scores, rtol=1e-5)


@pytest.mark.scenario
def test_seeded_sampling_repeats_and_seeds_differ(model, source_ids):
    settings = DecodingSettings(max_extra_length=6, sampling_topk=50, sampling_temperature=3.0)
    decode = tf.function(lambda s, seed: translate_ids(model, s, settings, seed=seed))
    seeds = tf.constant([5, 6, 7, 8, 9])
    first, scores, _ = decode(source_ids, seeds)
    again, again_scores, _ = decode(source_ids, seeds)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(scores, again_scores)
    eager = translate_ids(model, source_ids, settings, seed=5).ids  # int: row i gets 5 + i
    np.testing.assert_array_equal(eager, first)
    # A row's sample depends on its own seed only, not on the rest of the batch.
    alone = translate_ids(model, source_ids[2:3], settings, seed=tf.constant([7])).ids
    np.testing.assert_array_equal(alone[0], np.asarray(first)[2, : alone.shape[1]])
    outputs = {tuple(np.asarray(translate_ids(model, source_ids, settings, seed=s)[0])[0])
               for s in range(0, 40, 5)}  # fmt: skip
    assert len(outputs) > 1  # hot sampling: the seed matters


def test_sampling_settings_are_checked():
    with pytest.raises(ValueError):
        DecodingSettings(sampling_topk=-1)
    with pytest.raises(ValueError):
        DecodingSettings(sampling_topk=5, sampling_topp=0.0)
    with pytest.raises(ValueError):
        DecodingSettings(sampling_temperature=0.0)


# --------------------------------------------------------------------------- the export


@pytest.fixture(scope="module")
def sampling_export(model, toy_spm_bytes, _shared_root):
    """The copy model exported with sampling: once per run (shared by the workers)."""
    from shared_runs import shared_directory

    from keras_transformer.export import ExportPlan, export_saved_model

    settings = DecodingSettings(**fx.EXPORT_DECODE, sampling_topk=8, sampling_temperature=2.0)

    def export(base):
        plan = ExportPlan(settings=settings, data=fx.EXPORT_DATA)
        export_saved_model(model, toy_spm_bytes, plan, str(base / "saved_models"), "toy")

    base = shared_directory(_shared_root, "sampling_export", export)
    return str(base / "saved_models" / "toy" / "1")


@pytest.mark.scenario
def test_export_adds_translate_sample(sampling_export):
    import tensorflow_text  # noqa: F401

    loaded = tf.saved_model.load(sampling_export)
    sample = loaded.signatures["translate_sample"]
    texts = tf.constant(["red apple cat", "blue", "dog dog fish bird", ""] * 4)
    seeds = tf.range(16, dtype=tf.int64) * 1000003
    first = sample(text=texts, seed=seeds)
    again = sample(text=texts[::-1], seed=seeds[::-1])  # other order, other chunks
    np.testing.assert_array_equal(first["translation"], again["translation"][::-1])
    assert len(set(first["translation"].numpy().tolist())) > 4  # the seed matters
    beam = loaded.signatures["serving_default"](text=texts[:4])["translation"].numpy()
    assert [t.decode() for t in beam] == ["red apple cat", "blue", "dog dog fish bird", ""]
    with open(os.path.join(sampling_export, "assets.extra", "keras_transformer.json")) as f:
        metadata = json.load(f)
    assert metadata["sampling_topk"] == 8 and "translate_sample" in metadata["signatures"]
    with pytest.raises(tf.errors.InvalidArgumentError):
        sample(text=texts, seed=seeds[:3])


@pytest.mark.scenario
def test_cli_translate_samples_with_a_seed(sampling_export, capsys):
    args = ["translate", "--model", sampling_export, "--seed", "11", "red apple cat", "blue"]
    assert cli.main(args) == 0
    first = capsys.readouterr().out
    assert cli.main(args + ["--sampling-topk", "8", "--temperature", "2.0"]) == 0
    assert capsys.readouterr().out == first and len(first.splitlines()) == 2
    assert cli.main(args + ["--sampling-topk", "5"]) == 2
    assert "--sampling-topk 8" in capsys.readouterr().err
    assert cli.main(args + ["--n-best", "2"]) == 2
    capsys.readouterr()


@pytest.mark.scenario
def test_cli_file_mode_samples_each_line_as_text_mode_does(sampling_export, tmp_path, capsys):
    lines = ["red apple cat", "blue", "dog dog fish bird", "plum pear", "cat"]
    source = tmp_path / "mono.txt"
    source.write_text("\n".join(lines) + "\n")
    output = tmp_path / "out.txt"
    common = ["translate", "--model", sampling_export, "--seed", "4"]
    assert cli.main(common + ["--input", str(source), "--output", str(output)]) == 0
    capsys.readouterr()  # the summary line
    assert cli.main(common + ["--batch-size", "2", *lines]) == 0
    # Sorted and batched in the file, two at a time here: each line's sample is the same.
    assert output.read_text().splitlines() == capsys.readouterr().out.splitlines()


def test_cli_refuses_sampling_from_an_export_without_it(exported_copy_model, capsys):
    _, path = exported_copy_model
    assert cli.main(["translate", "--model", path, "--seed", "1", "blue"]) == 2
    assert "--sampling-topk" in capsys.readouterr().err


def test_export_flags_set_the_sampling_and_are_checked():
    import argparse

    from keras_transformer.commands.flags import export_settings
    from keras_transformer.config import from_dict
    from keras_transformer.errors import UsageError

    config = from_dict({"decode": {"sampling_topk": 5, "sampling_temperature": 0.5}})
    settings = export_settings(config, argparse.Namespace(sampling_topp=0.9))
    assert (settings.sampling_topk, settings.sampling_temperature, settings.sampling_topp) == (
        5, 0.5, 0.9,
    )  # fmt: skip
    assert export_settings(config, argparse.Namespace(sampling_topk=0)).sampling is False
    for flag, key, value in (("--sampling-topk", "sampling_topk", -1),
                             ("--temperature", "sampling_temperature", 0.0),
                             ("--top-p", "sampling_topp", 1.5)):  # fmt: skip
        with pytest.raises(UsageError, match=flag):
            export_settings(config, argparse.Namespace(**{key: value}))
