"""The run directory: what may be resumed, what may be replaced, and who holds it.

Rules (each enforced before anything is written, each with a test in tests/unit/test_rundir.py):

* A directory kerasdist did not write is never written into: a non-empty ``output.run_dir``
  without kerasdist's ``run.json`` (anything besides the launcher's ``logs/`` and the lock) is
  refused, and so is the run directory of a different model, even with checkpoints off.
* ``--overwrite`` deletes nothing: the old run directory is renamed to
  ``<run_dir>.old-<YYYYmmdd-HHMMSS>`` (files kerasdist never wrote included) and the log says where.
* One run per directory at a time: :class:`RunDirLock` holds an exclusive ``flock`` on
  ``<run_dir>/.kerasdist.lock`` for the whole run. The kernel drops the lock when its process dies,
  so a lock left by a dead process is taken over (with a message naming it); a live holder makes the
  second run fail with exit 2 naming its pid, host and command. Processes started by the holder
  (the tasks of a local cluster) run under their ancestor's lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kerasdist._log import get_logger
from kerasdist.errors import RunDirError
from kerasdist.training.outputs import CHECKPOINT_DIR, RUN_INFO, model_fingerprint, read_run_info

if TYPE_CHECKING:
    from kerasdist.config import Recipe

log = get_logger("training")

LOCK_NAME = ".kerasdist.lock"
LOCK_TOKEN_ENV = "KERASDIST_RUN_LOCK_TOKEN"
"""Environment variable through which a launcher hands its run-directory lock down to its tasks:
a task whose value equals the holder's token runs under the lock. The token identifies one run; it
is not a secret (Ray ships it to its workers inside the training function's config)."""
LAUNCH_ONLY = frozenset({"logs", "ray", LOCK_NAME})
"""Entries a run directory may hold before a run writes its ``run.json``: the launcher's task logs,
Ray's storage (``cluster.kind: ray``) and the lock."""


def _entries(run_dir: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in run_dir.iterdir())
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise RunDirError(f"output.run_dir '{run_dir}' is a file, not a directory. "
                          f"Received: run_dir='{run_dir}'") from None
    except OSError as err:
        raise RunDirError(f"output.run_dir '{run_dir}' cannot be read: {err.strerror}. "
                          f"Received: run_dir='{run_dir}'") from None


def has_previous_run(run_dir: Path) -> bool:
    """True when ``run_dir`` holds anything besides the launcher's logs and the lock."""
    return bool(set(_entries(Path(run_dir))) - LAUNCH_ONLY)


def check_run_dir(run_dir: Path, recipe: Recipe, *, checkpoint_schema: str, overwrite: bool) -> bool:
    """Refuse a run directory this run must not write into; reads only, writes nothing.

    A checkpoint can be continued by any strategy that reads the same checkpoint schema
    (default -> mirrored -> multi_worker at the exact step), but not by another model or schema.

    Returns:
        True when the directory holds checkpoints this run will resume from (False with
        ``overwrite``: the old run is moved aside by :func:`move_aside`).

    Raises:
        RunDirError (exit code 2), unless ``overwrite``: ``run_dir`` is a file; it holds files but
            no ``run.json`` (not a kerasdist run directory); it is the run of a different model; its
            checkpoints are of another checkpoint schema. The message names what was found and what
            was requested.
    """
    run_dir = Path(run_dir)
    entries = set(_entries(run_dir))
    if overwrite or not entries - LAUNCH_ONLY:
        return False
    info = read_run_info(run_dir)
    if info is None:
        shown = ", ".join(sorted(entries - LAUNCH_ONLY)[:5])
        raise RunDirError(f"output.run_dir '{run_dir}' is not empty and holds no kerasdist "
                          f"{RUN_INFO} (found: {shown}); kerasdist does not write into a folder "
                          "it did not create. Use another output.run_dir, or pass --overwrite to "
                          f"move the folder aside to '{run_dir}.old-<time>'.")
    ckpt_dir = run_dir / CHECKPOINT_DIR
    has_ckpt = ckpt_dir.is_dir() and any(ckpt_dir.iterdir())
    previous = info.get("fingerprint") or {}
    wanted = model_fingerprint(recipe, checkpoint_schema)
    if previous == wanted:
        return has_ckpt
    found_schema = previous.get("checkpoint_schema", "kerasdist-0.1 (no schema version)")
    found_kind = info.get("strategy") or (info.get("recipe") or {}).get("strategy", {}).get("kind")
    if previous.get("model") == wanted["model"]:
        if not has_ckpt:
            return False  # same model, nothing to restore: the schema does not matter
        what = (f"checkpoints in schema '{found_schema}' (strategy '{found_kind}'), which strategy "
                f"'{recipe.strategy.kind}' (schema '{checkpoint_schema}') cannot restore")
    else:
        holding = "a checkpoint" if has_ckpt else "the run"
        what = (f"{holding} of a different model (found: model {previous.get('model')}, "
                f"schema '{found_schema}', strategy '{found_kind}'; this recipe: model "
                f"{wanted['model']}, schema '{checkpoint_schema}', strategy "
                f"'{recipe.strategy.kind}')")
    raise RunDirError(f"output.run_dir '{run_dir}' holds {what}. Use another output.run_dir, or "
                      f"pass --overwrite to move the old run aside to '{run_dir}.old-<time>'.")


def move_aside(run_dir: Path) -> Path | None:
    """``--overwrite``: rename a run directory that holds a previous run (see
    :func:`has_previous_run`) to ``<run_dir>.old-<YYYYmmdd-HHMMSS>[-N]``; nothing is deleted.

    Returns:
        The new location, or None when there was nothing to move.

    Raises:
        RunDirError: the rename failed (the message names both paths and the OS error).
    """
    run_dir = Path(run_dir)
    if not has_previous_run(run_dir):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = run_dir.with_name(f"{run_dir.name}.old-{stamp}"), 1
    while target.exists():
        n += 1
        target = run_dir.with_name(f"{run_dir.name}.old-{stamp}-{n}")
    try:
        os.rename(run_dir, target)
    except OSError as err:
        raise RunDirError(f"--overwrite: cannot move output.run_dir '{run_dir}' aside to "
                          f"'{target}': {err.strerror}") from None
    log.warning(f"--overwrite: moved the previous run in {run_dir} aside to {target} "
                "(nothing deleted)")
    return target


def claim(stack: contextlib.ExitStack, run_dir: Path, recipe: Recipe, *, checkpoint_schema: str,
          overwrite: bool) -> bool:
    """Take the run directory for this run: lock it (held until ``stack`` closes), move a previous
    run aside under ``overwrite`` (unless an ancestor process, the local launcher, holds the lock and
    did so), then check it again under the lock.

    Returns:
        Whether there are checkpoints to resume (see :func:`check_run_dir`).

    Raises:
        RunDirError: see :class:`RunDirLock`, :func:`move_aside` and :func:`check_run_dir`.
    """
    lock = stack.enter_context(RunDirLock(run_dir))
    if overwrite and not lock.inherited and move_aside(run_dir) is not None:
        stack.close()
        stack.enter_context(RunDirLock(run_dir))
    return check_run_dir(run_dir, recipe, checkpoint_schema=checkpoint_schema, overwrite=overwrite)


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


def lock_token(run_dir: Path) -> str | None:
    """The token of the process holding ``run_dir``'s lock (read by a launcher's child that passes
    it on to remote tasks, :data:`LOCK_TOKEN_ENV`); None when the lock is free or unreadable."""
    holder = RunDirLock(run_dir)._read_holder()
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

    Args:
        run_dir: the run directory (created if missing, when the lock is taken).

    Attributes:
        inherited: True when an ancestor process (the local launcher), or the launcher whose token
            is in :data:`LOCK_TOKEN_ENV`, holds the lock, so this process runs under it without
            taking it.
        token: the holder's random token (hex), which the holder passes to its remote tasks.

    Raises (on enter):
        RunDirError: another live process holds the lock (its pid, host, command and start time
            are named; exit code 2), or the lock file cannot be created.
    """

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        self.inherited = False
        self.token: str | None = None
        self._created: list[Path] = []
        self._fd: int | None = None

    def _read_holder(self) -> dict:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def __enter__(self) -> RunDirLock:
        try:
            missing = [d for d in (self.path.parent, *self.path.parent.parents) if not d.exists()]
            self._created = missing  # removed again on exit if the run wrote nothing
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise RunDirError(f"output.run_dir '{self.path.parent}': cannot create the lock "
                              f"{self.path}: {err.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self._read_holder()
            if _holder_is_ours(holder):
                self.inherited, self.token = True, holder.get("token")
                return self
            raise RunDirError(
                f"output.run_dir '{self.path.parent}' is in use by another run: pid "
                f"{holder.get('pid', '?')} on {holder.get('host', '?')} since "
                f"{holder.get('since', '?')} ({holder.get('command', '?')}). Wait for it, or "
                "use another output.run_dir.") from None
        stale = self._read_holder()
        if stale.get("pid"):
            log.warning(f"took over the lock on {self.path.parent} left by pid {stale['pid']} on "
                        f"{stale.get('host', '?')} (since {stale.get('since', '?')}), which no "
                        "longer holds it")
        self.token = secrets.token_hex(16)
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "token": self.token,
                             "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                             "command": " ".join(sys.argv)[:300]})
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)  # an empty file: released cleanly, not stale
        if _entries(self.path.parent) == [LOCK_NAME]:  # the run wrote nothing: leave nothing
            self.path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                for folder in self._created:
                    folder.rmdir()
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
