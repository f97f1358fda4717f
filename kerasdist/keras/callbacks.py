"""Keras callbacks kerasdist adds to every training loop: throughput timing."""

from __future__ import annotations

import keras

from kerasdist.keras.timing import StepClock


class ThroughputMeter(keras.callbacks.Callback):
    """Measure training examples/s over timed steps, excluding compile/trace and validation.

    A Keras callback driving a :class:`~kerasdist.keras.timing.StepClock` (``self.clock``:
    the timing rule, ``timed_steps``, ``examples_per_sec``, ``epoch_end_s`` ...). The steps of
    a call are counted from the batch index Keras passes (``on_train_batch_end(batch)`` is the
    last batch of the call), so ``steps_per_execution`` > 1 and kerasdist's parameter-server
    loop are timed with the same rule as one step per call. It is the only throughput
    definition of kerasdist (every strategy and ``kerasdist bench`` use it).

    Args:
        global_batch_size: examples per step (all replicas together).
    """

    def __init__(self, global_batch_size: int):
        super().__init__()
        self.clock = StepClock(global_batch_size)
        self._last_batch = -1

    def on_train_begin(self, logs=None):
        self.clock.train_begin()

    def on_epoch_begin(self, epoch, logs=None):
        self.clock.epoch_begin()
        self._last_batch = -1

    def on_train_batch_end(self, batch, logs=None):
        self.clock.step_end(max(1, batch - self._last_batch))
        self._last_batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.clock.epoch_end()

    def summary(self) -> dict:
        """The clock's JSON-ready figures (``metrics.json``'s ``throughput``)."""
        return self.clock.summary()
