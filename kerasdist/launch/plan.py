"""What a local cluster runs and how its tasks ended: the pieces the caller builds for the
:class:`~kerasdist.launch.supervisor.Supervisor` (:class:`LaunchSpec`, :class:`TaskPlan`) and the
ones it reports with (:class:`TaskState`, :class:`Failure`, :class:`AttemptRecord`, one line per
task)."""

from __future__ import annotations

import shutil
import signal
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Sequence

from kerasdist import _exit, errors
from kerasdist.cluster.spec import TFConfig
from kerasdist.errors import EXIT_INTERRUPTED, RETRYABLE, ClusterError, KerasdistError
from kerasdist.launch import status
from kerasdist.launch.processes import Task, describe_exit

STOP_GRACE_S = 60.0
"""Seconds the tasks get to save a checkpoint and exit after SIGTERM, before SIGKILL."""
SURVIVOR_GRACE_S = 10.0
"""Seconds the other tasks get to fail on their own after one failed (so they say why)."""
RECIPE_CHECKED_ENV = "KERASDIST_RECIPE_CHECKED"
"""Set (to ``1``) in a recipe's tasks by the local launcher that made the run's entry checks
(:meth:`~kerasdist.launch.clusters.base.ClusterKind.enter`): their chief does not repeat them."""


class TaskState(str, Enum):
    """Where one task of an attempt stands."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RESTARTED = "restarted"  # a server worker that died and was started again
    STOPPED = "stopped"  # stopped by the supervisor (end of an attempt, an interrupt)


@dataclass(frozen=True)
class TaskPlan:
    """One task of an attempt.

    Attributes:
        tf_config: its role; ``TF_CONFIG`` is set to it in the task's environment only.
        argv: the whole command (``[sys.executable, "-m", ...]``).
        server: True for a task that runs until stopped (ps and worker servers of a parameter-
            server cluster); False for a *member*, which must exit 0 for the attempt to succeed.
    """

    tf_config: TFConfig
    argv: tuple[str, ...]
    server: bool = False

    @property
    def name(self) -> str:
        return self.tf_config.task_name


@dataclass(frozen=True)
class LaunchSpec:
    """What the supervisor runs; built by the caller (recipe launcher, CLI), never by it.

    Attributes:
        plan: ``plan(workers, attempt)`` -> the tasks of an attempt with that many workers
            (attempt numbers start at 1; a restart may change arguments, e.g. drop ``--overwrite``).
        workers: worker tasks of a full-size attempt (>= 1).
        min_workers: fewest workers the run goes on with (default ``workers``: not elastic).
        max_restarts: the restart budget: cluster restarts plus server-worker restarts (>= 0).
        spare_workers: server workers the coordinator goes on without once no restart is left for them
            (a synchronous parameter-server run's ``N - K`` backup workers; default 0).
        log_dir: task logs and status files (``<type>-<index>.log`` / ``.status.json``).
        threads_per_task: ``TF_NUM_INTRAOP_THREADS`` of each task (0: TensorFlow's default).
        start_timeout_s: seconds the servers get to listen on their ports.
        stop_grace_s: seconds between SIGTERM and SIGKILL when the run is interrupted.
        survivor_grace_s: seconds the other tasks get to fail on their own after one failed.
        check_workers: ``check_workers(n)`` raises if the run cannot go on with ``n`` workers
            (e.g. the global batch does not divide); called before every attempt.
        after_stop: called with the attempt's tasks once they are all stopped (clean-up).
        echo: copy every task's new log lines to stdout, prefixed ``[worker:1]``.
        task_env: variables added to every task's environment (besides ``TF_CONFIG``).
        what: the run, in words, for messages (``"multi-worker training"``).
        interrupt_body: a task that ends the run while ``body`` runs interrupts the main thread
            (SIGINT), and :meth:`Supervisor.run` raises :class:`TaskFailedError` naming it.
        hang_timeout_s: seconds a server task may go without answering a liveness probe before
            it is lost (:class:`kerasdist.cluster.watch.HangWatch`); None: not watched.
        abandon: called with that :class:`TaskFailedError` when the body is still blocked
            :data:`~kerasdist.launch.supervisor.BODY_ABANDON_S` s after every task stopped;
            default :func:`kerasdist._exit.abandon` (reports it, exit code 1).
    """

    plan: Callable[[int, int], list[TaskPlan]]
    workers: int
    log_dir: Path
    min_workers: int | None = None
    max_restarts: int = 0
    spare_workers: int = 0
    threads_per_task: int = 0
    start_timeout_s: float = 120.0
    stop_grace_s: float = STOP_GRACE_S
    survivor_grace_s: float = SURVIVOR_GRACE_S
    check_workers: Callable[[int], None] | None = None
    after_stop: Callable[[list[Task]], None] | None = None
    echo: bool = False
    task_env: dict[str, str] = field(default_factory=dict)
    what: str = "the local cluster"
    interrupt_body: bool = True
    hang_timeout_s: float | None = None
    abandon: Callable[[BaseException], object] = _exit.abandon

    def __post_init__(self):
        if not 1 <= self.fewest <= self.workers:
            raise ClusterError(f"the fewest workers must be between 1 and the workers. Received: "
                               f"min_workers={self.min_workers}, workers={self.workers}")
        if self.max_restarts < 0:
            raise ClusterError(f"max_restarts must be >= 0. Received: {self.max_restarts}")

    @property
    def fewest(self) -> int:
        return self.workers if self.min_workers is None else self.min_workers


def worker_recipe(recipe, **cluster: Any) -> dict:
    """The recipe a task of a cluster kerasdist starts runs (a Ray worker, a local task): this
    one as a ``tf_config`` task (its role comes from the ``TF_CONFIG`` it is given), with the
    resolved thread count and the ``cluster`` fields given."""
    from kerasdist.config.cluster_configs import as_kind

    data = recipe.model_dump(mode="json")
    data["cluster"] = as_kind(recipe.cluster, "tf_config", threads_per_task=recipe.intra_op_threads(),
                              **cluster).model_dump(mode="json")
    return data


@dataclass(frozen=True)
class Failure:
    """How one attempt failed: the report (first failed task, what the others did, log tail),
    the failure class of the task that caused it, its error class name and message, the worker
    tasks it lost (a killed task, the peers the others reported lost), and that task's name."""

    report: str
    failure_class: str
    message: str = ""
    error: str = ""
    lost: tuple[str, ...] = ()
    task: str = ""

    @property
    def retryable(self) -> bool:
        return self.failure_class in RETRYABLE

    @property
    def first_line(self) -> str:
        return self.report.splitlines()[0]


@dataclass
class AttemptRecord:
    """One attempt, as recorded in ``metrics.json`` (``supervisor.attempts``)."""

    workers: int
    ended: str = "running"

    def as_dict(self) -> dict[str, Any]:
        return {"workers": self.workers, "ended": self.ended}


def why(task: Task, hung: dict[str, float] | None = None) -> str:
    """How one task ended, in words, with the peers it reported lost in its status file;
    ``hung``: tasks killed because they stopped answering (name -> seconds silent)."""
    code = task.returncode()
    if code == EXIT_INTERRUPTED:
        return f"task {task.name} was preempted (SIGTERM; a checkpoint was saved)"
    if hung and task.name in hung:
        return (f"task {task.name} stopped answering (no reply for {hung[task.name]:.0f} s: "
                "frozen or hung) and was killed")
    text = f"task {task.name} {describe_exit(code)}"
    lost = (status.read(task.status_path) or {}).get("lost_tasks")
    return f"{text} (it lost task {', '.join(lost)})" if lost else text


def stop_line(task: Task, state: TaskState) -> str:
    """One line for a task of a stopping cluster: its name, how it ended, what it reported."""
    code = task.returncode()
    reported = status.read(task.status_path) or {}
    if code == 0:
        how = "exited 0"
    elif code == EXIT_INTERRUPTED:
        how = "saved a checkpoint and exited 130"
    elif state is TaskState.STOPPED and code == -signal.SIGTERM:
        how = "stopped by SIGTERM"
    else:
        how = describe_exit(code)
    if reported.get("class"):
        how += f" ({reported['class']}"
        if reported.get("lost_tasks"):
            how += f": it lost {', '.join(reported['lost_tasks'])}"
        how += ")"
    elif code not in (0, EXIT_INTERRUPTED, None) and state is not TaskState.STOPPED:
        how += " (no status: lost)"
    return f"  {task.name:<10} {how}"


def tagged(err: BaseException, failure: Failure) -> BaseException:
    """``err`` with the failed task's name (``err.task``), error class name (``err.error``) and
    message (``err.detail``), for :mod:`kerasdist.launch.explain`."""
    err.task, err.error, err.detail = failure.task, failure.error, failure.message
    return err


def bad_input_error(name: str) -> type[KerasdistError]:
    """The kerasdist error class a task reported by name (bad input), else ClusterError."""
    found = getattr(errors, name, None)
    return found if isinstance(found, type) and issubclass(found, KerasdistError) else ClusterError


def clean_scratch(folders: Sequence[Path]) -> Callable[[list[Task]], None]:
    """An ``after_stop`` that deletes each task's scratch folder (:func:`kerasdist._scratch.temp_dir`)
    under ``folders``; it imports neither TensorFlow nor Keras."""
    from kerasdist._scratch import temp_dir

    def clean(tasks: list[Task]) -> None:
        for folder in folders:
            for task in tasks:
                shutil.rmtree(temp_dir(folder, task.name), ignore_errors=True)

    return clean


def parse_worker_range(text: str) -> tuple[int, int]:
    """``'3'`` -> (3, 3); ``'2:4'`` -> (2, 4): ``kerasdist launch --workers MIN:MAX``.

    Raises:
        ClusterError: not ``N`` or ``MIN:MAX`` with 1 <= MIN <= MAX (names the value).
    """
    low, sep, high = str(text).partition(":")
    try:
        values = (int(low), int(high) if sep else int(low))
    except ValueError:
        values = (0, -1)
    if not 1 <= values[0] <= values[1]:
        raise ClusterError(f"--workers must be N or MIN:MAX with 1 <= MIN <= MAX. Received: "
                           f"--workers {text!r}")
    return values


__all__ = ["RECIPE_CHECKED_ENV", "STOP_GRACE_S", "SURVIVOR_GRACE_S", "AttemptRecord", "Failure",
           "LaunchSpec", "TaskPlan", "TaskState", "bad_input_error", "clean_scratch",
           "parse_worker_range", "stop_line", "tagged", "why", "worker_recipe"]
