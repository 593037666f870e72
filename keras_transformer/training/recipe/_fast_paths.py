"""Fast paths of training: the same numbers as `losses.py` and Keras's Adam, computed faster on
TensorFlow (measurements in docs/guides/performance.md).

Each function takes the caller's `kernels` (a `keras_transformer.fast_paths.Kernels`, chosen
when the loss or optimizer was built) and returns None (or False) where it does not apply (not
chosen, another backend); the caller then runs the plain form.
`tests/test_fast_paths.py` checks every path against it.
"""

import keras

from keras_transformer.tf_utils import in_xla_context

# ------------------------------------------------------------------------ the loss


def cross_entropy(kernels, labels, logits, eps):
    """`(losses [batch, length], statistics)` of the label-smoothed cross-entropy (TensorFlow), or
    None where the `fused_loss` fast path does not apply."""
    if not kernels.uses("fused_loss") or keras.backend.backend() != "tensorflow":
        return None
    return _tf_fused_cross_entropy(labels, logits, eps)


def _tf_fused_cross_entropy(labels, logits, eps):
    """`logsumexp(z) - (1 - eps) * z[label] - eps * mean(z)` with its gradient formed in one pass.

    The gradient `softmax(z) - target` is formed in the forward pass, so the backward pass is
    one multiplication, and one array of the logits' size ([tokens, vocab]) can carry the logits,
    then the softmax, then the gradient: the softmax runs after every read of the logits (their
    row maximum, mean and label logit), so TensorFlow may hand it the logits' buffer, and the
    gradient is written into the softmax's. (A `tf.custom_gradient` over the whole loss would
    keep the logits alive until its outputs exist, i.e. beside the softmax: so the custom
    gradient covers only the reads, and a zero "anchor" added to the loss carries the gradient.)
    The log-partition comes from the softmax: its largest value is `exp(0) / sum(exp(z - max z))`,
    so `logsumexp(z) = max z - log(max softmax(z))`, with no further pass over exponentials.

    Returns:
        `(losses [batch, length], statistics)`: `statistics` holds `label_logit`, `max_logit`
        and `logsumexp`, each `[batch, length]`, without gradient (see
        `MaskedSparseCrossEntropy.call_with_statistics`).

    tests/test_fast_paths.py checks values, gradient and statistics against the log-softmax
    formula; docs/guides/performance.md has the time and memory measured.
    """
    import tensorflow as tf

    vocab_size = logits.shape[-1] or tf.shape(logits)[-1]  # static when known
    z = tf.reshape(logits, [-1, vocab_size])  # [tokens, vocab]
    flat_labels = tf.reshape(labels, [-1])
    backward = {}  # filled below, read when the gradient is taken

    @tf.custom_gradient
    def read(z):
        label_logit = tf.gather(z, flat_labels, batch_dims=1)
        max_logit = tf.reduce_max(z, axis=-1)
        mean_logit = tf.reduce_mean(z, axis=-1) if eps else tf.zeros_like(max_logit)
        anchor = tf.zeros_like(max_logit)  # added to the loss: d loss / d anchor = upstream

        def grad(d_anchor, *_):  # the read values enter the loss without gradient
            return backward["d_logits"] * tf.expand_dims(d_anchor, -1)

        return (anchor, label_logit, max_logit, mean_logit), grad

    anchor, *values = read(z)
    label_logit, max_logit, mean_logit = [tf.stop_gradient(v) for v in values]
    with tf.control_dependencies([anchor, label_logit, max_logit, mean_logit]):
        probs = tf.nn.softmax(tf.stop_gradient(z))  # after every read of z: may reuse its buffer
    max_prob = tf.reduce_max(probs, axis=-1)
    logsumexp = max_logit - tf.math.log(max_prob)
    loss = anchor + logsumexp - (1.0 - eps) * label_logit - eps * mean_logit
    with tf.control_dependencies([max_prob]):  # the last read of probs before it is overwritten
        low = eps / tf.cast(tf.shape(z)[-1], tf.float32)
        d_logits = probs - low if eps else probs
        backward["d_logits"] = _subtract_at_labels(d_logits, flat_labels, 1.0 - eps)
    shape = tf.shape(labels)
    statistics = {
        "label_logit": tf.reshape(label_logit, shape),
        "max_logit": tf.reshape(max_logit, shape),
        "logsumexp": tf.reshape(logsumexp, shape),
    }
    return tf.reshape(loss, shape), statistics


def _subtract_at_labels(values, labels, amount):
    """`values[n, labels[n]] -= amount` for every row n of `values` `[tokens, vocab]`.

    TensorFlow's `tensor_scatter_nd_sub` always copies its input (a second array of the logits'
    size), so outside XLA this is `InplaceSub` on `values` viewed as `[tokens * vocab / k, k]`
    (k in 8, 4, 2, 1 dividing vocab: int32 row indices suffice up to 2^31 * k elements), which
    writes into `values`' own buffer. That is safe here because `values` is a fresh tensor with
    no other reader (the loss orders its reads first). XLA, which has no `InplaceSub` and
    updates in place by itself, gets the scatter.
    """
    import tensorflow as tf

    tokens = tf.shape(labels)[0]
    vocab = values.shape[-1]
    if vocab is None or in_xla_context():
        index = tf.stack([tf.range(tokens), labels], axis=1)
        return tf.tensor_scatter_nd_sub(values, index, tf.fill([tokens], amount))
    k = next(k for k in (8, 4, 2, 1) if vocab % k == 0)
    rows = tf.range(tokens) * (vocab // k) + labels // k
    updates = tf.one_hot(labels % k, k, on_value=amount, off_value=0.0, dtype=values.dtype)
    out = tf.raw_ops.InplaceSub(x=tf.reshape(values, [-1, k]), i=rows, v=updates)
    return tf.reshape(out, tf.shape(values))


# ------------------------------------------------------------------------ Adam

# The dtypes TensorFlow's ResourceApplyAdam kernel takes on every device.
_FUSED_ADAM_DTYPES = ("float16", "bfloat16", "float32", "float64")


def apply_adam(kernels, optimizer, gradient, variable, learning_rate):
    """Adam's update of `variable` as one `ResourceApplyAdam` kernel; False (nothing done) where
    the `fused_adam` fast path does not apply (other backends, `amsgrad`, unusual dtypes).

    Keras's Adam updates each variable with about a dozen element-wise ops (each a pass over the
    variable, its moments or a temporary as large); TensorFlow's kernel reads the gradient and
    writes the variable and both moments in one pass: the same formula
    `m += (g - m)(1 - beta_1)`, `v += (g^2 - v)(1 - beta_2)`,
    `w -= lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + epsilon)`.
    """
    if (
        not kernels.uses("fused_adam")
        or keras.backend.backend() != "tensorflow"
        or optimizer.amsgrad
        or keras.backend.standardize_dtype(variable.dtype) not in _FUSED_ADAM_DTYPES
    ):
        return False
    import tensorflow as tf

    m, v = adam_slots(optimizer, variable)
    dtype = variable.dtype
    if isinstance(gradient, tf.IndexedSlices):  # what Keras's Adam does implicitly
        gradient = tf.convert_to_tensor(gradient)
    step = tf.cast(optimizer.iterations + 1, dtype)
    beta_1 = tf.cast(optimizer.beta_1, dtype)
    beta_2 = tf.cast(optimizer.beta_2, dtype)
    tf.raw_ops.ResourceApplyAdam(
        var=_handle(variable),
        m=_handle(m),
        v=_handle(v),
        beta1_power=tf.pow(beta_1, step),
        beta2_power=tf.pow(beta_2, step),
        lr=tf.cast(learning_rate, dtype),
        beta1=beta_1,
        beta2=beta_2,
        epsilon=tf.cast(optimizer.epsilon, dtype),
        grad=tf.cast(gradient, dtype),
    )
    return True


def adam_slots(optimizer, variable):
    """`(momentum, velocity)`: the slot variables of `variable` in the built Keras `Adam`
    `optimizer`, those Keras's own update writes and checkpoints hold.

    Keras 3 has no public accessor for them: `Adam.build` keeps them in the private lists
    `_momentums` and `_velocities`, in the order of `_get_variable_index` (Keras 3.12 to 3.15).
    This is the one place that reads those names, and
    `tests/test_fast_paths.py::test_adam_slots_are_kerass_own` fails if Keras renames or
    re-keys them. Owning the slots through the public `add_variable_from_reference` instead
    would leave Keras's update (the fallback: other backends, amsgrad, other dtypes) without
    them, or hold every moment twice and change the checkpoints' variables.
    """
    index = optimizer._get_variable_index(variable)
    return optimizer._momentums[index], optimizer._velocities[index]


def _handle(variable):
    """The resource handle of a Keras or TensorFlow variable (per replica under tf.distribute)."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle
