"""A process forked from a kerasdist launcher, made to stand where a started one would
(:mod:`kerasdist.launch.forking`, :mod:`.netns`): its own session, death with its
parent, its own standard streams, none of the launcher's other descriptors, signal handlers,
``atexit`` hooks or environment, and an interpreter's ending; :class:`ForkedTask` is the
launcher's handle on it, as much of :class:`subprocess.Popen` as the launcher uses."""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import signal
import sys
import threading
from typing import Callable, NoReturn, Sequence


def die_with(parent: int) -> None:
    """``PR_SET_PDEATHSIG``: SIGKILL when the launcher dies; exit now if it already has."""
    from kerasdist._parent_death import signal_when_parent_dies

    if not signal_when_parent_dies(signal.SIGKILL, parent):
        os._exit(1)


def fork() -> int:
    """``os.fork()``, without Python 3.12's warning that this process has threads: the launcher's
    are its own (console echo, stderr filter) and the allocator's (module docs of the caller)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def name_process(name: str) -> None:
    """This process's name as ``ps -e``, ``top`` and ``/proc/PID/comm`` show it (at most 15
    bytes; ``PR_SET_NAME``): a forked process otherwise keeps its launcher's. Its command line
    (``ps -f``) stays the launcher's."""
    import ctypes

    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)


def flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()


class ForkedTask:
    """A forked task, as much of :class:`subprocess.Popen` as the launcher and supervisor use:
    ``pid``, ``returncode``, :meth:`poll`, :meth:`wait`, :meth:`kill`, :meth:`send_signal`."""

    def __init__(self, pid: int, args: Sequence[str]):
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def _reap(self, flags: int) -> int | None:
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # reaped elsewhere: its code is lost
                self.returncode = 255
                return self.returncode
            if pid == 0:
                return None
            self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int:
        import subprocess
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:  # never blocks holding the lock another thread polls with
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def child_io(log_fd: int | None) -> None:
    """stdin from ``/dev/null``; fds 1 and 2 to the log (``None``: left as they are, the
    console); new unbuffered ``sys`` streams (as ``PYTHONUNBUFFERED=1``) that share no lock with
    the launcher's; logging handlers that wrote to the old streams moved to the new ones."""
    import logging

    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if log_fd is not None:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
    old_out = {id(sys.stdout), id(sys.__stdout__)}
    old_err = {id(sys.stderr), id(sys.__stderr__)}
    encoding = getattr(sys.__stdout__, "encoding", None) or "utf-8"
    out = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=encoding,
                           errors="strict", write_through=True)
    err = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=encoding,
                           errors="backslashreplace", write_through=True)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r",
                                                                             closefd=False)))
    sys.stdout = sys.__stdout__ = out
    sys.stderr = sys.__stderr__ = err
    loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values()
                                      if isinstance(v, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            stream = getattr(handler, "stream", None)
            if not isinstance(handler, logging.StreamHandler):
                continue
            if id(stream) in old_err:
                handler.setStream(err)
            elif id(stream) in old_out:
                handler.setStream(out)


def release_inherited_fds(keep: Sequence[int] = ()) -> None:
    """Every descriptor above 2 the launcher had (the run directory's lock, the stderr filter's
    pipe and saved console, the crash-trace descriptor...) made a copy of ``/dev/null``: the task
    holds none of them, as a started task does (``close_fds``), and no object of the launcher
    that still owns a number can close a descriptor the task opened later under it. ``keep``:
    descriptors left as they are (a result pipe)."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd <= 2 or fd == null or fd in keep:
                continue
            try:
                os.fstat(fd)
            except OSError:  # the listing's own descriptor, closed by now
                continue
            os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


def child_state(env: dict) -> None:
    """What a new ``python -m kerasdist`` would not have: the launcher's environment, signal
    handlers, ``atexit`` hooks, stderr filter, crash-trace handler, reporters and start-up
    phases; NumPy's global random state (a new process seeds it from the OS); BLAS/OpenMP
    threads above the task's ``OMP_NUM_THREADS``."""
    import faulthandler

    from kerasdist import _exit, _native_log, _signals
    from kerasdist.importpath import child_pythonpath

    os.environ.clear()
    os.environ.update(env)
    for entry in reversed((child_pythonpath(env.get("PYTHONPATH")) or "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(0, entry)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                signal.SIGCHLD, signal.SIGALRM):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it at start
    atexit._clear()
    faulthandler.disable()
    _native_log._ACTIVE = None  # its descriptors are /dev/null now (release_inherited_fds)
    _exit._REPORTERS.clear()
    _signals._PHASES.clear()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    threads = env.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            return
        threadpool_limits(int(threads))


def run(parent: int, body: Callable[[], int], *, name: str, env: dict, log_fd: int | None,
        keep: Sequence[int] = ()) -> NoReturn:
    """In a child just forked from ``parent``: stand where a started process would (its own
    session, death with ``parent``, the process name ``name``, standard streams by
    :func:`child_io`, no other descriptor but ``keep``, the environment ``env``), run ``body``
    and end with its code (a traceback and code 1 if it raises); never returns."""
    code = 1
    try:
        os.setsid()
        die_with(parent)
        name_process(name)  # `ps -e`, `top`
        child_io(log_fd)
        release_inherited_fds(keep)
        child_state(env)
        code = body()
    except BaseException:  # noqa: BLE001 - report and end; never back to the launcher
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
            flush()
    finally:
        os._exit(code)


def finish(code: int) -> int:
    """End a forked child as an interpreter ends: wait for its non-daemon threads, run its
    ``atexit`` hooks, flush; ``code`` as an exit status (0-255) for ``os._exit``."""
    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main and not thread.daemon and thread is not threading.current_thread():
            thread.join()
    atexit._run_exitfuncs()
    flush()
    return code & 0xFF if code >= 0 else 1


__all__ = ["ForkedTask", "child_io", "child_state", "die_with", "finish", "flush", "fork",
           "name_process", "release_inherited_fds", "run"]
