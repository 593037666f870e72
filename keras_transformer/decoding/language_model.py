"""The next-token step of a decoder-only language model, for `greedy_search`, `beam_search` and
sampling (`greedy_search(..., pick=sampling_picker(...))`)."""

from keras import ops

from keras_transformer.config import BOS_ID, PAD_ID
from keras_transformer.decoding.search import NEG_INF, _banned_tokens_mask, _forcing_prefix


def language_model_step(
    model, batch_size, max_length, use_cache=True, prompt_ids=None, banned_ids=(PAD_ID, BOS_ID)
):
    """`(step_fn, initial_state)` that let the library's searches generate with a decoder-only
    (GPT-style) language model.

    Pass them to `greedy_search` or `beam_search` with `initial_ids` the start token of each
    row (BOS, the token the model was trained to continue) and the same `max_length`. The step
    returns the model's next-token log-probabilities, the `banned_ids` made impossible.

    Args:
        model: with `use_cache`, any model with `init_cache(batch_size, max_length)` and
            `decode_step(token_ids, cache_index, cache) -> (logits, cache)` (as
            `keras_transformer.models.DecoderOnlyTransformer`): one token per step, its keys
            and values cached. Without, any Keras model from int ids `[rows, length]` to logits
            `[rows, length, vocab]` (e.g. a functional model of the library's layers).
        batch_size: rows of `initial_ids` (before beam search repeats them for its beams).
        max_length: the search's `max_length` (most tokens generated, EOS included); the cache
            holds that many positions.
        use_cache: False re-runs `model` on the whole sequence at every step (slower; the same
            log-probabilities).
        prompt_ids: optional int `[batch_size, p]`, 0-padded prompts: the output of row `i`
            starts with the non-zero ids of its prompt (forced one per step), then the model
            continues it. Leave room for them in `max_length`.
        banned_ids: ids never generated (padding and BOS by default).

    Returns:
        `(step_fn, initial_state)`, see `keras_transformer.decoding.search`'s step contract.

    Example:
    ```python
    step_fn, state = language_model_step(model, batch_size=2, max_length=20)
    ids = beam_search(step_fn, ops.full((2,), BOS_ID), state, 4, max_length=20).ids
    ```
    """
    if use_cache:
        step_fn = _cached_step(model)
        initial_state = model.init_cache(batch_size, max_length)
    else:
        step_fn = _uncached_step(model)
        initial_state = ops.zeros((batch_size,), dtype="int32")

    def log_probs_fn(ids, index, state):  # [rows, vocab] log p
        logits, state = step_fn(ids, index, state)
        log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
        vocab = ops.arange(log_probs.shape[-1], dtype="int32")
        banned = _banned_tokens_mask(vocab, banned_ids)  # [vocab]
        return ops.where(banned, NEG_INF, log_probs), state

    if prompt_ids is None:
        return log_probs_fn, initial_state
    return _forcing_prefix(log_probs_fn, initial_state, prompt_ids)


def _cached_step(model):
    def step_fn(ids, index, cache):
        tokens = ops.take(ids, ops.reshape(index, (1,)), axis=1)  # [rows, 1] the last token
        logits, cache = model.decode_step(tokens, index, cache)
        return logits[:, 0], cache  # [rows, vocab]

    return step_fn


def _uncached_step(model):
    def step_fn(ids, index, unused):
        logits = model(ids[:, :-1], training=False)  # [rows, max_length, vocab]
        return ops.take(logits, ops.reshape(index, (1,)), axis=1)[:, 0], unused

    return step_fn
