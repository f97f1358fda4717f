"""A Keras callback for tools/bandwidth_bench.py: the wall-clock time of every training step's end.

Named in a recipe's ``callbacks`` as ``bandwidth_stamps:StepStamps`` (``tools/`` on PYTHONPATH).
When the environment variable ``KERASDIST_STEP_STAMPS`` names a file, each ``on_train_batch_end``
appends one line ``<epoch> <batch> <time.time()>`` (epoch and batch 0-based, seconds since the
epoch); without it the callback does nothing. Under parameter_server the coordinator reports a
scheduled call's end when its logs arrive (``kerasdist.keras.ps_loop``).
"""

from __future__ import annotations

import os
import time

import keras

ENV = "KERASDIST_STEP_STAMPS"


class StepStamps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self._path = os.environ.get(ENV)
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self._path:
            with open(self._path, "a", encoding="utf-8") as f:
                f.write(f"{self._epoch} {batch} {time.time():.6f}\n")
