"""A loss built with ``reduction="none"`` and reduced inside the user's own ``compute_loss``
(issue 29: "``none`` + a custom reduction in ``compute_loss``"), under MirroredStrategy on 2
replicas with kerasdist's mends (:func:`kerasdist._compat.apply`, as ``kerasdist.enable()``).

kerasdist cannot see how user code reduces the per-example losses; each replica's value is
taken as that replica's *mean* (docs/python-api.md, "what still differs"). These tests prove the
documented behaviour in both directions: a custom mean takes the strategy-free step; a custom
sum takes the strategy-free step divided by the replicas (one SGD step, where the update is
linear in the gradient), so the documented workaround is needed."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

pytestmark = pytest.mark.integration

REPLICAS = 2


def _model_class(reduce):
    class Reduced(keras.Sequential):
        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
            per_example = keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction="none")(y, y_pred)
            return reduce(per_example)

    return Reduced


def _one_step(strategy, reduce, steps: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Initial and trained weights of ``steps`` SGD steps on global batches of 32 (all full)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32 * steps, 8)).astype("float32")
    y = rng.integers(0, 3, 32 * steps)
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = _model_class(reduce)([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                      keras.layers.Dense(3)])
        model.compile(keras.optimizers.SGD(0.05))
    before = [w.copy() for w in model.get_weights()]
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    return before, model.get_weights()


@pytest.fixture(scope="module", autouse=True)
def mends():
    from kerasdist import _compat

    _compat.apply()


def _mirrored():
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])


def test_a_custom_mean_in_compute_loss_takes_the_strategy_free_steps():
    reference = _one_step(tf.distribute.get_strategy(), keras.ops.mean, steps=4)[1]
    mirrored = _one_step(_mirrored(), keras.ops.mean, steps=4)[1]
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(reference, mirrored, strict=True))
    assert diff < 1e-5, diff


def test_a_custom_sum_in_compute_loss_takes_the_step_divided_by_the_replicas():
    before, reference = _one_step(tf.distribute.get_strategy(), keras.ops.sum, steps=1)
    before_m, mirrored = _one_step(_mirrored(), keras.ops.sum, steps=1)
    for a, b in zip(before, before_m, strict=True):
        np.testing.assert_array_equal(a, b)  # same initial weights
    for w0, ref, mir in zip(before, reference, mirrored, strict=True):
        np.testing.assert_allclose(mir - w0, (ref - w0) / REPLICAS, rtol=1e-4, atol=1e-6)
    moved = max(float(np.max(np.abs(r - w))) for r, w in zip(reference, before, strict=True))
    assert moved > 1e-3, moved  # the step is not too small to tell the two apart
