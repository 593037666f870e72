"""The int8 projection model the LiteRT runtime writes for a batch's shortlist columns
(`keras_transformer.litert.projection`): LiteRT runs it; its logits are the int8 rows times their
scales times the hidden state, plus the biases, to within the rounding of the hidden state's int8
quantization; a model of some of the rows gives those rows' columns of the model of all of them,
each product of a model of two its own, and a model with the gathered head's graph written
after its products answers as the two models run one after the other. Skipped only when the
`litert` extra (ai-edge-litert) is missing."""

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

from ai_edge_litert.interpreter import Interpreter  # noqa: E402

from keras_transformer.export.litert_graphs import quantized_rows  # noqa: E402
from keras_transformer.litert.projection import projection_model  # noqa: E402

pytestmark = pytest.mark.numerics


def _run(model, *inputs):
    """The outputs of the LiteRT model `model` (bytes) on `inputs`, in order."""
    interpreter = Interpreter(model_content=model, num_threads=1)
    details = interpreter.get_input_details()
    for detail, value in zip(details, inputs):
        interpreter.resize_tensor_input(detail["index"], value.shape, strict=False)
    interpreter.allocate_tensors()
    for detail, value in zip(details, inputs):
        interpreter.set_tensor(detail["index"], value)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]


def _logits(model, hidden):
    outputs = _run(model, hidden)
    return outputs[0] if len(outputs) == 1 else outputs


@pytest.mark.parametrize("rows_count", [1, 7, 64])
def test_the_logits_are_the_int8_rows_product_to_the_inputs_rounding(rows_count):
    rng = np.random.default_rng(rows_count)
    matrix = rng.normal(size=(96, 48)).astype("float32") * rng.uniform(0.1, 3, (96, 1))
    rows, scales = quantized_rows(matrix)
    hidden = (rng.normal(size=(rows_count, 48)) * 2 + 0.5).astype("float32")
    bias = rng.normal(size=96).astype("float32")
    bias[::7] = -1e9  # the masked columns' bias
    out = _logits(projection_model([(rows, scales, bias)]), hidden)
    assert out.shape == (rows_count, 96) and out.dtype == np.float32
    weights = rows.astype("float64") * scales[:, None]
    exact = hidden.astype("float64") @ weights.T + bias
    # hidden is quantized per row to 255 levels: each element off by half a level at most
    step = (np.maximum(hidden.max(1), 0) - np.minimum(hidden.min(1), 0)) / 255
    bound = 0.5 * step[:, None] * np.abs(weights).sum(1)[None, :]
    assert (np.abs(out - exact) <= bound * 1.001 + 1e-5 + 1e-7 * np.abs(exact)).all()
    # and int8: not the float product of the hidden state
    assert np.abs(out - exact).max() > 0


def test_a_model_of_some_rows_gives_their_columns_of_all_rows():
    rng = np.random.default_rng(0)
    rows, scales = quantized_rows(rng.normal(size=(200, 32)).astype("float32"))
    hidden = rng.normal(size=(12, 32)).astype("float32")
    everything = _logits(projection_model([(rows, scales, None)]), hidden)
    ids = np.sort(rng.choice(200, 64, replace=False))
    some = _logits(projection_model([(rows[ids], scales[ids], None)]), hidden)
    np.testing.assert_allclose(some, everything[:, ids], rtol=1e-6, atol=1e-6)
    # two products in one model (the gathered head's columns and its banned pieces)
    special = np.array([0, 2])
    products = [(rows[ids], scales[ids], None), (rows[special], scales[special], np.ones(2, "f"))]
    both = _logits(projection_model(products), hidden)
    np.testing.assert_allclose(both[0], some, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(both[1], everything[:, special] + 1, rtol=1e-6, atol=1e-6)


def test_the_head_written_after_the_products_answers_as_the_two_models():
    """`projection_model(products, head=...)`: the gathered head's graph fed by the products
    inside one model gives what the products' model and the head's give one after the other."""
    from keras_transformer.export import litert

    head, names = litert._convert(litert._gathered_head(4, eos_id=3), "float32")
    rng = np.random.default_rng(5)
    rows, scales = quantized_rows(rng.normal(size=(300, 16)).astype("float32"))
    ids = np.concatenate([np.arange(4), np.sort(rng.choice(np.arange(4, 300), 252, False))])
    ban = np.isin(ids, (0, 2))
    products = [
        (rows[ids], scales[ids], np.where(ban, -1e9, 0.0).astype("float32")),
        (rows[[0, 2]], scales[[0, 2]], None),
    ]
    hidden = rng.normal(size=(6, 16)).astype("float32")
    banned, special = _run(projection_model(products), hidden)
    apart = _run(head, banned, special, ids.astype("int32"))
    together = _run(projection_model(products, head=head), hidden, ids.astype("int32"))
    assert len(together) == len(names) == 3
    for a, b in zip(apart, together):
        np.testing.assert_array_equal(a, b)
    # the scores: log-probabilities over the columns, padding and BOS never among the best
    outputs = dict(zip(names, together))
    logits = banned.astype("float64")  # columns 0 and 2 are ids 0 and 2: their own logits
    logits[:, 0], logits[:, 2] = special[:, 0], special[:, 1]
    log_probs = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    best = np.sort(np.where(ban, -np.inf, log_probs), axis=1)[:, ::-1][:, :4]
    np.testing.assert_allclose(outputs["top_log_probs"], best, atol=1e-5)
    assert not np.isin(outputs["top_ids"], (0, 2)).any()
    np.testing.assert_allclose(outputs["eos_log_probs"], log_probs[:, 3], atol=1e-5)


def test_rows_scales_and_biases_must_agree():
    rows, scales = np.zeros((4, 8), np.int8), np.ones(4, np.float32)
    with pytest.raises(ValueError, match="rows"):
        projection_model([(rows, scales[:3], None)])
    with pytest.raises(ValueError, match="rows"):
        projection_model([(rows[0], scales, None)])
    with pytest.raises(ValueError, match="rows"):
        projection_model([(rows.astype("float32"), scales, None)])
    with pytest.raises(ValueError, match="bias"):
        projection_model([(rows, scales, np.zeros(3, np.float32))])
    with pytest.raises(ValueError, match="wide"):
        projection_model([(rows, scales, None), (rows[:, :4], scales, None)])
    with pytest.raises(ValueError, match="no products"):
        projection_model([])
