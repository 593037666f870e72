"""Data: corpus specs, the synthetic corpus, the SentencePiece vocabulary and the tf.data pipeline.

Example:
```python
from keras_transformer import data
pairs = data.read_pairs("synthetic:split=train,size=2000")
tokenizer = data.get_or_train_tokenizer(config.data, pairs, workdir)
dataset = data.make_dataset(pairs, tokenizer, config.data, training=True)
```

Corpora of any size (WMT): prepare once, stream always.
```python
manifest = data.prepare(config)  # WORKDIR/spm.model and WORKDIR/prepared/ (shards, manifest)
dataset = data.prepared_dataset(Workdir.of(config).prepared, config.data)
```

The rest is importable from the modules: corpus specs (`data.corpora`), batching
(`data.pipeline`), writing shards and their manifest (`data.prepare`, which runs the jobs of
`data.manifest`, `data.vocabulary`, `data.encoding`, `data.workers`, `data.shards` and
`data.statistics`), reading them (`data.prepared`), the special ids `PAD_ID`,
`UNK_ID`, `BOS_ID`, `EOS_ID` (`data.tokenizer`), the synthetic corpus (`data.synthetic`).
"""

from keras_transformer.data.corpora import read_pairs
from keras_transformer.data.pipeline import encode_sources, make_dataset
from keras_transformer.data.prepare import prepare
from keras_transformer.data.prepared import prepared_dataset
from keras_transformer.data.tokenizer import Tokenizer, get_or_train_tokenizer

__all__ = [
    "Tokenizer",
    "encode_sources",
    "get_or_train_tokenizer",
    "make_dataset",
    "prepare",
    "prepared_dataset",
    "read_pairs",
]
