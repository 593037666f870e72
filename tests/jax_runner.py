"""Runs one check on the JAX backend for tests/test_jax_backend.py (run as a script under
`KERAS_BACKEND=jax`, or `tensorflow` for `quickstart_run`'s other side); prints its result as
one JSON line. `no_tensorflow` first makes
`tensorflow` unimportable, as on a machine without it."""

import dataclasses
import importlib.abc
import json
import os
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


def cli_without_tensorflow(*argv):
    """`keras-transformer ARGV` with `tensorflow` unimportable (a prepared workdir is read
    without it); returns its exit code and the TensorFlow modules loaded (none)."""
    sys.meta_path.insert(0, _BlockTensorFlow())
    from keras_transformer.cli import main

    code = main(list(argv))
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow")
    return {"exit_code": code, "tensorflow_modules": loaded}


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
    """One training step on a global batch of 4 rows (one padded, one shorter) from the same
    weights: on one device; with `gradient_accumulation_steps` 2 (two micro-batches of
    different token counts); under `keras.distribution.DataParallel` over this process's two
    (host) devices; and both. Returns each one's largest difference from the first."""
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
    target[1, 2:], labels[1, 2:] = 0, 0
    x = {"source_ids": source, "target_ids": target}

    def one_step(start=None, k=1):
        keras.utils.set_random_seed(3)
        model = build_transformer(config.model, 40)
        compile_model(model, dataclasses.replace(config, train=dataclasses.replace(
            config.train, gradient_accumulation_steps=k)), jit_compile=True)  # fmt: skip
        if start is not None:
            model.set_weights(start)
        before = model.get_weights()
        loss = model.fit(x, labels, batch_size=4, epochs=1, verbose=0, shuffle=False)
        return before, model.get_weights(), loss.history

    def difference(a, b):
        return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b))

    start, single, history = one_step()
    out = {"moved": difference(single, start), "weights": len(single)}
    _, accumulated, accumulated_history = one_step(start, k=2)
    out["accumulated"] = difference(single, accumulated)
    out["logs"] = {name: [history[name][0], accumulated_history[name][0]] for name in history}
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    out["parallel"] = difference(single, one_step(start)[1])
    out["parallel_accumulated"] = difference(single, one_step(start, k=2)[1])
    out["batch_sharded_over"] = keras.distribution.distribution().get_data_layout((4, 7)).axes
    return out


def quickstart_run(steps, initial_weights, *settings):
    """`configs/quickstart.yaml`'s corpus, vocabulary and model trained for `steps` steps with
    `model.fit` on the numpy batches of `data.records` (the same stream on either backend),
    then its greedy dev BLEU on 200 sentences; on whatever backend this process runs
    (`KERAS_BACKEND`). The model starts from the weights
    in `initial_weights` where that file exists, else it writes its own initial weights there
    (each backend draws different ones from the same seed). `settings`: more overrides."""
    import dataclasses

    import keras
    import numpy as np
    import sacrebleu

    from keras_transformer.config import EOS_ID, decoding_settings, load_config
    from keras_transformer.data.records import _padded, numpy_batches
    from keras_transformer.evaluation import compiled_search
    from keras_transformer.models import build_transformer
    from keras_transformer.training.recipe import compile_model

    steps = int(steps)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    config = load_config(os.path.join(root, "configs", "quickstart.yaml"),
                         overrides=[f"train.steps={steps}", *settings])  # fmt: skip
    d = config.data
    sys.path.insert(0, root)
    from benchmarks.accelerator_check import quickstart_data

    pairs, dev, processor = quickstart_data(config, threads=1)
    keras.utils.set_random_seed(config.train.seed)
    model = build_transformer(config.model, processor.get_piece_size())
    if os.path.exists(initial_weights):
        model.load_weights(initial_weights)
    else:
        model.save_weights(initial_weights)
    compile_model(model, config, jit_compile=keras.backend.backend() == "jax")
    batches = numpy_batches(pairs, d, seed=config.train.seed)
    model.fit(batches, steps_per_epoch=steps, epochs=1, verbose=0)
    greedy = dataclasses.replace(decoding_settings(config), beam_size=1)
    decode = compiled_search(model, greedy)  # tf.function or jax.jit
    hypotheses = []
    for start in range(0, len(dev), 100):  # batches of 100, sources padded to 48 tokens
        ids = np.zeros((100, d.max_source_length), np.int32)
        for i, (source, _) in enumerate(dev[start : start + 100]):
            row = processor.encode(source)[: d.max_source_length - 1] + [EOS_ID]
            ids[i, : len(row)] = row
        found = decode(ids).tolist()
        hypotheses += [processor.decode(row[: row.index(EOS_ID)] if EOS_ID in row else row)
                       for row in found]  # fmt: skip
    bleu = sacrebleu.corpus_bleu(hypotheses, [[t for _, t in dev]]).score
    # The dev loss, teacher-forced (the compiled loss, one batch of the 200 pairs): continuous,
    # where greedy BLEU moves in steps.
    rows = [(processor.encode(s)[: d.max_source_length - 1] + [EOS_ID],
             processor.encode(t)[: d.max_target_length - 1]) for s, t in dev]  # fmt: skip
    x, labels = _padded(rows, d.max_source_length, d.max_source_length, d.max_target_length)
    loss = model.evaluate(x, labels, batch_size=len(rows), verbose=0, return_dict=True)["loss"]
    return {"backend": keras.backend.backend(), "steps": steps, "dev_bleu_greedy": bleu,
            "dev_loss": float(loss)}  # fmt: skip


def translate_dev(workdir):
    """The dev set of `workdir` translated by its last checkpoint, with the export's settings,
    by the search the run scores with (`evaluation.translate_sentences`) on this backend."""
    from keras_transformer.config import decoding_settings, load_config
    from keras_transformer.data.corpora import read_pairs
    from keras_transformer.data.tokenizer import Tokenizer
    from keras_transformer.evaluation import translate_sentences
    from keras_transformer.models import build_transformer
    from keras_transformer.workdir import Workdir, list_checkpoints, load_model_weights

    config = load_config(f"{workdir}/config.yaml")
    tokenizer = Tokenizer(f"{workdir}/spm.model")
    model = build_transformer(config.model, tokenizer.vocab_size)
    load_model_weights(model, list_checkpoints(Workdir.of(config).checkpoints)[-1][1])
    sources = [s for s, _ in read_pairs(config.data.dev)]
    settings = decoding_settings(config, export=True)
    return {
        "sources": sources,
        "translations": translate_sentences(model, tokenizer, sources, config.data, settings),
    }


if __name__ == "__main__":
    print(json.dumps(globals()[sys.argv[1]](*sys.argv[2:])))
