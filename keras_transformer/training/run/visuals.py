"""Pictures of a Transformer at work, for TensorBoard and notebooks.

- `sentence_attention`: the attention weights of one sentence pair, with SentencePiece pieces to
  label the axes.
- `attention_figure` / `figure_to_png`: per-head heatmaps as a matplotlib figure (Agg, no display
  needed) and PNG bytes.
- `AttentionSummaries`: a callback writing the heatmaps of a fixed dev sentence to TensorBoard's
  Images dashboard at each evaluation (epoch end).
- `flatten_config` / `write_hparams`: the resolved config in TensorBoard's HParams dashboard.

Example:
```python
attention = sentence_attention(model, tokenizer, "the dog sees a cat", config.data)
figure = attention_figure(
    attention["decoder_cross_attention"][-1], attention["source_pieces"],
    attention["target_pieces"], title="cross-attention, last layer")
open("cross_attention.png", "wb").write(figure_to_png(figure))
```
"""

import dataclasses
import io
import json
import math
import os
import warnings

import keras
import numpy as np
import tensorflow as tf

# Heatmap kinds written to TensorBoard: `Transformer.attention_scores` key -> title.
ATTENTION_KINDS = {
    "encoder_self_attention": "encoder self-attention",
    "decoder_cross_attention": "decoder cross-attention",
}


def _numpy(x):
    # bfloat16 tensors (mixed precision) have no numpy dtype: cast first.
    return np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(x, "float32")))


def sentence_attention(model, tokenizer, source, data_config, translation=None, cache=None):
    """Attention weights of `model` for one sentence and its translation.

    The source is encoded as in training (pieces + EOS). The decoder reads `[BOS] + pieces` of
    `translation` (by default the model's own greedy translation), so row `i` of a decoder map is
    the attention used to produce output piece `i` (the last row produces EOS).

    Args:
        model: a `keras_transformer.models.Transformer`.
        tokenizer: the run's `keras_transformer.data.Tokenizer`.
        source: the source sentence (str).
        data_config: the `data` config section (max lengths).
        translation: the target sentence to attend with; None translates `source` greedily.
        cache: a dict reused across calls, so the greedy decoder is traced once.

    Returns:
        A dict with `"source"`, `"translation"`, `"source_pieces"` (list of str, EOS included),
        `"target_pieces"` (output pieces, EOS included), and per kind of
        `Transformer.attention_scores` a list over layers of float32 arrays
        `[heads, queries, keys]`.
    """
    from keras_transformer.data.pipeline import encode_source
    from keras_transformer.evaluation import translate_sentences

    if translation is None:
        translation = translate_sentences(model, tokenizer, [source], data_config, _cache=cache)[0]
    source_ids = np.array(
        [encode_source(tokenizer, source, data_config.max_source_length)], np.int32
    )  # [1, S]
    pieces = tokenizer.encode(translation)[: data_config.max_target_length - 1]
    target_ids = np.array([[tokenizer.bos_id] + pieces], np.int32)  # [1, T]
    with warnings.catch_warnings():
        # A one-piece translation makes Keras warn about a softmax over one key: expected here.
        warnings.simplefilter("ignore", UserWarning)
        scores = model.attention_scores(source_ids, target_ids)
    result = {
        "source": source,
        "translation": translation,
        "source_pieces": [tokenizer.id_to_piece(i) for i in source_ids[0]],
        "target_pieces": [tokenizer.id_to_piece(i) for i in pieces + [tokenizer.eos_id]],
    }
    for kind, per_layer in scores.items():
        result[kind] = [_numpy(layer)[0] for layer in per_layer]  # [heads, queries, keys] each
    return result


def attention_figure(weights, key_labels, query_labels, title=None, columns=4, cell_inches=0.28):
    """Per-head attention heatmaps with tokens on the axes, as a matplotlib `Figure`.

    The figure is made without pyplot (Agg canvas), so it works in servers, callbacks and
    notebooks alike and leaves matplotlib's global state alone.

    Args:
        weights: `[heads, queries, keys]` attention weights (rows sum to 1).
        key_labels: `keys` strings for the x axis (attended-to tokens).
        query_labels: `queries` strings for the y axis (attending tokens).
        title: figure title.
        columns: heads per row of the grid.
        cell_inches: size of one heatmap cell (smaller for long sentences).

    Returns:
        A `matplotlib.figure.Figure` with one heatmap per head.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    weights = np.asarray(weights, dtype="float32")
    heads, queries, keys = weights.shape
    if len(key_labels) != keys or len(query_labels) != queries:
        raise ValueError(
            f"labels ({len(query_labels)} x {len(key_labels)}) do not match the weights "
            f"({queries} x {keys})"
        )
    columns = max(1, min(columns, heads))
    rows = math.ceil(heads / columns)
    # Long sentences get smaller cells: a panel stays within about 10 inches (800 pixels).
    cell_inches = min(cell_inches, 10.0 / max(keys, queries, 1))
    panel_w = max(2.5, keys * cell_inches + 1.0)
    panel_h = max(2.5, queries * cell_inches + 1.0)
    figure = Figure(figsize=(columns * panel_w, rows * panel_h + (0.5 if title else 0.0)), dpi=80)
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False)
    for head in range(rows * columns):
        ax = axes[head // columns][head % columns]
        if head >= heads:
            ax.axis("off")
            continue
        ax.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="equal")
        ax.set_title(f"head {head + 1}", fontsize=9)
        ax.set_xticks(range(keys))
        ax.set_xticklabels(key_labels, rotation=90, fontsize=7)
        ax.set_yticks(range(queries))
        ax.set_yticklabels(query_labels, fontsize=7)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return figure


def figure_to_png(figure):
    """PNG bytes of a matplotlib figure."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _pad_to(images):
    """Pads `[h, w, c]` uint8 images with white to a common size (a TensorBoard image batch)."""
    height = max(image.shape[0] for image in images)
    width = max(image.shape[1] for image in images)
    padded = np.full((len(images), height, width, images[0].shape[2]), 255, dtype=np.uint8)
    for i, image in enumerate(images):
        padded[i, : image.shape[0], : image.shape[1]] = image
    return padded


def attention_images(attention, kind):
    """One rendered heatmap grid per layer for `kind` of `sentence_attention`'s result.

    Returns:
        uint8 array `[layers, height, width, 4]` (RGBA).
    """
    queries = (
        attention["source_pieces"] if kind.startswith("encoder") else attention["target_pieces"]
    )
    keys = (
        attention["target_pieces"]
        if kind == "decoder_self_attention"
        else attention["source_pieces"]
    )
    images = []
    for layer, weights in enumerate(attention[kind]):
        figure = attention_figure(
            weights, keys, queries, title=f"{ATTENTION_KINDS.get(kind, kind)}, layer {layer + 1}"
        )
        images.append(tf.io.decode_png(figure_to_png(figure), channels=4).numpy())
    return _pad_to(images)


class AttentionSummaries(keras.callbacks.Callback):
    """Attention heatmaps of a fixed dev sentence in TensorBoard at each epoch end.

    At every epoch end (the trainer's evaluation points) the model translates `source` greedily
    and the per-head attention weights of that translation are rendered, with the SentencePiece
    pieces on the axes, to images under `logdir/dev`: `attention/encoder_self_attention` and
    `attention/decoder_cross_attention`, one image per layer (TensorBoard's slider picks the
    layer), at the optimizer step.

    Args:
        source: the dev sentence to look at (the same one at every evaluation).
        tokenizer: the run's `keras_transformer.data.Tokenizer`.
        data_config: the `data` config section.
        logdir: TensorBoard log directory (the run's `WORKDIR/logs`).
        enabled: False on the non-chief workers of a multi-worker run.

    Example:
    ```python
    model.fit(dataset, callbacks=[AttentionSummaries(dev_pairs[0][0], tokenizer, config.data,
                                                     "workdir/logs")])
    ```
    """

    def __init__(self, source, tokenizer, data_config, logdir, enabled=True):
        super().__init__()
        self.source = source
        self.tokenizer = tokenizer
        self.data_config = data_config
        self.logdir = logdir
        self.enabled = enabled
        self._cache = {}
        self._writer = None

    def on_epoch_end(self, epoch, logs=None):
        if not self.enabled:
            return
        from keras_transformer.training.run.callbacks import averaged_weights, optimizer_step

        step = optimizer_step(self.model)
        with averaged_weights(self.model):
            attention = sentence_attention(
                self.model, self.tokenizer, self.source, self.data_config, cache=self._cache
            )
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self.logdir, "dev"))
        with self._writer.as_default(step=step):
            for kind, title in ATTENTION_KINDS.items():
                images = attention_images(attention, kind)
                tf.summary.image(
                    f"attention/{kind}",
                    images,
                    max_outputs=len(images),
                    description=f"{title} per head (one image per layer) for the dev sentence "
                    f"'{self.source}' translated as '{attention['translation']}'",
                )
        self._writer.flush()


def flatten_config(config):
    """`{"section.key": value}` of an `ExperimentConfig`, with values HParams accepts.

    Booleans, numbers and strings are kept; None becomes `"null"` and lists their JSON text.
    """
    flat = {}
    for section, values in dataclasses.asdict(config).items():
        if not isinstance(values, dict):
            flat[section] = values
            continue
        for key, value in values.items():
            if value is None:
                value = "null"
            elif isinstance(value, (list, dict)):
                value = json.dumps(value)
            flat[f"{section}.{key}"] = value
    return flat


# Metrics the HParams dashboard shows next to the config: (group = run subdirectory, tag).
HPARAMS_METRICS = (
    ("dev", "dev_bleu", "dev BLEU (greedy, during training)"),
    ("dev", "final_dev_bleu", "dev BLEU (final, configured beam)"),
    ("test", "final_test_bleu", "test BLEU (final, configured beam)"),
    ("train", "loss", "training loss"),
    ("train", "accuracy", "training token accuracy"),
)


def write_hparams(logdir, config):
    """Writes the resolved config to `logdir` for TensorBoard's HParams dashboard.

    One session per run (`trial_id` = the config name) whose hyperparameters are the flattened
    config keys; its metrics are the dev/test BLEU and training loss/accuracy scalars that the
    trainer writes under `logdir/dev`, `logdir/test` and `logdir/train`.
    """
    from tensorboard.plugins.hparams import api as hp

    values = flatten_config(config)
    writer = tf.summary.create_file_writer(logdir)
    with writer.as_default():
        hp.hparams_config(
            hparams=[hp.HParam(key) for key in values],
            metrics=[
                hp.Metric(tag, group=group, display_name=name)
                for group, tag, name in HPARAMS_METRICS
            ],
        )
        hp.hparams(values, trial_id=config.name)
    writer.flush()
    writer.close()
