"""A parameter-server task's own watch over the tasks it waits on, for clusters kerasdist does not
launch (``cluster.kind: tf_config``, Slurm, TFJob): a lost host ends the task in bounded time.

TF's ``ClusterCoordinator`` waits for ever on a worker or ps whose host is cut off (a partition
drops packets, with no TCP reset: its remote calls neither end nor fail), and a worker server
whose ps is gone serves on. kerasdist's local launcher probes every task itself
(:mod:`kerasdist.launch.hang`); on other clusters nothing did. :class:`TaskWatch` runs in a
daemon thread of the chief (watching every ps and worker) and of each worker (watching the ps
tasks): it probes each task's gRPC port (:func:`kerasdist.cluster.probe.probe`) and a task that
is ``unreachable`` (no TCP handshake: its host is down or cut off) or ``hung`` (connects, never
answers) for ``strategy.task_timeout_s`` seconds is **lost**. The process then ends the way a
process blocked in TensorFlow ends (:func:`kerasdist._exit.abandon`): the failure, a
:class:`~kerasdist.errors.TaskFailedError` naming the task with its state and address
(``lost task worker:1 (unreachable, 10.77.5.3:4021)``), is printed (and written to the task's
status file), and the process exits with code 1, what orchestrators restart on. Nothing is
lost: the newest complete checkpoint stays the resume point (TF's ``CheckpointManager`` names a
checkpoint only once its files are complete).

A ``dead`` task (port refused: a process restarting, or a chief that has finished) is not lost
here: TF's coordinator itself sees refused connections, and a worker restarted by its
orchestrator on the same address is taken back by the coordinator.

Why the run does not go on without a lost worker (as ``cluster.min_workers`` allows on local
clusters): the calls in flight on a cut-off worker never end and cannot be cancelled (TF's
``RemoteValue`` and ``ClusterCoordinator.join`` have no timeout), and the coordinator's eager
context registers and removes functions on *every* task with blocking calls
(:mod:`kerasdist._compat.tf_frozen_task`), so the next checkpoint, validation or function
traced would wait on the lost worker. A restart on the workers left is the bounded way on.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Mapping

from kerasdist._log import LAUNCHED_ENV, get_logger

log = get_logger("cluster")

PROBE_TIMEOUT_S = 2.0
"""Seconds one probe waits for a TCP handshake, then for the task's SETTINGS frame."""

LOST_STATES = frozenset({"unreachable", "hung"})
"""Probe states that count towards a task's loss (see module docs)."""


class TaskWatch:
    """Probe ``addresses`` every ``period_s`` seconds in a daemon thread; call
    ``on_lost(name, state, address, silent_s)`` once for the first task that stayed
    ``unreachable`` or ``hung`` for ``timeout_s`` seconds, then stop.

    Args:
        addresses: ``{task name: 'host:port'}`` of the tasks to watch (``worker:1``).
        timeout_s: seconds (> 0) a task may stay unreachable or hung (``strategy.task_timeout_s``).
        on_lost: called in the watch's thread; default :func:`abandon_on_loss` for ``task``.
        task: this process's task name, for the message (``chief:0``).
        period_s: seconds between two rounds of probes (default: a quarter of ``timeout_s``,
            between 1 and 5 s).
        prober: ``prober(address, timeout_s=...)`` -> a probe state (tests).
        setting: the name of the bound in the messages (default ``strategy.task_timeout_s``;
            ``--task-timeout-s`` for ``kerasdist launch``).

    Detection takes ``timeout_s`` plus at most ``period_s`` and two probe timeouts per task
    probed in a round.
    """

    def __init__(self, addresses: Mapping[str, str], timeout_s: float, *,
                 on_lost: Callable[[str, str, str, float], object] | None = None,
                 task: str = "this task", period_s: float | None = None, prober=None,
                 setting: str = "strategy.task_timeout_s"):
        from kerasdist.cluster.probe import probe

        self.addresses = dict(addresses)
        self.timeout_s = float(timeout_s)
        self.period_s = period_s if period_s is not None else min(5.0, max(1.0, timeout_s / 4))
        self.task = task
        self.setting = setting
        self.on_lost = on_lost or (lambda *lost: abandon_on_loss(task, timeout_s, *lost,
                                                                 setting=setting))
        self._probe = prober or probe
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
        since: dict[str, tuple[float, str]] = {}
        while not self._stop.is_set():
            for name, address in self.addresses.items():
                state = self._probe(address, timeout_s=min(PROBE_TIMEOUT_S, self.timeout_s))
                if self._stop.is_set():
                    return
                if state not in LOST_STATES:
                    since.pop(name, None)
                    continue
                first = since.setdefault(name, (time.monotonic(), state))[0]
                silent = time.monotonic() - first
                if silent >= self.timeout_s:
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
    """``{task name: address}`` this parameter-server task watches (see module docs): the chief
    watches every ps and worker, a worker the ps tasks, a ps nothing. Empty when ``timeout_s``
    is None, or when kerasdist's own launcher runs this task (it watches every task itself:
    :mod:`kerasdist.launch.hang`)."""
    if timeout_s is None or os.environ.get(LAUNCHED_ENV):
        return {}
    jobs = {"chief": ("ps", "worker"), "worker": ("ps",)}.get(tf_config.task_type, ())
    return {f"{job}:{i}": address for job in jobs
            for i, address in enumerate(tf_config.cluster.get(job, ()))
            if f"{job}:{i}" != tf_config.task_name}


__all__ = ["LOST_STATES", "PROBE_TIMEOUT_S", "TaskWatch", "abandon_on_loss", "lost_error",
           "watched_tasks"]
