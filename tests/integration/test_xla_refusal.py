"""``jit_compile=True`` under 2 mirrored replicas on CPU is refused before the first step, naming
the cause and the choices (issue 40, item 3); the default ``"auto"`` and one process train."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasdist.errors import UnsupportedFeatureError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module", autouse=True)
def enabled():
    import kerasdist

    kerasdist.enable()


@pytest.fixture(autouse=True)
def no_op_determinism():
    """Keras turns ``jit_compile=True`` off while TF's op determinism is on (an earlier test of
    the same process may have turned it on: ``trainer.deterministic``); off here, then restored."""
    from kerasdist._compat import internals

    was = internals.op_determinism(False)
    yield
    internals.op_determinism(was)


def _model(strategy, jit_compile):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile("sgd", "mse", jit_compile=jit_compile)
    return model


def test_jit_compile_under_two_mirrored_cpu_replicas_is_refused_before_training():
    model = _model(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), True)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(UnsupportedFeatureError, match=r"jit_compile=True.*MirroredStrategy.*"
                                                      r"jit_compile=False.*Received"):
        model.fit(np.ones((64, 4)), np.ones((64, 2)), epochs=1, verbose=0)
    for a, b in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mirrored, jit_compile", [(True, "auto"), (False, True)])
def test_auto_under_mirrored_and_xla_in_one_process_train(mirrored, jit_compile):
    strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if mirrored
                else tf.distribute.get_strategy())
    model = _model(strategy, jit_compile)
    history = model.fit(np.ones((64, 4)), np.ones((64, 2)), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
