"""The recipe callback module the interrupted-epoch tests write next to their recipes."""

from __future__ import annotations

import csv

MODULE = '''
import json, os, signal
import keras

class InterruptAt(keras.callbacks.Callback):
    """SIGINT to this process once global step `step` is passed (once per run folder when
    `once`, a marker file, is given); records each validation's global step in `record`."""
    def __init__(self, step, record, once=None):
        super().__init__()
        self.at, self.record, self.once = step, record, once
    def _step(self):
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
    def on_train_batch_end(self, batch, logs=None):
        if self._step() >= self.at and not (self.once and os.path.exists(self.once)):
            if self.once:
                open(self.once, "w").close()
            os.kill(os.getpid(), signal.SIGINT)
    def on_test_begin(self, logs=None):
        with open(self.record, "a") as out:
            out.write(json.dumps(self._step()) + "\\n")
'''


def rows(path) -> list[tuple[int, dict]]:
    """``(epoch, row)`` of each row of a CSVLogger file."""
    with open(path, newline="") as handle:
        return [(int(row["epoch"]), row) for row in csv.DictReader(handle)]
