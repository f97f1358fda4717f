"""``model.fit(callbacks=[OrbaxCheckpoint(...)])`` after ``kerasdist.enable()`` under
``MultiWorkerMirroredStrategy`` is refused by name, with what to use instead (the rule a recipe's
``callbacks`` follow: ``tests/unit/test_single_process_savers.py``)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasdist.errors import UnsupportedFeatureError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class _Orbax(keras.callbacks.OrbaxCheckpoint):
    """An ``OrbaxCheckpoint`` that needs no orbax package (it never saves here)."""

    def __init__(self):
        keras.callbacks.Callback.__init__(self)


def _fit(strategy, callbacks=None):
    """Fit a tiny model under ``strategy`` with ``callbacks(model)`` (default ``[_Orbax()]``)."""
    import kerasdist

    kerasdist.enable()
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    x, y = np.ones((8, 4), np.float32), np.ones((8, 1), np.float32)
    return model.fit(x, y, batch_size=4, epochs=1, verbose=0,
                     callbacks=[_Orbax()] if callbacks is None else callbacks(model))


def test_orbax_checkpoint_under_multi_worker_is_refused_by_name():
    with pytest.raises(UnsupportedFeatureError, match=(
            r"model.fit\(callbacks=...\): OrbaxCheckpoint is not accepted under strategy "
            r"'multi_worker'.*ModelCheckpoint \(written by the chief only\)")):
        _fit(tf.distribute.MultiWorkerMirroredStrategy())



@pytest.mark.parametrize("saver", [False, True], ids=["keras-callbacks", "orbax"])
def test_a_callback_list_is_read_as_keras_reads_it(saver):
    # Keras's fit takes a keras.callbacks.CallbackList as well as a list
    def callbacks(model):
        if saver:  # refused before it is used: no model set on it
            return keras.callbacks.CallbackList([_Orbax()])
        return keras.callbacks.CallbackList([], add_history=True, model=model)

    if saver:
        with pytest.raises(UnsupportedFeatureError, match="OrbaxCheckpoint is not accepted"):
            _fit(tf.distribute.MultiWorkerMirroredStrategy(), callbacks)
    else:  # trains (it raised TypeError: 'CallbackList' object is not iterable)
        assert _fit(tf.distribute.MultiWorkerMirroredStrategy(), callbacks).history["loss"]
