"""Writes notebooks/quickstart.ipynb (without outputs) from the cells below.

Edit the cells here, then run `python notebooks/make_quickstart.py`; tests/test_notebook.py
checks that the stored notebook matches this script and executes it.
"""

import os

import nbformat

CELLS = [
    (
        "markdown",
        """# keras-transformer quickstart

This notebook trains the quickstart Transformer (2 + 2 layers, d_model 128) on the built-in
synthetic corpus, translates with the exported SavedModel, and looks inside: the positional
encoding, the learning-rate schedule, and attention heatmaps per head. It ends by using the
library's layers in a Keras model of your own.

Parameters (environment variables, read in the next cell):

- `QUICKSTART_STEPS`: training steps (unset: the config's 600, about 3 minutes on a 2-core CPU);
- `QUICKSTART_SET`: extra config overrides separated by `;`, e.g. `data.vocab_size=500`;
- `QUICKSTART_WORKDIR`: where the run goes (default `workdirs/quickstart_notebook`).

Run it from the repository root or from `notebooks/`.""",
    ),
    (
        "code",
        """import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # figures are rendered to PNG and displayed as images
import numpy as np
from IPython.display import Image, display

ROOT = Path.cwd() if (Path.cwd() / "configs").is_dir() else Path.cwd().parent
sys.path.insert(0, str(ROOT))  # a source checkout works without `pip install`

STEPS = os.environ.get("QUICKSTART_STEPS")  # None: the config's own step count
EXTRA_OVERRIDES = [s for s in os.environ.get("QUICKSTART_SET", "").split(";") if s.strip()]
WORKDIR = Path(os.environ.get("QUICKSTART_WORKDIR", ROOT / "workdirs" / "quickstart_notebook"))
FIGURES = WORKDIR / "figures"
FIGURES.mkdir(parents=True, exist_ok=True)


def show(figure, name):
    \"\"\"Displays a matplotlib figure and keeps a PNG copy in WORKDIR/figures.\"\"\"
    from keras_transformer.training.run.visuals import figure_to_png

    png = figure_to_png(figure)
    (FIGURES / f"{name}.png").write_bytes(png)
    display(Image(png))""",
    ),
    ("markdown", "## 1. Configure and train\n\nThe same as `keras-transformer train --config configs/quickstart.yaml`."),
    (
        "code",
        """from keras_transformer.config import load_config

overrides = [
    f"runtime.workdir={WORKDIR}",
    f"export.base_dir={WORKDIR / 'saved_models'}",
    "export.name=quickstart",
]
if STEPS:
    overrides.append(f"train.steps={int(STEPS)}")
config = load_config(ROOT / "configs" / "quickstart.yaml", overrides=overrides + EXTRA_OVERRIDES)
print(config.model)
print(config.train)""",
    ),
    (
        "code",
        """from keras_transformer.training import train

# Trains, evaluates on the dev and test sets with beam search, exports a SavedModel.
# Running the cell again resumes from the workdir (a finished run is not retrained).
result = train(config)
result""",
    ),
    ("markdown", "## 2. Translate\n\nWith the exported SavedModel (what TF Serving runs): strings in, strings out."),
    (
        "code",
        """import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SentencePiece ops the SavedModel uses)

from keras_transformer.data import read_pairs

serving = tf.saved_model.load(result["saved_model"]).signatures["serving_default"]
test_pairs = read_pairs(config.data.test)[:5]
sources = [source for source, _ in test_pairs]
outputs = serving(text=tf.constant(sources))
for (source, reference), translation, score in zip(
    test_pairs, outputs["translation"].numpy(), outputs["score"].numpy()
):
    print(f"source:      {source}\\nreference:   {reference}")
    print(f"translation: {translation.decode()}  (score {score:.3f})\\n")""",
    ),
    (
        "markdown",
        "The same model in Python: rebuild it from the workdir's config, vocabulary and last "
        "checkpoint, and translate with the library's beam search.",
    ),
    (
        "code",
        """from keras_transformer.config import decoding_settings
from keras_transformer.data import Tokenizer
from keras_transformer.models import build_transformer
from keras_transformer.evaluation import translate_sentences
from keras_transformer.workdir import list_checkpoints

tokenizer = Tokenizer(str(WORKDIR / "spm.model"))
model = build_transformer(config.model, tokenizer.vocab_size)
step, checkpoint = list_checkpoints(WORKDIR / "checkpoints")[-1]
model.load_weights(checkpoint)
print(f"{model.count_params():,} parameters, checkpoint of step {step}")
library = translate_sentences(model, tokenizer, sources, config.data, decoding_settings(config))
for source, translation in zip(sources, library):
    print(f"{source}\\n  -> {translation}")""",
    ),
    (
        "markdown",
        """## 3. The positional encoding

`PE(pos, 2i) = sin(pos / 10000^(2i/d))`, `PE(pos, 2i+1) = cos(pos / 10000^(2i/d))`: each
pair of dimensions is a sinusoid whose wavelength grows geometrically from 2π to 10000·2π.""",
    ),
    (
        "code",
        """import keras
from matplotlib.figure import Figure

from keras_transformer.layers.embedding import positional_encoding

length, depth = 100, config.model.d_model
pe = keras.ops.convert_to_numpy(positional_encoding(keras.ops.arange(length), depth))
# Check a few entries against the paper's formula.
pos, i = 37, 5
np.testing.assert_allclose(pe[pos, 2 * i], np.sin(pos / 10000 ** (2 * i / depth)), atol=1e-5)
np.testing.assert_allclose(pe[pos, 2 * i + 1], np.cos(pos / 10000 ** (2 * i / depth)), atol=1e-5)

figure = Figure(figsize=(10, 4))
ax = figure.subplots()
image = ax.imshow(pe, cmap="RdBu", aspect="auto", vmin=-1, vmax=1)
ax.set_xlabel("dimension")
ax.set_ylabel("position")
ax.set_title(f"sinusoidal positional encoding, d_model = {depth}")
figure.colorbar(image)
show(figure, "positional_encoding")""",
    ),
    (
        "markdown",
        """## 4. The learning-rate schedule

`lr = scale · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)`: linear warm-up, then decay
with the inverse square root of the step. Left: this run's settings; right: the paper's base
model (d_model 512, 4000 warm-up steps).""",
    ),
    (
        "code",
        """from keras_transformer.training.recipe.schedules import TransformerSchedule

figure = Figure(figsize=(11, 3.5))
for ax, (title, d_model, warmup, scale, steps) in zip(
    figure.subplots(1, 2),
    [
        ("this run", config.model.d_model, config.train.warmup_steps,
         config.train.learning_rate_scale, max(config.train.steps, 3 * config.train.warmup_steps)),
        ("paper, base", 512, 4000, 1.0, 100_000),
    ],
):
    schedule = TransformerSchedule(d_model, warmup, scale)
    x = np.arange(1, steps + 1)
    y = keras.ops.convert_to_numpy(schedule(x))
    # The peak is at the end of warm-up: scale * (d_model * warmup)^-0.5.
    np.testing.assert_allclose(y.max(), scale * (d_model * warmup) ** -0.5, rtol=1e-5)
    ax.plot(x, y)
    ax.axvline(warmup, color="gray", linestyle=":")
    ax.set_title(f"{title}: d_model {d_model}, warmup {warmup}, scale {scale}")
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
figure.tight_layout()
show(figure, "learning_rate")""",
    ),
    (
        "markdown",
        """## 5. Attention, head by head

For one test sentence and the model's translation: encoder self-attention (source pieces on
both axes) and decoder cross-attention (output pieces down, source pieces across), in the last
layer. Row *i* of a cross-attention map is where the decoder looked to produce output piece
*i*. The synthetic language puts the verb last and adjectives after their noun, so a trained
model's cross-attention is far from diagonal.""",
    ),
    (
        "code",
        """from keras_transformer.training.run.visuals import attention_figure, sentence_attention

attention = sentence_attention(model, tokenizer, sources[0], config.data)
print("source:     ", attention["source"])
print("translation:", attention["translation"])
encoder = attention["encoder_self_attention"][-1]  # [heads, source, source]
cross = attention["decoder_cross_attention"][-1]  # [heads, target, source]
# Every row is a probability distribution over the (non-padding) keys.
np.testing.assert_allclose(encoder.sum(-1), 1.0, atol=1e-4)
np.testing.assert_allclose(cross.sum(-1), 1.0, atol=1e-4)

show(
    attention_figure(encoder, attention["source_pieces"], attention["source_pieces"],
                     title="encoder self-attention, last layer"),
    "encoder_self_attention",
)""",
    ),
    (
        "code",
        """show(
    attention_figure(cross, attention["source_pieces"], attention["target_pieces"],
                     title="decoder cross-attention, last layer"),
    "decoder_cross_attention",
)""",
    ),
    (
        "markdown",
        """## 6. The layers in your own Keras model

Every building block is a serializable Keras 3 layer. Here a small sentence classifier (is the
source sentence longer than 8 words?) built from `TokenEmbedding`,
`SinusoidalPositionalEncoding` and `TransformerEncoder`, trained for a moment, saved as a
`.keras` file and loaded back.""",
    ),
    (
        "code",
        """from keras_transformer.data import encode_sources
from keras_transformer.layers import (
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    TransformerEncoder,
)

pairs = read_pairs("synthetic:split=dev,size=256")
ids = encode_sources(tokenizer, [s for s, _ in pairs], 32).numpy()
labels = np.array([len(s.split()) > 8 for s, _ in pairs], dtype="int32")

inputs = keras.Input(shape=(None,), dtype="int32", name="ids")
x = TokenEmbedding(vocab_size=tokenizer.vocab_size, d_model=64)(inputs)
x = SinusoidalPositionalEncoding()(x)
x = TransformerEncoder(num_layers=1, num_heads=4, d_ff=128)(x, padding_mask=inputs != 0)
x = keras.layers.GlobalAveragePooling1D()(x)
outputs = keras.layers.Dense(2, activation="softmax")(x)
classifier = keras.Model(inputs, outputs)
classifier.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
classifier.fit(ids, labels, batch_size=32, epochs=2, verbose=2)

path = WORKDIR / "classifier.keras"
classifier.save(path)
restored = keras.saving.load_model(path)
np.testing.assert_allclose(restored.predict(ids[:8], verbose=0),
                           classifier.predict(ids[:8], verbose=0), atol=1e-6)
print(f"saved and reloaded {path}")""",
    ),
    (
        "markdown",
        """## Next

- `tensorboard --logdir` the run's `logs/` directory: loss, learning rate, dev BLEU, sample
  translations, attention heatmaps (Images) and this config (HParams).
- Serve the SavedModel with TF Serving: see the README.""",
    ),
]


def build():
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    notebook.metadata["language_info"] = {"name": "python"}
    for kind, source in CELLS:
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        cell = make(source)
        cell.pop("id", None)
        notebook.cells.append(cell)
    notebook.nbformat_minor = 4  # no cell ids: stable files
    return notebook


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.ipynb")
    nbformat.write(build(), path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
