"""Sparse gradients (an ``Embedding``'s ``tf.IndexedSlices``) under 2 mirrored replicas with
kerasdist's mends give the strategy-free weights, for every Keras optimizer that takes them
(issue 40, item 1: Adam on an Embedding ended 133x away once kerasdist's mends divided a sparse
gradient into a dense one, so Adam moved the rows the batch did not touch).

Same initial weights, same global batches (NumPy input, ``shuffle=False``), a dataset many
batches long; variants: a partial last batch, and per-example sample weights (the weighted-mean
path of :mod:`kerasdist._compat.keras_replica_apply`). The comparison is of the final weights."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

OPTIMIZERS = {
    "adam": {"learning_rate": 0.01},
    "adamw": {"learning_rate": 0.01},
    "adamax": {"learning_rate": 0.01},
    "nadam": {"learning_rate": 0.01},
    "rmsprop": {"learning_rate": 0.01},
    "adagrad": {"learning_rate": 0.05},
    "adadelta": {"learning_rate": 1.0},
    "ftrl": {"learning_rate": 0.05},
    "lion": {"learning_rate": 0.001},
    "adafactor": {"learning_rate": 0.01},
    "sgd": {"learning_rate": 0.05, "momentum": 0.9},
}


@pytest.fixture(scope="module", autouse=True)
def mends():
    from kerasdist import _compat

    _compat.apply()


def _data(examples: int, weighted: bool):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 200, size=(examples, 10)).astype("int32")
    y = rng.integers(0, 4, size=(examples,))
    w = rng.uniform(0.2, 2.0, size=(examples,)).astype("float32") if weighted else None
    return x, y, w


def _train(strategy, optimizer: str, *, examples: int = 384, weighted: bool = False):
    x, y, w = _data(examples, weighted)
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((10,), dtype="int32"),
                                  keras.layers.Embedding(200, 8),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(4)])
        model.compile(optimizer=keras.optimizers.get({"class_name": optimizer,
                                                      "config": OPTIMIZERS[optimizer]}),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, sample_weight=w, batch_size=32, epochs=3, shuffle=False, verbose=0)
    return [v.numpy() for v in model.weights]


def _mirrored():
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _assert_same(single, mirrored):
    for a, b in zip(single, mirrored, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


SUITE = ("adam", "rmsprop", "sgd")
"""In the README suite; the other optimizers run in the extended tier (about 8 s each)."""


@pytest.mark.parametrize("optimizer", [
    name if name in SUITE else pytest.param(name, marks=pytest.mark.extended)
    for name in sorted(OPTIMIZERS)])
def test_sparse_gradients_give_the_strategy_free_weights(optimizer):
    single = _train(tf.distribute.get_strategy(), optimizer)
    mirrored = _train(_mirrored(), optimizer)
    _assert_same(single, mirrored)


@pytest.mark.parametrize("variant", ["partial_last_batch", "sample_weight"])
def test_adam_on_an_embedding_with_a_partial_batch_or_sample_weights(variant):
    kwargs = {"examples": 400} if variant == "partial_last_batch" else {"weighted": True}
    single = _train(tf.distribute.get_strategy(), "adam", **kwargs)
    mirrored = _train(_mirrored(), "adam", **kwargs)
    _assert_same(single, mirrored)
