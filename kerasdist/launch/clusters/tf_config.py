"""``cluster.kind: tf_config``, and the base of the kinds whose tasks someone else starts (a
scheduler, an operator, Kubernetes): this process is one task of the cluster.

:meth:`ScheduledKind.run`: the task takes its role; the chief makes the run's entry checks
(:meth:`~kerasdist.launch.clusters.base.ClusterKind.enter`) unless a local launcher made them
(:data:`~kerasdist.launch.plan.RECIPE_CHECKED_ENV`); an ``evaluator`` follows the chief's run
directory; under ``parameter_server`` a ps or worker serves and the chief runs the lifecycle, each
watching the tasks it waits on; under ``multi_worker`` every worker runs it. A subclass adds its
scheduler's hooks (:mod:`.slurm`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from kerasdist import _log, tracking
from kerasdist.cluster.spec import TFConfig, parse_tf_config
from kerasdist.errors import ClusterError, Preempted
from kerasdist.launch.clusters.base import ClusterKind
from kerasdist.launch.plan import RECIPE_CHECKED_ENV
from kerasdist.strategies import registry
from kerasdist.training import RunResult, run_session

log = _log.get_logger("launch")


class ScheduledKind(ClusterKind):
    """A task of a cluster kerasdist does not launch (see the module docs); subclasses give
    :meth:`environment_role`."""

    def log_start(self, recipe, tf_config: TFConfig) -> None:
        """What the scheduler says about this task before it runs: nothing here."""

    def serve(self, recipe, tf_config: TFConfig) -> None:
        """A ps or worker task of a parameter-server cluster: serve until this process ends."""
        from kerasdist.cluster.server import serve

        serve(tf_config, intra_op_threads=recipe.intra_op_threads())

    def on_preempted(self, recipe) -> None:
        """After a preemption stop of the lifecycle, before it propagates: nothing here."""

    def on_success(self, recipe, tf_config: TFConfig) -> None:
        """After the chief's successful run of a parameter-server cluster: nothing here."""

    def run(self, recipe, *, overwrite, verbose, callbacks, echo=True,
            tf_config=None) -> RunResult | None:
        tf_config = self.role(recipe, tf_config)
        _log.configure(verbose, task=tf_config.task_name, is_chief=tf_config.is_chief)
        self.log_start(recipe, tf_config)
        if tf_config.task_type == "evaluator":  # the sidecar evaluator: follows the chief's run dir
            from kerasdist.training.evaluator import Evaluator, wait_for_run

            log.info(f"task {tf_config.task_name}: sidecar evaluator of {recipe.output.run_dir}")
            wait_for_run(Path(recipe.output.run_dir))
            Evaluator(recipe.output.run_dir).watch()
            return None
        topology = registry.for_recipe(recipe).traits.topology
        if topology == "coordinator" and tf_config.task_type not in ("chief", "ps", "worker"):
            raise ClusterError(f"strategy '{recipe.strategy.kind}': task type "
                               f"'{tf_config.task_type}' has no role here (expected chief, worker "
                               "or ps)")
        if tf_config.is_chief and not os.environ.get(RECIPE_CHECKED_ENV):  # else: its launcher's
            recipe = self.enter(recipe, overwrite=overwrite)
        with _task_watch(recipe, tf_config, topology):
            if topology == "coordinator" and tf_config.task_type in ("ps", "worker"):
                with tracking.watch_task(recipe, tf_config.task_name):
                    self.serve(recipe, tf_config)
                return None
            try:
                result = run_session(recipe, tf_config=tf_config, overwrite=overwrite,
                                     verbose=verbose, callbacks=callbacks, entry_checked=True)
            except Preempted:
                self.on_preempted(recipe)
                raise
        if topology == "coordinator":
            self.on_success(recipe, tf_config)
        return result


class TFConfigKind(ScheduledKind):
    """``cluster.kind: tf_config``: the role comes from ``TF_CONFIG`` (or the role flags of
    ``kerasdist fit``, given as ``tf_config``)."""

    def environment_role(self, recipe) -> TFConfig:
        """This task's ``TF_CONFIG`` (with ps tasks when the strategy needs them).

        Raises:
            ClusterError: ``TF_CONFIG`` missing or invalid (names what is wrong).
        """
        needs_ps = registry.for_recipe(recipe).traits.needs_ps
        return parse_tf_config(os.environ.get("TF_CONFIG"), require_ps=needs_ps)

    def role_note(self, recipe) -> str:
        """This machine's ``TF_CONFIG`` checked when it is set (the role ``fit`` would take) and
        described; when it is unset, a note that each task needs it when it runs.

        Raises:
            ClusterError: ``TF_CONFIG`` is set but invalid, or lacks the ps the strategy needs
                (exit code 2).
        """
        if not os.environ.get("TF_CONFIG"):
            return ("cluster.kind 'tf_config': TF_CONFIG is not set here; every task needs it (or "
                    "the --job-name/--task-index/... flags) when it runs")
        spec = self.environment_role(recipe)
        jobs = ", ".join(f"{job} x{spec.num(job)}" for job in ("chief", "worker", "ps")
                         if spec.num(job))
        return f"TF_CONFIG checked: this task is {spec.task_name} of a cluster of {jobs}"


def _task_watch(recipe, tf_config: TFConfig, topology: str):
    """A parameter-server chief or worker on a cluster kerasdist does not launch watches the
    tasks it waits on (:class:`kerasdist.cluster.watch.TaskWatch`: a host cut off ends this
    process in ``strategy.task_timeout_s`` plus a few seconds, exit code 1); else nothing."""
    from kerasdist.cluster.watch import TaskWatch, watched_tasks

    if topology != "coordinator":
        return contextlib.nullcontext()
    timeout_s = recipe.strategy.task_timeout_s
    tasks = watched_tasks(tf_config, timeout_s)
    return TaskWatch(tasks, timeout_s, task=tf_config.task_name) if tasks else \
        contextlib.nullcontext()


__all__ = ["ScheduledKind", "TFConfigKind"]
