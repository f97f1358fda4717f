"""The run directory: one object, :class:`RunDir`, owns its layout, its checks, its lock and its writes.

Every path of a run directory comes from a :class:`RunDir` (``run_info``, ``metrics``, ``model``,
``checkpoints``, ``tensorboard``, ``logs``, ``lock``, ...); no other module spells a file name.

The rules it enforces, each before anything is written, are listed in docs/recipes.md ("Run
directory"), each with a test in tests/unit/test_rundir.py.

The check (:meth:`RunDir.check`, reads only) runs once per process; :meth:`RunDir.claim` takes the
lock and checks again only if the directory changed since.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerasdist._files import write_json_atomic, write_text_atomic
from kerasdist._log import get_logger
from kerasdist.errors import RunDirError
from kerasdist.tracking.mlflow_store import TRACKING_ENTRIES, TRACKING_FILE
from kerasdist.training import outputs, rundir_checks
from kerasdist.training.outputs import LOCK_NAME, RUN_INFO
from kerasdist.training.rundir_lock import RunDirLock, link_error, lstat_or_none

if TYPE_CHECKING:
    from kerasdist.config import Recipe

log = get_logger("training")

LAUNCH_ONLY = frozenset({outputs.LOG_DIR, outputs.RAY_DIR, LOCK_NAME, *TRACKING_ENTRIES})
"""Entries a run directory may hold before a run writes its ``run.json``: the launcher's task logs,
Ray's storage (``cluster.kind: ray``), the lock and the tracker's files (``output.tracking``)."""
TASK_LOG_NAME = re.compile(r"(?:chief|worker|ps|evaluator)-\d+(?:\.log|\.status\.json(?:\.tmp)?)"
                           r"|recipe\.json|ray-worker-\d+\.json")
"""Names kerasdist's launchers write in ``logs/`` (:mod:`kerasdist.launch.processes`,
:mod:`kerasdist.launch.status`, :mod:`kerasdist.launch.ray_worker`)."""
FINISHED_FILES = (outputs.MODEL, outputs.METRICS)
"""A run directory holding one of these holds a finished run."""


class RunDir:
    """One run directory: its layout, the check-then-claim, atomic writes and the lock.

    Args:
        path: ``output.run_dir`` as the recipe gives it (relative paths are kept relative in the
            paths it returns; checks use the absolute path).

    Attributes:
        path: the run directory.
        previous: the ``run.json`` found by :meth:`check` (before this run replaces it), or None.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.previous: dict[str, Any] | None = None
        self._checked: tuple[Any, bool] | None = None  # (snapshot, resumable) of the last check

    @classmethod
    def of(cls, recipe: Recipe) -> RunDir:
        """The run directory of ``recipe`` (``output.run_dir``)."""
        return cls(recipe.output.run_dir)

    def __repr__(self) -> str:
        return f"RunDir('{self.path}')"

    # ------------------------------------------------------------------------------------ layout
    @property
    def run_info(self) -> Path:
        """``run.json``: fingerprint, strategy and recipe of the run (written by the chief)."""
        return self.path / RUN_INFO

    @property
    def metrics(self) -> Path:
        """``metrics.json``: the finished run's figures."""
        return self.path / outputs.METRICS

    @property
    def model(self) -> Path:
        """``model.keras``: the finished run's model."""
        return self.path / outputs.MODEL

    @property
    def inference_model(self) -> Path:
        """``inference_model.keras``: the finished model behind its source's preprocessing
        (a csv run: it predicts raw rows; :func:`kerasdist.data.inputs.serving_model`)."""
        return self.path / outputs.INFERENCE_MODEL

    def save_inference_model(self, recipe, model) -> Path | None:
        """Save ``model`` behind the data source's preprocessing as ``inference_model.keras``
        (atomically), when the source has any; returns its path or None."""
        from kerasdist.data.inputs import serving_model

        serving = serving_model(recipe.data, model, self.path)
        return None if serving is None else outputs.save_model_atomic(serving,
                                                                      self.inference_model)

    @property
    def checkpoints(self) -> Path:
        """``checkpoints/``: the checkpoint store's folder."""
        return self.path / outputs.CHECKPOINT_DIR

    @property
    def state_digests(self) -> Path:
        """``checkpoints/state-sha256.json``: the digest of each checkpoint's saved state."""
        from kerasdist.keras.state_digest import DIGESTS_FILE

        return self.checkpoints / DIGESTS_FILE

    @property
    def tensorboard(self) -> Path:
        """``tensorboard/``: TensorBoard event files (training, validation, sidecar evaluation)."""
        return self.path / outputs.TENSORBOARD_DIR

    @property
    def logs(self) -> Path:
        """``logs/``: a local launcher's task logs, status files and task recipe."""
        return self.path / outputs.LOG_DIR

    @property
    def task_recipe(self) -> Path:
        """``logs/recipe.json``: the resolved recipe a local launcher's tasks run."""
        return self.logs / outputs.TASK_RECIPE

    @property
    def ray(self) -> Path:
        """``ray/``: Ray Train's storage (``cluster.kind: ray``)."""
        return self.path / outputs.RAY_DIR

    @property
    def eval_file(self) -> Path:
        """``eval.json``: the sidecar evaluator's results."""
        return self.path / outputs.EVAL_FILE

    @property
    def lock(self) -> Path:
        """``.kerasdist.lock``: the run's lock (:class:`RunDirLock`)."""
        return self.path / LOCK_NAME

    # ------------------------------------------------------------------------------------- reads
    def entries(self) -> list[str]:
        """The names in the run directory (empty when it does not exist).

        Raises:
            RunDirError: it is a file, a link, or cannot be read.
        """
        return _entries(self.path)

    def read_run_info(self) -> dict[str, Any] | None:
        """The run directory's ``run.json``, or None if missing, unreadable or a link."""
        found = lstat_or_none(self.run_info)
        if found is None or not stat.S_ISREG(found.st_mode):
            return None
        return outputs.read_run_info(self.path)

    def has_checkpoints(self) -> bool:
        """Whether ``checkpoints/`` holds checkpoint files (``ckpt-*``), whole or not."""
        try:
            return any(name.startswith("ckpt-") for name in os.listdir(self.checkpoints))
        except OSError:
            return False

    def finished_files(self) -> list[str]:
        """The finished run's files present (``model.keras``, ``metrics.json``)."""
        return [name for name in FINISHED_FILES if lstat_or_none(self.path / name) is not None]

    def complete_notice(self, recipe: Recipe, *, overwrite: bool) -> str | None:
        """One line for a re-run of a run that already trained every epoch (its ``metrics.json``
        reached ``trainer.epochs`` x its steps per epoch): it says so and how to start afresh.
        None otherwise, and with ``overwrite``. Reads ``metrics.json`` only.

        Args:
            recipe: this run's recipe (``trainer.epochs``, ``trainer.checkpoint.enabled``).
            overwrite: ``--overwrite`` was given (the old run is moved aside: nothing to say).
        """
        found = lstat_or_none(self.metrics)
        if overwrite or not recipe.trainer.checkpoint.enabled or found is None or \
                not stat.S_ISREG(found.st_mode):
            return None
        try:
            figures = json.loads(self.metrics.read_text(encoding="utf-8"))
            steps, per_epoch = int(figures["global_steps"]), int(figures["steps_per_epoch"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if per_epoch < 1 or steps < recipe.trainer.epochs * per_epoch:
            return None
        return (f"output.run_dir '{self.path}' already holds a complete run ({steps // per_epoch} "
                f"epoch(s), global step {steps}; trainer.epochs={recipe.trainer.epochs}): nothing "
                "to train, its model is evaluated again. To start afresh, add --overwrite (the "
                f"old run is moved aside to '{self.path}.old-<time>').")

    def has_previous_run(self) -> bool:
        """True when the directory holds anything besides the launcher's logs and the lock."""
        return bool(set(self.entries()) - LAUNCH_ONLY) or not self._launch_logs_only()

    def _launch_logs_only(self) -> bool:
        try:
            names = os.listdir(self.logs)
        except OSError:
            return True
        return all(TASK_LOG_NAME.fullmatch(name) for name in names)

    def _snapshot(self) -> tuple:
        """What :meth:`check` read: the entries, ``run.json``'s identity, the checkpoint names."""
        info = lstat_or_none(self.run_info)
        try:
            ckpts = tuple(sorted(os.listdir(self.checkpoints)))
        except OSError:
            ckpts = ()
        return (tuple(self.entries()), info and (info.st_ino, info.st_mtime_ns, info.st_size),
                ckpts)

    # ------------------------------------------------------------------------------------ checks
    def check_path(self) -> None:
        """Refuse an ``output.run_dir`` that cannot be created or written; no file is read or made
        (:func:`kerasdist.training.rundir_checks.check_path`).

        Raises:
            RunDirError: naming ``output.run_dir``, the path and what is wrong (exit code 2).
        """
        rundir_checks.check_path(self.path)

    def check(self, recipe: Recipe, *, checkpoint_schema: str, overwrite: bool) -> bool:
        """Refuse a run directory this run must not write into; reads only, writes nothing.

        A checkpoint can be continued by any strategy that reads the same checkpoint schema
        (default -> mirrored -> multi_worker at the exact step), but not by another model, schema
        or optimizer. Sets :attr:`previous` (the ``run.json`` found).

        Returns:
            True when the directory holds checkpoints this run will resume from (False with
            ``overwrite``: the old run is moved aside by :meth:`claim`).

        Raises:
            RunDirError (exit code 2): see :meth:`check_path`; a link in the layout; with
                ``overwrite``, a run directory that is or holds the current directory; without
                it: files but no ``run.json`` (not a kerasdist run directory; a ``logs/`` holding
                files kerasdist did not name counts); the run of a different model; checkpoints of
                another checkpoint schema; checkpoints of another optimizer (``optimizer.name``,
                ``optimizer.momentum`` adding or removing slots); other ``callbacks`` than the
                checkpoints were written with; a finished run that this run
                would replace from global step 0; a folder of the layout this run writes that is
                not writable. The message names what was found and what was requested.
        """
        self.check_path()
        resumable = self._check(recipe, checkpoint_schema=checkpoint_schema, overwrite=overwrite)
        self._checked = (self._snapshot(), resumable)
        return resumable

    def _check(self, recipe: Recipe, *, checkpoint_schema: str, overwrite: bool) -> bool:
        entries = set(self.entries())
        self.previous = None
        rundir_checks.refuse_links(self.path, entries)
        if not self.has_previous_run():
            rundir_checks.refuse_unwritable(self, recipe, entries)
            return False
        if overwrite:
            rundir_checks.refuse_moving_cwd(self.path)
            return False
        info = self.read_run_info()
        if info is None:
            shown = ", ".join(sorted(entries - LAUNCH_ONLY)[:5]) or ", ".join(
                f"logs/{name}" for name in sorted(os.listdir(self.logs))[:5]
                if not TASK_LOG_NAME.fullmatch(name))
            how = (" (it is the current directory or holds it, so --overwrite cannot move it "
                   "aside)" if rundir_checks.holds_cwd(self.path) else ", or pass --overwrite "
                   f"to move the folder aside to '{self.path}.old-<time>'")
            raise RunDirError(f"output.run_dir '{self.path}' is not empty and holds no kerasdist "
                              f"{RUN_INFO} (found: {shown}); kerasdist does not write into a "
                              f"folder it did not create. Use another output.run_dir{how}.")
        self.previous = info
        has_ckpt = self.has_checkpoints()
        rundir_checks.refuse_other_model(self.path, recipe, info, checkpoint_schema, has_ckpt)
        resumable = has_ckpt and recipe.trainer.checkpoint.enabled
        finished = self.finished_files()
        if finished and not resumable:
            why = ("trainer.checkpoint.enabled is false" if not recipe.trainer.checkpoint.enabled
                   else f"no ckpt-* checkpoint in '{self.checkpoints}'")
            raise RunDirError(
                f"output.run_dir '{self.path}' holds a finished run ({', '.join(finished)}) but "
                f"this run would start from global step 0 ({why}) and replace it. Pass "
                f"--overwrite to move the old run aside to '{self.path}.old-<time>' and start "
                "afresh, or use another output.run_dir.")
        if resumable:
            rundir_checks.refuse_other_optimizer(self, recipe, info)
            rundir_checks.refuse_other_callbacks(self, recipe, info)
        rundir_checks.refuse_unwritable(self, recipe, entries)
        return resumable

    # ------------------------------------------------------------------------------------ claim
    def claim(self, stack: contextlib.ExitStack, recipe: Recipe, *, checkpoint_schema: str,
              overwrite: bool) -> bool:
        """Take the run directory for this run: under ``overwrite`` move a previous run aside
        (unless an ancestor process, the local launcher, holds the lock and did so), lock it (held
        until ``stack`` closes), and check it again if it changed since :meth:`check` (or was
        never checked in this process).

        Returns:
            Whether there are checkpoints to resume (see :meth:`check`).

        Raises:
            RunDirError: see :class:`RunDirLock`, :meth:`move_aside` and :meth:`check`.
        """
        if overwrite and self.has_previous_run():
            with contextlib.ExitStack() as probe:  # a live run in it must not be moved away
                held = probe.enter_context(RunDirLock(self.path, create=False))
                if not held.inherited:
                    rundir_checks.refuse_moving_cwd(self.path)
                    self.move_aside()
        stack.enter_context(RunDirLock(self.path))
        if self._checked is not None and self._checked[0] == self._snapshot():
            return self._checked[1]
        return self.check(recipe, checkpoint_schema=checkpoint_schema, overwrite=overwrite)

    def move_aside(self) -> Path | None:
        """``--overwrite``: rename a run directory that holds a previous run (see
        :meth:`has_previous_run`) to ``<run_dir>.old-<YYYYmmdd-HHMMSS>[-N]``; nothing is deleted.

        Returns:
            The new location, or None when there was nothing to move.

        Raises:
            RunDirError: the rename failed (the message names both paths and the OS error).
        """
        if not self.has_previous_run():
            return None
        source = Path(os.path.abspath(self.path))
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target, n = source.with_name(f"{source.name}.old-{stamp}"), 1
        while lstat_or_none(target) is not None:
            n += 1
            target = source.with_name(f"{source.name}.old-{stamp}-{n}")
        try:
            os.rename(source, target)
        except OSError as err:
            raise RunDirError(f"--overwrite: cannot move output.run_dir '{self.path}' aside to "
                              f"'{target}': {err.strerror}") from None
        log.warning(f"--overwrite: moved the previous run in {self.path} aside to {target} "
                    "(nothing deleted)")
        if lstat_or_none(target / TRACKING_FILE) is not None:
            try:
                from kerasdist.tracking.mlflow_tracker import record_move
            except ImportError:  # MLflow is not installed here: nothing to update
                return target
            record_move(source, target)  # its MLflow run names the new place
        return target

    # ----------------------------------------------------------------------------------- writes
    def write_json(self, path: Path, data: Any) -> Path:
        """Write ``data`` as strict JSON to ``path`` (a path of this layout) atomically
        (:func:`kerasdist._files.write_json_atomic`)."""
        return write_json_atomic(path, data)

    def write_run_info(self, recipe: Recipe, checkpoint_schema: str) -> Path:
        """Write ``run.json`` (atomically): fingerprint, the strategy kind that wrote it, the
        recipe."""
        return outputs.write_run_info(self.path, recipe, checkpoint_schema)

    def save_model(self, model) -> Path:
        """Save ``model`` to ``model.keras`` without ever truncating the previous file."""
        return outputs.save_model_atomic(model, self.model)

    def write_task_recipe(self, data: dict) -> Path:
        """Write ``logs/recipe.json`` (atomically) for a local launcher's tasks."""
        self.logs.mkdir(parents=True, exist_ok=True)
        return write_text_atomic(self.task_recipe, json.dumps(data, indent=2))


def _entries(run_dir: Path) -> list[str]:
    found = lstat_or_none(run_dir)
    if found is None:
        return []
    if stat.S_ISLNK(found.st_mode):
        raise link_error(run_dir, "output.run_dir")
    if not stat.S_ISDIR(found.st_mode):
        raise RunDirError(f"output.run_dir '{run_dir}' is a file, not a directory. "
                          f"Received: run_dir='{run_dir}'")
    try:
        return sorted(os.listdir(run_dir))
    except FileNotFoundError:
        return []
    except OSError as err:
        raise RunDirError(f"output.run_dir '{run_dir}' cannot be read: {err.strerror}. "
                          f"Received: run_dir='{run_dir}'") from None
