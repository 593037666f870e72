"""The export formats and their quantizations, declared once (a registry): `keras-transformer
export`'s `--format` and `--quantization` choices and their checks, the config's
`export.precision` (the SavedModel's quantizations) and the generated references read them.
Adding a format is one module (its exporter) and one `register_format` call; adding a
quantization, one `register_format` of its format with the quantization added (a
`dataclasses.replace` of `export_format(name)`); nothing else lists them.

Example:
```python
register_format(ExportFormat(
    "onnx", "an ONNX model (needs the onnx extra)", "my_package.onnx_export:export",
    quantizations=("float32", "int8"), default_quantization="float32",
))
```
"""

import dataclasses

from keras_transformer.errors import UsageError


@dataclasses.dataclass(frozen=True)
class ExportFormat:
    """One export format (`export --format NAME`).

    Args:
        name: the `--format` value.
        summary: one phrase for `--format`'s help and the reference.
        exporter: `"module:function"`, imported when used (no format's dependencies load
            before it is asked for).
        quantizations: the `--quantization` values it takes, its default first (the
            SavedModel's are its `export.precision` values, set with `--precision`).
        default_quantization: the value used when none is given (None: the format has none).
    """

    name: str
    summary: str
    exporter: str
    quantizations: tuple = ()
    default_quantization: str = None


_FORMATS = {}


def register_format(export_format):
    """Declares `export_format` (an `ExportFormat`), replacing one of the same name."""
    _FORMATS[export_format.name] = export_format
    return export_format


def format_names():
    """The registered formats' names, the default (`saved_model`) first."""
    return tuple(_FORMATS)


def export_format(name):
    """The registered `ExportFormat` called `name`; `UsageError` naming the choices."""
    if name not in _FORMATS:
        raise UsageError(f"--format {name}: the formats are {', '.join(_FORMATS)}")
    return _FORMATS[name]


def quantizations(format_name=None):
    """The quantizations of one format, or of every format (each once, in registry order)."""
    formats = _FORMATS.values() if format_name is None else [export_format(format_name)]
    return tuple(dict.fromkeys(q for f in formats for q in f.quantizations))


def precisions():
    """`export.precision`'s values: the SavedModel format's quantizations."""
    return quantizations("saved_model")


def check_quantization(format_name, quantization):
    """`UsageError` (one line) when `format_name` does not take `quantization` (None: fine)."""
    if quantization is None:
        return
    choices = export_format(format_name).quantizations
    if format_name == "saved_model":
        raise UsageError(
            "--quantization applies to --format "
            + " or ".join(n for n in _FORMATS if n != "saved_model")
            + f" (a SavedModel takes --precision {' or '.join(choices)})"
        )
    if quantization not in choices:
        owners = [f.name for f in _FORMATS.values() if quantization in f.quantizations]
        where = f" ({', '.join(owners)}'s)" if owners else ""
        raise UsageError(
            f"--quantization {quantization}{where}: --format {format_name} takes "
            f"{', '.join(choices)}"
        )


register_format(
    ExportFormat(
        "saved_model",
        "TF Serving's SavedModel (the default)",
        "keras_transformer.export.saved_model:export_saved_model",
        quantizations=("float32", "bfloat16"),
        default_quantization="float32",
    )
)
register_format(
    ExportFormat(
        "ctranslate2",
        "a CTranslate2 model (needs the ctranslate2 extra)",
        "keras_transformer.export.ct2:export_ctranslate2",
        quantizations=(
            "float32",
            "int8",
            "int8_float32",
            "int8_float16",
            "int8_bfloat16",
            "int16",
            "float16",
            "bfloat16",
        ),  # fmt: skip
        default_quantization="float32",
    )
)
register_format(
    ExportFormat(
        "litert",
        "LiteRT/TFLite for devices and small CPUs (run by the litert extra)",
        "keras_transformer.export.litert:export_litert",
        quantizations=("float32", "float16", "dynamic_int8"),
        default_quantization="float32",
    )
)
