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
"""

from keras_transformer.data.corpora import (
    DataError,
    DataWarning,
    iter_pairs,
    parse_spec,
    read_pairs,
)
from keras_transformer.data.pipeline import (
    batch_examples,
    bucket_batch_sizes,
    bucket_boundaries,
    encode_sources,
    make_dataset,
)
from keras_transformer.data.prepare import (
    check_prepared,
    prepare,
    prepared_dataset,
    prepared_examples,
    read_manifest,
)
from keras_transformer.data.synthetic import generate as generate_synthetic
from keras_transformer.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    get_or_train_tokenizer,
    train_sentencepiece,
)

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "DataError",
    "DataWarning",
    "Tokenizer",
    "batch_examples",
    "bucket_batch_sizes",
    "check_prepared",
    "bucket_boundaries",
    "encode_sources",
    "generate_synthetic",
    "get_or_train_tokenizer",
    "iter_pairs",
    "make_dataset",
    "parse_spec",
    "prepare",
    "prepared_dataset",
    "prepared_examples",
    "read_manifest",
    "read_pairs",
    "train_sentencepiece",
]
