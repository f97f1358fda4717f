"""``cluster.kind: local``: kerasdist starts the cluster's tasks on this machine; the one door to
isolation, forking and the supervisor.

The command (or library call) is the launcher: whether the cluster runs in a private network
namespace (:mod:`kerasdist.launch.isolation`), the run's entry checks (run directory, tracking
store: its tasks do not repeat them), :func:`kerasdist.launch.run.preflight`, the run
directory's lock, and the cluster: in a namespace child (forked where
:mod:`kerasdist.launch.forking` applies) or here when exposed, run by the one supervisor
(:mod:`kerasdist.launch.supervisor`) as peers (:mod:`kerasdist.launch.peers`) or as ps + worker
servers with the coordinator in the launcher (:mod:`kerasdist.launch.coordinator`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from kerasdist import _log
from kerasdist._timeline import mark
from kerasdist.errors import ClusterError
from kerasdist.launch import isolation
from kerasdist.launch.clusters.base import ClusterKind
from kerasdist.strategies import registry
from kerasdist.training import RunResult
from kerasdist.training.rundir import RunDir

log = _log.get_logger("launch")


class LocalKind(ClusterKind):
    """A cluster kerasdist starts on this machine (see the module docs)."""

    def check(self, recipe) -> None:
        """The tasks (workers + ps + a coordinator) against this machine's cores
        (:func:`kerasdist.launch.processes.check_task_count`)."""
        from kerasdist.launch.processes import check_task_count

        cluster = recipe.cluster
        coordinator = 1 if registry.for_recipe(recipe).traits.needs_ps else 0
        check_task_count(cluster.workers + cluster.ps + coordinator,
                         allowed=cluster.allow_oversubscription,
                         what=f"cluster.workers={cluster.workers}, cluster.ps={cluster.ps}",
                         flag="--set cluster.allow_oversubscription=true")

    def isolate(self, recipe, callbacks) -> bool:
        """Whether the run goes into a private network namespace; refuses, before anything is
        written, what cannot run (:func:`kerasdist.launch.isolation.plan`)."""
        return isolation.plan(recipe, callbacks=callbacks)

    def run(self, recipe, *, overwrite, verbose, callbacks, echo=True, tf_config=None):
        from kerasdist import tracking
        from kerasdist.launch.run import preflight, send_callbacks_by_path

        recipe, callbacks = send_callbacks_by_path(recipe, callbacks)
        isolated = self.isolate(recipe, callbacks)  # refuses before anything is written
        recipe = self.enter(recipe, overwrite=overwrite, isolated=isolated)  # its tasks: not again
        run_dir = preflight(recipe, overwrite=overwrite)
        mark("preflight")
        with contextlib.ExitStack() as held:  # the run dir's lock, for the whole local run
            run_dir.claim(held, recipe, overwrite=overwrite,
                          checkpoint_schema=registry.for_recipe(recipe).traits.checkpoint_schema)
            tracker = tracking.start(recipe, run_dir=run_dir.path, launcher=True)  # the user's
            try:
                mark("launching")
                with self._chief_echo(recipe, echo=echo, verbose=verbose):
                    if isolated or self._coordinator_in_a_child(recipe, callbacks):
                        return self._run_child(recipe, overwrite=overwrite, verbose=verbose,
                                               isolate=isolated)
                    return self.launch_here(recipe, overwrite=overwrite, verbose=verbose,
                                            callbacks=callbacks)
            except BaseException as err:
                if tracker is not None:  # e.g. a task killed before its chief could say so
                    tracker.fail("FAILED" if isinstance(err, Exception) else "KILLED")
                raise

    def chief_log(self, recipe) -> Path | None:
        """The log of the task whose progress is the run's (it writes the outputs, in a process
        of its own): ``worker-0.log`` under ``multi_worker``, ``chief-0.log`` for an elastic
        parameter-server run (its coordinator is task ``chief:0``); None when the coordinator
        runs in the launcher (its output is the console already)."""
        from kerasdist.launch.coordinator import elastic

        topology = registry.for_recipe(recipe).traits.topology
        if topology == "peers":
            return RunDir.of(recipe).logs / "worker-0.log"
        if topology == "coordinator" and elastic(recipe):
            return RunDir.of(recipe).logs / "chief-0.log"
        return None

    @contextlib.contextmanager
    def _chief_echo(self, recipe, *, echo: bool, verbose=None):
        """While the cluster runs, its chief's new log lines on the console (Keras's progress,
        kerasdist's notices; TensorFlow's start-up noise and kerasdist's verification records
        left out unless ``verbose == 2``), without a prefix: one task speaks. Nothing with
        ``echo`` False (``fit --quiet``)."""
        from kerasdist.launch.echo import Echo

        path = self.chief_log(recipe) if echo else None
        if path is None:
            yield
            return
        with Echo(verbose=verbose == 2) as shown:
            shown.follow(path)
            yield

    def launch_here(self, recipe, *, overwrite: bool, verbose, callbacks=()) -> RunResult:
        """Run the cluster from this process (the namespace child, or an exposed run)."""
        topology = registry.for_recipe(recipe).traits.topology
        if topology == "peers":
            from kerasdist.launch.peers import run_peers

            if callbacks:
                raise ClusterError("extra Python callbacks cannot be sent to local worker "
                                   f"processes. Received: callbacks={list(callbacks)!r}")
            run_peers(recipe, overwrite=overwrite)
            return RunResult.from_metrics(RunDir.of(recipe).metrics)
        from kerasdist.launch.coordinator import run_coordinator

        return run_coordinator(recipe, overwrite=overwrite, verbose=verbose, callbacks=callbacks)

    @staticmethod
    def _coordinator_in_a_child(recipe, callbacks) -> bool:
        """An exposed local parameter-server run from a library call (this interpreter is the
        user's, :func:`kerasdist._exit.owns_process` is False) runs its coordinator in a child
        process: TF can block a coordinator for good after a lost task, and only a child can
        then be ended (the caller gets the :class:`TaskFailedError`). Extra callbacks cannot
        cross into a child: with them it stays here (a blocked coordinator is then logged, never
        ended)."""
        from kerasdist import _exit

        return (not callbacks and not _exit.owns_process()
                and registry.for_recipe(recipe).traits.topology == "coordinator")

    @staticmethod
    def _run_child(recipe, *, overwrite: bool, verbose, isolate: bool) -> RunResult:
        """Run the cluster in a child process (:func:`kerasdist.launch.isolation.run_isolated`).

        A parameter-server child (not elastic) that fails with a lost peer is started again,
        whole, from the last checkpoint while ``cluster.max_restarts`` lasts (TF's
        ``ClusterCoordinator`` cannot be rebuilt in a process whose remote calls failed); each
        restart spends one, the child gets the rest. A multi-worker child restarts its own tasks.
        """
        from kerasdist.errors import RETRYABLE, classify
        from kerasdist.launch.coordinator import elastic

        restarts = recipe.cluster.max_restarts
        again = registry.for_recipe(recipe).traits.topology == "coordinator" and not elastic(recipe)
        while True:
            try:
                return isolation.run_isolated(recipe, overwrite=overwrite, verbose=verbose,
                                              isolate=isolate)
            except Exception as err:  # KeyboardInterrupt/Preempted: never restarted here
                if not again or restarts <= 0 or classify(err) not in RETRYABLE:
                    raise
                restarts -= 1
                first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
                log.warning(f"the parameter-server run lost a peer ({type(err).__name__}: "
                            f"{first}); restarting the cluster ({restarts} restart(s) left), "
                            "resuming from the last checkpoint")
                cluster = recipe.cluster.model_copy(update={"max_restarts": restarts})
                recipe = recipe.model_copy(update={"cluster": cluster})
                overwrite = False


__all__ = ["LocalKind"]
