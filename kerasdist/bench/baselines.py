"""Baselines for ``kerasdist bench``, each run in its own process on the recipe's model and data.

* ``plain_keras``: what a Keras 3 user writes without kerasdist: ``model.fit(x, y, batch_size=B)``
  on NumPy arrays in one process.
* ``raw_step``: a hand-written ``tf.function`` training step (``GradientTape`` + ``optimizer.apply``,
  the batch taken from the iterator inside the graph) over kerasdist's tf.data pipeline; no Keras
  ``fit`` machinery at all — the closest practical limit for this model on this hardware.

Both time steps exactly as kerasdist does (:class:`~kerasdist.keras.timing.StepClock`:
examples/s over steps 2..n of every epoch) and record the held-out accuracy after every epoch and
the seconds from the start of training to the end of that epoch.

Run: ``python -m kerasdist.bench.baselines {plain_keras,raw_step} RECIPE OUT.json``.
"""

from __future__ import annotations

import sys
import time

import numpy as np


def _setup(recipe):
    import keras

    from kerasdist.data import load_split
    from kerasdist.training.model import build_compiled_model

    keras.utils.set_random_seed(recipe.trainer.seed)
    train = load_split(recipe.data, recipe.data.train_split)
    held_out = load_split(recipe.data, recipe.data.eval_split)
    return build_compiled_model(recipe), train, held_out


def _as_float(x):
    if x.dtype == np.uint8:
        x = (x.astype(np.float32) / 255.0)[..., None]
    return x


def plain_keras(recipe) -> dict:
    """Plain Keras 3 ``model.fit`` on NumPy arrays, one process."""
    from kerasdist.keras.callbacks import ThroughputMeter

    model, (x, y), (ex, ey) = _setup(recipe)
    batch = recipe.data.batch_size
    keep = len(x) // batch * batch  # full batches only, as kerasdist's pipeline does
    meter = ThroughputMeter(batch)
    start = time.perf_counter()
    hist = model.fit(_as_float(x[:keep]), y[:keep], batch_size=batch, epochs=recipe.trainer.epochs,
                     steps_per_epoch=recipe.trainer.steps_per_epoch,
                     validation_data=(_as_float(ex), ey), shuffle=True, verbose=0,
                     callbacks=[meter])
    return {"throughput": meter.summary(), "wall_time_s": time.perf_counter() - start,
            "val_accuracy": [float(v) for v in hist.history.get("val_accuracy", [])],
            "val_loss": [float(v) for v in hist.history.get("val_loss", [])],
            "final_accuracy": float(hist.history["val_accuracy"][-1])}


def raw_step(recipe) -> dict:
    """A hand-written ``tf.function`` step over the tf.data pipeline (no ``fit``)."""
    import tensorflow as tf

    from kerasdist.data import make_dataset_fn
    from kerasdist.keras.timing import StepClock
    from kerasdist.models import registry
    from kerasdist.training.model import make_loss

    model, (x, y), (ex, ey) = _setup(recipe)
    loss_fn = make_loss(registry.resolve(recipe.model.name).loss)
    optimizer = model.optimizer
    batch = recipe.data.batch_size
    data = recipe.data
    steps_per_epoch = recipe.trainer.steps_per_epoch or len(x) // batch
    train_iter = iter(make_dataset_fn(x, y, global_batch_size=batch, training=True, repeat=True,
                                      shuffle_buffer=data.shuffle_buffer, seed=data.shuffle_seed)())
    eval_ds = make_dataset_fn(ex, ey, global_batch_size=batch, training=False)()

    @tf.function
    def train_step(iterator):
        # The batch is taken inside the graph, as Keras's own train function does: no eager
        # GetNext and no feeding of host tensors between steps.
        images, labels = next(iterator)
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    @tf.function
    def correct(images, labels):
        predicted = tf.argmax(model(images, training=False), axis=-1)
        return tf.reduce_sum(tf.cast(predicted == tf.cast(labels, predicted.dtype), tf.int64))

    clock, accuracies = StepClock(batch), []
    start = time.perf_counter()
    clock.train_begin()
    for _ in range(recipe.trainer.epochs):
        clock.epoch_begin()
        for _ in range(steps_per_epoch):
            # .numpy(): wait for the step, as fit does when a callback reads the batch logs.
            train_step(train_iter).numpy()
            clock.step_end()
        hits = sum(int(correct(i, lab)) for i, lab in eval_ds)
        accuracies.append(hits / len(ex))
        clock.epoch_end()
    return {"throughput": clock.summary(), "wall_time_s": time.perf_counter() - start,
            "val_accuracy": accuracies, "final_accuracy": accuracies[-1]}


BASELINES = {"plain_keras": plain_keras, "raw_step": raw_step}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    name, recipe_path, out_path = argv
    from kerasdist.bench.runner import write_result
    from kerasdist.config import load_recipe

    return write_result(BASELINES[name](load_recipe(recipe_path)), out_path)


if __name__ == "__main__":
    sys.exit(main())
