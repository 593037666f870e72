"""`keras-transformer train` and `prepare`: from a config (`--config` with its `--set`
overrides) to a workdir, one run per workdir at a time (`workdir_lock`); `prepare` runs
`keras_transformer.data.prepare` and `train` runs `keras_transformer.training.train`."""

import contextlib

from keras_transformer.commands import startup
from keras_transformer.workdir import Workdir


def prepare_command(args):
    """`keras-transformer prepare --config FILE [--workdir DIR] [--set KEY=VALUE ...]`."""
    config = load_command_config(args)
    from keras_transformer.data.prepare import prepare

    # TensorFlow: the lock is written with tf.io.gfile.
    startup.import_tensorflow(getattr(args, "verbose", False))
    from keras_transformer.training.run.init_from import prepare_parent

    with workdir_lock(config, "prepare"):
        prepare_parent(config)  # train.init_from: the parent's vocabulary
        manifest = prepare(config)
    layout = Workdir.of(config)
    counts = manifest["counts"]
    print(
        f"{layout.prepared}: {counts['written']} pairs in {len(manifest['shards'])} shards; "
        f"vocabulary {layout.spm}"
    )


def train_command(args):
    """`keras-transformer train --config FILE [--workdir DIR] [--init-from PATH] [--set KEY=VALUE
    ...]`."""
    # The config is checked before TensorFlow is imported: config mistakes fail in a blink.
    config = load_command_config(args)
    import keras

    if keras.backend.backend() == "jax":  # the JAX engine needs no TensorFlow
        from keras_transformer.training.engines.jax_engine import join_processes

        chief = join_processes(config.runtime)[0] == 0  # several processes: joined here
    else:
        startup.import_tensorflow(getattr(args, "verbose", False))
        from keras_transformer.training.engines.distribute import is_chief

        chief = is_chief()
    from keras_transformer.training import train

    # The workers (processes) of a multi-worker job share the chief's lock.
    with workdir_lock(config, "train") if chief else contextlib.nullcontext():
        train(config)


def load_command_config(args):
    """The config of `train` and `prepare`: `--config` with each `--set`, then `--workdir` and
    `--init-from` as the last overrides of `runtime.workdir` and `train.init_from`; validated as
    a whole, never changed after."""
    from keras_transformer.config import load_config

    config = load_config(args.config, overrides=args.set)  # every --set value is checked
    # The flags win over `--set runtime.workdir=...` (`train.init_from`), as the more specific.
    flags = [("runtime.workdir", args.workdir)]
    flags.append(("train.init_from", getattr(args, "init_from", None)))
    flags = [flag for flag in flags if flag[1] is not None]
    if not flags:
        return config
    return load_config(args.config, overrides=[*args.set, *flags])


def workdir_lock(config, command):
    """The lock on the config's workdir (`keras_transformer.lock.WorkdirLock`, a lease of
    `runtime.lock_lease_seconds`): one `train` or `prepare` at a time; a second one exits 2
    naming the holder."""
    from keras_transformer.lock import WorkdirLock

    return WorkdirLock(Workdir.of(config).root, command, config.runtime.lock_lease_seconds)
