"""Local coordinator clusters (parameter server): ps + worker servers, the coordinator here (or,
when elastic, as task ``chief:0``).

The :class:`~kerasdist.launch.supervisor.Supervisor` starts the servers and runs the session
(:func:`kerasdist.training.run_session`) as its body: a lost worker is restarted on its address
within ``cluster.max_restarts`` while ``ClusterCoordinator`` re-runs its steps; with
``cluster.min_workers`` (:func:`elastic`) the coordinator is member task ``chief:0`` and a lost
worker makes the next attempt run on the workers left; with no restart left, a synchronous run
goes on without up to N - K lost workers (:attr:`LaunchSpec.spare_workers`), elastic or not; a
lost ps ends the run (exit 1, naming it). What each failure costs: docs/guarantees.md.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from kerasdist import _exit
from kerasdist._log import get_logger
from kerasdist.cluster.spec import local_cluster
from kerasdist.errors import TaskFailedError
from kerasdist.launch.peers import record_attempts, task_recipe
from kerasdist.launch.plan import RECIPE_CHECKED_ENV, LaunchSpec, TaskPlan
from kerasdist.launch.supervisor import Supervisor
from kerasdist.training import RunResult, run_session
from kerasdist.training.rundir import RunDir

if TYPE_CHECKING:
    from kerasdist.config import Recipe


log = get_logger("launch")


def elastic(recipe: Recipe) -> bool:
    """True when ``cluster.min_workers`` is below ``cluster.workers``: the coordinator then runs
    as a task of its own (``chief:0``), so that the run can go on without a lost worker."""
    cluster = recipe.cluster
    return cluster.min_workers is not None and cluster.min_workers < cluster.workers


def launch_spec(recipe: Recipe, *, overwrite: bool = False) -> LaunchSpec:
    """The :class:`LaunchSpec` of a local parameter-server cluster: its ps and worker servers,
    plus, when :func:`elastic`, the coordinator as member task ``chief:0`` (``--overwrite`` on
    the first attempt only: a later attempt resumes from the last checkpoint)."""
    cluster = recipe.cluster
    out_of_process = elastic(recipe)

    def plan(workers: int, attempt: int) -> list[TaskPlan]:
        spec = local_cluster(workers=workers, ps=cluster.ps, chief=True)
        args = task_recipe(recipe, workers)
        argv = (sys.executable, "-m", "kerasdist", *args)
        tasks = [TaskPlan(spec.for_task(job, i), argv, server=True)
                 for job in ("ps", "worker") for i in range(spec.num(job))]
        if out_of_process:
            chief = [*argv, "--overwrite"] if overwrite and attempt == 1 else argv
            tasks.append(TaskPlan(spec.for_task("chief", 0), tuple(chief)))
        return tasks

    return LaunchSpec(plan=plan, workers=cluster.workers, min_workers=cluster.min_workers,
                      max_restarts=cluster.max_restarts, log_dir=RunDir.of(recipe).logs,
                      spare_workers=_backup_workers(recipe),
                      threads_per_task=recipe.intra_op_threads(),
                      start_timeout_s=cluster.start_timeout_s, what="parameter-server training",
                      hang_timeout_s=recipe.strategy.task_timeout_s,
                      task_env={RECIPE_CHECKED_ENV: "1"},
                      abandon=lambda err: _exit.abandon(_resumable(err, recipe)))


def _backup_workers(recipe: Recipe) -> int:
    """``N - K`` of a synchronous run (``strategy.sync``), whose steps need only K workers; 0
    otherwise."""
    sync = getattr(recipe.strategy, "sync", None)
    if sync is None:
        return 0
    k = sync.replicas_to_aggregate
    return 0 if k is None else recipe.cluster.workers - k


def _resumable(err: BaseException, recipe: Recipe) -> TaskFailedError:
    """``err`` with how to resume: re-run (with one worker fewer while a host is gone)."""
    fewer = (f" (add --set cluster.workers={recipe.cluster.workers - 1} to go on without a "
             "worker whose host is gone)" if recipe.cluster.workers > 1 else "")
    return TaskFailedError(f"{err}. Re-run the same command{fewer} to resume from the last "
                           f"checkpoint in {RunDir.of(recipe).checkpoints}.")


def _import_while_servers_start() -> None:
    """Import TensorFlow and Keras while the ps and worker servers start and the supervisor waits
    for them to listen: the coordinator's own import (seconds) then overlaps theirs instead of
    following it (:mod:`kerasdist._preload`)."""
    from kerasdist._preload import tensorflow_in_background

    tensorflow_in_background()


def run_coordinator(recipe: Recipe, *, overwrite: bool, verbose, callbacks) -> RunResult:
    """Start 1+ ps and N workers as subprocesses, run the coordinator here, always stop them.

    Raises:
        ClusterError: a port was taken, a task did not start (named in the message; exit 2).
        TaskFailedError: a ps task died, or a worker died with no restart left (named in the
            message; the checkpoints in ``<run_dir>/checkpoints`` resume it).
    """
    if elastic(recipe):
        return _run_elastic(recipe, overwrite=overwrite)
    supervisor = Supervisor(launch_spec(recipe))
    _import_while_servers_start()

    def session(tf_config) -> RunResult:
        result = run_session(recipe, tf_config=tf_config.for_task("chief", 0),
                             overwrite=overwrite, verbose=verbose, callbacks=callbacks,
                             entry_checked=True)  # by its launcher, LocalKind.run
        import gc

        gc.collect()  # release remote iterators/functions while their servers still answer
        return result

    try:
        result = supervisor.run(session)
    except TaskFailedError as err:
        raise _resumable(err, recipe) from None
    if supervisor.restarted or supervisor.left:
        from kerasdist.training.result import write_metrics

        tasks = result.extra.setdefault("parameter_server", {})
        tasks.update(restarted_tasks=supervisor.restarted, left_tasks=supervisor.left)
        write_metrics(result, recipe)
    return result


def _run_elastic(recipe: Recipe, *, overwrite: bool) -> RunResult:
    """The coordinator as task ``chief:0`` of each attempt: a worker lost with no restart left
    (beyond a synchronous run's backup workers) fails the attempt (the coordinator, blocked
    waiting for it, is stopped with the others), and the next attempt runs on the workers left,
    its coordinator resuming from the last checkpoint at its exact step. The result is read from
    the ``metrics.json`` the last coordinator wrote, with the attempts under ``supervisor``."""
    supervisor = Supervisor(launch_spec(recipe, overwrite=overwrite))
    try:
        supervisor.run()
    except TaskFailedError as err:
        raise _resumable(err, recipe) from None
    record_attempts(RunDir.of(recipe), supervisor)
    return RunResult.from_metrics(RunDir.of(recipe).metrics)

