"""Supervise a local cluster of peers (every worker runs the run): start, watch, restart after a failure.

One *attempt* starts every worker (``python -m kerasdist fit <run_dir>/logs/recipe.json``, each
with its own ``TF_CONFIG`` in its environment only) on fresh localhost ports and waits:

* all workers exit 0: done (the chief wrote ``metrics.json``);
* a worker dies or fails: the survivors get a few seconds to fail on their own (their collectives
  fail within ``strategy.timeout_s``, naming the lost task), then every task is stopped and the
  failure is reported, naming the task and how it ended (killed by a signal, exit code, the task a
  survivor lost: read from the tasks' status files, :mod:`kerasdist.launch.status`). A lost peer
  or a preemption is retried from the last backup, up to ``cluster.max_restarts``; a deterministic
  error (class ``fatal``, e.g. a label out of range) or bad input is not: the same input would fail
  the same way, so it is reported at once with the task's own message;
* a worker exits 130 (preempted by SIGTERM after saving): reported as such, restarted the same way;
* the launcher itself gets SIGTERM or Ctrl-C: it forwards SIGTERM to the workers, which save a
  checkpoint at an agreed step and exit; it waits up to :data:`STOP_GRACE_S` seconds, then raises
  ``KeyboardInterrupt`` (the CLI exits 130; re-running the command finishes the run).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kerasdist import errors
from kerasdist._log import get_logger
from kerasdist._signals import terminate_on_sigterm
from kerasdist.cluster.spec import check_ports_free, local_cluster
from kerasdist.errors import (
    BAD_INPUT,
    EXIT_INTERRUPTED,
    RETRYABLE,
    ClusterError,
    KerasdistError,
    TaskFailedError,
    TrainingError,
)
from kerasdist.launch import status
from kerasdist.launch.processes import (
    LocalLauncher,
    Task,
    describe_exit,
    network_note,
)

if TYPE_CHECKING:
    from kerasdist.config import Recipe


log = get_logger("launch")

STOP_GRACE_S = 60.0
"""Seconds the workers get to save a checkpoint and exit after SIGTERM, before SIGKILL."""
SURVIVOR_GRACE_S = 10.0
"""Seconds the other workers get to fail on their own after one failed (so their logs say why)."""


@dataclass(frozen=True)
class Failure:
    """How one attempt failed: the report (first failed task, what the others did, log tail),
    the failure class of the first failed task, and the original error of a non-retryable one."""

    report: str
    failure_class: str
    message: str = ""
    error: str = ""

    @property
    def retryable(self) -> bool:
        return self.failure_class in RETRYABLE


def _first_failure(launcher: LocalLauncher, tasks: list[Task]) -> Task | None:
    """Poll until a task fails (returned; one killed by a signal first) or all exit 0 (None)."""
    while True:
        failed = launcher.failed()
        if failed:
            return min(failed, key=lambda t: (t.returncode() >= 0, tasks.index(t)))
        if all(t.returncode() == 0 for t in tasks):
            return None
        time.sleep(0.2)


def _wait_for_survivors(tasks: list[Task], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(t.returncode() is None for t in tasks):
        time.sleep(0.2)


def _why(task: Task) -> str:
    """How one task ended, in words, with the lost peer it reported in its status file."""
    code = task.returncode()
    if code == EXIT_INTERRUPTED:
        return f"task {task.name} was preempted (SIGTERM; a checkpoint was saved)"
    text = f"task {task.name} {describe_exit(code)}"
    lost = (status.read(task.status_path) or {}).get("lost_tasks")
    return f"{text} (it lost task {', '.join(lost)})" if lost else text


def _root_cause(launcher: LocalLauncher, first: Task) -> Task:
    """The task whose failure caused the others': one that failed on its own (class ``fatal`` or
    ``bad_input``, e.g. the worker whose shard holds a bad label) before the peers that merely
    lost it; else the first task that failed."""
    own = [t for t in launcher.tasks if t.returncode() not in (None, 0)
           and status.failure_class(t.status_path) not in RETRYABLE]
    return own[0] if own else first


def describe_failure(launcher: LocalLauncher, first: Task) -> Failure:
    """The failure of one attempt: the first failed task, then what the others did."""
    others = [t for t in launcher.tasks if t is not first and t.returncode() not in (None, 0)]
    lines = [_why(first)] + [f"then {_why(t)}" for t in others]
    report = "; ".join(lines) + f"; log {first.log_path}:\n{launcher.tail(first)}"
    reported = status.read(first.status_path) or {}
    return Failure(report=report, failure_class=status.failure_class(first.status_path),
                   message=reported.get("message", ""), error=reported.get("error", ""))


def _bad_input(name: str) -> type[KerasdistError]:
    """The kerasdist error class a task reported by name (bad input), else ClusterError."""
    found = getattr(errors, name, None)
    return found if isinstance(found, type) and issubclass(found, KerasdistError) else ClusterError


def _clean_scratch(recipe, tasks: list[Task]) -> None:
    """Delete the scratch folders of stopped non-chief tasks (local tasks share this machine)."""
    from kerasdist.keras.backup import temp_dir
    from kerasdist.training.rundir import RunDir

    for task in tasks:
        shutil.rmtree(temp_dir(RunDir.of(recipe).checkpoints, task.name), ignore_errors=True)


def run_attempt(recipe: Recipe, args: list[str], log_dir: Path) -> Failure | None:
    """Start the workers once and wait; return None on success, else the :class:`Failure`.

    Raises:
        ClusterError: a port of the cluster was taken before the workers started (names the task).
        KeyboardInterrupt: SIGTERM or Ctrl-C; the workers were asked to save and stop first.
    """
    spec = local_cluster(workers=recipe.cluster.workers)
    check_ports_free(spec)
    with LocalLauncher(log_dir=log_dir, threads_per_task=recipe.intra_op_threads()) as \
            launcher, terminate_on_sigterm():
        tasks = [launcher.start(spec.for_task("worker", i), args) for i in range(spec.num("worker"))]
        log.info(f"local cluster: {len(tasks)} workers started (worker:0 is the chief; "
                 f"{network_note()}); logs in {log_dir}")
        try:
            first = _first_failure(launcher, tasks)
        except KeyboardInterrupt:
            log.warning(f"interrupted: the workers save a checkpoint and stop "
                        f"(up to {STOP_GRACE_S:.0f} s)")
            launcher.stop_all(grace_s=STOP_GRACE_S)
            _clean_scratch(recipe, tasks)
            raise
        if first is None:
            return None
        _wait_for_survivors(tasks, min(SURVIVOR_GRACE_S, recipe.strategy.timeout_s + 5))
        launcher.stop_all()
        _clean_scratch(recipe, tasks)
        return describe_failure(launcher, _root_cause(launcher, first))


def run_peers(recipe: Recipe, *, args: list[str], log_dir: Path) -> None:
    """Run the attempts of a local peers cluster until one succeeds, a failure is not retryable,
    or ``cluster.max_restarts`` restarts are spent.

    Raises:
        TaskFailedError: a peer was lost in the last attempt (retryable class).
        TrainingError: a task failed deterministically (names the task; its original message).
        ClusterError: a task refused its input (e.g. its port is taken; names the task; exit 2).
        KeyboardInterrupt: interrupted (the workers saved first).
    """
    attempts = recipe.cluster.max_restarts + 1
    for attempt in range(1, attempts + 1):
        failure = run_attempt(recipe, args, log_dir)
        if failure is None:
            return
        log.warning(f"attempt {attempt}/{attempts} failed: {failure.report}")
        if failure.failure_class == BAD_INPUT:  # e.g. its port taken: exit 2, like the task
            raise _bad_input(failure.error)(f"{failure.report.splitlines()[0]}: {failure.message}")
        if not failure.retryable:
            raise TrainingError(f"{failure.report.splitlines()[0]}; not restarted (a "
                                f"{failure.failure_class} error fails the same way again): "
                                f"{failure.message}")
        if attempt < attempts:
            log.warning(f"restarting the cluster (cluster.max_restarts="
                        f"{recipe.cluster.max_restarts}); the workers resume from the last backup")
        if "--overwrite" in args:
            args.remove("--overwrite")  # restarts resume, they never discard the new checkpoints
    raise TaskFailedError(f"multi-worker training failed after {attempts} attempt(s): "
                          f"{failure.report}")
