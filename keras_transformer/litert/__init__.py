"""Translation with a LiteRT (TFLite) export, without TensorFlow: the LiteRT interpreter,
SentencePiece and numpy (`pip install "keras-nmt-transformer[litert]"`).

Example:
```python
from keras_transformer import litert

translator = litert.load("saved_models/quickstart-litert")
translator.translate(["Guten Morgen."])["translation"]
```
"""

from keras_transformer.litert.runtime import LiteRTError, LiteRTTranslator, is_litert_export, load

__all__ = ["LiteRTError", "LiteRTTranslator", "is_litert_export", "load"]
