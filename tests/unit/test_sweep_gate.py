"""The prune gate inside a trial (:mod:`kerasdist.sweep.gate`) on a real Keras ``fit``: an epoch cut
short by a stop reports no value and waits for nothing; a trial the driver stopped does not wait
for a decision, and a decision written before stands."""

from __future__ import annotations

import json
import time

import keras
import numpy as np
import pytest

from kerasdist.sweep import gate


class StopAt(keras.callbacks.Callback):
    """Sets ``model.stop_training`` after batch ``batch`` of epoch ``epoch`` (0-based), after the
    gate, as the training loop's agreed stop on SIGTERM does."""

    def __init__(self, epoch: int, batch: int):
        super().__init__()
        self.at, self.epoch = (epoch, batch), -1

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            self.model.stop_training = True


def _fit(callbacks) -> None:
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.linspace(-1, 1, 64, dtype="float32").reshape(-1, 1)
    model.fit(x, 2 * x, batch_size=4, epochs=2, steps_per_epoch=4, validation_data=(x, 2 * x),
              callbacks=callbacks, verbose=0)


def test_an_epoch_cut_short_by_a_stop_reports_nothing_and_waits_for_nothing(tmp_path):
    gate.write_atomic(gate.decision_path(tmp_path, 1), gate.CONTINUE)  # epoch 1: answered
    callback = gate.SweepPruneGate(str(tmp_path), "val_loss", wait=True, wait_s=20, poll_s=0.05,
                                   driver_pid=0)
    started = time.monotonic()
    _fit([callback, StopAt(epoch=1, batch=1)])  # epoch 2 stopped after 2 of its 4 steps
    assert time.monotonic() - started < 15
    first = json.loads(gate.value_path(tmp_path, 1).read_text())
    assert first["epoch"] == 1 and first["step"] == 4
    assert not gate.value_path(tmp_path, 2).exists()  # the half epoch is not an epoch


def test_a_trial_the_driver_stopped_does_not_wait_and_an_earlier_decision_stands(tmp_path):
    callback = gate.SweepPruneGate(str(tmp_path), "val_loss", wait=True, wait_s=20, poll_s=0.05,
                                   driver_pid=0)
    gate.write_atomic(gate.stopped_path(tmp_path), "")
    started = time.monotonic()
    assert callback._await(3) == gate.CONTINUE
    assert time.monotonic() - started < 5
    gate.write_atomic(gate.decision_path(tmp_path, 3), gate.PRUNE)
    assert callback._await(3) == gate.PRUNE


@pytest.mark.parametrize("wait", [True, False])
def test_a_whole_epoch_reports_its_value(tmp_path, wait):
    for epoch in (1, 2):
        gate.write_atomic(gate.decision_path(tmp_path, epoch), gate.CONTINUE)
    _fit([gate.SweepPruneGate(str(tmp_path), "val_loss", wait=wait, wait_s=20, driver_pid=0)])
    steps = [json.loads(gate.value_path(tmp_path, e).read_text())["step"] for e in (1, 2)]
    assert steps == [4, 8]
