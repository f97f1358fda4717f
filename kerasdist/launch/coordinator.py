"""Local coordinator clusters (parameter server): ps + worker subprocesses, the coordinator here.

Fault handling (what TF's ``ClusterCoordinator`` promises, plus what the launcher adds):

* a **worker** that dies is restarted on the same address (up to ``cluster.max_restarts`` restarts
  in all); meanwhile the coordinator re-schedules its unfinished steps on the remaining workers
  (steps are at-least-once) and the restarted worker rejoins;
* a **ps** task that dies is not restarted (its variables are gone): the coordinator's next
  ``schedule``/``join`` fails, and kerasdist raises :class:`TaskFailedError` (exit code 1) naming the ps task.
  Re-running the command resumes from the last checkpoint, which the coordinator writes at every
  epoch end;
* the **coordinator** killed: the tasks die with it (``PR_SET_PDEATHSIG``); re-running resumes
  from the last checkpoint.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from kerasdist._log import get_logger
from kerasdist._signals import terminate_on_sigterm
from kerasdist.cluster.spec import check_ports_free, local_cluster
from kerasdist.errors import TaskFailedError
from kerasdist.launch.processes import (
    LocalLauncher,
    describe_exit,
    network_note,
)
from kerasdist.training import RunResult, run_session
from kerasdist.training.rundir import RunDir

if TYPE_CHECKING:
    from kerasdist.config import Recipe


log = get_logger("launch")


class WorkerRestarter(threading.Thread):
    """Restart worker tasks that exit, up to ``budget`` restarts; remember dead ps tasks."""

    def __init__(self, launcher: LocalLauncher, args: list[str], *, budget: int):
        super().__init__(daemon=True, name="kerasdist-worker-restarter")
        self.launcher, self.args, self.budget = launcher, args, budget
        self.stop_event = threading.Event()
        self.restarts: list[str] = []
        self.dead_ps: list[str] = []

    def run(self) -> None:
        while not self.stop_event.wait(0.5):
            for task in list(self.launcher.tasks):
                code = task.returncode()
                if code is None or task.name in self.dead_ps or task.replaced:
                    continue
                if task.tf_config.task_type == "ps":
                    self.dead_ps.append(task.name)
                    log.warning(f"task {task.name} {describe_exit(code)}; the coordinator will fail")
                elif len(self.restarts) < self.budget:
                    task.replaced = True
                    self.restarts.append(task.name)
                    log.warning(f"task {task.name} {describe_exit(code)}; restarting it "
                                f"({len(self.restarts)}/{self.budget})")
                    self.launcher.start(task.tf_config, self.args)
                else:
                    task.replaced = True
                    log.warning(f"task {task.name} {describe_exit(code)}; no restarts left, "
                                "training continues on the remaining workers")


def _dead_ps(launcher: LocalLauncher, restarter: WorkerRestarter, grace_s: float = 5.0) -> list:
    """Names of dead ps tasks; waits up to ``grace_s`` for the exit to be observed, since the
    coordinator can notice the lost ps before the process has been reaped."""
    deadline = time.monotonic() + grace_s
    while True:
        dead = restarter.dead_ps or [t.name for t in launcher.tasks
                                     if t.tf_config.task_type == "ps" and t.returncode() is not None]
        if dead or time.monotonic() > deadline:
            return dead
        time.sleep(0.2)


def run_coordinator(recipe: Recipe, *, args: list[str], overwrite: bool, verbose,
                    callbacks) -> RunResult:
    """Start 1+ ps and N workers as subprocesses, run the coordinator here, always stop them.

    Raises:
        ClusterError: a port was taken, a task did not start (named in the message; exit 2).
        TaskFailedError: a ps task died (named in the message).
    """
    spec = local_cluster(workers=recipe.cluster.workers, ps=recipe.cluster.ps, chief=True)
    check_ports_free(spec)
    run_dir = RunDir.of(recipe)
    log_dir = run_dir.logs
    with LocalLauncher(log_dir=log_dir, threads_per_task=recipe.intra_op_threads()) as \
            launcher, terminate_on_sigterm():
        tasks = [launcher.start(spec.for_task(job, i), args)
                 for job in ("ps", "worker") for i in range(spec.num(job))]
        log.info(f"local cluster: {spec.num('ps')} ps + {spec.num('worker')} workers started "
                 f"({network_note()}); logs in {log_dir}")
        launcher.wait_listening(tasks, timeout_s=recipe.cluster.start_timeout_s)
        restarter = WorkerRestarter(launcher, args, budget=recipe.cluster.max_restarts)
        restarter.start()
        try:
            result = run_session(recipe, tf_config=spec, overwrite=overwrite, verbose=verbose,
                                 callbacks=callbacks)
        except Exception as err:  # TF raises several error types for a lost ps
            restarter.stop_event.set()
            dead = _dead_ps(launcher, restarter)
            if dead:
                raise TaskFailedError(
                    f"parameter server {', '.join(dead)} died; training stopped "
                    f"({type(err).__name__}). Re-run the same command to resume from the last "
                    f"checkpoint in {run_dir.checkpoints}.") from None
            raise
        finally:
            restarter.stop_event.set()
        import gc

        gc.collect()  # release remote iterators/functions while their servers still answer
        if restarter.restarts:
            from kerasdist.training.result import write_metrics

            result.extra.setdefault("parameter_server", {})["restarted_tasks"] = restarter.restarts
            write_metrics(result, recipe)
        return result
