"""Export: the string-to-string `Translator` and SavedModels in TF Serving's layout."""

from keras_transformer.export.saved_model import (
    export_saved_model,
    list_versions,
    resolve_model_dir,
)
from keras_transformer.export.translator import Translator

__all__ = ["Translator", "export_saved_model", "list_versions", "resolve_model_dir"]
