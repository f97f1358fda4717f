"""The sidecar evaluator (``kerasdist evaluate RUN_DIR``): evaluate a run's checkpoints from outside
the training cluster, in this one process, with no strategy (docs/launch.md, "Sidecar evaluation").

Each evaluation is written to ``<run_dir>/eval.json`` (atomically; ``{"split", "evaluations":
[{"checkpoint", "global_step", "loss", <metrics>...}]}``, newest last) and as TensorBoard
scalars (``eval_loss``, ``eval_<metric>`` at the checkpoint's global step) in
``<run_dir>/tensorboard/sidecar_eval``.
Source of the role: https://www.tensorflow.org/tutorials/distribute/parameter_server_training
(section "Side-car evaluation").
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable

from kerasdist._files import read_json
from kerasdist._log import get_logger
from kerasdist.errors import RunDirError
from kerasdist.training import outputs, rundir, rundir_lock

log = get_logger("evaluate")

EVAL_FILE = outputs.EVAL_FILE
TENSORBOARD_DIR = "sidecar_eval"


def _recipe(run_dir: Path):
    from kerasdist.config import validate_recipe

    layout = rundir.RunDir(run_dir)
    info = layout.read_run_info()
    if not info or "recipe" not in info:
        raise RunDirError(f"'{run_dir}' is not a kerasdist run directory (no readable "
                          f"{outputs.RUN_INFO} with its recipe). Received: run_dir='{run_dir}'")
    return validate_recipe(info["recipe"], source=str(layout.run_info))


def run_finished(run_dir: Path) -> bool:
    """True when no live process holds the run directory's lock (it ended, or never started). A
    holder on another host (a shared run directory) counts as live until it empties the lock."""
    holder = rundir_lock.read_holder(Path(run_dir))
    pid = holder.get("pid")
    if not pid:
        return True
    if holder.get("host") != socket.gethostname():
        return False  # held from another machine (shared run dir): released when it is emptied
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def wait_for_run(run_dir: Path, *, poll_s: float = 2.0, timeout_s: float | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> bool:
    """Wait until ``run_dir`` holds the ``run.json`` a starting run writes (an ``evaluator`` task
    may start before the chief); False after ``timeout_s`` (None: wait forever)."""
    start = time.monotonic()
    while not rundir.RunDir(run_dir).run_info.exists():
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            return False
        sleep(poll_s)
    return True


def checkpoints(run_dir: Path) -> list[tuple[int, str]]:
    """``(global step, prefix)`` of the checkpoints on disk, oldest first."""
    found = []
    for index in rundir.RunDir(run_dir).checkpoints.glob("ckpt-*.index"):
        number = index.name[len("ckpt-"):-len(".index")]
        if number.isdigit():
            found.append((int(number), str(index.with_suffix(""))))
    return sorted(found)


def _evaluation_input(data, split: str, run_dir: Path):
    """The evaluated split as a dataset of global batches. A streaming source is read from its
    files as it is evaluated, a csv source with the vocabularies the run saved in ``run_dir``
    (so its ids are those training used, even if the training files changed since); an
    in-memory source is loaded whole, as training loaded it."""
    from kerasdist.data.inputs import eval_dataset

    return eval_dataset(data, split, run_dir=run_dir)


class Evaluator:
    """Rebuilds a run's model and evaluates its checkpoints (see module docs).

    Args:
        run_dir: the run directory (holds ``run.json``).
        split: the split to evaluate; default the recipe's ``data.eval_split``.

    Raises:
        RunDirError: not a kerasdist run directory.
        RecipeError, DataError: the recipe (from ``run.json``) no longer builds, or no split.
    """

    def __init__(self, run_dir: str | Path, *, split: str | None = None):
        import tensorflow as tf

        from kerasdist.errors import RecipeError
        from kerasdist.training.model import build_compiled_model

        self.run_dir = Path(run_dir)
        self.layout = rundir.RunDir(self.run_dir)
        self.recipe = _recipe(self.run_dir)
        self.split = split or self.recipe.data.eval_split
        if not self.split:
            raise RecipeError(f"the run in '{self.run_dir}' has no data.eval_split; name one with "
                              "--split. Received: split=None")
        self.dataset = _evaluation_input(self.recipe.data, self.split, self.run_dir)
        self.model = build_compiled_model(self.recipe)
        self._checkpoint = tf.train.Checkpoint(model=self.model)
        self.results: list[dict[str, Any]] = [
            r for r in self._read_results() if r.get("split") == self.split]
        self._writer = None

    def _read_results(self) -> list[dict[str, Any]]:
        data = read_json(self.layout.eval_file)
        if data is None:
            return []
        return [r for r in data.get("evaluations", []) if isinstance(r, dict)]

    def evaluate_checkpoint(self, step: int, prefix: str) -> dict[str, Any] | None:
        """Evaluate the checkpoint at ``prefix`` (global ``step``); None when it does not read
        back whole (rotated away or damaged: logged and skipped)."""
        from kerasdist.keras.backup import BackupStore

        reason = BackupStore._unreadable(prefix)
        if reason is not None:
            log.warning(f"checkpoint {prefix} skipped: {reason}")
            return None
        self._checkpoint.read(prefix).expect_partial()
        return self._record(Path(prefix).name, step)

    def evaluate_saved_model(self) -> dict[str, Any]:
        """Evaluate ``model.keras`` (a run without checkpoints)."""
        import keras

        path, metrics = self.layout.model, self.layout.metrics
        if not path.exists():
            raise RunDirError(f"'{self.run_dir}' holds no checkpoint and no {path.name} to "
                              "evaluate yet")
        self.model.set_weights(keras.saving.load_model(path, compile=False).get_weights())
        info = json.loads(metrics.read_text(encoding="utf-8")) if metrics.exists() else {}
        return self._record(path.name, int(info.get("global_steps", 0)))

    def _record(self, name: str, step: int) -> dict[str, Any]:
        import tensorflow as tf

        logs = self.model.evaluate(self.dataset, verbose=0, return_dict=True)
        result = {"checkpoint": name, "global_step": step, "split": self.split,
                  **{key: float(value) for key, value in logs.items()}}
        self.results = [r for r in self.results if r.get("checkpoint") != name] + [result]
        self.results.sort(key=lambda r: r["global_step"])
        self.layout.write_json(self.layout.eval_file,
                               {"split": self.split, "evaluations": self.results})
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(
                str(self.layout.tensorboard / TENSORBOARD_DIR))
        with self._writer.as_default(step=step):
            for key, value in logs.items():
                tf.summary.scalar(f"eval_{key}", float(value))
        self._writer.flush()
        shown = ", ".join(f"{k} {v:.4f}" for k, v in result.items() if isinstance(v, float))
        log.info(f"{name} (global step {step}) on '{self.split}': {shown}")
        return result

    def finished(self) -> bool:
        """The run is over: no live lock holder, and its ``metrics.json`` was written after its
        newest checkpoint (a run that is about to resume has not written it yet)."""
        if not run_finished(self.run_dir):
            return False
        metrics = self.layout.metrics
        if not metrics.exists():
            return False
        newest = [Path(p + ".index").stat().st_mtime for _, p in checkpoints(self.run_dir)[-1:]]
        return not newest or metrics.stat().st_mtime >= newest[0]

    def once(self) -> dict[str, Any]:
        """Evaluate the newest checkpoint that reads back whole, else ``model.keras``."""
        for step, prefix in reversed(checkpoints(self.run_dir)):
            result = self.evaluate_checkpoint(step, prefix)
            if result is not None:
                return result
        return self.evaluate_saved_model()

    def watch(self, *, poll_s: float = 2.0, idle_timeout_s: float | None = None,
              sleep: Callable[[float], None] = time.sleep) -> list[dict[str, Any]]:
        """Evaluate every new checkpoint until the run has finished; returns the evaluations.

        Args:
            poll_s: seconds between looks at the checkpoint folder.
            idle_timeout_s: stop after this many seconds without a new checkpoint while the run
                is not running (e.g. it never starts); None waits for the run to finish.
        """
        done = {r["checkpoint"] for r in self.results}
        evaluated: list[dict[str, Any]] = []
        idle_since = time.monotonic()
        while True:
            finished = self.finished()
            new = [(s, p) for s, p in checkpoints(self.run_dir) if Path(p).name not in done]
            for step, prefix in new:
                result = self.evaluate_checkpoint(step, prefix)
                done.add(Path(prefix).name)
                if result is not None:
                    evaluated.append(result)
                    idle_since = time.monotonic()
            if finished:
                return evaluated
            if idle_timeout_s is not None and time.monotonic() - idle_since > idle_timeout_s:
                log.warning(f"no new checkpoint for {idle_timeout_s:.0f} s; stopping")
                return evaluated
            sleep(poll_s)
