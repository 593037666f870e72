"""The README's picture: the decoder's cross-attention heatmaps that a training run logged to
TensorBoard at its last evaluation (the last layer, one panel per head).

    keras-transformer train --config configs/quickstart.yaml
    python docs/tools/attention_figure.py workdirs/quickstart docs/img/quickstart_attention.png
"""

import glob
import os
import sys

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


def main(argv):
    workdir, output = argv[1], argv[2]
    step, png = last_attention_png(workdir)
    with open(output, "wb") as f:
        f.write(png)
    print(f"{output}: {TAG}, last layer, step {step}")


if __name__ == "__main__":
    main(sys.argv)
