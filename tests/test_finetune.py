"""Fine-tuning (`train --init-from PATH`, `train.init_from`): a new workdir that starts from a
trained model's weights and vocabulary, refuses another shape or vocabulary, and resumes from
its own backups."""

import json
import os

import numpy as np
import pytest
from training_helpers import tiny_config, write_yaml

from keras_transformer import cli
from keras_transformer.data import Tokenizer, read_pairs
from keras_transformer.models import build_transformer
from keras_transformer.training import train
from keras_transformer.training.engines import strategies
from keras_transformer.workdir import Workdir, load_model_weights

# Short sentences and a word-level vocabulary: the tiny model learns them in a few hundred steps.
MODEL = dict(d_model=64, d_ff=128, num_heads=2)
CORPUS = "synthetic:split={split},size={size},min_words=3,max_words=5"


def _config(root, name, **train_keys):
    data = dict(
        vocab_size=1000, tokens_per_batch=1024, train=CORPUS.format(split="train", size=3000)
    )
    data.update(train_keys.pop("data", {}))
    steps = train_keys.pop("steps", 200)
    keys = dict(
        steps=steps, steps_per_epoch=steps, checkpoint_every=steps, warmup_steps=40,
        learning_rate_scale=0.5, log_every=50, eval_max_sentences=50,
    )  # fmt: skip
    keys.update(train_keys)
    return tiny_config(
        os.path.join(root, name), model=MODEL, data=data, train=keys,
        export=dict(base_dir=os.path.join(root, "saved_models"), average_checkpoints=1),
    )  # fmt: skip


@pytest.fixture(scope="module")
def parent(_shared_root):
    """A tiny model trained 200 steps on the built-in corpus: its workdir (trained once per run,
    shared by the workers; the tests only read it)."""
    from shared_runs import shared_directory

    root = _shared_root / "finetune_parent"
    shared_directory(_shared_root, "finetune_parent", lambda _: train(_config(str(root), "parent")),
                     provides=_config(str(root), "parent"))  # fmt: skip
    return _config(str(root), "parent")


def _weights_of_checkpoint(config, path):
    vocab_size = Tokenizer(Workdir.of(config).spm).vocab_size
    model = build_transformer(config.model, vocab_size)
    load_model_weights(model, path)
    return [np.asarray(w) for w in model.get_weights()]


@pytest.mark.scenario
def test_refuses_another_shape_or_vocabulary_with_one_line(parent, tmp_path, capsys):
    values = _config(str(tmp_path), "child").to_dict()
    config_file = write_yaml(tmp_path / "child.yaml", values)
    base = ["train", "--config", config_file, "--workdir", str(tmp_path / "child")]
    base += ["--init-from", parent.runtime.workdir]
    for override, expected in (
        ("model.d_model=128", "model.d_model: 64 in the parent"),
        ("model.num_layers=2", "model.num_layers: 1 in the parent"),
        ("data.vocab_size=500", "data.vocab_size: 1000 in the parent"),
    ):
        capsys.readouterr()
        assert cli.main([*base, "--set", override]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("keras-transformer train: error: "), err
        assert expected in err and "here" in err, err
    missing = ["--init-from", str(tmp_path / "nowhere")]
    assert cli.main([*base[:-2], *missing]) == 2
    assert "neither a training workdir nor a step checkpoint" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "child" / "checkpoints")


class _Stop(Exception):
    pass


def _weights_at_start(monkeypatch, config):
    """The model's weights once `fit`'s resume state is restored, before any update."""
    captured = []

    class Capturing(strategies.ResumeState):
        def restore(self):
            position = super().restore()
            captured.append([np.asarray(w) for w in self.model.get_weights()])
            raise _Stop(position)

    monkeypatch.setattr(strategies, "ResumeState", Capturing)  # the input object makes it
    with pytest.raises(_Stop):
        train(config)
    monkeypatch.undo()
    return captured[0]


@pytest.mark.scenario
def test_step_0_is_the_parent_and_a_resume_uses_its_own_backups(parent, tmp_path, monkeypatch):
    parent_layout = Workdir.of(parent)
    step, checkpoint = parent_layout.list_checkpoints()[-1]
    expected = _weights_of_checkpoint(parent, checkpoint)
    # A step checkpoint file as the parent: the same weights, the parent's vocabulary.
    child = _config(str(tmp_path), "child", steps=4, checkpoint_every=2, init_from=checkpoint)
    start = _weights_at_start(monkeypatch, child)
    assert len(start) == len(expected)
    for mine, theirs in zip(start, expected):
        np.testing.assert_array_equal(mine, theirs)
    layout = Workdir.of(child)
    with open(layout.spm, "rb") as a, open(parent_layout.spm, "rb") as b:
        assert a.read() == b.read()
    with open(layout.prepared_manifest) as f:
        assert json.load(f)["vocabulary"]["trained"] is False  # prepare trained none

    result = train(child)
    assert result["init_from"] == {"path": checkpoint, "checkpoint": checkpoint, "step": step}
    extra = os.path.join(result["saved_model"], "assets.extra")
    with open(os.path.join(extra, "model_card.json")) as f:
        assert json.load(f)["training"]["init_from"]["step"] == step
    with open(os.path.join(extra, "model_card.md")) as f:
        assert f"Fine-tuned from `{checkpoint}` (step {step})" in f.read()
    # Run again for more steps: it resumes from its own backup of step 4, not from the parent.
    longer = _config(str(tmp_path), "child", steps=8, checkpoint_every=2, init_from=checkpoint)
    resumed = _weights_at_start(monkeypatch, longer)
    own = _weights_of_checkpoint(child, layout.checkpoint(4))
    for mine, theirs in zip(resumed, own):
        np.testing.assert_array_equal(mine, theirs)
    assert any(not np.array_equal(mine, theirs) for mine, theirs in zip(resumed, expected))


def _shifted(pairs, directory, name):
    """The pairs with their target words in reverse order (another word-order rule), as files."""
    source, target = os.path.join(directory, f"{name}.src"), os.path.join(directory, f"{name}.tgt")
    with open(source, "w") as s, open(target, "w") as t:
        for src, tgt in pairs:
            s.write(src + "\n")
            t.write(" ".join(tgt.split()[::-1]) + "\n")
    return f"text:{source},{target}"


@pytest.mark.scenario(
    slow="the parent decodes the shifted dev set, then a 150-step child trains on 3,000 pairs and "
    "chooses on dev: the learning has to show in BLEU"
)
def test_fine_tuning_raises_the_dev_bleu_of_a_shifted_corpus(parent, tmp_path):
    from keras_transformer.config import decoding_settings
    from keras_transformer.evaluation import evaluate_bleu

    train_pairs = read_pairs(CORPUS.format(split="train", size=3000), verbose=False)
    dev_pairs = read_pairs(CORPUS.format(split="dev", size=50), verbose=False)
    train_spec = _shifted(train_pairs, tmp_path, "train")
    dev_spec = _shifted(dev_pairs, tmp_path, "dev")
    # The parent on the shifted dev set: its words, in the wrong order.
    tokenizer = Tokenizer(Workdir.of(parent).spm)
    model = build_transformer(parent.model, tokenizer.vocab_size)
    model.set_weights(_weights_of_checkpoint(parent, Workdir.of(parent).list_checkpoints()[-1][1]))
    shifted_dev = read_pairs(dev_spec, verbose=False)
    before, _ = evaluate_bleu(model, tokenizer, shifted_dev, parent.data, decoding_settings(parent))

    child = _config(
        str(tmp_path), "child", steps=150, init_from=parent.runtime.workdir,
        data=dict(train=train_spec, dev=dev_spec),
    )  # fmt: skip
    after = train(child)["dev"]
    assert after["bleu"] > before["bleu"] + 20, (before, after)
