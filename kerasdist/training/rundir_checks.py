"""The refusals of :class:`kerasdist.training.rundir.RunDir`'s check, one function each.

Each reads only (``os.lstat``, ``os.access``, ``os.pathconf``, directory listings) and raises
:class:`~kerasdist.errors.RunDirError` (exit code 2) naming ``output.run_dir``, what was found and
what was requested; the rules they enforce are listed in :mod:`kerasdist.training.rundir`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from kerasdist.errors import RunDirError
from kerasdist.training import outputs
from kerasdist.training.outputs import LOCK_NAME, RUN_INFO, model_fingerprint
from kerasdist.training.rundir_lock import link_error, lstat_or_none

if TYPE_CHECKING:
    from kerasdist.config import Recipe

_MOMENTUM_SLOTS = frozenset({"sgd", "rmsprop"})
"""Optimizers whose variables include momentum slots only when ``optimizer.momentum`` > 0."""


def check_path(path: Path) -> None:
    """Refuse an ``output.run_dir`` that cannot be created or written; no file is read or made.

    Checks: not a symbolic link; not an existing non-directory; every component fits the
    filesystem's name limit (``NAME_MAX``) and the whole path its path limit; the nearest
    existing ancestor is a directory this process can write into (``os.access``; always true
    for root).

    Raises:
        RunDirError: naming ``output.run_dir``, the path and what is wrong (exit code 2).
    """
    label = f"output.run_dir '{path}'"
    found = lstat_or_none(path)
    if found is not None and stat.S_ISLNK(found.st_mode):
        raise link_error(path, "output.run_dir")
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


def refuse_links(path: Path, entries: set[str]) -> None:
    """Refuse a symbolic link among the layout's names in ``entries`` (names in ``path``)."""
    layout = {RUN_INFO, outputs.METRICS, outputs.MODEL, outputs.INFERENCE_MODEL,
              outputs.CHECKPOINT_DIR,
              outputs.TENSORBOARD_DIR, outputs.LOG_DIR, outputs.RAY_DIR, outputs.EVAL_FILE,
              LOCK_NAME}
    for name in sorted(entries & layout):
        found = lstat_or_none(path / name)
        if found is not None and stat.S_ISLNK(found.st_mode):
            raise link_error(path / name, f"output.run_dir '{path}': the entry")


def holds_cwd(path: Path) -> bool:
    """Whether ``path`` is the current directory or one of its parents."""
    here, target = Path.cwd().resolve(), path.resolve()
    return target == here or target in here.parents


def refuse_moving_cwd(path: Path) -> None:
    """Refuse moving ``path`` aside when it is or holds the current directory, is the root, or
    its folder is not writable."""
    here, target = Path.cwd().resolve(), path.resolve()
    if holds_cwd(path):
        raise RunDirError(
            f"--overwrite would move output.run_dir '{path}' ('{target}') aside, but it "
            f"is the current directory or holds it ('{here}'). Run kerasdist from another "
            f"directory, or name another output.run_dir. Received: run_dir='{path}'")
    if target.parent == target:
        raise RunDirError(f"--overwrite cannot move output.run_dir '{path}' aside (it is "
                          f"the root directory). Received: run_dir='{path}'")
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise RunDirError(f"--overwrite cannot move output.run_dir '{path}' aside: its "
                          f"folder '{target.parent}' is not writable by this user. Received: "
                          f"run_dir='{path}'")


def refuse_other_model(path: Path, recipe: Recipe, info: dict, checkpoint_schema: str,
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
    raise RunDirError(f"output.run_dir '{path}' holds {what}. Use another "
                      f"output.run_dir, or pass --overwrite to move the old run aside to "
                      f"'{path}.old-<time>'.")


def refuse_other_optimizer(layout, recipe: Recipe, info: dict) -> None:
    """The checkpoint's optimizer variables must be the ones this recipe's optimizer has
    (``layout``: the :class:`~kerasdist.training.rundir.RunDir`; ``info``: its ``run.json``).

    Raises:
        RunDirError: ``optimizer.name`` changed, ``optimizer.momentum`` crossed 0 (its slots come
            or go), or the schedule changed (:func:`refuse_other_schedule`); exit code 2.
    """
    before = (info.get("recipe") or {}).get("optimizer") or {}
    now = recipe.optimizer
    old_name = before.get("name")
    if old_name is not None and str(old_name).lower() != now.name.lower():
        raise RunDirError(
            f"optimizer.name changed since the checkpoints in '{layout.checkpoints}' were "
            f"written ('{old_name}' -> '{now.name}'): a '{now.name}' optimizer cannot resume "
            f"'{old_name}' state. Keep optimizer.name '{old_name}', or pass --overwrite to "
            f"start afresh (the old run is moved aside). Received: optimizer.name='{now.name}'")
    old_momentum = before.get("momentum")
    if now.name in _MOMENTUM_SLOTS and isinstance(old_momentum, (int, float)) and \
            (old_momentum > 0) != (now.momentum > 0):
        raise RunDirError(
            f"optimizer.momentum changed from {old_momentum} to {now.momentum} since the "
            f"checkpoints in '{layout.checkpoints}' were written: a '{now.name}' optimizer has "
            "momentum variables only when momentum > 0, so the checkpoint cannot be resumed. "
            "Keep momentum on the same side of 0, or pass --overwrite. Received: "
            f"optimizer.momentum={now.momentum}")
    refuse_other_schedule(layout, recipe, before)


def refuse_other_schedule(layout, recipe: Recipe, before: dict) -> None:
    """A learning-rate schedule is a function of the global step: resuming under another one
    (or switching between a schedule and a constant) would jump the rate at the resumed step, so
    it is refused naming ``optimizer.learning_rate``. A constant changed into another constant is
    applied from the resumed step (logged by the session)."""
    if "learning_rate" not in before:
        return
    old = before["learning_rate"]
    new = recipe.optimizer.model_dump(mode="json")["learning_rate"]
    if not (isinstance(old, dict) or isinstance(new, dict)) or old == new:
        return
    raise RunDirError(
        f"optimizer.learning_rate: the schedule changed since the checkpoints in "
        f"'{layout.checkpoints}' were written ({old!r} -> {new!r}); a resumed run continues its "
        "schedule at the exact step, so it must be the same. Keep the previous "
        "optimizer.learning_rate, or pass --overwrite to start afresh (the old run is moved "
        f"aside). Received: learning_rate={new!r}")


def refuse_other_callbacks(layout, recipe: Recipe, info: dict) -> None:
    """The recipe's ``callbacks`` are part of what a resumed run must keep: an ``EarlyStopping``
    with another patience, another ``LearningRateScheduler`` or a callback added or removed
    would train the rest of the run differently from the first part (or, on a finished run,
    silently do nothing). A change is refused naming ``callbacks.<i>`` (the first entry that
    differs), the old and the new entry. A ``run.json`` written before recipes had callbacks
    (no ``callbacks`` key) is not compared.

    Args:
        layout: the :class:`~kerasdist.training.rundir.RunDir`.
        recipe: this run's recipe.
        info: the previous run's ``run.json``.

    Raises:
        RunDirError: the callbacks changed (exit code 2).
    """
    before = (info.get("recipe") or {}).get("callbacks")
    if before is None:
        return
    now = recipe.model_dump(mode="json")["callbacks"]
    if before == now:
        return
    pairs = zip(before, now, strict=False)  # a callback added or removed: the first past both
    index = next((i for i, (old, new) in enumerate(pairs) if old != new), min(len(before), len(now)))
    old = before[index] if index < len(before) else "(none)"
    new = now[index] if index < len(now) else "(none)"
    raise RunDirError(
        f"callbacks.{index}: changed since the checkpoints in '{layout.checkpoints}' were written "
        f"({old!r} -> {new!r}); a resumed run trains with the callbacks it started with. Keep the "
        "previous callbacks, or pass --overwrite to start afresh (the old run is moved aside). "
        f"Received: callbacks.{index}={new!r}")


def refuse_unwritable(layout, recipe: Recipe, entries: set[str]) -> None:
    """Refuse a folder of the layout this run writes (``layout``: the
    :class:`~kerasdist.training.rundir.RunDir`) that this user cannot write into."""
    folders = [layout.path] if layout.path.exists() else []
    if recipe.trainer.checkpoint.enabled and outputs.CHECKPOINT_DIR in entries:
        folders.append(layout.checkpoints)
    if recipe.output.tensorboard and outputs.TENSORBOARD_DIR in entries:
        folders.append(layout.tensorboard)
        with contextlib.suppress(OSError):
            folders += [layout.tensorboard / e.name for e in os.scandir(layout.tensorboard)
                        if e.is_dir(follow_symlinks=False)]
    if outputs.LOG_DIR in entries:
        folders.append(layout.logs)
    for folder in folders:
        if os.path.isdir(folder) and not os.access(folder, os.W_OK | os.X_OK):
            raise RunDirError(
                f"output.run_dir '{layout.path}': '{folder}' is not writable by this user, and "
                "this run writes there; nothing was started. Make it writable, or use another "
                f"output.run_dir. Received: run_dir='{layout.path}'")


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
