"""Step checkpoints hold the model's weights only (no optimizer variables) and are read by
averaging and export as before; the resume state restores weights, optimizer, dropout RNG and
the data position."""

import os
import warnings

import h5py
import keras
import numpy as np
import pytest

from keras_transformer.config import from_dict
from keras_transformer.models import build_transformer
from keras_transformer.training import compile_model
from keras_transformer.training.engines.tf_state import ResumeState
from keras_transformer.training.recipe import make_optimizer
from keras_transformer.training.run.callbacks import StepCheckpoint, averaged_weights
from keras_transformer.workdir import average_checkpoints, complete_checkpoints, list_checkpoints

# Numerically sensitive: CI runs this module again with oneDNN off and with one thread.
pytestmark = pytest.mark.numerics

TOY_MODEL = dict(num_layers=1, d_model=16, num_heads=2, d_ff=32, dropout=0.1)


def _toy_model():
    """The toy Transformer, uncompiled (checkpoints and averages load into it)."""
    return build_transformer(TOY_MODEL, vocab_size=40)


def _compiled_model(**train):
    config = from_dict({"model": TOY_MODEL, "train": dict(warmup_steps=2, **train)})
    model = build_transformer(config.model, vocab_size=40)
    compile_model(model, config)
    return model


def _fit(model, steps, callbacks=()):
    rng = np.random.default_rng(0)
    source = rng.integers(4, 40, size=(4 * steps, 7)).astype("int32")
    target = rng.integers(4, 40, size=(4 * steps, 6)).astype("int32")
    inputs = {"source_ids": source, "target_ids": target}
    model.fit(inputs, target, batch_size=4, epochs=1, verbose=0, callbacks=list(callbacks))


def _h5_names(path):
    names = []
    with h5py.File(path, "r") as f:
        f.visit(names.append)
    return names


@pytest.mark.scenario
def test_step_checkpoints_hold_weights_only_and_average(tmp_path):
    model = _compiled_model()
    _fit(model, 4, [StepCheckpoint(tmp_path, every=2, keep=5)])
    checkpoints = list_checkpoints(tmp_path)
    assert [step for step, _ in checkpoints] == [2, 4]
    for _, path in checkpoints:
        names = _h5_names(path)
        assert not [n for n in names if "optimizer" in n], names
        assert [n for n in names if n.startswith("layers")], names
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]
    # About a third of Keras's save_weights of the compiled model (Adam's two moments dropped).
    full = tmp_path / "full.weights.h5"
    model.save_weights(str(full))
    assert os.path.getsize(checkpoints[-1][1]) < 0.7 * os.path.getsize(full)

    # Averaging and loading read them into an uncompiled model and a compiled one (no warning).
    fresh = _toy_model()
    average_checkpoints(fresh, [path for _, path in checkpoints])
    last = _toy_model()
    last.load_weights(checkpoints[-1][1])
    for a, b in zip(last.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chosen = complete_checkpoints(tmp_path, 2)
        assert [step for step, _ in chosen] == [2, 4]
        average_checkpoints(model, [path for _, path in chosen])
    for a, b in zip(model.get_weights(), fresh.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6)


class _Snapshot(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        self.variables = [np.array(v) for v in self.model.variables]
        self.optimizer_variables = [np.array(v) for v in self.model.optimizer.variables]


@pytest.mark.parametrize("train", [{}, {"ema_momentum": 0.9}], ids=["adam", "adam_ema"])
def test_resume_state_restores_optimizer_dropout_rng_and_data_position(tmp_path, train):
    model = _compiled_model(**train)  # compile_model builds the optimizer: ResumeState needs it
    state = ResumeState(model, str(tmp_path), every=3, keep=2)
    snapshot = _Snapshot()
    _fit(model, 3, [state, snapshot])
    assert state.batches == 3
    # As at the last state's save (what a killed run resumes from; with EMA, the end of `fit`
    # then puts the averages into the model, Keras's finalize_variable_values).
    saved, saved_optimizer = snapshot.variables, snapshot.optimizer_variables
    seeds = [v for v in model.variables if "seed_generator" in v.path]
    assert seeds  # the dropout layers' RNG states are among the model's variables

    averages = [v for v in model.optimizer.variables if "average" in v.path]
    # With EMA the moving averages are among the optimizer's variables, so they resume too.
    assert len(averages) == (len(model.trainable_variables) if train else 0)

    keras.utils.set_random_seed(99)
    other = _compiled_model(**train)
    assert ResumeState(other, str(tmp_path), every=3, keep=2).restore() == 3
    assert len(other.optimizer.variables) == len(saved_optimizer)  # the moments too
    for a, b in zip(other.variables, saved):
        np.testing.assert_array_equal(np.asarray(a), b)
    for a, b in zip(other.optimizer.variables, saved_optimizer):
        np.testing.assert_array_equal(np.asarray(a), b)
    assert int(keras.ops.convert_to_numpy(other.optimizer.iterations)) == 3


class _RecordWeights(keras.callbacks.Callback):
    """After each step: the trained weights, and those seen inside `averaged_weights`."""

    def __init__(self):
        super().__init__()
        self.trained, self.averaged, self.after = [], [], []

    def on_train_batch_end(self, batch, logs=None):
        self.trained.append([np.array(v) for v in self.model.trainable_weights])
        with averaged_weights(self.model):
            self.averaged.append([np.array(v) for v in self.model.trainable_weights])
        self.after.append([np.array(v) for v in self.model.trainable_weights])


def test_ema_checkpoints_hold_the_moving_average_of_the_weights(tmp_path):
    momentum = 0.9
    model = _compiled_model(ema_momentum=momentum)
    record = _RecordWeights()
    _fit(model, 4, [record, StepCheckpoint(tmp_path, every=2, keep=5)])

    # The formula: a_1 = w_1, a_t = m * a_(t-1) + (1 - m) * w_t over the trained weights.
    expected = [record.trained[0]]
    for weights in record.trained[1:]:
        expected.append([momentum * a + (1 - momentum) * w for a, w in zip(expected[-1], weights)])
    for step in range(4):
        for got, want in zip(record.averaged[step], expected[step]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
        # The block gives the trained weights back.
        for got, want in zip(record.after[step], record.trained[step]):
            np.testing.assert_array_equal(got, want)
    assert any(not np.allclose(a, w) for a, w in zip(expected[1], record.trained[1])), (
        "the average should differ from the weights after two steps"
    )

    # The checkpoints hold the averages, not the trained weights.
    fresh = _toy_model()
    for step, path in list_checkpoints(tmp_path):
        fresh.load_weights(path)
        for got, want in zip(fresh.trainable_weights, expected[step - 1]):
            np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-7)
    # Keras's fit ends with the averages in the model (Optimizer.finalize_variable_values).
    for got, want in zip(model.trainable_weights, expected[-1]):
        np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-7)


@pytest.mark.scenario
def test_without_ema_averaged_weights_are_the_weights(tmp_path):
    model = _compiled_model()
    record = _RecordWeights()
    _fit(model, 2, [record])
    assert not model.optimizer.use_ema
    for step in range(2):
        for got, want in zip(record.averaged[step], record.trained[step]):
            np.testing.assert_array_equal(got, want)
    optimizer = make_optimizer(from_dict({"train": {"ema_momentum": 0.999}}))
    assert optimizer.use_ema and optimizer.ema_momentum == 0.999


def test_weight_decay_shrinks_all_weights_but_biases_and_layer_norms_by_the_formula():
    config = from_dict({"model": TOY_MODEL, "train": dict(warmup_steps=2, weight_decay=0.1)})
    model = _toy_model()
    optimizer = make_optimizer(config)
    variables = model.trainable_variables
    rng = np.random.default_rng(0)
    for variable in variables:  # no zeros (biases start at 0): every decay shows
        variable.assign(rng.uniform(0.5, 1.5, variable.shape).astype("float32"))
    before = [np.array(v) for v in variables]
    learning_rate = float(optimizer.learning_rate)  # the schedule at this step
    # Zero gradients: Adam's own update is zero, what moves is the decay alone.
    optimizer.apply([keras.ops.zeros_like(v) for v in variables], variables)
    decayed = set()
    for variable, old in zip(variables, before):
        new = np.array(variable)
        if not np.array_equal(new, old):
            np.testing.assert_allclose(new, old * (1 - learning_rate * 0.1), rtol=1e-6)
            decayed.add(variable.path)
    kept = {v.path for v in variables} - decayed
    # Kernels and the shared embedding decay; biases and LayerNorm parameters stay.
    excluded = ("bias", "gamma", "beta")
    assert any("embeddings" in path for path in decayed)
    assert any(path.endswith("kernel") for path in decayed)
    assert kept and all(path.rsplit("/", 1)[-1] in excluded for path in kept)
    assert not any(path.rsplit("/", 1)[-1] in excluded for path in decayed)
    assert make_optimizer(from_dict({})).weight_decay is None  # the paper's: off


def test_weight_decay_goes_by_rank_not_by_name():
    """Matrices decay whatever their names; vectors never do (a renamed bias stays undecayed)."""
    optimizer = make_optimizer(from_dict({"train": dict(warmup_steps=2, weight_decay=0.1)}))
    matrix = keras.Variable(np.ones((3, 2), "float32"), name="bias")  # a matrix named like a bias
    vector = keras.Variable(np.ones((3,), "float32"), name="offset")  # a vector named otherwise
    learning_rate = float(optimizer.learning_rate)
    optimizer.apply([keras.ops.zeros_like(matrix), keras.ops.zeros_like(vector)], [matrix, vector])
    np.testing.assert_allclose(np.array(matrix), 1 - learning_rate * 0.1, rtol=1e-6)
    np.testing.assert_array_equal(np.array(vector), 1.0)


@pytest.mark.scenario
def test_with_ema_the_resume_state_saved_at_the_end_of_fit_holds_the_trained_weights(tmp_path):
    """With EMA, Keras's `fit` ends by putting the averages in place of the weights
    (`finalize_variable_values`) before the callbacks' `on_train_end`: the resume state saved at
    the end still holds the trained weights (what a resumed run trains on from), and the
    averages beside them among the optimizer's variables."""
    import tensorflow as tf

    from keras_transformer.training.run.callbacks import _moving_averages

    model = _compiled_model(ema_momentum=0.9)
    state = ResumeState(model, str(tmp_path), every=1000, keep=1)
    record = _RecordWeights()
    _fit(model, 3, [state, record])
    trained, averaged = record.trained[-1], record.averaged[-1]
    assert any(not np.allclose(a, w) for a, w in zip(averaged, trained))
    assert "finalize_variable_values" not in vars(model.optimizer)  # Keras's own again

    saved = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path)))
    assert saved.get_tensor("data_position/.ATTRIBUTES/VARIABLE_VALUE") == 3

    def value(part, variables, variable):
        index = [id(v) for v in variables].index(id(variable))
        return saved.get_tensor(f"{part}/{index}/.ATTRIBUTES/VARIABLE_VALUE")

    pairs = _moving_averages(model.optimizer)
    assert [id(w) for w, _ in pairs] == [id(w) for w in model.trainable_weights]
    for (weight, average), want_weight, want_average in zip(pairs, trained, averaged):
        np.testing.assert_array_equal(value("model", model.variables, weight), want_weight)
        optimizer_variables = model.optimizer.variables
        np.testing.assert_array_equal(
            value("optimizer", optimizer_variables, average), want_average
        )
