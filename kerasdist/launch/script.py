"""``kerasdist launch``: run a user's own Keras script as a local cluster (torchrun for Keras 3).

* **Multi-worker** (``--ps 0``): ``--workers N`` tasks (plus ``chief:0`` with ``--chief``) each
  run the script with its own ``TF_CONFIG``.
* **Parameter server** (``--ps M``): ``M`` ps and ``N`` worker tasks serve; the script runs once,
  as ``chief:0``, the coordinator of its ``ParameterServerStrategy``.

Every script task runs ``python -m kerasdist.launch.script_task SCRIPT ARGS``. The
:class:`~kerasdist.launch.supervisor.Supervisor` recipes use runs the cluster (task logs echoed
with their task as prefix, restarts within ``--max-restarts``, ``--workers MIN:MAX`` shrinking),
in a private network namespace unless ``--allow-network-exposure`` (docs/launch.md).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from kerasdist._log import get_logger
from kerasdist.cluster.spec import TFConfig, local_cluster
from kerasdist.errors import ClusterError
from kerasdist.launch.plan import LaunchSpec, TaskPlan
from kerasdist.launch.supervisor import Supervisor

log = get_logger("launch")

TASK_MODULE = "kerasdist.launch.script_task"
STOP_GRACE_S = 30.0


@dataclass(frozen=True)
class ScriptCluster:
    """What ``kerasdist launch`` runs (the launch spec the CLI builds). ``workers`` >= 1 (at
    most; ``min_workers``, default ``workers``, at least); ``ps`` >= 0 (0: multi-worker).
    ``task_timeout_s`` (seconds, None: never): with ps tasks, a ps or worker server that answers no
    liveness probe for that long is lost, as with a recipe's ``strategy.task_timeout_s``
    (:class:`kerasdist.cluster.watch.HangWatch`)."""

    script: str
    args: tuple[str, ...] = ()
    workers: int = 2
    ps: int = 0
    chief: bool = False
    max_restarts: int = 0
    log_dir: Path = Path("kerasdist-logs")
    threads_per_task: int = 0
    start_timeout_s: float = 120.0
    min_workers: int | None = None
    task_timeout_s: float | None = 60.0

    def __post_init__(self):
        if not Path(self.script).is_file():
            raise ClusterError(f"script: no such file. Received: script='{self.script}'")
        for name, low in (("workers", 1), ("ps", 0), ("max_restarts", 0)):
            if getattr(self, name) < low:
                raise ClusterError(f"--{name.replace('_', '-')} must be >= {low}. "
                                   f"Received: {name}={getattr(self, name)}")
        if self.min_workers is not None and not 1 <= self.min_workers <= self.workers:
            raise ClusterError(f"--workers MIN:MAX needs 1 <= MIN <= MAX. Received: "
                               f"--workers {self.min_workers}:{self.workers}")

    @property
    def parameter_server(self) -> bool:
        return self.ps > 0

    def spec(self, workers: int | None = None) -> TFConfig:
        """The local cluster (free localhost ports; a chief whenever there are ps tasks)."""
        return local_cluster(workers=workers or self.workers, ps=self.ps,
                             chief=self.chief or self.parameter_server)

    def commands(self, spec: TFConfig) -> list[tuple[TFConfig, list[str]]]:
        """``(task's TF_CONFIG, argv)`` of every task, servers first."""
        python = [sys.executable, "-m", TASK_MODULE]
        script = [*python, str(Path(self.script).resolve()), *self.args]
        jobs = [("ps", [*python, "--serve"]), ("worker", [*python, "--serve"]),
                ("chief", script)] if self.parameter_server else [("chief", script),
                                                                  ("worker", script)]
        return [(spec.for_task(job, i), argv) for job, argv in jobs for i in range(spec.num(job))]

    def launch_spec(self) -> LaunchSpec:
        """The supervisor's :class:`LaunchSpec`: the tasks of an attempt with N workers (ps and
        worker *servers* under parameter server, the script as chief; else script members)."""
        def plan(workers: int, attempt: int) -> list[TaskPlan]:
            return [TaskPlan(task, tuple(argv), server=self.parameter_server
                             and task.task_type in ("ps", "worker"))
                    for task, argv in self.commands(self.spec(workers))]

        return LaunchSpec(plan=plan, workers=self.workers, min_workers=self.min_workers,
                          max_restarts=self.max_restarts, log_dir=self.log_dir,
                          threads_per_task=self.threads_per_task,
                          hang_timeout_s=self.task_timeout_s if self.parameter_server else None,
                          start_timeout_s=self.start_timeout_s, stop_grace_s=STOP_GRACE_S,
                          survivor_grace_s=2.0, echo=True, what="kerasdist launch")

    def cli_args(self) -> list[str]:
        """This cluster as ``kerasdist launch`` arguments (for the namespace child)."""
        workers = (f"{self.min_workers}:{self.workers}" if self.min_workers is not None
                   else str(self.workers))
        return ["launch", "--workers", workers, "--ps", str(self.ps), "--max-restarts",
                str(self.max_restarts), "--log-dir", str(Path(self.log_dir).resolve()),
                "--threads-per-task", str(self.threads_per_task), *(["--chief"] * self.chief),
                "--task-timeout-s", "none" if self.task_timeout_s is None else
                f"{self.task_timeout_s:g}",
                "--allow-oversubscription", str(Path(self.script).resolve()), *self.args]


def dry_run(cluster: ScriptCluster) -> str:
    """Each task's ``TF_CONFIG`` and command, one block per task (nothing is started)."""
    spec = cluster.spec()
    return "\n".join(f"[{task.task_name}]\n  TF_CONFIG='{task.to_json()}'\n  {' '.join(argv)}"
                     for task, argv in cluster.commands(spec))


def launch(cluster: ScriptCluster, *, isolate: bool = False) -> int:
    """Run the script cluster until it succeeds, fails in a way a restart cannot mend, or neither
    a restart nor ``min_workers`` is left; with ``isolate``, in a private network namespace
    (:func:`kerasdist.launch.isolation.run_command_isolated`). Returns the exit code (0).

    Raises:
        TaskFailedError: a task was lost and the run cannot go on (names it, how it ended).
        TrainingError: the script failed by itself (class ``fatal``): its own message.
        ClusterError: bad input (no script, a taken port) before anything started (exit 2), or
            no namespace can be made here.
        KeyboardInterrupt: Ctrl-C or SIGTERM; every task was stopped.
    """
    if isolate:
        from kerasdist.launch.isolation import run_command_isolated

        return run_command_isolated(cluster.cli_args())
    Supervisor(cluster.launch_spec()).run()
    log.info("every script task exited 0")
    return 0


__all__ = ["ScriptCluster", "dry_run", "launch"]
