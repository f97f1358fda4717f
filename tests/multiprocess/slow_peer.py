"""A recipe callback for test_mwms_faults: worker:1 pauses before its first validation, as a
worker of a loaded host can at an epoch's end (issue 33, item 8). Imported by the workers
(``callbacks: ['slow_peer:PauseBeforeValidation']`` with this folder on ``PYTHONPATH``)."""

from __future__ import annotations

import json
import os
import time

import keras

PAUSE_S = 8.0  # > the test's strategy.timeout_s (5 s), < the epoch-boundary barrier's 3 x 5 s


class PauseBeforeValidation(keras.callbacks.Callback):
    """On task worker:1, sleep :data:`PAUSE_S` seconds at the first ``on_test_begin``."""

    def __init__(self):
        super().__init__()
        task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
        self._pause = task.get("type") == "worker" and task.get("index") == 1

    def on_test_begin(self, logs=None):
        if self._pause:
            self._pause = False
            print(f"slow_peer: worker:1 pauses {PAUSE_S:g} s before validation", flush=True)
            time.sleep(PAUSE_S)
