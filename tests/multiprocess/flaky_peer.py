"""Recipe callbacks for test_failure_report: a coordinator that meets one transient TensorFlow
RPC error, and a worker whose own code fails deterministically. Imported by the tasks
(``callbacks: ['flaky_peer:TransientRPCOnce']`` with this folder on ``PYTHONPATH``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import keras

GARBLED = ("Unable to parse request\nAdditional GRPC error information from remote target "
           "/job:worker/replica:0/task:1 while calling "
           "/tensorflow.eager.EagerService/RunComponentFunction")


class TransientRPCOnce(keras.callbacks.Callback):
    """At the end of epoch 1, raise the ``InternalError`` TensorFlow raised in issue 39's PS run,
    once (a file ``marker`` says it happened)."""

    def __init__(self, marker: str):
        super().__init__()
        self.marker = marker

    def on_epoch_end(self, epoch, logs=None):
        import tensorflow as tf

        if epoch == 1 and not Path(self.marker).exists():
            Path(self.marker).write_text("raised")
            raise tf.errors.InternalError(None, None, GARBLED)


class BrokenOnWorker1(keras.callbacks.Callback):
    """On task worker:1, raise a ValueError at the end of epoch 1: the user's own bug."""

    def __init__(self):
        super().__init__()
        task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
        self._broken = task.get("type") == "worker" and task.get("index") == 1

    def on_epoch_end(self, epoch, logs=None):
        if self._broken and epoch == 1:
            raise ValueError("my callback is broken: no such column 'price'")
