"""Bench: the embedding recipe's click model on 1, 2 and 4 ps, kerasdist (Keras 3) vs tf_keras.

Both train the same model (``kerasdist.models.recommender.click_model``, rebuilt layer for layer
in tf_keras), on the same synthetic click logs, with the same partitioner
(``MinSizePartitioner(min_shard_bytes=256 KiB, max_shards=N)``), Adam, global batch 256, on an
in-process cluster of 2 workers and N ps started afresh in a subprocess per configuration. The
figure is the second epoch's steps per second (the first holds tracing and variable creation;
tf_keras's PS ``fit`` allows no batch callbacks, so both are timed per epoch by the same
callback). Configurations run round-robin, ``--repeats`` times; only ratios from one run count.

Run: ``python tools/embedding_ps_bench.py [--ps 1,2,4] [--repeats 2] [--steps 60]
[--items 1048576]``; needs ``tf-keras`` (``pip install .[bench]``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

DIM, USERS, BATCH, EXAMPLES = 32, 4096, 256, 100_000


def _tf_keras_model(tf, items: int):
    layers = tf.keras.layers
    ids = tf.keras.Input(shape=(2,), dtype="int64")
    users = layers.Embedding(USERS, DIM)(ids[:, 0])
    item_rows = layers.Embedding(items, DIM)(ids[:, 1])
    hidden = layers.Dense(64, activation="relu")(layers.Concatenate()([users, item_rows]))
    return tf.keras.Model(ids, layers.Dense(1, activation="sigmoid")(hidden))


def one(impl: str, num_ps: int, steps: int, items: int) -> dict:
    """Train 2 epochs of ``steps`` steps; return the second epoch's steps/s."""
    import tensorflow as tf

    from kerasdist.cluster.inprocess import start_inprocess_cluster
    from kerasdist.data import make_dataset_fn
    from kerasdist.data.readers import synthetic_clicks

    x, y = synthetic_clicks("train", num_examples=EXAMPLES, num_users=USERS, num_items=items,
                            seed=42)
    train_fn = make_dataset_fn(x, y, global_batch_size=BATCH, training=True, repeat=True)
    cluster = start_inprocess_cluster(num_workers=2, num_ps=num_ps)
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=256 << 10, max_shards=num_ps)
    strategy = tf.distribute.ParameterServerStrategy(cluster.cluster_resolver,
                                                     variable_partitioner=partitioner)
    if impl == "tf_keras":
        keras = tf.keras
        with strategy.scope():
            model = _tf_keras_model(tf, items)
            model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy")
        data = keras.utils.experimental.DatasetCreator(train_fn)
    else:
        import keras

        import kerasdist
        from kerasdist.models.recommender import click_model

        kerasdist.enable()
        with strategy.scope():
            model = click_model(num_users=USERS, num_items=items, dim=DIM)
            model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy",
                          steps_per_execution=1)
        data = train_fn
    seconds: list[float] = []

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.began = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds.append(time.perf_counter() - self.began)

    model.fit(data, epochs=2, steps_per_epoch=steps, verbose=0, callbacks=[EpochTimer()])
    return {"impl": impl, "ps": num_ps, "steps_per_sec": steps / seconds[1],
            "first_epoch_s": seconds[0]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps", default="1,2,4", help="ps counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60, help="steps per epoch (2 epochs)")
    parser.add_argument("--items", type=int, default=1_048_576, help="item-table rows")
    parser.add_argument("--one", nargs=2, metavar=("IMPL", "PS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.steps, args.items)), flush=True)
        os._exit(0)  # in-process servers cannot be stopped
    results: dict[tuple[str, int], list[float]] = {}
    counts = [int(n) for n in args.ps.split(",")]
    for _ in range(args.repeats):
        for num_ps in counts:
            for impl in ("kerasdist", "tf_keras"):
                env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                           TF_USE_LEGACY_KERAS="1" if impl == "tf_keras" else "0")
                done = subprocess.run(
                    [sys.executable, __file__, "--one", impl, str(num_ps), "--steps",
                     str(args.steps), "--items", str(args.items)],
                    capture_output=True, text=True, env=env, timeout=900)
                lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
                if done.returncode != 0 or not lines:
                    print(f"{impl} ps={num_ps}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                    return 1
                rate = json.loads(lines[-1])["steps_per_sec"]
                results.setdefault((impl, num_ps), []).append(rate)
                print(f"{impl:9s} ps={num_ps}: {rate:.2f} steps/s", flush=True)
    print("\n| ps | kerasdist steps/s | tf_keras steps/s | kerasdist / tf_keras |")
    print("| ---: | --- | --- | ---: |")
    for num_ps in counts:
        ours, theirs = results[("kerasdist", num_ps)], results[("tf_keras", num_ps)]
        print(f"| {num_ps} | {statistics.median(ours):.2f} [{min(ours):.2f}-{max(ours):.2f}] | "
              f"{statistics.median(theirs):.2f} [{min(theirs):.2f}-{max(theirs):.2f}] | "
              f"{statistics.median(ours) / statistics.median(theirs):.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
