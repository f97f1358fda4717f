"""The run directory: one object, :class:`RunDir`, owns its layout, its checks, its lock and its writes.

Every path of a run directory comes from a :class:`RunDir` (``run_info``, ``metrics``, ``model``,
``checkpoints``, ``tensorboard``, ``logs``, ``lock``, ...); no other module spells a file name.

Rules (each enforced before anything is written, each with a test in tests/unit/test_rundir.py):

* A directory kerasdist did not write is never written into: a non-empty ``output.run_dir``
  without kerasdist's ``run.json`` (anything besides the launcher's task logs, Ray's storage and
  the lock) is refused, and so is the run directory of a different model, even with checkpoints
  off. A ``logs/`` folder counts as the launcher's only if every file in it is a task log, status
  file or task recipe kerasdist names that way (a user's ``logs/app.log`` makes the folder foreign).
* Nothing the user had is lost: a finished run (``model.keras`` or ``metrics.json``) is never
  replaced by a run that would start from global step 0 (its checkpoints deleted, or checkpoints
  off) unless ``--overwrite`` is given; a checkpoint written with another optimizer
  (``optimizer.name``, or momentum slots added/removed) is refused naming the field.
* ``--overwrite`` deletes nothing: the old run directory is renamed to
  ``<run_dir>.old-<YYYYmmdd-HHMMSS>`` (files kerasdist never wrote included) and the log says where.
  A run directory that is the current directory or holds it (``.``, ``..``) is not moved.
* No symbolic link is followed: ``output.run_dir`` itself, the lock and every name of the layout
  must not be links (refused with exit 2 naming the link and its target).
* Every folder of the layout the run will write (the run directory, ``checkpoints/``,
  ``tensorboard/`` and its subfolders, ``logs/``) must be writable before anything starts.
* One run per directory at a time: :class:`RunDirLock` holds an exclusive ``flock`` on
  ``<run_dir>/.kerasdist.lock`` for the whole run, opened without following links. The kernel drops
  the lock when its process dies, so a lock left by a dead process is taken over (with a message
  naming it); a live holder makes the second run fail with exit 2 naming its pid, host and command.
  Processes started by the holder (the tasks of a local cluster) run under their ancestor's lock.
  The lock is created only in a folder the run is about to own (missing, empty, or a kerasdist run
  directory) and removed again, with the folders the run created, when the run wrote nothing.

The check (:meth:`RunDir.check`, reads only) runs once per process; :meth:`RunDir.claim` takes the
lock and checks again only if the directory changed since.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import secrets
import socket
import stat
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerasdist._log import get_logger
from kerasdist.errors import RunDirError
from kerasdist.training import outputs
from kerasdist.training.outputs import LOCK_NAME, RUN_INFO, model_fingerprint

if TYPE_CHECKING:
    from kerasdist.config import Recipe

log = get_logger("training")

LOCK_TOKEN_ENV = "KERASDIST_RUN_LOCK_TOKEN"
"""Environment variable through which a launcher hands its run-directory lock down to its tasks:
a task whose value equals the holder's token runs under the lock. The token identifies one run; it
is not a secret (Ray ships it to its workers inside the training function's config)."""
LAUNCH_ONLY = frozenset({outputs.LOG_DIR, outputs.RAY_DIR, LOCK_NAME})
"""Entries a run directory may hold before a run writes its ``run.json``: the launcher's task logs,
Ray's storage (``cluster.kind: ray``) and the lock."""
TASK_LOG_NAME = re.compile(r"(?:chief|worker|ps|evaluator)-\d+(?:\.log|\.status\.json(?:\.tmp)?)"
                           r"|recipe\.json|ray-worker-\d+\.json")
"""Names kerasdist's launchers write in ``logs/`` (:mod:`kerasdist.launch.processes`,
:mod:`kerasdist.launch.status`, :mod:`kerasdist.launch.ray_worker`)."""
FINISHED_FILES = (outputs.MODEL, outputs.METRICS)
"""A run directory holding one of these holds a finished run."""
_MOMENTUM_SLOTS = frozenset({"sgd", "rmsprop"})
"""Optimizers whose variables include momentum slots only when ``optimizer.momentum`` > 0."""


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (OSError, ValueError):
        return None


def _link_error(path: Path, what: str) -> RunDirError:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return RunDirError(f"{what} '{path}' is a symbolic link (to '{target}'); kerasdist follows no "
                       "link in a run directory (it would write where the link points). Remove the "
                       "link, or name the directory itself in output.run_dir.")


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
        found = _lstat(self.run_info)
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
        return [name for name in FINISHED_FILES if _lstat(self.path / name) is not None]

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
        info = _lstat(self.run_info)
        try:
            ckpts = tuple(sorted(os.listdir(self.checkpoints)))
        except OSError:
            ckpts = ()
        return (tuple(self.entries()), info and (info.st_ino, info.st_mtime_ns, info.st_size),
                ckpts)

    # ------------------------------------------------------------------------------------ checks
    def check_path(self) -> None:
        """Refuse an ``output.run_dir`` that cannot be created or written; no file is read or made.

        Checks: not a symbolic link; not an existing non-directory; every component fits the
        filesystem's name limit (``NAME_MAX``) and the whole path its path limit; the nearest
        existing ancestor is a directory this process can write into (``os.access``; always true
        for root).

        Raises:
            RunDirError: naming ``output.run_dir``, the path and what is wrong (exit code 2).
        """

        path = self.path
        label = f"output.run_dir '{path}'"
        found = _lstat(path)
        if found is not None and stat.S_ISLNK(found.st_mode):
            raise _link_error(path, "output.run_dir")
        existing = _nearest_existing(path)
        name_max, path_max = _limits(existing)
        for part in path.parts:
            if len(os.fsencode(part)) > name_max:
                raise RunDirError(f"{label}: the name '{part[:40]}...' has {len(os.fsencode(part))} "
                                  f"bytes, more than this filesystem allows ({name_max}; "
                                  f"{errno.errorcode[errno.ENAMETOOLONG]}). Received: run_dir='{path}'")
        if len(os.fsencode(str(path.absolute()))) >= path_max:
            raise RunDirError(f"{label}: path longer than this filesystem allows ({path_max} bytes). "
                              f"Received: run_dir='{path}'")
        if existing == path.absolute() and not existing.is_dir():
            raise RunDirError(f"{label} exists and is not a directory. Received: run_dir='{path}'")
        if not existing.is_dir():
            raise RunDirError(f"{label}: '{existing}' is not a directory, so the run directory "
                              f"cannot be created in it. Received: run_dir='{path}'")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise RunDirError(f"{label}: '{existing}' is not writable by this user. "
                              f"Received: run_dir='{path}'")

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
                ``optimizer.momentum`` adding or removing slots); a finished run that this run
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
        self._refuse_links(entries)
        if not self.has_previous_run():
            self._refuse_unwritable(recipe, entries)
            return False
        if overwrite:
            self._refuse_moving_cwd()
            return False
        info = self.read_run_info()
        if info is None:
            shown = ", ".join(sorted(entries - LAUNCH_ONLY)[:5]) or ", ".join(
                f"logs/{name}" for name in sorted(os.listdir(self.logs))[:5]
                if not TASK_LOG_NAME.fullmatch(name))
            raise RunDirError(f"output.run_dir '{self.path}' is not empty and holds no kerasdist "
                              f"{RUN_INFO} (found: {shown}); kerasdist does not write into a "
                              "folder it did not create. Use another output.run_dir, or pass "
                              f"--overwrite to move the folder aside to '{self.path}.old-<time>'.")
        self.previous = info
        has_ckpt = self.has_checkpoints()
        self._refuse_other_model(recipe, info, checkpoint_schema, has_ckpt)
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
            self._refuse_other_optimizer(recipe, info)
        self._refuse_unwritable(recipe, entries)
        return resumable

    def _refuse_links(self, entries: set[str]) -> None:
        layout = {RUN_INFO, outputs.METRICS, outputs.MODEL, outputs.CHECKPOINT_DIR,
                  outputs.TENSORBOARD_DIR, outputs.LOG_DIR, outputs.RAY_DIR, outputs.EVAL_FILE,
                  LOCK_NAME}
        for name in sorted(entries & layout):
            found = _lstat(self.path / name)
            if found is not None and stat.S_ISLNK(found.st_mode):
                raise _link_error(self.path / name, f"output.run_dir '{self.path}': the entry")

    def _refuse_moving_cwd(self) -> None:
        here, target = Path.cwd().resolve(), self.path.resolve()
        if target == here or target in here.parents:
            raise RunDirError(
                f"--overwrite would move output.run_dir '{self.path}' ('{target}') aside, but it "
                f"is the current directory or holds it ('{here}'). Run kerasdist from another "
                f"directory, or name another output.run_dir. Received: run_dir='{self.path}'")
        if target.parent == target:
            raise RunDirError(f"--overwrite cannot move output.run_dir '{self.path}' aside (it is "
                              f"the root directory). Received: run_dir='{self.path}'")
        if not os.access(target.parent, os.W_OK | os.X_OK):
            raise RunDirError(f"--overwrite cannot move output.run_dir '{self.path}' aside: its "
                              f"folder '{target.parent}' is not writable by this user. Received: "
                              f"run_dir='{self.path}'")

    def _refuse_other_model(self, recipe: Recipe, info: dict, checkpoint_schema: str,
                            has_ckpt: bool) -> None:
        previous = info.get("fingerprint") or {}
        wanted = model_fingerprint(recipe, checkpoint_schema)
        if previous == wanted:
            return
        found_schema = previous.get("checkpoint_schema", "kerasdist-0.1 (no schema version)")
        found_kind = info.get("strategy") or (info.get("recipe") or {}).get(
            "strategy", {}).get("kind")
        if previous.get("model") == wanted["model"]:
            if not has_ckpt:
                return  # same model, nothing to restore: the schema does not matter
            what = (f"checkpoints in schema '{found_schema}' (strategy '{found_kind}'), which "
                    f"strategy '{recipe.strategy.kind}' (schema '{checkpoint_schema}') cannot "
                    "restore")
        else:
            holding = "a checkpoint" if has_ckpt else "the run"
            what = (f"{holding} of a different model (found: model {previous.get('model')}, "
                    f"schema '{found_schema}', strategy '{found_kind}'; this recipe: model "
                    f"{wanted['model']}, schema '{checkpoint_schema}', strategy "
                    f"'{recipe.strategy.kind}')")
        raise RunDirError(f"output.run_dir '{self.path}' holds {what}. Use another "
                          f"output.run_dir, or pass --overwrite to move the old run aside to "
                          f"'{self.path}.old-<time>'.")

    def _refuse_other_optimizer(self, recipe: Recipe, info: dict) -> None:
        """The checkpoint's optimizer variables must be the ones this recipe's optimizer has."""
        before = (info.get("recipe") or {}).get("optimizer") or {}
        now = recipe.optimizer
        old_name = before.get("name")
        if old_name is not None and old_name != now.name:
            raise RunDirError(
                f"optimizer.name changed since the checkpoints in '{self.checkpoints}' were "
                f"written ('{old_name}' -> '{now.name}'): a '{now.name}' optimizer cannot resume "
                f"'{old_name}' state. Keep optimizer.name '{old_name}', or pass --overwrite to "
                f"start afresh (the old run is moved aside). Received: optimizer.name='{now.name}'")
        old_momentum = before.get("momentum")
        if now.name in _MOMENTUM_SLOTS and isinstance(old_momentum, (int, float)) and \
                (old_momentum > 0) != (now.momentum > 0):
            raise RunDirError(
                f"optimizer.momentum changed from {old_momentum} to {now.momentum} since the "
                f"checkpoints in '{self.checkpoints}' were written: a '{now.name}' optimizer has "
                "momentum variables only when momentum > 0, so the checkpoint cannot be resumed. "
                "Keep momentum on the same side of 0, or pass --overwrite. Received: "
                f"optimizer.momentum={now.momentum}")

    def _refuse_unwritable(self, recipe: Recipe, entries: set[str]) -> None:
        folders = [self.path] if self.path.exists() else []
        if recipe.trainer.checkpoint.enabled and outputs.CHECKPOINT_DIR in entries:
            folders.append(self.checkpoints)
        if recipe.output.tensorboard and outputs.TENSORBOARD_DIR in entries:
            folders.append(self.tensorboard)
            with contextlib.suppress(OSError):
                folders += [self.tensorboard / e.name for e in os.scandir(self.tensorboard)
                            if e.is_dir(follow_symlinks=False)]
        if outputs.LOG_DIR in entries:
            folders.append(self.logs)
        for folder in folders:
            if os.path.isdir(folder) and not os.access(folder, os.W_OK | os.X_OK):
                raise RunDirError(
                    f"output.run_dir '{self.path}': '{folder}' is not writable by this user, and "
                    "this run writes there; nothing was started. Make it writable, or use another "
                    f"output.run_dir. Received: run_dir='{self.path}'")

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
                    self._refuse_moving_cwd()
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
        while _lstat(target) is not None:
            n += 1
            target = source.with_name(f"{source.name}.old-{stamp}-{n}")
        try:
            os.rename(source, target)
        except OSError as err:
            raise RunDirError(f"--overwrite: cannot move output.run_dir '{self.path}' aside to "
                              f"'{target}': {err.strerror}") from None
        log.warning(f"--overwrite: moved the previous run in {self.path} aside to {target} "
                    "(nothing deleted)")
        return target

    # ----------------------------------------------------------------------------------- writes
    def write_json(self, path: Path, data: Any) -> Path:
        """Write ``data`` as strict JSON to ``path`` (a path of this layout) atomically
        (:func:`kerasdist.training.outputs.write_json_atomic`)."""
        return outputs.write_json_atomic(path, data)

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
        return outputs.write_text_atomic(self.task_recipe, json.dumps(data, indent=2))



def _exists(path: Path) -> bool:
    try:
        os.stat(path)
    except (OSError, ValueError):  # missing, a name too long, a file used as a folder, NUL
        return False
    return True


def _nearest_existing(path: Path) -> Path:
    current = path.absolute()
    while not _exists(current) and current != current.parent:
        current = current.parent
    return current


def _limits(existing: Path) -> tuple[int, int]:
    folder = existing if existing.is_dir() else existing.parent
    try:
        return os.pathconf(folder, "PC_NAME_MAX"), os.pathconf(folder, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):  # not POSIX, or not reported
        return 255, 4096


def _entries(run_dir: Path) -> list[str]:
    found = _lstat(run_dir)
    if found is None:
        return []
    if stat.S_ISLNK(found.st_mode):
        raise _link_error(run_dir, "output.run_dir")
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


# --------------------------------------------------------- module-level API (kept for callers)
def has_previous_run(run_dir: Path) -> bool:
    """True when ``run_dir`` holds anything besides the launcher's logs and the lock."""
    return RunDir(run_dir).has_previous_run()


def check_run_dir(run_dir: Path, recipe: Recipe, *, checkpoint_schema: str, overwrite: bool) -> bool:
    """:meth:`RunDir.check` of ``run_dir`` (same returns and errors)."""
    return RunDir(run_dir).check(recipe, checkpoint_schema=checkpoint_schema, overwrite=overwrite)


def move_aside(run_dir: Path) -> Path | None:
    """:meth:`RunDir.move_aside` of ``run_dir`` (same returns and errors)."""
    return RunDir(run_dir).move_aside()


def claim(stack: contextlib.ExitStack, run_dir: Path, recipe: Recipe, *, checkpoint_schema: str,
          overwrite: bool) -> bool:
    """:meth:`RunDir.claim` of ``run_dir`` (same returns and errors)."""
    return RunDir(run_dir).claim(stack, recipe, checkpoint_schema=checkpoint_schema,
                                 overwrite=overwrite)


# ------------------------------------------------------------------------------------- the lock
def _ancestors() -> set[int]:
    pids, pid = {os.getpid()}, os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        pids.add(pid)
    return pids


def read_holder(run_dir: Path) -> dict:
    """What the lock file of ``run_dir`` records about its holder (pid, host, token, since,
    command); empty when the lock is free, missing, unreadable or a link (never followed)."""
    try:
        fd = os.open(Path(run_dir) / LOCK_NAME,
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        data = json.loads(os.read(fd, 64 * 1024).decode("utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else {}


def lock_token(run_dir: Path) -> str | None:
    """The token of the process holding ``run_dir``'s lock (read by a launcher's child that passes
    it on to remote tasks, :data:`LOCK_TOKEN_ENV`); None when the lock is free or unreadable."""
    holder = read_holder(run_dir)
    return holder.get("token") if isinstance(holder.get("token"), str) else None


def _holder_is_ours(holder: dict) -> bool:
    """Whether the lock's holder runs this process: an ancestor on this host (the local launcher),
    or the launcher that passed its lock token down (:data:`LOCK_TOKEN_ENV`, e.g. to Ray workers,
    which need not be its descendants nor on its host)."""
    if holder.get("pid") in _ancestors() and holder.get("host") == socket.gethostname():
        return True
    token = os.environ.get(LOCK_TOKEN_ENV)
    return bool(token) and secrets.compare_digest(token, str(holder.get("token", "")))


class RunDirLock:
    """Exclusive lock on a run directory for the duration of a run (context manager).

    The run directory and the lock file are opened without following symbolic links; the lock
    must be a regular file.

    Args:
        run_dir: the run directory (created if missing, when the lock is taken).
        create: False: lock only an existing lock file (nothing is created; a missing directory
            or lock file leaves this object unlocked, ``locked`` False).

    Attributes:
        inherited: True when an ancestor process (the local launcher), or the launcher whose token
            is in :data:`LOCK_TOKEN_ENV`, holds the lock, so this process runs under it without
            taking it.
        locked: True while this object holds the lock itself.
        token: the holder's random token (hex), which the holder passes to its remote tasks.

    Raises (on enter):
        RunDirError: another live process holds the lock (its pid, host, command and start time
            are named; exit code 2); the run directory or the lock is a symbolic link (its target
            is named) or the lock is not a regular file; the lock file cannot be created.
    """

    def __init__(self, run_dir: Path, *, create: bool = True):
        self.dir = Path(run_dir)
        self.path = self.dir / LOCK_NAME
        self.create = create
        self.inherited = False
        self.token: str | None = None
        self._created: list[Path] = []
        self._fd: int | None = None
        self._dir_fd: int | None = None

    @property
    def locked(self) -> bool:
        return self._fd is not None

    def _read_holder(self) -> dict:
        return read_holder(self.dir)

    def _open_dir(self) -> int | None:
        if self.create:
            missing = [d for d in (self.dir, *self.dir.parents) if _lstat(d) is None]
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise RunDirError(f"output.run_dir '{self.dir}': cannot create it: "
                                  f"{err.strerror}") from None
            self._created = missing  # removed again on exit if the run wrote nothing
        try:
            return os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            if not self.create:
                return None
            raise RunDirError(f"output.run_dir '{self.dir}' vanished while it was locked") from None
        except OSError as err:
            found = _lstat(self.dir)
            if err.errno == errno.ELOOP or (found is not None and stat.S_ISLNK(found.st_mode)):
                raise _link_error(self.dir, "output.run_dir") from None
            raise RunDirError(f"output.run_dir '{self.dir}' cannot be opened as a directory: "
                              f"{err.strerror}") from None

    def _open_lock(self, dir_fd: int) -> int | None:
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        for _ in range(3):
            try:
                fd = os.open(LOCK_NAME, flags, dir_fd=dir_fd)
            except FileNotFoundError:
                if not self.create:
                    return None
                try:
                    fd = os.open(LOCK_NAME, flags | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
                except FileExistsError:
                    continue  # created meanwhile by another run (or a link): look again
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise _link_error(self.path, "the run directory's lock") from None
                raise RunDirError(f"output.run_dir '{self.dir}': cannot open the lock "
                                  f"{self.path}: {err.strerror}") from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise RunDirError(f"the run directory's lock '{self.path}' is not a regular file; "
                                  "remove it (kerasdist creates it)")
            return fd
        raise RunDirError(f"output.run_dir '{self.dir}': cannot create the lock {self.path}")

    def __enter__(self) -> RunDirLock:
        dir_fd = self._open_dir()
        if dir_fd is None:
            return self
        try:
            fd = self._open_lock(dir_fd)
        except BaseException:
            os.close(dir_fd)
            self._remove_created()
            raise
        if fd is None:
            os.close(dir_fd)
            return self
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            os.close(dir_fd)
            holder = self._read_holder()
            if _holder_is_ours(holder):
                self.inherited, self.token = True, holder.get("token")
                return self
            raise RunDirError(
                f"output.run_dir '{self.dir}' is in use by another run: pid "
                f"{holder.get('pid', '?')} on {holder.get('host', '?')} since "
                f"{holder.get('since', '?')} ({holder.get('command', '?')}). Wait for it, or "
                "use another output.run_dir.") from None
        stale = self._read_holder()
        if stale.get("pid"):
            log.warning(f"took over the lock on {self.dir} left by pid {stale['pid']} on "
                        f"{stale.get('host', '?')} (since {stale.get('since', '?')}), which no "
                        "longer holds it")
        self.token = secrets.token_hex(16)
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "token": self.token,
                             "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                             "command": " ".join(sys.argv)[:300]})
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode(), 0)
        self._fd, self._dir_fd = fd, dir_fd
        return self

    def _remove_created(self) -> None:
        with contextlib.suppress(OSError):
            for folder in self._created:
                folder.rmdir()
        self._created = []

    def __exit__(self, *exc) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)  # an empty file: released cleanly, not stale
        try:
            if os.listdir(self._dir_fd) == [LOCK_NAME]:  # the run wrote nothing: leave nothing
                os.unlink(LOCK_NAME, dir_fd=self._dir_fd)
                self._remove_created()
        except OSError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        os.close(self._dir_fd)
        self._fd = self._dir_fd = None
