"""The manual's pictures: the decoder's cross-attention heatmaps that a training run logged to
TensorBoard at its last evaluation (the last layer, one panel per head), and one head's panel
alone (`--head N` of `--heads H`, the panels being equally wide), which stays legible at a
page's width where the four side by side do not.

    keras-transformer train --config configs/quickstart.yaml
    python docs/tools/attention_figure.py workdirs/quickstart docs/img/quickstart_attention.png
    python docs/tools/attention_figure.py workdirs/quickstart \
        docs/img/quickstart_attention_head1.png --head 1 --heads 4
"""

import argparse
import glob
import io
import os

import tensorflow as tf

TAG = "attention/decoder_cross_attention"


def last_attention_png(workdir, tag=TAG):
    """The PNG bytes of the last layer's heatmap at the last step that logged `tag`."""
    found = None
    for path in sorted(glob.glob(os.path.join(workdir, "logs", "dev", "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    # An image summary's tensor: [width, height, png per layer...].
                    found = (event.step, value.tensor.string_val[-1])
    if found is None:
        raise SystemExit(f"no {tag} image in {workdir}/logs/dev")
    return found


def one_head(png, head, heads):
    """The PNG bytes of panel `head` (1-based) of `heads` equally wide panels."""
    from PIL import Image

    image = Image.open(io.BytesIO(png))
    width = image.width / heads
    panel = image.crop((round((head - 1) * width), 0, round(head * width), image.height))
    out = io.BytesIO()
    panel.save(out, format="PNG", optimize=True)
    return out.getvalue()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir")
    parser.add_argument("output")
    parser.add_argument("--head", type=int, help="only this head's panel (1-based)")
    parser.add_argument("--heads", type=int, default=4, help="the panels in the image")
    args = parser.parse_args()
    step, png = last_attention_png(args.workdir)
    if args.head:
        png = one_head(png, args.head, args.heads)
    with open(args.output, "wb") as f:
        f.write(png)
    print(f"{args.output}: {TAG}, last layer, step {step}")


if __name__ == "__main__":
    main()
