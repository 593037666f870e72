"""TensorBoard visuals: attention heatmap images, sample translations, the config in HParams."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.plugins.hparams import plugin_data_pb2
from training_helpers import tiny_config

from keras_transformer.config import from_dict
from keras_transformer.training import train
from keras_transformer.training.run.visuals import (
    attention_figure,
    figure_to_png,
    flatten_config,
)


def _events(logdir):
    """`[(run, step, value)]` of every summary value in the event files under `logdir`."""
    found = []
    for path in sorted(
        glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True)
    ):
        run = os.path.relpath(os.path.dirname(path), logdir)
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                found.append((run, event.step, value))
    return found


def _tiny_run_config(workdir):
    # Two epochs of 4 steps: evaluations at steps 4 and 8.
    return tiny_config(workdir, train=dict(steps=8, steps_per_epoch=4))


@pytest.fixture(scope="module")
def tiny_run(_shared_root):
    """A tiny run's config and its TensorBoard events, trained once per test run (the
    module's tests may run on both workers; they only read it)."""
    from shared_runs import shared_directory

    workdir = shared_directory(_shared_root, "tensorboard_visuals_run",
                               lambda directory: train(_tiny_run_config(directory)))  # fmt: skip
    return _tiny_run_config(workdir), _events(os.path.join(workdir, "logs"))


@pytest.mark.scenario
def test_attention_images_at_each_evaluation(tiny_run):
    config, events = tiny_run
    images = [(run, step, v) for run, step, v in events if v.tag.startswith("attention/")]
    tags = {v.tag for _, _, v in images}
    assert tags == {"attention/encoder_self_attention", "attention/decoder_cross_attention"}
    for tag in tags:
        steps = sorted(step for run, step, v in images if v.tag == tag)
        assert steps == [4, 8], (tag, steps)
    for run, step, value in images:
        assert run == "dev"
        assert value.metadata.plugin_data.plugin_name == "images"
        # tf.summary.image stores [width, height, png, png, ...]: one PNG per layer.
        blobs = tf.make_ndarray(value.tensor)
        width, height = int(blobs[0]), int(blobs[1])
        pngs = blobs[2:]
        assert len(pngs) == config.model.num_layers
        image = tf.io.decode_png(pngs[0]).numpy()
        assert image.shape[:2] == (height, width)
        assert image.shape[0] > 100 and image.shape[1] > 100
        assert image[..., :3].std() > 10  # a picture, not a blank canvas
        # The description names the fixed dev sentence.
        assert "translated as" in value.metadata.summary_description


@pytest.mark.scenario
def test_sample_translations_as_text(tiny_run):
    config, events = tiny_run
    texts = [(run, step, v) for run, step, v in events if v.tag == "sample_translations"]
    assert texts and all(run == "dev" for run, _, _ in texts)
    samples = [s.decode() for s in tf.make_ndarray(texts[0][2].tensor).ravel()]
    assert len(samples) == config.train.num_sample_translations
    assert all("**source:**" in s and "**model:**" in s for s in samples)


@pytest.mark.scenario
def test_resolved_config_in_hparams(tiny_run):
    config, events = tiny_run
    hparams = [(run, v) for run, _, v in events if v.metadata.plugin_data.plugin_name == "hparams"]
    assert hparams and all(run == "." for run, _ in hparams)
    sessions, experiments = [], []
    for _, value in hparams:
        data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
        if data.HasField("session_start_info"):
            sessions.append(data.session_start_info)
        if data.HasField("experiment"):
            experiments.append(data.experiment)
    assert len(sessions) == 1 and len(experiments) == 1
    logged = {}
    for key, v in sessions[0].hparams.items():
        kind = v.WhichOneof("kind")
        logged[key] = getattr(v, kind)
    expected = flatten_config(config)
    assert set(logged) == set(expected)
    for key, value in expected.items():
        if isinstance(value, bool):
            assert logged[key] is value, key
        elif isinstance(value, (int, float)):
            assert logged[key] == pytest.approx(value), key
        else:
            assert logged[key] == value, key
    # The dashboard's metric columns point at scalars that the run really wrote.
    metric_tags = {(m.name.group, m.name.tag) for m in experiments[0].metric_infos}
    written = {(run, v.tag) for run, _, v in events}
    for group, tag in [("dev", "dev_bleu"), ("dev", "final_dev_bleu"), ("train", "loss")]:
        assert (group, tag) in metric_tags and (group, tag) in written, (group, tag)


def test_flatten_config_round_trips_through_the_schema():
    config = from_dict({"data": {"bucket_boundaries": [8, 16]}, "model": {"d_model": 64}})
    flat = flatten_config(config)
    assert flat["model.d_model"] == 64
    assert flat["data.bucket_boundaries"] == "[8, 16]"
    assert flat["data.dev"] == "null"
    assert flat["runtime.jit_compile"] == "auto"
    assert flat["name"] == "experiment"
    assert all(isinstance(v, (bool, int, float, str)) for v in flat.values())
    # Every config key appears once.
    sections = config.to_dict()
    count = sum(len(v) if isinstance(v, dict) else 1 for v in sections.values())
    assert len(flat) == count


def test_attention_figure_has_one_labelled_heatmap_per_head():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 4, 5))
    weights = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    keys = ["▁a", "▁b", "c", "▁d", "</s>"]
    queries = ["▁w", "▁x", "▁y", "</s>"]
    figure = attention_figure(weights, keys, queries, title="t", columns=2)
    heatmaps = [ax for ax in figure.axes if ax.images]
    assert len(heatmaps) == 3
    for head, ax in enumerate(heatmaps):
        assert [t.get_text() for t in ax.get_xticklabels()] == keys
        assert [t.get_text() for t in ax.get_yticklabels()] == queries
        np.testing.assert_allclose(ax.images[0].get_array(), weights[head], rtol=1e-6)
    png = figure_to_png(figure)
    assert png.startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="labels"):
        attention_figure(weights, keys[:-1], queries)
