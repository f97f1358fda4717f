"""The liveness of a cluster's tasks: each task's gRPC port is probed
(:func:`kerasdist.cluster.probe.probe`), and a task whose probes stay silent for ``timeout_s``
seconds (``strategy.task_timeout_s``) is **lost**: TF's ``ClusterCoordinator`` would wait for
ever on a task cut off or frozen (docs/guarantees.md, the partition and frozen-task rows).

* :class:`HangWatch`, the local supervisor's over the server tasks it started: only ``hung``
  counts; a lost task is killed (SIGKILL), then handled as any lost task.
* :class:`TaskWatch`, on clusters kerasdist does not launch: a daemon thread of the chief and of
  each worker; ``unreachable`` and ``hung`` count, and the process ends with a
  :class:`~kerasdist.errors.TaskFailedError` naming the task (exit 1, :func:`abandon_on_loss`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Callable, Mapping, Sequence

from kerasdist._log import LAUNCHED_ENV, get_logger

log = get_logger("cluster")

PROBE_TIMEOUT_S = 2.0
"""Seconds one probe waits for a TCP handshake, then for the task's SETTINGS frame."""

LOST_STATES = frozenset({"unreachable", "hung"})
"""Probe states that count towards a task's loss on clusters kerasdist does not launch."""


class Silences:
    """How long each watched task has not answered: a task is silent from the first probe whose
    state counts until a probe whose state does not.

    Args:
        timeout_s: seconds of silence after which a task is lost (> 0), or None (no bound).
        counts: the probe states that count as silence.
        period_s: seconds between two rounds of probes (default: a quarter of ``timeout_s``,
            between 1 and 5 s).
        prober: ``prober(address, timeout_s=...)`` -> a probe state (tests); default
            :func:`kerasdist.cluster.probe.probe`.
    """

    def __init__(self, timeout_s: float | None, *, counts: frozenset[str] = LOST_STATES,
                 period_s: float | None = None, prober: Callable[..., str] | None = None):
        from kerasdist.cluster.probe import probe

        self.timeout_s = timeout_s
        self.period_s = period_s if period_s is not None else \
            min(5.0, max(1.0, (timeout_s or 4.0) / 4))
        self.counts = counts
        self.prober = prober or probe
        self._since: dict = {}

    def probe(self, key, address: str) -> tuple[str, float]:
        """Probe the task ``key`` at ``address`` once: its state and how many seconds it has been
        silent (0.0 when the state does not count)."""
        state = self.prober(address, timeout_s=min(PROBE_TIMEOUT_S, self.timeout_s))
        if state not in self.counts:
            self._since.pop(key, None)
            return state, 0.0
        return state, time.monotonic() - self._since.setdefault(key, time.monotonic())

    def forget(self, key) -> None:
        """Start ``key``'s clock afresh at its next silent probe."""
        self._since.pop(key, None)


class TaskWatch:
    """Probe ``addresses`` every ``period_s`` seconds in a daemon thread; call
    ``on_lost(name, state, address, silent_s)`` once for the first task that stayed
    ``unreachable`` or ``hung`` for ``timeout_s`` seconds, then stop.

    Args:
        addresses: ``{task name: 'host:port'}`` of the tasks to watch (``worker:1``).
        timeout_s: seconds (> 0) a task may stay unreachable or hung (``strategy.task_timeout_s``).
        on_lost: called in the watch's thread; default :func:`abandon_on_loss` for ``task``.
        task: this process's task name, for the message (``chief:0``).
        period_s, prober: as :class:`Silences`.
        setting: the name of the bound in the messages (default ``strategy.task_timeout_s``).

    Detection takes ``timeout_s`` plus at most ``period_s`` and two probe timeouts per task.
    """

    def __init__(self, addresses: Mapping[str, str], timeout_s: float, *,
                 on_lost: Callable[[str, str, str, float], object] | None = None,
                 task: str = "this task", period_s: float | None = None, prober=None,
                 setting: str = "strategy.task_timeout_s"):
        self.addresses = dict(addresses)
        self.timeout_s = float(timeout_s)
        self._silences = Silences(self.timeout_s, period_s=period_s, prober=prober)
        self.period_s = self._silences.period_s
        self.task = task
        self.setting = setting
        self.on_lost = on_lost or (lambda *lost: abandon_on_loss(task, timeout_s, *lost,
                                                                 setting=setting))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kerasdist-task-watch", daemon=True)
        self.lost: tuple[str, str, str, float] | None = None

    def __enter__(self) -> TaskWatch:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        if self.addresses:
            log.info(f"task {self.task}: watching {', '.join(sorted(self.addresses))} (lost after "
                     f"{self.timeout_s:g} s unreachable or hung: {self.setting})")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, address in self.addresses.items():
                state, silent = self._silences.probe(name, address)
                if self._stop.is_set():
                    return
                if state in LOST_STATES and silent >= self.timeout_s:
                    self.lost = (name, state, address, silent)
                    self.on_lost(name, state, address, silent)
                    return
            self._stop.wait(self.period_s)


def lost_error(task: str, timeout_s: float, name: str, state: str, address: str, silent_s: float,
               setting: str = "strategy.task_timeout_s"):
    """The :class:`~kerasdist.errors.TaskFailedError` of a lost task (class ``peer_lost``, exit 1)."""
    from kerasdist.errors import TaskFailedError

    what = "its host is down or cut off" if state == "unreachable" else \
        "it accepts connections but does not answer"
    failure = TaskFailedError(
        f"task {task}: lost task {name} ({state}, {address}) during training: no answer for "
        f"{silent_s:.0f} s ({what}; {setting}={timeout_s:g}). Restart the cluster "
        "(with the task's host back, or a cluster spec without it) to resume from the last "
        "checkpoint")
    failure.lost_tasks = [name]
    return failure


def abandon_on_loss(task: str, timeout_s: float, name: str, state: str, address: str,
                    silent_s: float, setting: str = "strategy.task_timeout_s") -> None:
    """End this process with the lost task's failure (:func:`kerasdist._exit.abandon`: exit
    code 1 in a process kerasdist owns; a library call only logs it)."""
    from kerasdist import _exit

    _exit.abandon(lost_error(task, timeout_s, name, state, address, silent_s, setting))


def watched_tasks(tf_config, timeout_s: float | None) -> dict[str, str]:
    """``{task name: address}`` this parameter-server task watches: the chief watches every ps
    and worker, a worker the ps tasks, a ps nothing. Empty when ``timeout_s`` is None, or when
    kerasdist's own launcher runs this task (:class:`HangWatch` then watches)."""
    if timeout_s is None or os.environ.get(LAUNCHED_ENV):
        return {}
    jobs = {"chief": ("ps", "worker"), "worker": ("ps",)}.get(tf_config.task_type, ())
    return {f"{job}:{i}": address for job in jobs
            for i, address in enumerate(tf_config.cluster.get(job, ()))
            if f"{job}:{i}" != tf_config.task_name}


class HangWatch:
    """The supervisor's watch: probe server tasks at most every ``period_s`` seconds; report the
    ones that answered no probe for ``timeout_s`` (only ``hung`` counts; see module docs).

    Args:
        timeout_s: seconds without an answer after which a task is lost (the recipe's
            ``strategy.task_timeout_s``); None disables the watch.
        period_s, prober: as :class:`Silences`.

    The tasks are the supervisor's :class:`kerasdist.launch.processes.Task`.
    """

    def __init__(self, timeout_s: float | None, *, period_s: float | None = None,
                 prober: Callable[..., str] | None = None):
        self.timeout_s = timeout_s
        self._silences = Silences(timeout_s, counts=frozenset({"hung"}), period_s=period_s,
                                  prober=prober)
        self.period_s = self._silences.period_s
        self._next = 0.0
        self.hung: dict[str, float] = {}  # task name -> seconds it had not answered when killed

    def overdue(self, tasks: Sequence) -> list[tuple[object, float]]:
        """The tasks (with how long they have not answered, s) silent for ``timeout_s`` or more;
        probes only when a round is due, else returns []."""
        now = time.monotonic()
        if self.timeout_s is None or now < self._next:
            return []
        self._next = now + self.period_s
        found = []
        for task in tasks:
            if task.tf_config is None or task.returncode() is not None:
                continue
            _, silent = self._silences.probe(id(task), task.tf_config.address)
            if silent >= self.timeout_s:
                found.append((task, silent))
        return found

    def hung_now(self, tasks: Sequence) -> list:
        """The tasks that do not answer one probe now (for a stop that must not wait on them)."""
        return [t for t in tasks if t.tf_config is not None and t.returncode() is None
                and self._silences.prober(t.tf_config.address, timeout_s=PROBE_TIMEOUT_S) == "hung"]

    def kill(self, task, silent_s: float | None) -> None:
        """Treat ``task`` as lost: SIGKILL it (a stopped process dies too) and wait for it;
        ``silent_s`` None: a stop, already announced (no line here)."""
        if silent_s is not None:
            log.warning(f"task {task.name} has not answered for {silent_s:.0f} s (frozen or hung: "
                        "its gRPC server sends nothing; strategy.task_timeout_s="
                        f"{self.timeout_s:g}): treating it as lost")
            self.hung[task.name] = silent_s
        self._silences.forget(id(task))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(task.pid, signal.SIGKILL)  # its own process group (die_with_parent)
        task.process.kill()
        task.process.wait()


__all__ = ["LOST_STATES", "PROBE_TIMEOUT_S", "HangWatch", "Silences", "TaskWatch", "abandon_on_loss",
           "lost_error", "watched_tasks"]
