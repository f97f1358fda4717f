"""Hung-task detection for the server tasks of a local cluster (parameter server: ps, workers).

A task that is frozen (SIGSTOP, a swapped-out or stalled host) or hung is not dead: its process
runs on, the kernel still completes TCP handshakes for its port, and TF's ``ClusterCoordinator``
waits on its remote calls for ever -- no error, no progress. The supervisor therefore probes
every server task's gRPC port (:func:`kerasdist.cluster.probe.probe`: a live gRPC server answers
an HTTP/2 preface with its SETTINGS frame at once, even when busy, since gRPC's own threads send
it) and treats a task that has answered no probe for ``timeout_s`` seconds as **lost**: it is
killed (SIGKILL), and what follows is what follows any lost task (a worker restarted alone on
its address while the budget lasts; with ``cluster.min_workers`` the run goes on without it; a
ps ends the run).

Only ``'hung'`` counts: a port that refuses connections (a task starting or restarting) is not
hung, and a dead process is seen by its exit code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Callable, Sequence

from kerasdist._log import get_logger
from kerasdist.cluster.probe import probe
from kerasdist.launch.processes import Task

log = get_logger("launch")

PROBE_TIMEOUT_S = 2.0
"""Seconds one probe waits for a task's SETTINGS frame."""


class HangWatch:
    """Probe server tasks at most every ``period_s`` seconds; report the ones hung too long.

    Args:
        timeout_s: seconds without an answer after which a task is lost (the recipe's
            ``strategy.task_timeout_s``); None disables the watch.
        period_s: seconds between two rounds of probes (default: a quarter of ``timeout_s``,
            between 1 and 5 s).
        prober: ``prober(address, timeout_s=...)`` -> ``'alive' | 'hung' | 'dead'`` (tests).
    """

    def __init__(self, timeout_s: float | None, *, period_s: float | None = None,
                 prober: Callable[..., str] = probe):
        self.timeout_s = timeout_s
        self.period_s = period_s if period_s is not None else \
            min(5.0, max(1.0, (timeout_s or 4.0) / 4))
        self._probe = prober
        self._next = 0.0
        self._silent_since: dict[int, float] = {}
        self.hung: dict[str, float] = {}  # task name -> seconds it had not answered when killed

    def overdue(self, tasks: Sequence[Task]) -> list[tuple[Task, float]]:
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
            state = self._probe(task.tf_config.address,
                                timeout_s=min(PROBE_TIMEOUT_S, self.timeout_s))
            if state != "hung":
                self._silent_since.pop(id(task), None)
                continue
            since = self._silent_since.setdefault(id(task), now)
            if time.monotonic() - since >= self.timeout_s:
                found.append((task, time.monotonic() - since))
        return found

    def hung_now(self, tasks: Sequence[Task]) -> list[Task]:
        """The tasks that do not answer one probe now (for a stop that must not wait on them)."""
        return [t for t in tasks if t.tf_config is not None and t.returncode() is None
                and self._probe(t.tf_config.address, timeout_s=PROBE_TIMEOUT_S) == "hung"]

    def kill(self, task: Task, silent_s: float | None) -> None:
        """Treat ``task`` as lost: SIGKILL it (a stopped process dies too) and wait for it;
        ``silent_s`` None: a stop, already announced (no line here)."""
        if silent_s is not None:
            log.warning(f"task {task.name} has not answered for {silent_s:.0f} s (frozen or hung: "
                        "its gRPC server sends nothing; strategy.task_timeout_s="
                        f"{self.timeout_s:g}): treating it as lost")
            self.hung[task.name] = silent_s
        self._silent_since.pop(id(task), None)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(task.pid, signal.SIGKILL)  # its own process group (die_with_parent)
        task.process.kill()
        task.process.wait()


__all__ = ["PROBE_TIMEOUT_S", "HangWatch"]
