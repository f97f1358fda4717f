"""The launching side of a local cluster run in a child process (:mod:`kerasdist.launch.isolation`):
start the child (forked into a fresh network namespace, :mod:`kerasdist.launch.netns`; or a new
interpreter, ``unshare --net python -m kerasdist.launch.isolation``; or, exposed, without
``unshare``), stream nothing itself (the child inherits the console), forward SIGINT and SIGTERM to
it, and map how it ended back: the :class:`RunResult` of ``<run_dir>/metrics.json``, or the
child's error, same class and message (:mod:`kerasdist.launch.status`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from typing import TYPE_CHECKING

from kerasdist import _log
from kerasdist._signals import Terminated, terminate_on_sigterm
from kerasdist.errors import TaskFailedError
from kerasdist.launch import status
from kerasdist.launch.isolation import launcher_env, unshare_argv
from kerasdist.launch.processes import describe_exit, die_with_parent
from kerasdist.training import RunResult
from kerasdist.training.rundir import RunDir

if TYPE_CHECKING:
    from kerasdist.config import Recipe

log = _log.get_logger("launch")

STOP_GRACE_S = 90.0
"""Seconds the namespace child gets after a forwarded SIGINT/SIGTERM (its tasks save and stop
within the launcher's own grace, 60 s), before SIGKILL."""
REPORTED_EXIT_S = 30.0
"""Seconds the namespace child gets to exit once it has reported how the run ended (its result
pipe closed), before it is killed with its tasks (:func:`run_isolated`)."""



def run_isolated(recipe: Recipe, *, overwrite: bool, verbose, isolate: bool = True) -> RunResult:
    """Run the local cluster in a child process in a fresh network namespace; wait; map its end.

    The child is forked from this process where it imported TensorFlow for the run
    (:func:`kerasdist.launch.forked.launcher_ready`; :mod:`kerasdist.launch.netns`), else
    started as ``unshare --net python -m kerasdist.launch.isolation``. With ``isolate=False``
    the child runs in this network namespace (an exposed run): a library call's coordinator then
    runs in a process that may be ended when TensorFlow blocks it for good
    (:mod:`kerasdist._exit`), never in the caller's interpreter.

    Raises:
        the child's error, same class and message (RecipeError ... TaskFailedError, TrainingError,
        Preempted, KeyboardInterrupt); TaskFailedError if the child itself was killed.
    """
    from kerasdist.launch import forked

    if isolate and forked.launcher_ready():
        from kerasdist.launch import netns

        try:
            return _supervise(recipe, lambda fd: (netns.fork_launcher(
                recipe, overwrite=overwrite, verbose=verbose, result_fd=fd), None))
        except netns.NotIsolated as err:  # nothing started: start it as a new interpreter
            log.warning(f"the local cluster's launcher could not be forked into a network "
                        f"namespace ({err}); starting it as a new process")
            forked.spend()
    return _supervise(recipe, lambda fd: _popen_launcher(
        recipe, fd, overwrite=overwrite, verbose=verbose, isolate=isolate))


def _popen_launcher(recipe: Recipe, write_fd: int, *, overwrite: bool, verbose,
                    isolate: bool) -> tuple[subprocess.Popen, bytes]:
    argv = [*(unshare_argv() if isolate else ()), sys.executable, "-m",
            "kerasdist.launch.isolation", "--result-fd", str(write_fd), "--verbose",
            json.dumps(verbose)]
    if overwrite:
        argv.append("--overwrite")
    if not isolate:
        argv.append("--exposed")
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, pass_fds=(write_fd,), env=launcher_env(),
                             preexec_fn=die_with_parent)
    return child, json.dumps(recipe.model_dump(mode="json")).encode()


def _supervise(recipe: Recipe, start) -> RunResult:
    """Start the child (``start(write_fd)`` returns it and the bytes for its stdin, or None),
    wait for it, forwarding SIGINT/SIGTERM, and map how it ended (:func:`_outcome`)."""
    read_fd, write_fd = os.pipe()
    try:
        child, payload = start(write_fd)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    reply: list[bytes] = []
    reader = threading.Thread(target=_read_all, args=(read_fd, reply), daemon=True)
    reader.start()
    interrupted: BaseException | None = None
    killed_after_report = False
    try:
        if payload is not None:
            try:
                child.stdin.write(payload)
                child.stdin.close()
            except BrokenPipeError:  # it ended at once: its report says why
                pass
        with terminate_on_sigterm():
            try:
                killed_after_report = _wait_for(child, reader)
            except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: the child saves and stops
                interrupted = err
                _forward(child, signal.SIGTERM if isinstance(err, Terminated) else signal.SIGINT)
    finally:
        if child.poll() is None:  # a second interrupt, or an error here: leave nothing behind
            _kill(child)
    reader.join(timeout=10)
    return _outcome(recipe, child, b"".join(reply), interrupted, killed_after_report)


def _wait_for(child, reader: threading.Thread) -> bool:
    """Wait for the child; once it has reported how the run ended (its result pipe is closed), it
    gets :data:`REPORTED_EXIT_S` seconds to exit, then it is killed with its tasks: the run's end
    is known, and a process whose teardown blocks in TensorFlow (a runtime still waiting for a
    lost task) must not hold the command for ever. True when it had to be killed so."""
    while True:
        try:
            child.wait(timeout=0.5)
            return False
        except subprocess.TimeoutExpired:
            pass
        if not reader.is_alive():
            try:
                child.wait(timeout=REPORTED_EXIT_S)
            except subprocess.TimeoutExpired:
                log.warning(f"the local cluster's launcher (pid {child.pid}) reported how the run "
                            f"ended but had not exited {REPORTED_EXIT_S:.0f} s later: killing it "
                            "and its tasks")
                _kill(child)
                return True
            return False


def _read_all(fd: int, into: list[bytes]) -> None:
    with os.fdopen(fd, "rb") as pipe:
        into.append(pipe.read())


def _forward(child, sig: int) -> None:
    log.warning(f"interrupted: the local cluster saves a checkpoint and stops (up to "
                f"{STOP_GRACE_S:.0f} s)")
    try:
        os.kill(child.pid, sig)
        child.wait(timeout=STOP_GRACE_S)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        _kill(child)


def _kill(child) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)  # its tasks die with it (PR_SET_PDEATHSIG)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()


def _outcome(recipe: Recipe, child, reply: bytes,
             interrupted: BaseException | None, killed_after_report: bool = False) -> RunResult:
    code = child.returncode
    try:
        result = json.loads(reply.decode("utf-8")) if reply else None
    except ValueError:
        result = None
    if result and "not_isolated" in result and interrupted is None:
        from kerasdist.launch.netns import NotIsolated

        raise NotIsolated(result["not_isolated"])
    if result and result.get("ok") and (code == 0 or killed_after_report):
        return RunResult.from_metrics(RunDir.of(recipe).metrics)
    if result and not result.get("ok"):
        raise status.rebuild(result)
    if interrupted is not None:
        raise interrupted
    raise TaskFailedError(f"the local cluster's launcher (pid {child.pid}, in its network namespace) "
                          f"{describe_exit(code)} without reporting how it ended; task logs in "
                          f"{RunDir.of(recipe).logs}")


__all__ = ["REPORTED_EXIT_S", "STOP_GRACE_S", "run_isolated"]
