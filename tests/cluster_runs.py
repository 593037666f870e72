"""Runs for tests/test_training_cluster.py, in a subprocess (train_runner.py --call)."""

import json
import sys

import tensorflow as tf
from training_helpers import tiny_config


def train_on_ram(report):
    """A whole `train()` with the workdir and the export on TensorFlow's in-memory `ram://`
    filesystem; then what it wrote there, and a translation by the exported SavedModel, go to
    the local file `report` (the test's, outside the watched directories)."""
    from keras_transformer.training import train

    config = tiny_config(
        "ram://cluster/work",
        export=dict(base_dir="ram://cluster/saved_models", average_checkpoints=2),
        data=dict(test="synthetic:split=test,size=4,max_words=8"),
    )
    result = train(config)
    # `keras-transformer export` from that workdir, to both formats, on ram:// too.
    from keras_transformer import cli

    work = config.runtime.workdir
    assert cli.main(["export", "--workdir", work, "--output", "ram://cluster/exports"]) == 0
    ct2 = ["--format", "ctranslate2", "--output", "ram://cluster/ct2"]
    assert cli.main(["export", "--workdir", work, *ct2]) == 0
    written = sorted(
        f"{directory}/{name}" for directory, _, names in tf.io.gfile.walk("ram://cluster")
        for name in names
    )  # fmt: skip
    served = tf.saved_model.load(result["saved_model"]).signatures["serving_default"]
    translation = served(text=tf.constant(["a b c"]))["translation"].numpy()[0].decode()
    with open(report, "w") as f:
        json.dump({"result": result, "written": written, "translation": translation}, f)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
