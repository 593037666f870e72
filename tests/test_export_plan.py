"""One description of what an export serves (`export.plan.ExportPlan`), resolved once from the
config and the command's flags by the function that `train`'s own export and
`keras-transformer export` both call."""

import argparse
import json
import os

import pytest

from keras_transformer.config import decoding_settings, from_dict
from keras_transformer.errors import UsageError
from keras_transformer.export.plan import ExportPlan, resolve_export_plan


def _flags(**given):
    return argparse.Namespace(**given)


def test_the_plan_is_the_configs_with_the_flags_over_it(tmp_path):
    config = from_dict(
        {
            "export": {"shortlist": False, "alignments": True, "precision": "bfloat16"},
            "decode": {"beam_size": 3},
        }
    )
    settings = decoding_settings(config, export=True)
    plan = resolve_export_plan(config, str(tmp_path), settings)
    assert plan == ExportPlan(
        format="saved_model", quantization="bfloat16", settings=plan.settings,
        data=config.data, jit_compile=False, shortlist=None, alignments=True,
        alignment_layer=config.export.alignment_layer, constraints=False,
    )  # fmt: skip
    assert plan.settings.beam_size == 3
    # Flags win; None (not given) keeps the config's.
    flagged = resolve_export_plan(
        config,
        str(tmp_path),
        settings,
        _flags(precision="float32", alignments=False, jit_compile=None),  # fmt: skip
    )
    assert (flagged.quantization, flagged.alignments) == ("float32", False)
    litert = resolve_export_plan(
        config, str(tmp_path), settings, _flags(format="litert", quantization="dynamic_int8")
    )
    assert (litert.format, litert.quantization, litert.jit_compile) == (
        "litert", "dynamic_int8", False,
    )  # fmt: skip
    # Frozen: a plan is not changed on its way to the exporter.
    with pytest.raises(AttributeError):
        plan.alignments = False


def test_the_plans_refusals_are_one_line(tmp_path):
    config = from_dict({})
    for flags, words in [
        (_flags(format="litert", quantization="int8"), "--format litert takes"),
        (_flags(format="nope"), "the formats are saved_model"),
        (_flags(jit_compile=True, shortlist=True), "does not compile with XLA"),
        # Asked for, a shortlist that cannot be built (no SentencePiece model here).
        (_flags(shortlist=True), "the export's shortlist"),
    ]:
        with pytest.raises(UsageError, match=words) as e:
            resolve_export_plan(config, str(tmp_path), decoding_settings(config, True), flags)
        assert "\n" not in str(e.value)


@pytest.mark.scenario
def test_train_and_export_write_the_same_metadata(toy_quickstart, tmp_path, run_cli):
    """`train`'s own export and `keras-transformer export` of the same workdir, with no flag:
    the same `keras_transformer.json` (signatures, decoding settings, shortlist, precision)."""
    workdir = os.path.join(toy_quickstart, "workdirs", "quickstart")
    trained = os.path.join(toy_quickstart, "saved_models", "quickstart", "1")
    code, out, err = run_cli("export", "--workdir", workdir, "--output", str(tmp_path))
    assert code == 0, err
    exported = out.strip().splitlines()[-1].split(" to ")[-1]

    def metadata(path):
        with open(os.path.join(path, "assets.extra", "keras_transformer.json")) as f:
            return json.load(f)

    assert metadata(exported) == metadata(trained)
