"""Local multi-process clusters: start tasks as subprocesses, watch them, always stop them.

Each task is ``python -m kerasdist <args>`` (or any program) with its own ``TF_CONFIG`` in the
child's environment only. Output goes to ``<log_dir>/<type>-<index>.log``; the task reports how it
ended in ``<log_dir>/<type>-<index>.status.json`` (:mod:`kerasdist.launch.status`). Children run
in their own process group and
are killed with the launcher: on normal exit, on errors, on Ctrl-C / SIGTERM (the context manager
and :func:`terminate_on_sigterm`), and, on Linux, when the launcher process itself dies
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from kerasdist._parent_death import signal_when_parent_dies
from kerasdist._task_logs import task_log_name
from kerasdist.cluster.spec import TFConfig, split_address
from kerasdist.errors import ClusterError
from kerasdist.importpath import child_pythonpath


@dataclass
class Task:
    """A started task: its name (``worker:1``), process (a :class:`subprocess.Popen`, or a
    :class:`kerasdist.launch.forking.ForkedTask`), log file and status file."""

    name: str
    tf_config: TFConfig | None
    process: subprocess.Popen
    log_path: Path
    status_path: Path | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def returncode(self) -> int | None:
        return self.process.poll()


TASKS_PER_CORE = 4
"""Most local tasks per CPU core (at least :data:`MIN_TASK_LIMIT` in all) a local cluster starts
unless told to go past: every task is a full TensorFlow process (~0.8 GiB resident here), and
``cluster.workers: 1000`` once started 250 processes before anything stopped it."""
MIN_TASK_LIMIT = 8


def check_task_count(tasks: int, *, allowed: bool, what: str, flag: str,
                     cores: int | None = None) -> None:
    """Refuse a local cluster of more than ``max(MIN_TASK_LIMIT, TASKS_PER_CORE * cores)`` tasks
    before anything starts, unless ``allowed``.

    Args:
        tasks: processes the cluster would start (workers, ps, coordinator or chief).
        allowed: the user asked to go past the bound (``flag``).
        what: the fields or flags that set the count, with their values, for the message.
        flag: how to allow it (``cluster.allow_oversubscription: true`` or a CLI flag).
        cores: CPU cores of this machine (default ``os.cpu_count()``).

    Raises:
        ClusterError: over the bound (exit code 2), naming the count, the bound and ``flag``.
    """
    from kerasdist.errors import ClusterError

    cores = cores or os.cpu_count() or 1
    limit = max(MIN_TASK_LIMIT, TASKS_PER_CORE * cores)
    if tasks > limit and not allowed:
        raise ClusterError(
            f"a local cluster of {tasks} tasks on this machine's {cores} CPU core(s) is over the "
            f"bound of {limit} ({TASKS_PER_CORE} per core, at least {MIN_TASK_LIMIT}); each task "
            f"is a TensorFlow process. Received: {what}. Use fewer tasks, or pass {flag} to "
            "start them anyway")


def die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    signal_when_parent_dies(signal.SIGKILL)


def describe_exit(code: int | None) -> str:
    """``'exited with code 3'`` / ``'was killed by SIGKILL'`` / ``'is running'``."""
    if code is None:
        return "is running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class LocalLauncher:
    """Start, watch and stop the tasks of a local cluster.

    Args:
        log_dir: folder for the task logs (created).
        threads_per_task: if > 0, ``TF_NUM_INTRAOP_THREADS`` / ``OMP_NUM_THREADS`` for children.

    Use as a context manager: leaving the block stops every task it started.
    """

    def __init__(self, *, log_dir: str | Path, threads_per_task: int = 0):
        self.log_dir = Path(log_dir)
        self.threads_per_task = threads_per_task
        self.tasks: list[Task] = []

    def __enter__(self) -> LocalLauncher:
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()

    def start(self, tf_config: TFConfig, args: Sequence[str],
              *, program: Sequence[str] | None = None) -> Task:
        """Start ``python -m kerasdist *args`` (or ``program + args``) as the task ``tf_config``
        names, with ``TF_CONFIG`` set in the child's environment only."""
        return self.start_process(tf_config.task_name, [*(program or [sys.executable, "-m",
                                                                       "kerasdist"]), *args],
                                  env={"TF_CONFIG": tf_config.to_json()}, tf_config=tf_config)

    def start_process(self, name: str, argv: Sequence[str], *, env: dict | None = None,
                      tf_config: TFConfig | None = None) -> Task:
        """Start ``argv`` as task ``name`` (``worker:1``) with ``env`` added to a copy of this
        process's environment; its log is ``<log_dir>/<type>-<index>.log``."""
        from kerasdist.launch.status import STATUS_ENV

        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / task_log_name(name)
        status_path = self.log_dir / f"{log_path.stem}.status.json"
        status_path.unlink(missing_ok=True)
        env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        pythonpath = child_pythonpath(env.get("PYTHONPATH"))  # the user's modules
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        env[STATUS_ENV] = str(status_path)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if self.threads_per_task:
            env["TF_NUM_INTRAOP_THREADS"] = env["OMP_NUM_THREADS"] = str(self.threads_per_task)
        from kerasdist.launch import forking

        if forking.ready(argv):  # the first attempt of a fit that imported TensorFlow for it
            process = forking.start(argv, env=env, log_path=log_path)
        else:
            process = self._popen(argv, env, log_path)
        task = Task(name=name, tf_config=tf_config, process=process, log_path=log_path,
                    status_path=status_path)
        self.tasks.append(task)
        return task

    @staticmethod
    def _popen(argv: Sequence[str], env: dict, log_path: Path) -> subprocess.Popen:
        with open(log_path, "ab") as log:
            return subprocess.Popen(list(argv), env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)

    def wait_listening(self, tasks: Sequence[Task], *, timeout_s: float) -> None:
        """Wait until every task's own process (or a process it started) listens on its port.

        A listener that belongs to another process does not count: the task is still starting
        (or fails on the port being taken), and the error says who holds the port.

        Raises:
            ClusterError: a task exited (with the error it reported, e.g. its port in use), or
                did not listen within ``timeout_s`` (names it).
        """
        deadline = time.monotonic() + timeout_s
        pending = list(tasks)
        while pending:
            task = pending[0]
            if task.returncode() is not None:
                raise ClusterError(self._start_failure(task))
            _, port = split_address(task.tf_config.address)
            if listens(task.pid, port):
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                held = port_holders(port)
                other = f"; port {port} is held by another process (pid {held[0]})" if held else ""
                raise ClusterError(f"task {task.name} did not start listening on "
                                   f"{task.tf_config.address} within {timeout_s:.0f} s{other}; "
                                   f"log {task.log_path}")
            time.sleep(0.1)

    def _start_failure(self, task: Task) -> str:
        from kerasdist.launch.status import read

        reported = (read(task.status_path) or {}).get("message")
        if reported:
            return f"task {task.name} could not start: {reported} (log {task.log_path})"
        return (f"task {task.name} {describe_exit(task.returncode())} while starting; "
                f"log {task.log_path}:\n{self.tail(task)}")

    def failed(self) -> list[Task]:
        """Tasks that have exited with a non-zero code or a signal."""
        return [t for t in self.tasks if t.returncode() not in (None, 0)]

    def tail(self, task: Task, lines: int = 25) -> str:
        """The last ``lines`` lines of a task's log."""
        try:
            text = task.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, task: Task, *, grace_s: float = 5.0) -> None:
        """SIGTERM the task's process group, then SIGKILL after ``grace_s`` seconds."""
        if task.returncode() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(task.pid, sig)
            try:
                task.process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def stop_all(self, *, grace_s: float = 5.0) -> None:
        """Stop every task this launcher started (idempotent)."""
        for task in self.tasks:
            self.stop(task, grace_s=grace_s)


def network_interfaces() -> list[str]:
    """Network interfaces of this process's network namespace other than loopback."""
    try:
        return [name for _, name in socket.if_nameindex() if name != "lo"]
    except OSError:
        return ["?"]


def network_note() -> str:
    """What the task servers started from this process can be reached from, truthfully: TF binds
    them to every interface of this network namespace."""
    others = network_interfaces()
    if not others:
        return "private network namespace, loopback only: unreachable from other hosts"
    return (f"task servers listen on every interface ({', '.join(others)}, unauthenticated): "
            "reachable from the network")


_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column


def _listening_inodes(pid: int, port: int) -> set[str]:
    """Socket inodes listening on ``port`` in ``pid``'s network namespace (/proc/<pid>/net)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets process ``pid`` holds open."""
    found = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def _tree(pid: int) -> list[int]:
    import psutil

    try:
        return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return [pid]


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` or one of its descendants holds a socket listening on ``port``.

    Linux: from ``/proc`` (the listening sockets of its network namespace, matched to its open
    file descriptors), so another program's listener on the same port never counts. Elsewhere:
    whether anything accepts connections on localhost:``port``.
    """
    if not os.path.isdir("/proc/self/net"):  # no procfs: the best that can be known
        try:
            with socket.create_connection(("localhost", port), timeout=0.5):
                return True
        except OSError:
            return False
    inodes = _listening_inodes(pid, port)
    return bool(inodes) and any(inodes & _socket_inodes(p) for p in _tree(pid))


def port_holders(port: int) -> list[int]:
    """Pids of this user's processes that listen on ``port`` in this network namespace."""
    inodes = _listening_inodes(os.getpid(), port)
    if not inodes:
        return []
    holders = []
    for name in os.listdir("/proc"):
        if name.isdigit() and inodes & _socket_inodes(int(name)):
            holders.append(int(name))
    return holders
