"""Run a recipe wherever its strategy's topology and ``cluster.kind`` say.

================  ==============  ===========================================================
topology          cluster.kind    what this process does
================  ==============  ===========================================================
single            this_process    runs the lifecycle (:func:`kerasdist.training.run_session`)
peers             local           preflight, then (in a private network namespace) starts the
                                  workers, supervises, restarts them
peers             tf_config/      is one worker: runs the lifecycle with its role
                  slurm/jobset
peers             ray             preflight, then (a local Ray: in a private network namespace)
                                  runs the workers as Ray Train workers (:mod:`.ray_run`)
coordinator       local           preflight, then (in a private network namespace) starts
                                  ps + worker tasks, runs the lifecycle
coordinator       tf_config/      ps/worker: serve (under Slurm: until the chief ends);
                  slurm/jobset    chief: runs the lifecycle
================  ==============  ===========================================================

The topology comes from the strategy object's traits (``multi_worker`` is ``peers``,
``parameter_server`` is ``coordinator``); nothing here compares strategy names. A local cluster
runs in a child process in its own network namespace (:mod:`kerasdist.launch.isolation`): TF's task
servers listen on every interface without authentication. An ``evaluator`` task (TF_CONFIG) is
refused: ``kerasdist evaluate`` serves it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from kerasdist import _log
from kerasdist._signals import startup
from kerasdist._timeline import mark
from kerasdist.cluster.spec import TFConfig, parse_tf_config
from kerasdist.errors import ClusterError, DataError, Preempted
from kerasdist.strategies import registry
from kerasdist.training import RunResult, run_session
from kerasdist.training.rundir import RunDir

if TYPE_CHECKING:
    from kerasdist.config import Recipe


log = _log.get_logger("launch")


def preflight(recipe: Recipe, *, overwrite: bool) -> RunDir:
    """Every bad-input check of a local cluster, in the launching process, before any process
    starts or any file is written: the number of tasks against this machine's cores
    (:func:`kerasdist.launch.processes.check_task_count`), the strategy's own (global batch vs
    replicas known in advance),
    the run directory (path, fingerprint), the data splits (readable, at least one global batch),
    and the model built here against the data (labels within its classes, shapes, NaN/inf:
    :func:`kerasdist.training.checks.check_recipe_here`; no strategy is created here; in a child
    forked from this process where :mod:`kerasdist.launch.forking` applies).

    Returns:
        The checked :class:`~kerasdist.training.rundir.RunDir` (claimed by the launcher).

    Raises:
        RecipeError, DataError, RunDirError, ClusterError: bad input (exit code 2).
        Interrupted: SIGINT/SIGTERM (:func:`kerasdist._signals.startup`).
    """
    with startup("checking the recipe, its data and its run directory"):
        return _preflight(recipe, overwrite=overwrite)


def _preflight(recipe: Recipe, *, overwrite: bool) -> RunDir:
    from kerasdist.data.inputs import examples_per_worker
    from kerasdist.launch import forking

    strategy = registry.for_recipe(recipe)
    check_shape(recipe)
    run_dir = RunDir.of(recipe)
    run_dir.check_path()
    # files, feature spec, columns, data.source.function, both splits: checked for every source kind
    per_worker = examples_per_worker(recipe)
    if per_worker < recipe.data.batch_size:
        raise DataError(f"data.train_split '{recipe.data.train_split}' has {per_worker} "
                        f"examples, fewer than one global batch. Received: "
                        f"batch_size={recipe.data.batch_size}")
    run_dir.check(recipe, overwrite=overwrite, checkpoint_schema=strategy.traits.checkpoint_schema)
    # checks.check_recipe_here, in a child forked from here where that applies (launch.forking)
    forking.check_recipe(recipe)
    return run_dir


def check_shape(recipe: Recipe) -> None:
    """The checks of :func:`preflight` that read nothing and start nothing (``kerasdist
    validate`` runs them too): the tasks of a local cluster against this machine's cores, and the
    strategy's own (:meth:`~kerasdist.strategies.base.Strategy.preflight`: the global batch
    against the replicas known in advance).

    Raises:
        RecipeError, ClusterError: bad input (exit code 2), naming the fields and their values.
    """
    from kerasdist.launch.processes import check_task_count

    strategy = registry.for_recipe(recipe)
    cluster = recipe.cluster
    if cluster.kind == "local":
        coordinator = 1 if strategy.traits.needs_ps else 0
        check_task_count(cluster.workers + cluster.ps + coordinator,
                         allowed=cluster.allow_oversubscription,
                         what=f"cluster.workers={cluster.workers}, cluster.ps={cluster.ps}",
                         flag="--set cluster.allow_oversubscription=true")
    strategy.preflight(recipe)


def _coordinator_in_a_child(recipe: Recipe, callbacks) -> bool:
    """An exposed local parameter-server run from a library call (this interpreter is the
    user's, :func:`kerasdist._exit.owns_process` is False) runs its coordinator in a child
    process: TF can block a coordinator for good after a lost task, and only a child can then be
    ended (the caller gets the :class:`TaskFailedError`). Extra callbacks cannot cross into a
    child: with them it stays here (a blocked coordinator is then logged, never ended)."""
    from kerasdist import _exit

    return (recipe.cluster.kind == "local" and not callbacks and not _exit.owns_process()
            and registry.for_recipe(recipe).traits.topology == "coordinator")


def _plan_ray(recipe: Recipe, callbacks) -> bool:
    """Checks of a Ray run before anything is written; whether it runs isolated (a local Ray)."""
    from kerasdist.launch import isolation, ray_run

    ray_run.require_ray()
    ray_run.check_elastic(recipe)
    if callbacks:
        raise ClusterError("extra Python callbacks cannot be sent to Ray workers. "
                           f"Received: callbacks={list(callbacks)!r}")
    if recipe.cluster.address is None:
        return isolation.plan(recipe)
    ray_run.check_address(recipe.cluster.address)
    return False


def send_callbacks_by_path(recipe: Recipe, callbacks) -> tuple[Recipe, list]:
    """Move the Python ``callbacks`` that a child task can build from a recipe entry (an import
    path, ``{class_name, config}``, or an instance of an importable class with ``get_config``:
    :func:`kerasdist.training.keras_objects.as_recipe_callback`) into ``recipe.callbacks`` (after
    the recipe's own); return the new recipe and the callbacks that cannot be sent (refused later
    for a cluster whose tasks run in other processes).

    Raises:
        RecipeError: a sent callback the recipe schema refuses (names ``callbacks.<i>``).
    """
    from kerasdist.config import validate_recipe
    from kerasdist.training.keras_objects import as_recipe_callback

    sent, kept = [], []
    for callback in callbacks:
        spec = as_recipe_callback(callback)
        (kept if spec is None else sent).append(callback if spec is None else spec)
    if not sent:
        return recipe, kept
    raw = recipe.model_dump(mode="json")
    raw["callbacks"] = [*raw.get("callbacks", []), *sent]
    log.info(f"{len(sent)} Python callback(s) sent to the cluster's tasks by import path")
    return validate_recipe(raw, source="callbacks="), kept


def resolve_role(recipe: Recipe, tf_config: TFConfig | None) -> TFConfig:
    """This task's role on a real cluster: given, from Slurm, or from ``TF_CONFIG``.

    Raises:
        ClusterError: missing or invalid ``TF_CONFIG`` / Slurm variables (names what is wrong).
    """
    needs_ps = registry.for_recipe(recipe).traits.needs_ps
    if tf_config is None and recipe.cluster.kind == "jobset":
        from kerasdist.cluster.jobset import tf_config_from_jobset

        return tf_config_from_jobset(needs_ps=needs_ps, workers=recipe.cluster.workers,
                                     ps=recipe.cluster.ps, port=recipe.cluster.port_base)
    if tf_config is None and recipe.cluster.kind == "slurm":
        from kerasdist.cluster.slurm import tf_config_from_slurm

        cluster = recipe.cluster
        if needs_ps:
            from kerasdist.cluster.slurm_job import check_commands

            check_commands("scancel")  # the chief releases the servers with it
        return tf_config_from_slurm(
            needs_ps=needs_ps, num_ps=cluster.ps, port_base=cluster.port_base,
            num_workers=cluster.workers if "workers" in cluster.model_fields_set else None)
    if tf_config is None:
        return parse_tf_config(os.environ.get("TF_CONFIG"), require_ps=needs_ps)
    return tf_config


def _run_local(recipe: Recipe, *, overwrite: bool, verbose, callbacks,
               echo: bool = True) -> RunResult | None:
    """A local or Ray cluster started from this process (see :func:`run_recipe`)."""
    from kerasdist.launch import isolation
    from kerasdist.launch.console import chief_echo

    recipe, callbacks = send_callbacks_by_path(recipe, callbacks)
    run_dir = preflight(recipe, overwrite=overwrite)
    mark("preflight")
    if recipe.cluster.kind == "ray":
        isolated = _plan_ray(recipe, callbacks)
    else:
        isolated = isolation.plan(recipe, callbacks=callbacks)  # refuses before anything is written
    from kerasdist import tracking

    with startup("checking the tracking server"):
        recipe = tracking.check(recipe, isolated=isolated)  # untracked when allowed and unreachable
    with contextlib.ExitStack() as held:  # the run dir's lock, for the whole local run
        run_dir.claim(held, recipe, overwrite=overwrite,
                      checkpoint_schema=registry.for_recipe(recipe).traits.checkpoint_schema)
        tracker = tracking.start_launch(recipe, run_dir=run_dir.path)  # the user's recipe
        try:
            mark("launching")
            with chief_echo(recipe, echo=echo):
                if isolated or _coordinator_in_a_child(recipe, callbacks):
                    return _run_child(recipe, overwrite=overwrite, verbose=verbose,
                                      isolate=isolated)
                return isolation.launch_here(recipe, overwrite=overwrite, verbose=verbose,
                                             callbacks=callbacks)
        except BaseException as err:
            if tracker is not None:  # e.g. a task killed before its chief could say so
                tracker.fail("FAILED" if isinstance(err, Exception) else "KILLED")
            raise


def _run_child(recipe: Recipe, *, overwrite: bool, verbose, isolate: bool) -> RunResult:
    """Run the local cluster in a child process (:func:`kerasdist.launch.isolation.run_isolated`).

    A parameter-server coordinator (not elastic) that fails with a lost peer -- a transient
    TensorFlow RPC error, a crash of the coordinator process itself -- is started again, whole
    (servers and coordinator, in a fresh process), resuming from the last checkpoint, while
    ``cluster.max_restarts`` lasts: the child's own supervisor restarts lost workers, but TF's
    ``ClusterCoordinator`` cannot be rebuilt inside a process whose remote calls failed. Each
    such restart spends one of ``cluster.max_restarts``; the child gets the restarts left
    (issue 39). A multi-worker child restarts its tasks itself (its supervisor), so it is run
    once here.
    """
    from kerasdist.errors import RETRYABLE, classify
    from kerasdist.launch import isolation
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
            log.warning(f"the parameter-server run lost a peer ({type(err).__name__}: {first}); "
                        f"restarting the cluster ({restarts} restart(s) left), resuming from the "
                        "last checkpoint")
            cluster = recipe.cluster.model_copy(update={"max_restarts": restarts})
            recipe = recipe.model_copy(update={"cluster": cluster})
            overwrite = False


def run_recipe(recipe: Recipe, *, overwrite: bool = False, verbose=None, tf_config: TFConfig | None = None,
               callbacks=(), echo: bool = True) -> RunResult | None:
    """Run ``recipe``; returns the :class:`RunResult` in the process that owns the outputs
    (the chief), ``None`` in other tasks.

    Args:
        recipe: a validated :class:`kerasdist.config.Recipe`.
        overwrite: discard checkpoints in ``output.run_dir`` that this run cannot resume.
        verbose: Keras progress verbosity and log level (0, 1, 2); default the recipe's.
        tf_config: this task's role on a real cluster; default: from ``TF_CONFIG`` when
            ``cluster.kind`` is ``tf_config``, from the ``SLURM_*`` variables when ``slurm``.
        callbacks: extra Keras callbacks; refused for a local cluster (its launcher runs in a
            child process in a private network namespace) unless it runs exposed
            (``cluster.allow_network_exposure``) with the coordinator here.
        echo: on a local cluster, show the chief task's new log lines on the console while it
            runs (:func:`kerasdist.launch.console.chief_log`; default True; ``fit --quiet``: False).

    Raises:
        RecipeError, DataError, RunDirError, ClusterError: bad input, before anything starts (also:
            a local cluster that cannot be isolated without ``cluster.allow_network_exposure``).
        TaskFailedError: a task was lost (named), after the restarts allowed.
        TrainingError: a task of a local cluster failed deterministically (its own message).
    """
    _log.ensure_configured()
    topology = registry.for_recipe(recipe).traits.topology
    if topology == "single":
        return run_session(recipe, overwrite=overwrite, verbose=verbose, callbacks=callbacks)
    if recipe.cluster.kind in ("local", "ray"):
        return _run_local(recipe, overwrite=overwrite, verbose=verbose, callbacks=callbacks,
                          echo=echo)
    tf_config = resolve_role(recipe, tf_config)
    _log.configure(verbose, task=tf_config.task_name,
                   is_chief=tf_config.is_chief)
    if recipe.cluster.kind == "slurm":
        from kerasdist.cluster.slurm_job import log_start

        log_start(tf_config, recipe.cluster.max_restarts)
    if tf_config.task_type == "evaluator":  # the sidecar evaluator: follows the chief's run dir
        from kerasdist.training.evaluator import Evaluator, wait_for_run

        log.info(f"task {tf_config.task_name}: sidecar evaluator of {recipe.output.run_dir}")
        wait_for_run(Path(recipe.output.run_dir))
        Evaluator(recipe.output.run_dir).watch()
        return None
    if topology == "coordinator" and tf_config.task_type not in ("chief", "ps", "worker"):
        raise ClusterError(f"strategy '{recipe.strategy.kind}': task type "
                           f"'{tf_config.task_type}' has no role here (expected chief, worker or ps)")
    return _run_task(recipe, tf_config, topology, overwrite=overwrite, verbose=verbose,
                     callbacks=callbacks)


def _run_task(recipe: Recipe, tf_config: TFConfig, topology: str, *, overwrite: bool, verbose,
              callbacks) -> RunResult | None:
    """This task of a cluster kerasdist does not launch: a ps/worker server serves, the others
    run the lifecycle. Under Slurm a parameter-server server ends with its chief and the chief
    releases them; a preempted task 0 requeues the job (:mod:`kerasdist.cluster.slurm_job`)."""
    with _task_watch(recipe, tf_config, topology):
        under_slurm = recipe.cluster.kind == "slurm" and topology == "coordinator"
        if topology == "coordinator" and tf_config.task_type in ("ps", "worker"):
            if under_slurm:  # ends when the chief ends (kerasdist.cluster.slurm_job)
                from kerasdist.cluster.slurm_job import serve_until_chief_ends

                serve_until_chief_ends(tf_config, intra_op_threads=recipe.intra_op_threads(),
                                       preemption_signal=recipe.cluster.preemption_signal)
                return None
            from kerasdist.cluster.server import serve

            serve(tf_config, intra_op_threads=recipe.intra_op_threads())
            return None
        try:
            result = run_session(recipe, tf_config=tf_config, overwrite=overwrite,
                                 verbose=verbose, callbacks=callbacks)
        except Preempted:
            if recipe.cluster.kind == "slurm":  # task 0 requeues the job (slurm_job)
                from kerasdist.cluster.slurm_job import after_preemption

                after_preemption(recipe.cluster.max_restarts)
            raise
    if under_slurm:
        from kerasdist.cluster.slurm_job import release_servers

        release_servers(tf_config)
    return result


def _task_watch(recipe: Recipe, tf_config, topology: str):
    """A parameter-server chief or worker on a cluster kerasdist does not launch watches the
    tasks it waits on (:class:`kerasdist.cluster.watch.TaskWatch`: a host cut off ends this
    process in ``strategy.task_timeout_s`` plus a few seconds, exit code 1); else nothing."""
    import contextlib

    from kerasdist.cluster.watch import TaskWatch, watched_tasks

    if topology != "coordinator":
        return contextlib.nullcontext()
    timeout_s = recipe.strategy.task_timeout_s
    tasks = watched_tasks(tf_config, timeout_s)
    if not tasks:
        return contextlib.nullcontext()
    return TaskWatch(tasks, timeout_s, task=tf_config.task_name)
