"""Runs one check on the JAX backend for tests/test_jax_backend.py (run as a script under
`KERAS_BACKEND=jax`); prints its result as one JSON line. `no_tensorflow` first makes
`tensorflow` unimportable, as on a machine without it."""

import importlib.abc
import json
import sys


class _BlockTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorflow_text", "tf_keras"):
            raise ImportError(f"{name} is blocked in this process")
        return None


def no_tensorflow(check_out=None):
    """The model, loss, step and search with `tensorflow` unimportable; then (given a path)
    `benchmarks/accelerator_check.py --tiny`, its lines appended to `check_out`."""
    sys.meta_path.insert(0, _BlockTensorFlow())
    import keras
    import numpy as np

    from keras_transformer.config import from_dict
    from keras_transformer.decoding import translate_ids
    from keras_transformer.models import build_transformer
    from keras_transformer.training import compile_model

    assert keras.backend.backend() == "jax"
    config = from_dict({"model": dict(num_layers=1, d_model=16, num_heads=2, d_ff=32, dropout=0.0),
                        "train": {"warmup_steps": 10}})  # fmt: skip
    keras.utils.set_random_seed(1)
    model = compile_model(build_transformer(config.model, 20), config, jit_compile=True)
    rng = np.random.default_rng(0)
    source = rng.integers(4, 20, (3, 6)).astype("int32")
    source[:, -1] = 3
    target = rng.integers(4, 20, (3, 5)).astype("int32")
    x = {"source_ids": source, "target_ids": target}
    history = model.fit(x, target, epochs=20, verbose=0).history["loss"]
    greedy = np.asarray(translate_ids(model, source, beam_size=1)[0])
    beam = np.asarray(translate_ids(model, source, beam_size=4)[0])
    if check_out:
        sys.path.insert(0, ".")
        from benchmarks.accelerator_check import main

        assert main(["--tiny", "--out", check_out]) == 0
    blocked = sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow")
    return {"tensorflow_modules": blocked, "loss_decreased": history[-1] < history[0],
            "greedy": greedy.tolist(), "beam": beam.tolist()}  # fmt: skip


def same_numbers(weights, batch, out):
    import keras
    import numpy as np

    from keras_transformer.decoding import translate_ids
    from keras_transformer.models import build_transformer
    from keras_transformer.training import compile_model

    sys.path.insert(0, "tests")
    from test_jax_backend import _tiny_setup

    config = _tiny_setup()[0]
    model = build_transformer(config.model, 40)
    compile_model(model, config, jit_compile=True)
    model.load_weights(weights)
    with np.load(batch) as b:
        source, target, labels = b["source"], b["target"], b["labels"]
    x = {"source_ids": source, "target_ids": target}
    result = {
        "logits": np.asarray(model(x, training=False)),
        "greedy": np.asarray(translate_ids(model, source, beam_size=1)[0]),
        "beam": np.asarray(translate_ids(model, source, beam_size=4)[0]),
        "w0_before": np.asarray(model.trainable_variables[0]),
    }
    model.fit(x, labels, batch_size=3, epochs=1, verbose=0, shuffle=False)
    result.update({f"w{i}": np.asarray(v) for i, v in enumerate(model.trainable_variables)})
    result["paths"] = json.dumps([v.path for v in model.trainable_variables])
    np.savez(out, **result)
    assert keras.backend.backend() == "jax"
    return {"ok": True}


def data_parallel():
    """One training step on a global batch of 4 rows: on one device, then under
    `keras.distribution.DataParallel` over this process's two (host) devices, from the same
    weights; returns the largest difference of the updated weights."""
    import jax
    import keras
    import numpy as np

    from keras_transformer.models import build_transformer
    from keras_transformer.training import compile_model

    sys.path.insert(0, "tests")
    from test_jax_backend import _tiny_setup

    devices = keras.distribution.list_devices()
    assert len(devices) == 2 == len(jax.devices()), devices
    config = _tiny_setup()[0]
    rng = np.random.default_rng(11)
    source = rng.integers(4, 40, (4, 7)).astype("int32")
    source[:, -1] = 3
    source[3, 3], source[3, 4:] = 3, 0
    target = rng.integers(4, 40, (4, 6)).astype("int32")
    labels = np.concatenate([target[:, 1:], np.full((4, 1), 3, "int32")], axis=1)
    target[:, 0] = 2
    target[1, 3:], labels[1, 3:] = 0, 0
    x = {"source_ids": source, "target_ids": target}

    def one_step(start=None):
        keras.utils.set_random_seed(3)
        model = compile_model(build_transformer(config.model, 40), config, jit_compile=True)
        if start is not None:
            model.set_weights(start)
        before = model.get_weights()
        model.fit(x, labels, batch_size=4, epochs=1, verbose=0, shuffle=False)
        return before, model.get_weights()

    start, single = one_step()
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    _, parallel = one_step(start)
    layout = keras.distribution.distribution().get_data_layout((4, 7))
    return {
        "max_difference": max(float(np.max(np.abs(a - b))) for a, b in zip(single, parallel)),
        "moved": max(float(np.max(np.abs(a - b))) for a, b in zip(single, start)),
        "batch_sharded_over": list(layout.axes),
        "weights": len(single),
    }


def translate_dev(workdir):
    import sentencepiece as spm

    from keras_transformer.config import decoding_settings, load_config
    from keras_transformer.data.corpora import read_pairs
    from keras_transformer.models import build_transformer
    from keras_transformer.training.jax_trainer import translate
    from keras_transformer.workdir import Workdir, list_checkpoints, load_model_weights

    config = load_config(f"{workdir}/config.yaml")
    processor = spm.SentencePieceProcessor(model_file=f"{workdir}/spm.model")
    model = build_transformer(config.model, processor.get_piece_size())
    load_model_weights(model, list_checkpoints(Workdir.of(config).checkpoints)[-1][1])
    sources = [s for s, _ in read_pairs(config.data.dev)]
    settings = decoding_settings(config, export=True)
    return {"sources": sources, "translations": translate(model, processor, sources, config,
                                                          settings)}  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(globals()[sys.argv[1]](*sys.argv[2:])))
