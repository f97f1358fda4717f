"""Local clusters in a private network namespace: their task servers are unreachable from the network
(docs/guarantees.md, "Local clusters are isolated").

The launching process checks everything first (:func:`kerasdist.launch.run.preflight`), then starts
ONE child, ``unshare --net [--map-root-user] python -m kerasdist.launch.isolation`` (or forks it:
:mod:`kerasdist.launch.forking.netns`), which brings ``lo`` up and runs the local launcher there
(:func:`serve`). :func:`run_isolated` forwards SIGINT and SIGTERM to the child and maps its result
back: the :class:`RunResult` of ``<run_dir>/metrics.json``, or the child's exception class and
message.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
from functools import lru_cache
from typing import TYPE_CHECKING

from kerasdist import _exit, _log, errors
from kerasdist._signals import Terminated, terminate_on_sigterm
from kerasdist.errors import ClusterError, TaskFailedError
from kerasdist.importpath import child_pythonpath
from kerasdist.launch import status
from kerasdist.launch.processes import (
    describe_exit,
    die_with_parent,
    network_interfaces,
)
from kerasdist.training import RunResult
from kerasdist.training.rundir import RunDir

if TYPE_CHECKING:
    from kerasdist.config import Recipe

log = _log.get_logger("launch")

NO_NETNS_ENV = "KERASDIST_NO_NETNS"
"""Set to ``1`` to act as if network namespaces were unavailable on this machine (tests)."""


def launcher_env() -> dict[str, str]:
    """The environment of the local cluster's launcher (started or forked): this process's,
    unbuffered, with the user's modules on ``PYTHONPATH``
    (:func:`kerasdist.importpath.child_pythonpath`)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    pythonpath = child_pythonpath(os.environ.get("PYTHONPATH"))  # the user's modules
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def unshare_argv() -> list[str]:
    """The command prefix that runs a program in a fresh network namespace (empty if impossible)."""
    binary = shutil.which("unshare")
    if binary is None:
        return []
    return [binary, "--net"] if os.geteuid() == 0 else [binary, "--net", "--map-root-user"]


@lru_cache(maxsize=1)
def _probe() -> str | None:
    prefix = unshare_argv()
    if not prefix:
        return "no 'unshare' program on PATH (util-linux)"
    try:
        done = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"'{' '.join(prefix)} true' could not run ({err})"
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else describe_exit(
            done.returncode)
        return f"'{' '.join(prefix)} true' failed: {why}"
    return None


def unavailable_reason() -> str | None:
    """Why this machine cannot isolate a local cluster in a network namespace; None if it can."""
    if os.environ.get(NO_NETNS_ENV, "") not in ("", "0"):
        return f"{NO_NETNS_ENV} is set"
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux-only (this is {sys.platform})"
    return _probe()


def plan(recipe: Recipe, *, callbacks=()) -> bool:
    """Decide, before anything starts or is written, whether a local cluster runs isolated.

    Returns:
        True: run it in a private network namespace
        (:func:`run_isolated`); False: run it here, exposed, because the
        recipe allows it (a warning says so).

    Raises:
        ClusterError: isolation is impossible and ``cluster.allow_network_exposure`` is not set,
            or extra callbacks were given for an isolated coordinator run (exit code 2).
    """
    reason = unavailable_reason()
    if reason is None:
        if callbacks:
            raise ClusterError(
                "extra Python callbacks cannot be sent into a local cluster, which runs in a child "
                "process in its own network namespace, unless a task can rebuild them: give them "
                "as recipe callbacks (a Keras class name, {class_name, config} or "
                "'pkg.mod:Class'), or as instances of an importable class with get_config(); or "
                f"pass them to a single-process run. Received: callbacks={list(callbacks)!r}")
        return True
    if not recipe.cluster.allow_network_exposure:
        raise ClusterError(
            f"cannot isolate the local cluster in a private network namespace: {reason}. Its task "
            "servers would listen on every network interface without authentication (anyone who "
            "reaches this machine could run ops in them), so it was not started. Run where "
            "'unshare --net' works (as root, or with unprivileged user namespaces for "
            "'unshare --net --map-root-user'), or set cluster.allow_network_exposure: true to "
            "run it exposed on a trusted network. Received: cluster.allow_network_exposure=false")
    log.warning(f"cluster.allow_network_exposure is set and the local cluster cannot be isolated "
                f"({reason}): its task servers listen on every network interface of this machine, "
                "without authentication, for the whole run")
    return False


def isolated_argv(argv: list[str]) -> list[str]:
    """A command that runs ``argv`` in a fresh network namespace with only loopback up: for other
    programs that start local clusters with :class:`~kerasdist.launch.processes.LocalLauncher`.

    Raises:
        ClusterError: network namespaces are unavailable here (says why).
    """
    reason = unavailable_reason()
    if reason is not None:
        raise ClusterError(f"cannot isolate a local cluster in a private network namespace: {reason}")
    return [*unshare_argv(), sys.executable, "-m", "kerasdist.launch.isolation", "--exec", *argv]


IN_NETNS_ENV = "KERASDIST_LAUNCH_ISOLATED"
"""Set in a namespace child of :func:`run_command_isolated` (so it does not isolate itself again)."""


def run_command_isolated(command: list[str]) -> int:
    """Run ``python -m kerasdist COMMAND`` (``kerasdist launch ...``) in a private network
    namespace; wait for it, forwarding SIGTERM/Ctrl-C; return its exit code.

    Raises:
        ClusterError: namespaces are unavailable (exit 2): ``--allow-network-exposure`` says so.
        KeyboardInterrupt: SIGTERM/Ctrl-C, after the child stopped (or was killed 60 s later).
    """
    try:
        argv = isolated_argv([sys.executable, "-m", "kerasdist", *command])
    except ClusterError as err:
        raise ClusterError(f"{err}. Pass --allow-network-exposure to run the tasks reachable "
                           "from the network (TensorFlow's servers have no authentication)") \
            from None
    child = subprocess.Popen(argv, env={**os.environ, IN_NETNS_ENV: "1"},
                             preexec_fn=die_with_parent)
    with terminate_on_sigterm():
        try:
            return child.wait()
        except KeyboardInterrupt as err:
            child.send_signal(signal.SIGTERM if isinstance(err, Terminated) else signal.SIGINT)
            try:
                child.wait(timeout=60)
            finally:
                if child.poll() is None:
                    child.kill()
            raise


def isolated_here() -> bool:
    """Whether this process is the namespace child of :func:`run_command_isolated`."""
    return bool(os.environ.get(IN_NETNS_ENV))


# ------------------------------------------------------------------------- the launching side
STOP_GRACE_S = 90.0
"""Seconds the namespace child gets after a forwarded SIGINT/SIGTERM (its tasks save and stop
within the launcher's own grace, 60 s), before SIGKILL."""
REPORTED_EXIT_S = 30.0
"""Seconds the namespace child gets to exit once it has reported how the run ended (its result
pipe closed), before it is killed with its tasks (:func:`run_isolated`)."""


def run_isolated(recipe: Recipe, *, overwrite: bool, verbose, isolate: bool = True) -> RunResult:
    """Run the local cluster in a child process in a fresh network namespace; wait; map its end.

    The child is forked from this process where it imported TensorFlow for the run
    (:func:`kerasdist.launch.forking.launcher_ready`; :mod:`kerasdist.launch.forking.netns`), else
    started as ``unshare --net python -m kerasdist.launch.isolation``. With ``isolate=False``
    the child runs in this network namespace (an exposed run): a library call's coordinator then
    runs in a process that may be ended when TensorFlow blocks it for good
    (:mod:`kerasdist._exit`), never in the caller's interpreter.

    Raises:
        the child's error, same class and message (RecipeError ... TaskFailedError, TrainingError,
        Preempted, KeyboardInterrupt); TaskFailedError if the child itself was killed.
    """
    from kerasdist.launch import forking

    if isolate and forking.launcher_ready():
        from kerasdist.launch.forking import netns

        def forked(fd):
            return netns.fork_launcher(lambda: serve(lambda: recipe, result_fd=fd, verbose=verbose,
                                                     overwrite=overwrite),
                                       env=launcher_env(), result_fd=fd), None

        try:
            return _supervise(recipe, forked)
        except netns.NotIsolated as err:  # nothing started: start it as a new interpreter
            log.warning(f"the local cluster's launcher could not be forked into a network "
                        f"namespace ({err}); starting it as a new process")
            forking.spend()
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
            with contextlib.suppress(BrokenPipeError):  # it ended at once: its report says why
                child.stdin.write(payload)
                child.stdin.close()
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
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=0.5)
            return False
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
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)  # its tasks die with it (PR_SET_PDEATHSIG)
    child.wait()


def _outcome(recipe: Recipe, child, reply: bytes,
             interrupted: BaseException | None, killed_after_report: bool = False) -> RunResult:
    code = child.returncode
    try:
        result = json.loads(reply.decode("utf-8")) if reply else None
    except ValueError:
        result = None
    if result and "not_isolated" in result and interrupted is None:
        from kerasdist.launch.forking.netns import NotIsolated

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


# ------------------------------------------------------------------------------ the namespace side
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def loopback_up() -> None:
    """Bring ``lo`` up in this network namespace (a fresh one has it down), with an ioctl.

    Raises:
        ClusterError: it cannot be brought up, or the namespace holds other interfaces.
    """
    others = network_interfaces()
    if others:
        raise ClusterError(f"the local cluster's network namespace is not private: it has the "
                           f"interfaces {', '.join(others)}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            request = struct.pack("16sH14x", b"lo", 0)
            flags = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
            fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))
        except OSError as err:
            raise ClusterError(f"cannot bring up the loopback interface of the local cluster's "
                               f"network namespace: {err.strerror}") from None


def _report(fd: int, err: BaseException | None) -> None:
    data = {"ok": True} if err is None else {"ok": False, **status.record(err)}
    with os.fdopen(fd, "w", encoding="utf-8") as pipe:
        pipe.write(json.dumps(data))


def serve(load_recipe, *, result_fd: int, verbose, overwrite: bool, exposed: bool = False) -> int:
    """The namespace child's work (:func:`main`; :mod:`kerasdist.launch.forking.netns` when forked):
    bring ``lo`` up (unless ``exposed``), take the recipe (``load_recipe()``), run the local
    cluster, report how it ended on ``result_fd``. Returns the CLI's exit code for that end."""
    _log.configure(verbose)
    from kerasdist import _native_log
    from kerasdist.launch import clusters

    _native_log.enable_crash_traces()  # a crash of the launcher (the PS coordinator) shows where
    failure: BaseException | None = None
    with terminate_on_sigterm(), _exit.reporting_to(lambda err: _report(result_fd, err)):
        try:
            if not exposed:
                loopback_up()
            recipe = load_recipe()
            clusters.of(recipe).launch_here(recipe, overwrite=overwrite, verbose=verbose)
        except (Exception, KeyboardInterrupt) as err:
            failure = err
    _report(result_fd, failure)
    return 0 if failure is None else errors.exit_code(errors.classify(failure))


def main(argv=None) -> int:
    """The namespace child started as a new interpreter: bring ``lo`` up, read the recipe (JSON
    on stdin), run the local cluster, report how it ended on ``--result-fd`` (:func:`serve`).
    With ``--exec PROGRAM ARGS...``: bring ``lo`` up and exec the program (:func:`isolated_argv`)."""
    parser = argparse.ArgumentParser(prog="python -m kerasdist.launch.isolation")
    parser.add_argument("--exec", nargs=argparse.REMAINDER, help="bring lo up, then exec this")
    parser.add_argument("--result-fd", type=int)
    parser.add_argument("--verbose", type=json.loads, default=None)
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--exposed", action="store_true",
                        help="run in this network namespace (an exposed run): lo is left alone")
    args = parser.parse_args(argv)
    if args.exec:
        loopback_up()
        os.execvp(args.exec[0], args.exec)

    def load_recipe():
        from kerasdist.config.loader import validate_recipe

        return validate_recipe(json.loads(sys.stdin.read()), source="<local launcher>")

    return serve(load_recipe, result_fd=args.result_fd, verbose=args.verbose,
                 overwrite=args.overwrite, exposed=args.exposed)


if __name__ == "__main__":
    sys.exit(main())
