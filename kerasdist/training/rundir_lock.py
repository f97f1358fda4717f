"""The run directory's lock: one run per directory at a time (:class:`RunDirLock`).

:class:`kerasdist.training.rundir.RunDir` takes it in :meth:`~kerasdist.training.rundir.RunDir.claim`;
the rules it enforces are listed in :mod:`kerasdist.training.rundir`. The lock is an exclusive
``flock`` on ``<run_dir>/.kerasdist.lock`` (``fcntl.flock``, Linux/POSIX), which the kernel drops
when its holder dies; the file records the holder (pid, host, token, start time, command) as JSON.
Nothing here follows a symbolic link.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import socket
import stat
import sys
import time
from pathlib import Path

from kerasdist._log import get_logger
from kerasdist.errors import RunDirError
from kerasdist.training.outputs import LOCK_NAME

log = get_logger("training")

LOCK_TOKEN_ENV = "KERASDIST_RUN_LOCK_TOKEN"
"""Environment variable through which a launcher hands its run-directory lock down to its tasks:
a task whose value equals the holder's token runs under the lock. The token identifies one run; it
is not a secret (Ray ships it to its workers inside the training function's config)."""

def lstat_or_none(path: Path) -> os.stat_result | None:
    """``os.lstat(path)`` (the link itself, not its target), or None when it cannot be read."""
    try:
        return os.lstat(path)
    except (OSError, ValueError):
        return None


def link_error(path: Path, what: str) -> RunDirError:
    """The refusal of a symbolic link at ``path`` (``what`` names its role), naming its target."""
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return RunDirError(f"{what} '{path}' is a symbolic link (to '{target}'); kerasdist follows no "
                       "link in a run directory (it would write where the link points). Remove the "
                       "link, or name the directory itself in output.run_dir.")


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
            or lock file leaves this object unlocked).

    Attributes:
        inherited: True when an ancestor process (the local launcher), or the launcher whose token
            is in :data:`LOCK_TOKEN_ENV`, holds the lock, so this process runs under it without
            taking it.
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

    def _open_dir(self) -> int | None:
        if self.create:
            missing = [d for d in (self.dir, *self.dir.parents) if lstat_or_none(d) is None]
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
            found = lstat_or_none(self.dir)
            if err.errno == errno.ELOOP or (found is not None and stat.S_ISLNK(found.st_mode)):
                raise link_error(self.dir, "output.run_dir") from None
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
                    raise link_error(self.path, "the run directory's lock") from None
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
            holder = read_holder(self.dir)
            if _holder_is_ours(holder):
                self.inherited, self.token = True, holder.get("token")
                return self
            raise RunDirError(
                f"output.run_dir '{self.dir}' is in use by another run: pid "
                f"{holder.get('pid', '?')} on {holder.get('host', '?')} since "
                f"{holder.get('since', '?')} ({holder.get('command', '?')}). Wait for it, or "
                "use another output.run_dir.") from None
        stale = read_holder(self.dir)
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
        with contextlib.suppress(OSError):
            if os.listdir(self._dir_fd) == [LOCK_NAME]:  # the run wrote nothing: leave nothing
                os.unlink(LOCK_NAME, dir_fd=self._dir_fd)
                self._remove_created()
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        os.close(self._dir_fd)
        self._fd = self._dir_fd = None
