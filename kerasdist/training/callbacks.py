"""Keras callbacks kerasdist adds to ``model.fit``: throughput timing and checkpoint/resume."""

from __future__ import annotations

import keras

from kerasdist.training.timing import StepClock


class ThroughputMeter(keras.callbacks.Callback):
    """Measure training examples/s over timed steps, excluding compile/trace and validation.

    A Keras callback driving a :class:`~kerasdist.training.timing.StepClock` (``self.clock``:
    the timing rule, ``timed_steps``, ``examples_per_sec``, ``epoch_end_s`` ...).

    Args:
        global_batch_size: examples per step (all replicas together).
    """

    def __init__(self, global_batch_size: int):
        super().__init__()
        self.clock = StepClock(global_batch_size)

    def on_train_begin(self, logs=None):
        self.clock.train_begin()

    def on_epoch_begin(self, epoch, logs=None):
        self.clock.epoch_begin()

    def on_train_batch_end(self, batch, logs=None):
        self.clock.step_end()

    def on_epoch_end(self, epoch, logs=None):
        self.clock.epoch_end()

    def summary(self) -> dict:
        """The clock's JSON-ready figures (``metrics.json``'s ``throughput``)."""
        return self.clock.summary()


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
