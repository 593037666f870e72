"""Hostile configs: every key of every config in configs/, mutated one at a time (wrong type,
negative, zero, huge, NaN, inf, null, empty string, a list, an unknown neighbour key), is either
refused by `keras-transformer train` in one line with exit 2 before TensorFlow loads, or loads
and then trains a step.

Every case runs through `cli.main` in this process, training replaced by a stub that records the
config (milliseconds each). The accepted mutations are few and the same whatever the config
(zeros where zero means off, nulls, 0 seeds, ...): they are gathered into a couple of groups,
each applied to a shrunken synthetic setup and trained for one step through the same command
line, so a value that loads but trains on nonsense (a NaN loss, a crash) fails here.
"""

import dataclasses
import glob
import json
import math
import os
import subprocess
import sys
import typing

import pytest
import yaml
from training_helpers import read_scalars, subprocess_env

from keras_transformer import cli
from keras_transformer.config import SECTIONS, ConfigError, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))

# A run of one optimizer step on a few hundred synthetic pairs (the accepted mutations go on it).
TINY = {
    "model": dict(num_layers=1, d_model=16, num_heads=2, d_ff=32, dropout=0.1),
    "data": dict(
        train="synthetic:split=train,size=200,max_words=6",
        dev="synthetic:split=dev,size=4,max_words=6",
        vocab_size=120,
        max_source_length=16,
        max_target_length=16,
        tokens_per_batch=256,
        bucket_boundaries=[8, 16],
    ),
    "train": dict(steps=1, warmup_steps=2, steps_per_epoch=1, checkpoint_every=1, log_every=1),
    "decode": dict(beam_size=2, batch_size=8, max_extra_length=4),
    "runtime": dict(jit_compile=False, mixed_precision=None),
}


def _keys():
    """`[(dotted key, type hint)]` of every key of the schema, the top-level `name` too."""
    keys = []
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        keys += [(f"{section}.{f.name}", hints[f.name]) for f in dataclasses.fields(cls)]
    return keys + [("name", str)]


def _mutations(key, hint):
    """`{kind: --set text}`: the hostile values of one key (YAML, as `--set` parses them)."""
    takes_strings = hint is str or str in typing.get_args(hint)
    return {
        "wrong type": "7" if takes_strings else "abc",
        "negative": "-1",
        "zero": "0",
        "huge": "9" * 20,
        "nan": ".nan",
        "inf": ".inf",
        "-inf": "-.inf",
        "null": "",
        "empty string": "''",
        "list": "[1, 2]",
        "mapping": "{a: 1}",
    }


def _cases():
    """Every (config, override) pair: each key's mutations, and an unknown neighbour key."""
    cases = []
    for path in CONFIGS:
        for key, hint in _keys():
            for text in _mutations(key, hint).values():
                cases.append((path, key, f"{key}={text}"))
            cases.append((path, key + "_x", f"{key}_x=1"))
    return cases


def _accepted(monkeypatch, capsys):
    """Runs every case through `keras-transformer train` in this process, training replaced by a
    stub that records the config: a refusal must be exit 2 and one line naming the key. Returns
    `{(key, override)}` of the accepted ones."""
    from keras_transformer import training
    from keras_transformer.commands import startup

    loaded = []
    monkeypatch.setattr(startup, "import_tensorflow", lambda verbose=False: None)
    monkeypatch.setattr(training, "train", loaded.append)
    accepted = set()
    for path, key, override in _cases():
        code = cli.main(["train", "--config", path, "--workdir", "unused", "--set", override])
        out, err = capsys.readouterr()
        if code == 0:
            assert len(loaded) == 1 and out == err == "", (override, out, err)
            accepted.add((key, override))
            loaded.clear()
            continue
        assert code == 2 and not loaded, (override, code, out, err)
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("keras-transformer train: error: "), err
        assert key in lines[0], (override, lines[0])
        assert out == ""
    return accepted


def _groups(accepted, tiny_path):
    """The accepted overrides that change the tiny run, spread over as few groups as possible
    (one value per key in a group)."""
    base = load_config(tiny_path).to_dict()
    groups = []
    for key, override in sorted(accepted):
        changed = load_config(tiny_path, overrides=[override]).to_dict()
        if changed == base:
            continue  # e.g. null where the tiny run has null: nothing new to train
        group = next((g for g in groups if key not in g), None)
        if group is None:
            groups.append(group := {})
        group[key] = override
    return groups


@pytest.mark.scenario(slow="every key of every shipped config: each accepted value trains a step")
def test_every_key_of_every_config_is_refused_in_one_line_or_trains(tmp_path, capsys, monkeypatch):
    assert len(CONFIGS) >= 4
    with monkeypatch.context() as patched:
        accepted = _accepted(patched, capsys)
    # Values that cannot work are refused: these loaded before each key had its range.
    for key, text in [
        ("model.d_ff", "0"), ("model.d_ff", "-1"), ("model.layer_norm_epsilon", "0"),
        ("model.attention_dropout", "-1"), ("train.adam_beta_1", "-1"),
        ("train.adam_epsilon", "-1"), ("train.learning_rate_scale", "0"),
        ("train.log_every", "0"), ("data.shuffle_buffer", "-1"),
        ("data.spm_character_coverage", "0"), ("model.num_layers", "9" * 20),
        ("train.steps", "9" * 20), ("data.vocab_size", "9" * 20), ("model.dropout", ".nan"),
        ("train.clip_norm", ".inf"), ("data.bucket_boundaries", "[-1, 2]"),
        ("runtime.workdir", "''"), ("name", "[1, 2]"),
    ]:  # fmt: skip
        assert (key, f"{key}={text}") not in accepted, (key, text)

    tiny_path = str(tmp_path / "tiny.yaml")
    with open(tiny_path, "w") as f:
        yaml.safe_dump(TINY, f)
    groups = _groups(accepted, tiny_path)
    assert 1 <= len(groups) <= 3, groups
    for i, group in enumerate(groups):
        _trains_one_step(capsys, tiny_path, str(tmp_path / f"run{i}"), list(group.values()))


def _trains_one_step(capsys, tiny_path, workdir, overrides):
    argv = ["train", "--config", tiny_path, "--workdir", workdir]
    for override in overrides:
        argv += ["--set", override]
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 0, (overrides, err[-3000:])
    with open(os.path.join(workdir, "result.json")) as f:
        assert json.load(f)["step"] == 1, overrides
    losses = [value for _, value in read_scalars(os.path.join(workdir, "logs"))["loss"]]
    assert losses and all(math.isfinite(v) for v in losses), (overrides, losses)


def test_config_errors_come_before_tensorflow_loads():
    """A refused value costs no TensorFlow start-up: the command exits before importing it."""
    code = (
        "import sys; from keras_transformer import cli; "
        "code = cli.main(['train', '--config', 'configs/small.yaml', '--set', 'model.d_ff=0']); "
        "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'; sys.exit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    expected = "keras-transformer train: error: model.d_ff must be in [1, 262144], got 0\n"
    assert done.stderr == expected


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_every_numeric_key_declares_its_range(path):
    """Each int or float key carries `valid=` beside its default (the ranges above come from
    there), and the shipped configs are inside them."""
    load_config(path)
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            numeric = {int, float} & ({hints[f.name]} | set(typing.get_args(hints[f.name])))
            if numeric:
                assert f.metadata.get("valid"), f"{section}.{f.name} has no valid range"


@pytest.mark.parametrize(
    "setting, value",
    [("beam_size", 10**20), ("beam_size", 0), ("alpha", float("nan")), ("alpha", -1.0),
     ("n_best", -1), ("max_extra_length", 10**20)],
)  # fmt: skip
def test_export_flags_keep_the_export_keys_ranges(setting, value):
    """`keras-transformer export --beam-size/--alpha/--n-best/--max-extra-length` are checked
    against the ranges of their `export.` keys."""
    from keras_transformer.config import decoding_settings, from_dict

    with pytest.raises(ConfigError, match=f"export.{setting} must be in"):
        decoding_settings(from_dict({}), export=True, **{setting: value})
