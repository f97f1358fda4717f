"""tf_keras (Keras 2) baseline: its own ``ParameterServerStrategy`` / ``MultiWorkerMirroredStrategy``
``fit`` on the seed CNN and the recipe's data — the tool Keras 3 users are told to fall back to.

Runs in a process started with ``TF_USE_LEGACY_KERAS=1`` (so ``tf.keras`` is tf_keras 2.x) and
``TF_CONFIG`` naming its task; needs the optional ``tf-keras`` package (``pip install .[bench]``).

Run: ``python -m kerasdist.bench.tfkeras_job {parameter_server,multi_worker} RECIPE OUT.json``.
Only the chief (PS coordinator, or MWMS worker 0) writes ``OUT.json``.
"""

from __future__ import annotations

import os
import sys
import time

from kerasdist.bench.runner import is_coordinator, write_result
from kerasdist.bench.scaling_job import epoch_timer


def _model(tf, recipe):
    layers = tf.keras.layers
    dropout = recipe.model.params.get("dropout", 0.5)
    return tf.keras.Sequential([
        tf.keras.Input(shape=(28, 28, 1)),
        layers.Conv2D(32, 5, padding="same", activation="relu"), layers.MaxPooling2D(2),
        layers.Conv2D(64, 5, padding="same", activation="relu"), layers.MaxPooling2D(2),
        layers.Flatten(), layers.Dense(1024, activation="relu"), layers.Dropout(dropout),
        layers.Dense(10)])


def _meter(tf, batch):
    """A tf_keras callback driving kerasdist's own :class:`StepClock` (same timing rule)."""
    from kerasdist.keras.timing import StepClock

    class Meter(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.clock = StepClock(batch)

        def on_train_begin(self, logs=None):
            self.clock.train_begin()

        def on_epoch_begin(self, epoch, logs=None):
            self.clock.epoch_begin()

        def on_train_batch_end(self, batch_index, logs=None):
            self.clock.step_end()

        def on_epoch_end(self, epoch, logs=None):
            self.clock.epoch_end()

        def summary(self):
            return self.clock.summary()

    return Meter()


def run(kind: str, recipe) -> dict | None:
    import tensorflow as tf

    from kerasdist.cluster.spec import parse_tf_config
    from kerasdist.data import build_datasets

    tf_config = parse_tf_config(os.environ.get("TF_CONFIG"))
    data = build_datasets(recipe.data, repeat_train=True)
    steps = recipe.trainer.steps_per_epoch or data.steps_per_epoch
    if is_coordinator(kind):
        strategy = tf.distribute.ParameterServerStrategy(tf_config.cluster_resolver())
        train = tf.keras.utils.experimental.DatasetCreator(data.train_fn)
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=tf_config.cluster_resolver())
        train = strategy.distribute_datasets_from_function(data.train_fn)
    with strategy.scope():
        model = _model(tf, recipe)
        model.compile(optimizer=tf.keras.optimizers.Adam(recipe.optimizer.learning_rate),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    start = time.perf_counter()
    if is_coordinator(kind):
        # tf_keras refuses batch-level callbacks under ParameterServerStrategy: time whole epochs
        # (no validation inside fit), excluding the first (tracing); evaluate once at the end.
        timer = epoch_timer(tf.keras.callbacks.Callback)
        model.fit(train, epochs=recipe.trainer.epochs, steps_per_epoch=steps, verbose=0,
                  callbacks=[timer])
        # Evaluate on a local copy of the trained weights (read from the ps): tf_keras's own
        # evaluate under ParameterServerStrategy can be cancelled remotely.
        local = _model(tf, recipe)
        local.set_weights(model.get_weights())
        local.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        final = float(local.evaluate(data.eval_fn(), verbose=0, return_dict=True)["accuracy"])
        return {"throughput": _epoch_summary(timer, recipe.data.batch_size * steps),
                "wall_time_s": time.perf_counter() - start, "val_accuracy": [], "final_accuracy": final,
                "note": "epoch-level timing (tf_keras PS allows no batch callbacks)"}
    meter = _meter(tf, recipe.data.batch_size)
    hist = model.fit(train, epochs=recipe.trainer.epochs, steps_per_epoch=steps,
                     validation_data=data.eval_fn(), callbacks=[meter], verbose=0)
    if not tf_config.is_chief:
        return None
    val = [float(v) for v in hist.history.get("val_accuracy", [])]
    return {"throughput": meter.summary(), "wall_time_s": time.perf_counter() - start,
            "val_accuracy": val, "final_accuracy": val[-1] if val else None}


def _epoch_summary(timer, examples_per_epoch: int) -> dict:
    """examples/s over epochs 2..n of an :func:`~kerasdist.bench.scaling_job.epoch_timer`
    (epoch 1 holds the tracing)."""
    timed = timer.seconds[1:]
    seconds = sum(timed)
    rate = len(timed) * examples_per_epoch / seconds if seconds else 0.0
    return {"examples_per_sec": rate, "timed_steps": None, "timed_seconds": seconds,
            "timed_epochs": len(timed), "epoch_end_s": timer.ends}


def main(argv=None) -> int:
    kind, recipe_path, out_path = sys.argv[1:] if argv is None else argv
    from kerasdist.config import load_recipe

    return write_result(run(kind, load_recipe(recipe_path)), out_path)


if __name__ == "__main__":
    sys.exit(main())

