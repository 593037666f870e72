"""The engines a training run runs on: what differs between Keras's TensorFlow and JAX backends.

The run (`training.run`) is one, whatever the backend; it asks its engine, made once per run by
`engine_for(runtime)` (the `runtime:` section), for these and nothing else:

- `backend` ("tensorflow" or "jax"), `strategy` (`scope()`, where the model is built, and
  `num_replicas_in_sync`), `strategy_name`, `chief` (this process writes the workdir),
  `several_workers`, `exports` (the run ends with a SavedModel), `decodes_while_training`
  (the chief's dev evaluation after each epoch);
- the workers' agreements: `heartbeat(path)` (around the chief's preparation),
  `agreement()` (the chief's value everywhere), `any_worker()` (any worker's flag),
  `lost_peers(error)` (a failed `fit` means a worker is gone), `end_training()` (after `fit`,
  on every worker);
- `jit_compile(value)`: `runtime.jit_compile` as a bool;
- the data: `prepare(config, layout)` (the chief's) and `wait_for_prepared(config, layout,
  heartbeat)` (another worker's);
- the resume state: `backup_directory(backup)` (a context giving where this worker writes it),
  `restore(model, data, run_state, backup, every, keep, write_directory)` -> `(resume,
  batches)` (a `run.callbacks.ResumeCallback`, restored, and what `fit` trains on from its
  data position) and `has_resume_state(directory)`.

The TensorFlow engine is `engines.strategies` (one input object per `tf.distribute` strategy:
`tf.data` batches, a `tf.train.Checkpoint` resume state, `engines.tf_state`); the JAX engine is
`engines.jax_engine` (numpy batches, an npz resume state, `keras.distribution`).
"""


def engine_for(runtime):
    """The engine of the backend Keras runs, for the `runtime:` section `runtime`: on
    TensorFlow its strategy is made first (multi-worker and TPU set-ups must precede any device
    use)."""
    import keras

    if keras.backend.backend() == "jax":
        from keras_transformer.training.engines.jax_engine import JaxEngine

        return JaxEngine(runtime)
    from keras_transformer.training.engines.distribute import get_strategy
    from keras_transformer.training.engines.strategies import strategy_input

    return strategy_input(get_strategy(runtime))
