"""Keras callbacks kerasdist adds to ``model.fit``: throughput timing and checkpoint/resume."""

from __future__ import annotations

import time

import keras


class ThroughputMeter(keras.callbacks.Callback):
    """Measure training examples/s over timed steps, excluding compile/trace and validation.

    Within each epoch, the time between the end of step ``i-1`` and the end of step ``i`` is
    counted for ``i >= 1``: the first step of an epoch (tracing, iterator start) and everything
    between epochs (validation, checkpoints) are excluded.

    Attributes:
        timed_steps: number of timed steps.
        timed_seconds: their total wall time, seconds.
        examples_per_sec: ``timed_steps * global_batch_size / timed_seconds`` (0 if nothing timed).
        epoch_end_s: for each epoch, seconds from the start of training to the end of the epoch
            (after its validation), used for time-to-accuracy.
        epoch_examples_per_sec: examples/s over the timed steps of each epoch (warm-up shows
            as slower first epochs).
    """

    def __init__(self, global_batch_size: int):
        super().__init__()
        self.global_batch_size = global_batch_size
        self.timed_steps = 0
        self.timed_seconds = 0.0
        self._last = None
        self._start = None
        self.epoch_end_s: list[float] = []
        self.epoch_examples_per_sec: list[float] = []
        self._epoch_steps, self._epoch_seconds = 0, 0.0

    def on_train_begin(self, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_end_s.append(time.perf_counter() - self._start)
        self.epoch_examples_per_sec.append(
            self._epoch_steps * self.global_batch_size / self._epoch_seconds
            if self._epoch_seconds else 0.0)

    def on_epoch_begin(self, epoch, logs=None):
        self._last = None
        self._epoch_steps, self._epoch_seconds = 0, 0.0

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if self._last is not None:
            self.timed_steps += 1
            self.timed_seconds += now - self._last
            self._epoch_steps += 1
            self._epoch_seconds += now - self._last
        self._last = now

    @property
    def examples_per_sec(self) -> float:
        if not self.timed_seconds:
            return 0.0
        return self.timed_steps * self.global_batch_size / self.timed_seconds

    def summary(self) -> dict:
        return {"examples_per_sec": self.examples_per_sec, "timed_steps": self.timed_steps,
                "timed_seconds": self.timed_seconds, "global_batch_size": self.global_batch_size,
                "epoch_end_s": list(self.epoch_end_s),
                "epoch_examples_per_sec": list(self.epoch_examples_per_sec)}


class EpochCheckpoint(keras.callbacks.Callback):
    """Save model, optimizer and the completed-epoch count at the end of every epoch.

    Uses ``tf.train.CheckpointManager``: each save goes to a new file prefix and the ``checkpoint``
    pointer file is replaced atomically, and the data files are crc-checked on restore, so a crash
    during a save leaves the previous checkpoint as the latest readable one.

    Args:
        manager: a ``tf.train.CheckpointManager`` over a checkpoint holding ``epoch``.
        epoch_var: int64 ``tf.Variable``: epochs completed, restored on resume.
    """

    def __init__(self, manager, epoch_var):
        super().__init__()
        self.manager = manager
        self.epoch_var = epoch_var
        self.saved: list[str] = []

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_var.assign(epoch + 1)
        self.saved.append(self.manager.save(checkpoint_number=epoch + 1))
