"""Tasks forked from a launcher that imported TensorFlow once (issue 42, item 8: time to first
step). On by default where it applies; ``KERASDIST_FORK_TASKS=0`` turns it off.

Without it, the launching command imports TensorFlow and builds the model against the data (its
bad-input checks: nothing may start before they pass), then every task imports TensorFlow again.
Where this module applies, the command instead:

1. imports ``tensorflow`` and ``keras`` once and initializes no TensorFlow runtime (no eager
   context, no op: a ``MultiWorkerMirroredStrategy`` must be the first TF runtime op of its
   process, and TensorFlow's runtime threads would not survive a fork);
2. runs the checks (:func:`kerasdist.training.checks.check_recipe_here`) in a child forked from
   it, which reports its verdict on a pipe and exits: bad input still exits 2 with the same
   message and starts nothing;
3. runs the local cluster's launcher: an isolated run (the default where a network namespace can
   be made) forks it into a fresh network namespace (:mod:`kerasdist.launch.netns`); an exposed
   run (``cluster.allow_network_exposure`` where none can be made) runs it in the command;
4. the launcher forks the first attempt's tasks (:func:`start`): each child leaves the
   launcher's session and dies with it (as a started task does), reads ``/dev/null``, writes its
   log file, takes its task's environment, drops the launcher's signal handlers, ``atexit``
   hooks, stderr filter and crash-trace descriptor, and runs ``python -m kerasdist <args>``'s
   entry point; it ends with ``os._exit`` and the code that command returns.

It applies only to a local ``fit`` started by kerasdist's own command (not a library call),
without tracking, ``multi_worker`` or ``parameter_server``; only the first attempt's tasks are
forked (a restart, a parameter-server worker started again, ``kerasdist launch``, Slurm and Ray
start processes as before). Once the launcher may have started TensorFlow's runtime (a
parameter-server coordinator runs in it), nothing more is forked from it (:func:`spend`).
"""

from __future__ import annotations

import atexit
import io
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from kerasdist.config import Recipe

ENV = "KERASDIST_FORK_TASKS"
"""``0`` turns the fork path off (every task then starts as ``python -m kerasdist``)."""

_STATE = {"warm": False, "spent": False}


def enabled() -> bool:
    """The switch (:data:`ENV`, default on) and a platform with ``fork`` and ``/proc``."""
    return (os.environ.get(ENV, "1") not in ("0", "")
            and sys.platform.startswith("linux") and hasattr(os, "fork"))


def applies(recipe: Recipe) -> bool:
    """Whether this ``fit`` may fork its checks, its namespace child and its tasks (see the
    module docs)."""
    from kerasdist import _exit
    from kerasdist.strategies import registry

    if not enabled() or not _exit.owns_process() or recipe.cluster.kind != "local":
        return False
    if recipe.output.tracking is not None:
        return False
    return registry.for_recipe(recipe).traits.topology in ("peers", "coordinator")


def ready(argv: Sequence[str]) -> bool:
    """Whether :func:`start` may fork the task ``argv`` now: this process imported TensorFlow
    for it (:func:`check_recipe`), has not spent the fork path, and ``argv`` is
    ``python -m kerasdist ...`` started from the main thread."""
    return (_STATE["warm"] and not _STATE["spent"] and list(argv[:3]) == [
        sys.executable, "-m", "kerasdist"] and threading.current_thread() is threading.main_thread())


def launcher_ready() -> bool:
    """Whether the namespace child of an isolated local cluster may be forked from this process
    now (:mod:`kerasdist.launch.netns`): as :func:`ready`, for the launcher itself."""
    return (_STATE["warm"] and not _STATE["spent"]
            and threading.current_thread() is threading.main_thread())


def spend() -> None:
    """Fork no more tasks from this process (the first attempt's tasks have started)."""
    _STATE["spent"] = True


def _import_tensorflow() -> None:
    """``import tensorflow, keras`` here, with ``TF_CPP_MIN_LOG_LEVEL`` as the tasks get it
    (:meth:`~kerasdist.launch.processes.LocalLauncher.start_process`): TensorFlow reads it once,
    at import. This process's own environment is left as it was."""
    before = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
    finally:
        if before is None:
            os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)


def check_recipe(recipe: Recipe) -> None:
    """:func:`kerasdist.training.checks.check_recipe_here`: in a forked child where
    :func:`applies`, else here.

    Raises:
        the check's own error (same class and message), e.g. DataError (exit code 2).
    """
    from kerasdist.training.checks import check_recipe_here

    if not applies(recipe):
        check_recipe_here(recipe)
        return
    _import_tensorflow()
    verdict = _check_in_child(recipe)
    if verdict is None:  # the child died without a verdict: check here, start tasks as before
        from kerasdist._log import get_logger

        get_logger("launch").warning("the forked recipe check ended without a verdict; "
                                     "checking here (the tasks start as new processes)")
        spend()
        check_recipe_here(recipe)
        return
    if not verdict.get("ok"):
        from kerasdist.launch import status

        raise status.rebuild(verdict)
    _STATE["warm"] = True


def _check_in_child(recipe: Recipe) -> dict | None:
    from kerasdist.launch import status
    from kerasdist.training.checks import check_recipe_here

    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    pid = _fork()
    if pid == 0:  # the child: check, report, exit; never returns
        code = 1
        try:
            os.close(read_fd)
            _die_with(parent)
            atexit._clear()
            try:
                check_recipe_here(recipe)
                verdict, code = {"ok": True}, 0
            except (Exception, KeyboardInterrupt) as err:
                verdict, code = {"ok": False, **status.record(err)}, 2
            with os.fdopen(write_fd, "w", encoding="utf-8") as pipe:
                pipe.write(json.dumps(verdict))
            _flush()
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as pipe:
            data = pipe.read()
    except BaseException:
        _kill(pid)
        raise
    finally:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    try:
        return json.loads(data.decode("utf-8")) if data else None
    except ValueError:
        return None


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _die_with(parent: int) -> None:
    """``PR_SET_PDEATHSIG``: SIGKILL when the launcher dies; exit now if it already has."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass
    if os.getppid() != parent:
        os._exit(1)


def _fork() -> int:
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

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)
    except OSError:
        pass


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


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
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(argv: Sequence[str], *, env: dict, log_path: Path) -> ForkedTask:
    """Fork the task ``argv`` (``python -m kerasdist ARGS``; :func:`ready` said yes) with the
    environment ``env`` (the whole of it, as a started task gets it), its standard output and
    error appended to ``log_path``."""
    _flush()
    parent = os.getpid()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        pid = _fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.setsid()
                _die_with(parent)
                name_process(f"kd-{log_path.stem}")  # `ps -e`, `top`: kd-worker-1
                _child_io(log_fd)
                _release_inherited_fds()
                _child_state(env)
                from kerasdist._timeline import mark

                mark("forked")  # KERASDIST_TIMELINE: this task was forked (tests, the profile)
                code = _run(list(argv[3:]))
            except BaseException:  # noqa: BLE001 - report and end; never back to the launcher
                try:
                    import traceback

                    traceback.print_exc()
                    _flush()
                except BaseException:  # noqa: BLE001
                    pass
            finally:
                os._exit(code)
    finally:
        os.close(log_fd)
    return ForkedTask(pid, argv)


def _child_io(log_fd: int | None) -> None:
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


def _release_inherited_fds(keep: Sequence[int] = ()) -> None:
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


def _child_state(env: dict) -> None:
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
    _native_log._ACTIVE = None  # its descriptors are /dev/null now (_release_inherited_fds)
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


def _run(args: list[str]) -> int:
    """``python -m kerasdist ARGS`` here: its exit code as the interpreter would give it, after
    the non-daemon threads ended and the ``atexit`` hooks ran (as at an interpreter's exit)."""
    import runpy

    sys.argv = ["-m", *args]  # runpy puts the module's path first, as `python -m` does
    code = 0
    try:
        runpy.run_module("kerasdist", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = done.code
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    return finish(code)


def finish(code: int) -> int:
    """End a forked child as an interpreter ends: wait for its non-daemon threads, run its
    ``atexit`` hooks, flush; ``code`` as an exit status (0-255) for ``os._exit``."""
    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main and not thread.daemon and thread is not threading.current_thread():
            thread.join()
    atexit._run_exitfuncs()
    _flush()
    return code & 0xFF if code >= 0 else 1


__all__ = ["ENV", "ForkedTask", "applies", "check_recipe", "enabled", "finish", "launcher_ready",
           "ready", "spend", "start"]
