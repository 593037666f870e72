"""The Transformer's train and test steps: gradient accumulation inside the step (TensorFlow and
JAX), the loss's per-token statistics handed to the metrics, and a multi-worker workaround.

`Transformer` inherits `TrainStep`, so any `Transformer` that is fitted (through `train()` or by a
user after `keras_transformer.training.compile_model`) trains this way. The model module keeps
to the model; this module holds what `model.fit` needs beyond Keras's own step.

One `train_step` call is one optimizer update. With `gradient_accumulation_steps = k > 1` the
input batch holds k micro-batches: the step splits it along the batch axis, takes the gradient
of each micro-batch in turn (a `tf.while_loop`, so only one micro-batch's activations are alive),
and applies their sum once. Each micro-batch's loss is divided by the token count of the whole
batch, so the sum is exactly the gradient of the whole batch's loss (a mean over its non-padding
tokens). There is no `cond` around the update (Keras's optimizer option applies the accumulated
update inside one, where tf.distribute's `merge_call` is not allowed), so it works under every
strategy and with XLA. On the JAX backend the same accumulation is a `jax.lax.scan` over the
micro-batches inside Keras's stateless step (`_jax_accumulated_step`), also under
`keras.distribution.DataParallel`; with k = 1 the JAX backend runs Keras's own step.

When the compiled loss offers `call_with_statistics` (the library's `MaskedSparseCrossEntropy`)
the step asks it for the per-token losses and the statistics of the logits it computed
(`label_logit`, `max_logit`, `logsumexp`), and gives those to the metrics that accept them
(`update_state_from_statistics`): the logits are read by the loss only, as in one fused kernel.
Any other loss or metric goes through Keras's `compute_loss` / `update_state`.
"""

import functools

import keras
from keras import ops


def _spans_workers(strategy):
    """True where `strategy` trains across several workers (processes): the strategy's own
    answer, which `training.engines.strategies` also reads to choose the trainer's input object."""
    if strategy is None or keras.backend.backend() != "tensorflow":
        return False
    return bool(strategy.extended._in_multi_worker_mode())


def _unpack(data):
    """`(x, y, sample_weight)` of a batch as `fit` yields it."""
    if isinstance(data, (tuple, list)):
        data = tuple(data) + (None,) * (3 - len(data))
        return data[0], data[1], data[2]
    return data, None, None


def _replicas():
    import tensorflow as tf

    return tf.distribute.get_strategy().num_replicas_in_sync


def _for_distribution(value):
    """One replica's share of a global mean: tf.distribute sums the replicas' gradients."""
    replicas = _replicas()
    return value / replicas if replicas > 1 else value


def _current(scope, variables, values):
    """The values a `StatelessScope` ended with: the assigned ones, else the ones it began with."""
    found = [scope.get_current_value(v) for v in variables]
    return [value if new is None else new for new, value in zip(found, values)]


class TrainStep:
    """Mixin for `keras.Model`: the train/test steps described in this module's docstring.

    Attributes:
        gradient_accumulation_steps: micro-batches per optimizer update (k); set by
            `keras_transformer.training.compile_model` from `train.gradient_accumulation_steps`.
            Every batch's size must be a multiple of k (times the replicas under tf.distribute).

    Example:
    ```python
    model = Transformer.from_preset("transformer_tiny", vocab_size=100)
    compile_model(model, config)  # config.train.gradient_accumulation_steps = 2
    model.fit(make_dataset(pairs, tokenizer, config.data, batch_multiple=2), ...)
    ```
    """

    gradient_accumulation_steps = 1

    # ------------------------------------------------------------------ the steps

    # `*args`: the JAX trainer's steps take `(state, data)`; they are passed through untouched.
    def train_step(self, *args, **kwargs):
        k = int(self.gradient_accumulation_steps)
        loss_fn = self._statistics_loss()
        if keras.backend.backend() == "jax" and k > 1:
            return self._jax_accumulated_step(*args, k=k, loss_fn=loss_fn)
        if keras.backend.backend() != "tensorflow" or (loss_fn is None and k == 1):
            if k > 1:
                raise NotImplementedError(
                    "gradient_accumulation_steps > 1 needs the TensorFlow or JAX backend"
                )
            return self._multi_worker_logs(super().train_step(*args, **kwargs))
        (data,) = args
        x, y, sample_weight = _unpack(data)
        if k == 1:
            self._plain_update(x, y, sample_weight, loss_fn)
        else:
            self._accumulated_update(x, y, sample_weight, loss_fn, k)
        return self._multi_worker_logs(self.get_metrics_result())

    def test_step(self, *args, **kwargs):
        loss_fn = self._statistics_loss()
        if keras.backend.backend() != "tensorflow" or loss_fn is None:
            return self._multi_worker_logs(super().test_step(*args, **kwargs))
        (data,) = args
        x, y, sample_weight = _unpack(data)
        y_pred = self(x, training=False)
        denominator = ops.sum(loss_fn.token_weights(y, sample_weight))
        loss = self._micro_batch_loss(x, y, y_pred, sample_weight, loss_fn, denominator, 1)
        self._track_loss(loss, x)
        return self._multi_worker_logs(self.get_metrics_result())

    def _plain_update(self, x, y, sample_weight, loss_fn):
        """k = 1: Keras's step, with the loss's statistics going to the metrics."""
        import tensorflow as tf

        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            denominator = ops.sum(loss_fn.token_weights(y, sample_weight))
            loss = self._micro_batch_loss(x, y, y_pred, sample_weight, loss_fn, denominator, 1)
            scaled = self.optimizer.scale_loss(loss)
        self._track_loss(loss, x)
        weights = self.trainable_weights
        self.optimizer.apply_gradients(zip(tape.gradient(scaled, weights), weights))

    def _accumulated_update(self, x, y, sample_weight, loss_fn, k):
        """k > 1: k micro-batches' gradients, summed in a while loop, applied once."""
        import tensorflow as tf

        def split(t):  # [batch, ...] -> [k, batch / k, ...]
            if t is None:
                return None
            t = tf.convert_to_tensor(t)
            return tf.reshape(t, tf.concat([[k, -1], tf.shape(t)[1:]], axis=0))

        # Metrics and optimizer are built before the loop: no variable may be created inside it.
        compiled = getattr(self, "_compile_metrics", None)
        if (compiled is not None and not compiled.built) or not self.optimizer.built:
            self._symbolic_build(data_batch=(x, y, sample_weight))
        xs = tf.nest.map_structure(split, x)
        ys, weights_s = split(y), split(sample_weight)
        # The whole batch's normaliser: the sum of the k micro-batch losses is its mean loss.
        denominator = None
        if loss_fn is not None:
            denominator = ops.sum(loss_fn.token_weights(y, sample_weight))
        variables = self.trainable_weights

        def body(i, loss_sum, sums):
            xi = tf.nest.map_structure(lambda t: t[i], xs)
            yi = ys[i] if ys is not None else None
            wi = weights_s[i] if weights_s is not None else None
            with tf.GradientTape() as tape:
                y_pred = self(xi, training=True)
                loss = self._micro_batch_loss(xi, yi, y_pred, wi, loss_fn, denominator, k)
                scaled = self.optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, variables)
            sums = [
                s if g is None else s + tf.cast(tf.convert_to_tensor(g), s.dtype)
                for s, g in zip(sums, grads)
            ]
            return i + 1, loss_sum + loss, sums

        zeros = [tf.zeros(v.shape, v.dtype) for v in variables]
        _, loss, gradients = tf.while_loop(
            lambda i, *_: i < k,
            body,
            (tf.constant(0), tf.constant(0.0), zeros),
            # One micro-batch at a time: its activations are freed before the next one starts.
            parallel_iterations=1,
        )
        self._track_loss(loss, x)
        self.optimizer.apply_gradients(zip(gradients, variables))

    def _jax_accumulated_step(self, state, data, k, loss_fn):
        """k > 1 on JAX: Keras's stateless step `(state, data) -> (logs, state)`, the gradient
        summed over the k micro-batches in a `lax.scan` (one micro-batch's activations alive
        at a time), each micro-batch's loss divided by the whole batch's token count, so the
        sum is the whole batch's gradient (as `_accumulated_update` on TensorFlow), plus the
        model's own losses (guided alignment) averaged over the micro-batches. Dropout's seeds
        and the metrics' variables travel through the scan; the update is applied once."""
        import jax
        import jax.numpy as jnp

        if loss_fn is None:
            raise NotImplementedError(
                "gradient_accumulation_steps > 1 on JAX needs the library's loss "
                "(compile_model), whose token weights make the accumulation exact"
            )
        trainable, non_trainable, optimizer_vars, metrics_vars = state
        x, y, sample_weight = _unpack(data)
        rows = keras.tree.flatten(x)[0].shape[0]
        if rows % k:
            raise ValueError(f"a batch of {rows} rows does not split into {k} micro-batches")
        denominator = jnp.sum(loss_fn.token_weights(y, sample_weight))
        forward = functools.partial(self.stateless_call, training=True, return_losses=True)

        def split(t):  # [batch, ...] -> [k, batch / k, ...]: micro-batch i = rows i, i + k, ...
            if t is None:  # (strided, so that a device's rows under DataParallel stay its own)
                return None
            return jnp.swapaxes(jnp.reshape(t, (-1, k) + tuple(t.shape[1:])), 0, 1)

        def micro_loss(trainable, non_trainable, metrics_vars, xi, yi, wi):
            y_pred, non_trainable, added = forward(trainable, non_trainable, xi)
            losses, weights, statistics = loss_fn.call_with_statistics(yi, y_pred, wi)
            loss = ops.divide_no_nan(ops.sum(losses * weights), denominator)
            if added:
                loss = loss + ops.sum(added) / k
            mapping = list(zip(self.metrics_variables, metrics_vars))
            with keras.StatelessScope(state_mapping=mapping) as scope:
                self._update_metrics(yi, y_pred, wi, weights, statistics)
            metrics_vars = _current(scope, self.metrics_variables, metrics_vars)
            scaled = loss
            if self.optimizer is not None:
                mapping = list(zip(self.optimizer.variables, optimizer_vars))
                with keras.StatelessScope(state_mapping=mapping):
                    scaled = self.optimizer.scale_loss(loss)
            return scaled, (loss, non_trainable, metrics_vars)

        gradient = jax.value_and_grad(micro_loss, has_aux=True)

        def body(carry, micro):
            grads, loss_sum, non_trainable, metrics_vars = carry
            (_, (loss, non_trainable, metrics_vars)), g = gradient(
                trainable, non_trainable, metrics_vars, *micro
            )
            grads = jax.tree.map(jnp.add, grads, g)
            return (grads, loss_sum + loss, non_trainable, metrics_vars), None

        zeros = jax.tree.map(jnp.zeros_like, trainable)
        micro = (keras.tree.map_structure(split, x), split(y), split(sample_weight))
        start = (zeros, jnp.zeros((), "float32"), non_trainable, metrics_vars)
        (grads, loss, non_trainable, metrics_vars), _ = jax.lax.scan(body, start, micro)
        trainable, optimizer_vars = self.optimizer.stateless_apply(optimizer_vars, grads, trainable)
        mapping = list(zip(self.metrics_variables, metrics_vars))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            self._loss_tracker.update_state(loss, sample_weight=rows)
            logs = self.get_metrics_result()
        metrics_vars = _current(scope, self.metrics_variables, metrics_vars)
        return logs, (trainable, non_trainable, optimizer_vars, metrics_vars)

    def _micro_batch_loss(self, x, y, y_pred, sample_weight, loss_fn, denominator, k):
        """The loss whose gradient is this micro-batch's share of the step's gradient (already
        divided for tf.distribute); updates the metrics with this micro-batch."""
        if loss_fn is None:  # Keras's loss, a mean per micro-batch: the k means are averaged
            loss = self._compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
            self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
            return loss / k
        losses, weights, statistics = loss_fn.call_with_statistics(y, y_pred, sample_weight)
        # Keras's "mean_with_sample_weight": sum(losses * weights) / sum(weights), 0 when empty.
        loss = ops.divide_no_nan(ops.sum(losses * weights), ops.cast(denominator, "float32"))
        if self.losses:  # regularisers, once per step
            loss = loss + ops.sum(self.losses) / k
        self._update_metrics(y, y_pred, sample_weight, weights, statistics)
        return _for_distribution(loss)

    def _update_metrics(self, y, y_pred, sample_weight, weights, statistics):
        compiled = getattr(self, "_compile_metrics", None)
        if compiled is None:
            return
        if not compiled.built:
            compiled.build(y, y_pred)
        for metric in compiled.metrics:
            if statistics is not None and hasattr(metric, "update_state_from_statistics"):
                metric.update_state_from_statistics(statistics, weights)
            else:
                metric.update_state(y, y_pred, sample_weight=sample_weight)

    def _track_loss(self, loss, x):
        """The `loss` log: Keras's running mean of the (global) batch losses, weighted by rows."""
        import tensorflow as tf

        rows = tf.shape(tf.nest.flatten(x)[0])[0]
        self._loss_tracker.update_state(loss * _replicas(), sample_weight=rows)

    def _statistics_loss(self):
        """The compiled loss when it can hand statistics to the metrics, else None."""
        loss = getattr(self, "loss", None)
        if hasattr(loss, "call_with_statistics") and hasattr(loss, "token_weights"):
            return loss
        return None

    # ------------------------------------------------------------------ multi-worker training
    #
    # Keras 3's TensorFlow trainer fails under MultiWorkerMirroredStrategy (keras-team/keras#20585):
    # (1) `_maybe_symbolic_build` averages the first distributed batch across replicas with
    # `strategy.reduce`, which the collective strategy cannot do for a per-replica batch
    # ("Attempt to convert a value (PerReplica...)"); (2) the step's scalar logs are reduced with
    # `strategy.reduce("MEAN", v, axis=0)`, which fails on rank-0 tensors ("Invalid reduction
    # dimension 0"). Both are sidestepped here, and only in multi-worker mode: the model is built
    # from one local replica's batch (only shapes and dtypes matter), and step logs get a leading
    # axis of 1, so the axis-0 mean over replicas gives back the scalar.

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = getattr(self, "_distribute_strategy", None)
        if iterator is not None and _spans_workers(strategy):
            import tensorflow as tf  # only the TensorFlow trainer calls this method

            for _, _, batches in iterator:
                first = next(batches)
                data_batch = tf.nest.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0], first
                )
                break
            iterator = None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def _multi_worker_logs(self, logs):
        if keras.backend.backend() != "tensorflow" or not _spans_workers(self.distribute_strategy):
            return logs
        return {k: ops.reshape(v, (1,)) if len(ops.shape(v)) == 0 else v for k, v in logs.items()}
