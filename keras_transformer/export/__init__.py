"""Export: the string-to-string `Translator`, SavedModels in TF Serving's layout, and the
conversion to CTranslate2 (`export_ctranslate2`, needs the optional `ctranslate2` package)."""

from keras_transformer.export.ct2 import export_ctranslate2
from keras_transformer.export.plan import ExportPlan
from keras_transformer.export.saved_model import export_saved_model
from keras_transformer.export.translator import Translator

__all__ = ["ExportPlan", "Translator", "export_ctranslate2", "export_saved_model"]
