"""A local cluster of peers (every worker runs the run, ``multi_worker``): its launch spec.

Each attempt of the :class:`~kerasdist.launch.supervisor.Supervisor` starts every worker
(``python -m kerasdist fit <run_dir>/logs/recipe.json``, its ``TF_CONFIG`` in its environment
only) on fresh localhost ports. A lost peer or a preemption is retried from the last backup
within ``cluster.max_restarts``, or continued on fewer workers with ``cluster.min_workers``; a
deterministic error or bad input is reported at once with the task's own message.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from kerasdist._files import read_json
from kerasdist._log import get_logger
from kerasdist.cluster.spec import local_cluster
from kerasdist.errors import TaskFailedError
from kerasdist.launch.plan import RECIPE_CHECKED_ENV, LaunchSpec, TaskPlan, clean_scratch, worker_recipe
from kerasdist.launch.supervisor import Supervisor
from kerasdist.training.rundir import RunDir

if TYPE_CHECKING:
    from kerasdist.config import Recipe


log = get_logger("launch")


def task_recipe(recipe: Recipe, workers: int) -> list[str]:
    """Arguments of ``python -m kerasdist`` for a task of a local cluster with ``workers``
    workers: the resolved recipe (``cluster.kind: tf_config``, the resolved thread count, the
    attempt's worker count) written as ``<run_dir>/logs/recipe.json`` (after the preflight)."""
    path = RunDir.of(recipe).write_task_recipe(worker_recipe(recipe, workers=workers))
    return ["fit", str(path), "--verbose", "2"]


def check_workers(recipe: Recipe):
    """``check_workers(n)`` of a recipe: refuse a worker count the global batch does not divide
    into equal per-replica batches (times ``trainer.gradient_accumulation_steps``)."""
    batch = recipe.data.batch_size
    micro = recipe.trainer.gradient_accumulation_steps

    def check(workers: int) -> None:
        if batch % (workers * micro):
            raise TaskFailedError(
                f"cannot go on with {workers} workers: data.batch_size={batch} (the global batch, "
                f"kept when the cluster shrinks) does not divide into {workers} per-replica batches"
                + (f" of {micro} micro-batches" if micro > 1 else "") + ". The run stopped at its "
                "last backup; re-run with a cluster.min_workers whose counts divide data.batch_size "
                f"(received: cluster.workers={recipe.cluster.workers}, "
                f"cluster.min_workers={recipe.cluster.min_workers})")

    return check


def launch_spec(recipe: Recipe, *, overwrite: bool) -> LaunchSpec:
    """The :class:`LaunchSpec` of a local peers cluster running ``recipe``."""
    run_dir = RunDir.of(recipe)
    cluster = recipe.cluster

    def plan(workers: int, attempt: int) -> list[TaskPlan]:
        spec = local_cluster(workers=workers)
        args = task_recipe(recipe, workers)
        if overwrite and attempt == 1:  # restarts resume: they never discard the new checkpoints
            args.append("--overwrite")
        argv = (sys.executable, "-m", "kerasdist", *args)
        return [TaskPlan(spec.for_task("worker", i), argv) for i in range(workers)]

    return LaunchSpec(plan=plan, workers=cluster.workers, min_workers=cluster.min_workers,
                      max_restarts=cluster.max_restarts, log_dir=run_dir.logs,
                      threads_per_task=recipe.intra_op_threads(),
                      survivor_grace_s=min(10.0, recipe.strategy.timeout_s + 5),
                      check_workers=check_workers(recipe),
                      after_stop=clean_scratch([run_dir.checkpoints]),
                      task_env={RECIPE_CHECKED_ENV: "1"}, what="multi-worker training")


def run_peers(recipe: Recipe, *, overwrite: bool) -> Supervisor:
    """Run a local peers cluster to its end; record its attempts in ``metrics.json``.

    Raises:
        TaskFailedError: a peer was lost and neither a restart nor ``cluster.min_workers`` is left.
        TrainingError: a task failed deterministically (names the task; its original message).
        ClusterError: a task refused its input (e.g. its port is taken; names the task; exit 2).
        KeyboardInterrupt: interrupted (the workers saved first).
    """
    supervisor = Supervisor(launch_spec(recipe, overwrite=overwrite))
    supervisor.run()
    record_attempts(RunDir.of(recipe), supervisor)
    return supervisor


def record_attempts(run_dir: RunDir, supervisor: Supervisor) -> None:
    """Add ``supervisor: {attempts: [{workers, ended}], workers, restarted_tasks}`` to the run's
    ``metrics.json`` (atomically), and ``parameter_server.left_tasks``: the backup workers the
    run went on without."""
    data = read_json(run_dir.metrics)
    if data is None:
        return
    data["supervisor"] = {"attempts": [a.as_dict() for a in supervisor.attempts],
                          "workers": supervisor.attempts[-1].workers,
                          "restarted_tasks": list(supervisor.restarted)}
    if supervisor.left:
        data.setdefault("parameter_server", {})["left_tasks"] = list(supervisor.left)
    run_dir.write_json(run_dir.metrics, data)


__all__ = ["check_workers", "launch_spec", "record_attempts", "run_peers", "task_recipe"]
