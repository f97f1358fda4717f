"""The epoch-end gate between a trial's tasks and the sweep driver: how a prune decision stops
every task of a trial at the same epoch boundary (``docs/sweep.md``, "Pruning at an agreed epoch").

Files in ``<trial dir>/gate/``, each written whole with ``os.replace``: at the end of epoch ``E``
(1-based) the chief writes ``epoch-EEEE.value.json`` (``{"epoch": E, "value": <objective
metric>, "step": <global step>}``); the driver reports it to Optuna and writes
``epoch-EEEE.decision`` (``continue`` or ``prune``), which every task waits for before it leaves
the epoch (on ``prune`` each sets ``model.stop_training``). Nobody waits once the driver is gone
or has written ``driver-stopped`` (a decision written before is still read first), nor with
``wait: false`` (pruner ``none``); an epoch cut short by a stop is not a finished epoch: no value
is written for it.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import keras

from kerasdist._files import write_text_atomic

CONTINUE, PRUNE = "continue", "prune"
DRIVER_ENV = "KERASDIST_SWEEP_DRIVER"
"""The environment variable holding the driver's pid in a trial's processes."""


def value_path(gate_dir: Path, epoch: int) -> Path:
    """The file of epoch ``epoch``'s intermediate value (1-based epochs)."""
    return Path(gate_dir) / f"epoch-{epoch:04d}.value.json"


def decision_path(gate_dir: Path, epoch: int) -> Path:
    """The file of the driver's decision after epoch ``epoch``."""
    return Path(gate_dir) / f"epoch-{epoch:04d}.decision"


def stopped_path(gate_dir: Path) -> Path:
    """The file the driver writes when it stops the trial (no task waits once it is there)."""
    return Path(gate_dir) / "driver-stopped"


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole: a reader sees the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)


class SweepPruneGate(keras.callbacks.Callback):
    """Report the objective at each epoch end and stop at the driver's prune decision.

    Args:
        gate_dir: the trial's gate folder (absolute path), shared by every task of the trial.
        metric: the epoch-log key of the objective (``val_accuracy``).
        wait: wait for the driver's decision after each epoch (False: report only).
        wait_s: seconds to wait for a decision before failing (the driver is gone).
        poll_s: seconds between looks at the decision file.
        driver_pid: the sweep driver's process id on this machine; default: the environment
            variable ``KERASDIST_SWEEP_DRIVER`` the driver gives its trials (unset: 0, not
            watched). When it is gone the tasks stop waiting (module docs).

    Raises:
        kerasdist.errors.TrainingError: from ``on_epoch_end``: the epoch's logs lack ``metric``
            (names the keys they have), or no decision came within ``wait_s`` seconds.
    """

    def __init__(self, gate_dir: str, metric: str, wait: bool = True, wait_s: float = 600.0,
                 poll_s: float = 0.2, driver_pid: int | None = None):
        super().__init__()
        self.gate_dir, self.metric = Path(gate_dir), metric
        if driver_pid is None:
            driver_pid = int(os.environ.get(DRIVER_ENV, "0") or 0)
        self.driver_pid = int(driver_pid)
        self.wait, self.wait_s, self.poll_s = bool(wait), float(wait_s), float(poll_s)
        self.stopped_epoch = 0  # Keras's EarlyStopping attribute: names this callback as the stopper
        self._last_batch = -1

    def _is_chief(self) -> bool:
        from kerasdist._compat.keras_chief_callbacks import role

        return role(self.model) != "other"  # 'single' (one process, a PS coordinator) or 'chief'

    def on_epoch_begin(self, epoch, logs=None):
        self._last_batch = -1

    def on_train_batch_end(self, batch, logs=None):
        self._last_batch = batch

    def on_epoch_end(self, epoch, logs=None):
        from kerasdist.errors import TrainingError

        steps = self.params.get("steps")
        if self.model.stop_training and steps and self._last_batch + 1 < steps:
            return  # cut short by a stop (module docs): not a finished epoch
        number = epoch + 1
        logs = logs or {}
        if self.metric not in logs:
            raise TrainingError(f"sweep objective.metric '{self.metric}' is not in the epoch's "
                                f"logs (they have: {', '.join(sorted(logs)) or 'nothing'}). "
                                f"Received: metric={self.metric!r}")
        value = float(keras.ops.convert_to_numpy(logs[self.metric]))
        if self._is_chief():
            step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            write_atomic(value_path(self.gate_dir, number), json.dumps(
                {"epoch": number, "value": value if math.isfinite(value) else None, "step": step}))
        if not self.wait:
            return
        decision = self._await(number)
        if decision == PRUNE:
            self.stopped_epoch = number
            self.model.stop_training = True

    def _await(self, number: int) -> str:
        from kerasdist.errors import TrainingError

        path = decision_path(self.gate_dir, number)
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            gone = not self._driver_alive()
            text = _read(path)
            if text in (CONTINUE, PRUNE):
                return text
            if gone or stopped_path(self.gate_dir).exists():
                return CONTINUE
            time.sleep(self.poll_s)
        raise TrainingError(f"no prune decision for epoch {number} in {path} after "
                            f"{self.wait_s:g} s (is the sweep driver still running?)")

    def _driver_alive(self) -> bool:
        from kerasdist.sweep.processes import pid_alive

        return self.driver_pid <= 0 or pid_alive(self.driver_pid)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return ""
