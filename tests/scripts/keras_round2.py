"""Five ordinary Keras 3 scripts in one (issue 29), run strategy-free or under ``kerasdist launch``.

Usage: ``python keras_round2.py OUT_DIR`` writes ``OUT_DIR/result-<task>.json`` with, per part:
``metrics`` (evaluate of AUC/Precision/Recall built outside the scope, on 2,048 shuffled
examples), ``spe`` (``steps_per_execution=4``, 18 batches: a partial last group),
``reduction_<r>`` (every loss reduction, 12.5 batches: a partial last batch, sample weights),
``shuffle`` (a seeded, reshuffled dataset, plain and ``repeat()`` + ``steps_per_epoch``) and
``save`` (``model.save``/``save_weights``/``export`` then loads, five times over). Weights are
summarised as per-variable sums of absolute values, history as Keras's.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import keras
import numpy as np
import tensorflow as tf

OUT = sys.argv[1]
STRATEGY = (tf.distribute.MultiWorkerMirroredStrategy() if "TF_CONFIG" in os.environ
            else tf.distribute.get_strategy())
TASK = json.loads(os.environ.get("TF_CONFIG", '{"task": {"type": "main", "index": 0}}'))["task"]


def summary(model, history=None) -> list[float]:
    return ([float(np.abs(w).sum()) for w in model.get_weights()]
            + (list(history.history.get("loss", [])) if history else []))


def scce(**kwargs):
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, **kwargs)


def metrics_part() -> dict:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 12, 12, 1)).astype("float32")
    y = (x[:, :6].mean(axis=(1, 2, 3)) > 0).astype("float32")
    keras.utils.set_random_seed(7)
    metrics = [keras.metrics.AUC(), keras.metrics.Precision(), keras.metrics.Recall()]  # outside
    with STRATEGY.scope():
        model = keras.Sequential([keras.Input((12, 12, 1)), keras.layers.Flatten(),
                                  keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer="adam", loss="binary_crossentropy", metrics=metrics)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048, seed=1).batch(64, drop_remainder=True)
    model.fit(ds.repeat(), epochs=2, steps_per_epoch=16, verbose=0)
    return {"evaluate": model.evaluate(ds, verbose=0, return_dict=True),
            "weights": summary(model)}


def spe_part() -> dict:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = (x.sum(1) > 0).astype("int64")
    keras.utils.set_random_seed(1)
    with STRATEGY.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss=scce(), metrics=["accuracy"],
                      steps_per_execution=4)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(30)
    history = model.fit(ds, epochs=2, verbose=0)
    return {"weights": summary(model, history), "evaluate": model.evaluate(ds, verbose=0)}


def reduction_part(reduction: str, weighted: bool) -> dict:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 3, size=400).astype("int64")
    w = rng.uniform(0.2, 2.0, size=400).astype("float32")
    keras.utils.set_random_seed(3)
    with STRATEGY.scope():
        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3),
                                  keras.layers.Flatten(), keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.SGD(0.002), loss=scce(reduction=reduction))
    parts = (x, y, w) if weighted else (x, y)
    history = model.fit(tf.data.Dataset.from_tensor_slices(parts).batch(32), epochs=2, verbose=0)
    return {"weights": summary(model, history)}


def shuffle_part(repeat: bool) -> dict:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(768, 8)).astype("float32")
    y = rng.integers(0, 3, size=768).astype("int64")
    keras.utils.set_random_seed(5)
    with STRATEGY.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=scce())
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(768, seed=1).batch(64, drop_remainder=True)
    if repeat:
        history = model.fit(ds.repeat(), epochs=2, steps_per_epoch=12, verbose=0)
    else:
        history = model.fit(ds, epochs=2, verbose=0)
    return {"weights": summary(model, history)}


def sparse_part(optimizer: str) -> dict:
    """An Embedding (sparse gradients) with Adam or RMSprop (issue 40, item 1)."""
    rng = np.random.default_rng(5)
    x = rng.integers(0, 200, size=(384, 10)).astype("int32")
    y = rng.integers(0, 4, size=384).astype("int64")
    with STRATEGY.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((10,), dtype="int32"), keras.layers.Embedding(200, 8),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(4)])
        model.compile(optimizer=keras.optimizers.get({"class_name": optimizer,
                                                      "config": {"learning_rate": 0.01}}),
                      loss=scce())
    history = model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)
    return {"weights": summary(model, history)}


def save_part() -> dict:
    x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    y = (x.sum(1) > 0).astype("int64")
    with STRATEGY.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(optimizer="adam", loss=scce())
    model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    folder = os.path.join(OUT, "saved")
    os.makedirs(folder, exist_ok=True)
    expected = model.predict(x[:4], verbose=0)
    for _ in range(5):
        model.save(os.path.join(folder, "model.keras"))
        model.save_weights(os.path.join(folder, "w.weights.h5"))
        model.export(os.path.join(folder, "sm"))
        loaded = keras.models.load_model(os.path.join(folder, "model.keras"))
        np.testing.assert_allclose(loaded.predict(x[:4], verbose=0), expected, rtol=1e-5)
        clone = keras.models.clone_model(model)
        clone.load_weights(os.path.join(folder, "w.weights.h5"))
        tf.saved_model.load(os.path.join(folder, "sm"))
    own = tempfile.mkdtemp(prefix="round2-own-")  # each task's own folder: a disk of its own
    try:
        for _ in range(2):
            model.save(os.path.join(own, "m.keras"))
            model.save_weights(os.path.join(own, "w.weights.h5"))
            model.export(os.path.join(own, "sm"))
            loaded = keras.models.load_model(os.path.join(own, "m.keras"))
            np.testing.assert_allclose(loaded.predict(x[:4], verbose=0), expected, rtol=1e-5)
            clone = keras.models.clone_model(model)
            clone.load_weights(os.path.join(own, "w.weights.h5"))
            tf.saved_model.load(os.path.join(own, "sm"))
        own_files = sorted(os.listdir(own))
    finally:
        shutil.rmtree(own, ignore_errors=True)
    return {"files": sorted(os.listdir(folder)), "own_files": own_files}


def main() -> None:
    result = {"metrics": metrics_part(), "spe": spe_part(),
              "shuffle": shuffle_part(False), "shuffle_repeat": shuffle_part(True),
              "sparse_adam": sparse_part("adam"), "sparse_rmsprop": sparse_part("rmsprop")}
    for reduction in ("sum", "sum_over_batch_size", "mean_with_sample_weight"):
        for weighted in (False, True):
            result[f"reduction_{reduction}_{int(weighted)}"] = reduction_part(reduction, weighted)
    if STRATEGY.num_replicas_in_sync > 1 or "TF_CONFIG" not in os.environ:
        result["save"] = save_part()
    name = f"result-{TASK['type']}-{TASK['index']}.json"
    with open(os.path.join(OUT, name), "w") as sink:
        json.dump(result, sink, default=float)


if __name__ == "__main__":
    main()
