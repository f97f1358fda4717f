"""Mend: Keras 3 ``TensorBoard`` and ``CSVLogger`` are written by every multi-worker task.

Upstream: no Keras issue found; reproduction (Keras 3.15 / TF 2.21, ``MultiWorkerMirroredStrategy``
with 2 workers, one shared path as in TensorFlow's multi-worker tutorial): ``TensorBoard(log_dir)``
leaves two event files in ``log_dir/train`` (the same curves twice), and ``CSVLogger(path)`` is
written by both workers at once: Keras 3 callbacks have no chief logic.

Mend (installed by ``kerasdist.enable()``): under a multi-worker strategy a non-chief task writes
its TensorBoard logs and CSV file into a private temporary folder, removed at train end; the chief
(task ``chief``, else ``worker`` 0) writes the user's path. Probe: :func:`bug_present` (neither
callback's source looks at the strategy).
"""

from __future__ import annotations

import functools
import inspect
import os
import shutil
import tempfile

from kerasdist._compat import _patch
from kerasdist._compat.keras_chief_callbacks import role

NAME = "keras-chief-logs"
ISSUE = "no upstream issue found; reproduction in this module's docstring"
_OTHER = "other"


def _classes():
    from keras.src.callbacks.csv_logger import CSVLogger
    from keras.src.callbacks.tensorboard import TensorBoard

    return TensorBoard, CSVLogger


def bug_present() -> bool:
    """Whether neither callback consults the distribution strategy (source check)."""
    return all("distribute" not in inspect.getsource(cls) for cls in _classes())


def _private(callback) -> str:
    folder = tempfile.mkdtemp(prefix="kerasdist-worker-logs-")
    callback._kerasdist_private = folder
    return folder


def _tensorboard_set_model(original):
    @functools.wraps(original)
    def set_model(self, model):
        if role(model) == _OTHER and not getattr(self, "_kerasdist_private", None):
            self.log_dir = _private(self)
        return original(self, model)

    return set_model


def _csv_train_begin(original):
    @functools.wraps(original)
    def on_train_begin(self, logs=None):
        if role(self.model) == _OTHER and not getattr(self, "_kerasdist_private", None):
            self.filename = os.path.join(_private(self), os.path.basename(self.filename))
        return original(self, logs)

    return on_train_begin


def _cleanup_after(original):
    @functools.wraps(original)
    def on_train_end(self, logs=None):
        result = original(self, logs)
        folder = getattr(self, "_kerasdist_private", None)
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
            self._kerasdist_private = None
        return result

    return on_train_end


def _patches():
    tensorboard, csv_logger = _classes()
    return [_patch.Patch(tensorboard, "set_model", _tensorboard_set_model),
            _patch.Patch(tensorboard, "on_train_end", _cleanup_after),
            _patch.Patch(csv_logger, "on_train_begin", _csv_train_begin),
            _patch.Patch(csv_logger, "on_train_end", _cleanup_after)]


installed, install, uninstall = _patch.functions(__name__)  # see _patch.functions
