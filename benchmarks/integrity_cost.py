"""What the integrity checks cost: seconds per GB to checksum prepared shards and a checkpoint.

`train` and `prepare` read every prepared shard at start (`data.prepare.verify_shards`: size and
sha256 against the manifest); a step checkpoint is hashed once when written and once when
averaged or exported (`integrity.file_digest`). This writes `--mb` MB of random shards into a
temporary directory (on the disk of `--dir`, default the system's temporary directory), then
times the verification twice: `cold` right after writing (mostly the page cache on Linux: drop
caches first for a true cold read) and `warm`. Prints one JSON line per figure.

Run alone on an idle machine:

    PYTHONPATH=. python benchmarks/integrity_cost.py --mb 1024
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import emit  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024, help="total size of the shards in MB")
    parser.add_argument("--shards", type=int, default=16, help="number of shard files")
    parser.add_argument("--dir", default=None, help="where to write them (default: tmp)")
    args = parser.parse_args(argv)

    import tensorflow as tf  # loaded before the timing (the checks read through tf.io.gfile)

    from keras_transformer.data.prepare import verify_shards
    from keras_transformer.integrity import file_digest

    tf.io.gfile.exists(".")

    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        per_shard = args.mb * (1 << 20) // args.shards
        manifest = {"shards": []}
        for i in range(args.shards):
            name = f"train-{i:05d}-of-{args.shards:05d}.tfrecord"
            with open(os.path.join(directory, name), "wb") as f:
                for offset in range(0, per_shard, 1 << 24):
                    f.write(os.urandom(min(1 << 24, per_shard - offset)))
            manifest["shards"].append({"file": name})
        start = time.perf_counter()
        for shard in manifest["shards"]:  # what prepare records of each shard it writes
            shard["bytes"], shard["sha256"] = file_digest(os.path.join(directory, shard["file"]))
        write_seconds = time.perf_counter() - start
        gigabytes = sum(s["bytes"] for s in manifest["shards"]) / 1e9
        emit(
            benchmark="integrity_cost",
            what="checksum_at_prepare",
            gigabytes=round(gigabytes, 3),
            seconds=round(write_seconds, 3),
            seconds_per_gb=round(write_seconds / gigabytes, 3),
        )
        for run in ("cold", "warm"):
            start = time.perf_counter()
            verify_shards(directory, manifest)
            seconds = time.perf_counter() - start
            emit(
                benchmark="integrity_cost",
                what=f"verify_at_train_start_{run}",
                gigabytes=round(gigabytes, 3),
                seconds=round(seconds, 3),
                seconds_per_gb=round(seconds / gigabytes, 3),
            )


if __name__ == "__main__":
    main()
