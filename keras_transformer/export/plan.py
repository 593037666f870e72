"""What an export serves, described once: `ExportPlan`, resolved from a workdir's config and a
command's flags by `resolve_export_plan`, and taken whole by `run_export`, which hands it to
the format's exporter (`config.formats`, the registry). `train`'s own export
(`training.run.finish`) and `keras-transformer export` both resolve and run it here, so that
for the same config they export the same thing (the same `keras_transformer.json`).

Example:
```python
settings = decoding_settings(config, export=True)
plan = resolve_export_plan(config, "workdirs/quickstart", settings)  # no flags
path = run_export(plan, model, spm_bytes, "saved_models", "quickstart")
```
"""

import dataclasses
import importlib
from typing import Any, Optional

from keras_transformer.config import DecodingSettings, saved_model_shortlist
from keras_transformer.config.formats import check_quantization, export_format
from keras_transformer.errors import DataError, UsageError


@dataclasses.dataclass(frozen=True)
class ExportPlan:
    """What one export serves (see the module docstring).

    Args:
        format: a registered format's name (`config.formats`): `saved_model`, `litert`,
            `ctranslate2`, or one registered by a user.
        quantization: the format's weight type (the SavedModel's: its `export.precision`;
            None: the format's default).
        settings: the `DecodingSettings` fixed into the export.
        data: the `DataConfig` (the source and target length limits).
        jit_compile: the SavedModel's search compiled with XLA.
        shortlist: the vocabulary shortlist's lexical table, or None: a SavedModel decodes
            over it; a LiteRT or CTranslate2 export holds it for its runtime to use when asked.
        alignments: `serving_default`'s `alignment` output (a LiteRT export: its alignment
            graph).
        alignment_layer: the decoder layer whose cross-attention aligns.
        constraints: a LiteRT export's constrained step (a SavedModel always has it).
    """

    format: str = "saved_model"
    quantization: Optional[str] = None
    settings: DecodingSettings = DecodingSettings()
    data: Any = None
    jit_compile: bool = False
    shortlist: Any = None
    alignments: bool = False
    alignment_layer: int = -2
    constraints: bool = False

    @property
    def lengths(self):
        """`(max_source_length, max_length)` of `data` (a `DataConfig` or a dict; missing: 128
        and None): inputs are truncated to the first; the second is the longest output, EOS
        included (as in the dev-set decoding during training: no longer than the targets)."""
        data = {} if self.data is None else self.data
        if isinstance(data, dict):
            return int(data.get("max_source_length", 128)), data.get("max_target_length")
        return int(getattr(data, "max_source_length", 128)), getattr(data, "max_target_length")

    @property
    def searched_shortlist(self):
        """The lexical table the export's own search decodes over (a SavedModel's `shortlist`;
        another format holds its table for its runtime to use when asked: None, the whole
        vocabulary). `train`'s and `export --select-on-dev`'s choice on dev decode over it."""
        return self.shortlist if self.format == "saved_model" else None


def resolve_export_plan(config, workdir, settings, flags=None):
    """The `ExportPlan` of a training workdir's `config` (an `ExperimentConfig`), with its
    decoding `settings` (`config.decoding_settings(config, export=True)` and the command's
    decoding flags, made where the command or the run starts) and the command's `flags` (an
    object with any of `format`, `quantization`, `precision`, `jit_compile`, `shortlist`,
    `alignments`, `constraints`; a missing or None one: the config's). The vocabulary
    shortlist is read from the workdir, or built (its errors one line, `UsageError`).
    """

    def flag(name, configured=None):
        value = getattr(flags, name, None)
        return configured if value is None else value

    name = flag("format", "saved_model")
    export_format(name)  # a registered one
    quantization = flag("quantization")
    check_quantization(name, quantization)
    if name == "saved_model":
        quantization = flag("precision", config.export.precision)
    jit_compile = name == "saved_model" and flag("jit_compile", config.export.jit_compile)
    return ExportPlan(
        format=name,
        quantization=quantization,
        settings=settings,
        data=config.data,
        jit_compile=bool(jit_compile),
        shortlist=_shortlist(config, workdir, name, flag("shortlist"), jit_compile),
        alignments=bool(flag("alignments", config.export.alignments)),
        alignment_layer=config.export.alignment_layer,
        constraints=bool(flag("constraints", False)),
    )


def _shortlist(config, workdir, name, asked, jit_compile):
    """The lexical table the export holds, or None. A SavedModel: `config.
    saved_model_shortlist` (by default where it can be built, not with XLA). Another format
    holds it when asked (`--shortlist`, `export.shortlist: true`); with neither, CTranslate2
    when the workdir has one (its `vmap.txt`), LiteRT not (its shortlist step is a second
    copy of the step's weights, and not faster there: docs/guides/on-device.md)."""
    from keras_transformer import local_files
    from keras_transformer.data.shortlist import export_shortlist
    from keras_transformer.workdir import Workdir

    layout = Workdir(workdir)
    if name == "saved_model":
        use, required = saved_model_shortlist(config.export, asked, jit_compile)
        if use and jit_compile:
            raise UsageError(
                "the vocabulary shortlist does not compile with XLA yet: not both --shortlist "
                "(export.shortlist) and --jit-compile (export.jit_compile)"
            )
    else:
        use = config.export.shortlist if asked is None else asked
        required = bool(use)  # asked for: an error where it cannot be had
        if use is None:  # CTranslate2 holds the workdir's, where it is current
            use = name == "ctranslate2" and local_files.gfile().exists(layout.shortlist)
    if not use:
        return None
    try:
        return export_shortlist(layout, required)
    except DataError as e:
        raise UsageError(f"the export's shortlist: {e}") from None


def run_export(plan, model, tokenizer, output, name=None, card=(None, None)):
    """Exports `model` (and its SentencePiece `tokenizer`) as `plan` says; returns the path.

    Args:
        plan: an `ExportPlan`.
        model: the `Transformer` to export.
        tokenizer: SentencePiece model bytes (or a `Tokenizer`).
        output: the SavedModel's base directory (its versions go to `output/name/N`), or
            another format's directory.
        name: the SavedModel's model name.
        card: `(card_facts, dev_pairs)`: the model card's facts and the pairs that calibrate
            the confidence (a SavedModel's and a LiteRT export's).
    """
    module, function = export_format(plan.format).exporter.split(":")
    exporter = getattr(importlib.import_module(module), function)
    facts, dev_pairs = card
    if plan.format == "saved_model":
        return exporter(model, tokenizer, plan, output, name, facts, dev_pairs)
    if plan.format == "litert":
        return exporter(model, tokenizer, output, plan, facts, dev_pairs=dev_pairs)
    # A converted model (CTranslate2's, or a registered format's): this call.
    return exporter(
        model, tokenizer, output, plan.quantization, plan.data, plan.settings,
        shortlist=plan.shortlist,
    )  # fmt: skip
