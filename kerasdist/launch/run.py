"""Run a recipe where its ``cluster.kind`` says (:func:`run_recipe` hands it to the kind,
:mod:`kerasdist.launch.clusters`); the launcher's checks (:func:`preflight`, :func:`check_shape`)
and the callbacks a task can rebuild."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kerasdist import _log
from kerasdist._signals import startup
from kerasdist.cluster.spec import TFConfig
from kerasdist.errors import DataError
from kerasdist.launch import clusters
from kerasdist.strategies import registry
from kerasdist.training import RunResult
from kerasdist.training.rundir import RunDir

if TYPE_CHECKING:
    from kerasdist.config import Recipe


log = _log.get_logger("launch")


def preflight(recipe: Recipe, *, overwrite: bool) -> RunDir:
    """Every bad-input check of a cluster started from this process, before any process starts
    or any file is written: :func:`check_shape`, the run directory, the data splits (at least one
    global batch) and the model built against the data
    (:func:`kerasdist.training.checks.check_recipe_here`, in a forked child where it applies).

    Returns:
        The checked :class:`~kerasdist.training.rundir.RunDir` (claimed by the launcher).

    Raises:
        RecipeError, DataError, RunDirError, ClusterError: bad input (exit code 2).
        Interrupted: SIGINT/SIGTERM (:func:`kerasdist._signals.startup`).
    """
    from kerasdist.data.inputs import examples_per_worker
    from kerasdist.launch import forking

    with startup("checking the recipe, its data and its run directory"):
        check_shape(recipe)
        run_dir = RunDir.of(recipe)
        # files, feature spec, columns, data.source.function, both splits: every source kind
        per_worker = examples_per_worker(recipe)
        if per_worker < recipe.data.batch_size:
            raise DataError(f"data.train_split '{recipe.data.train_split}' has {per_worker} "
                            f"examples, fewer than one global batch. Received: "
                            f"batch_size={recipe.data.batch_size}")
        run_dir.check(recipe, overwrite=overwrite,
                      checkpoint_schema=registry.for_recipe(recipe).traits.checkpoint_schema)
        forking.check_recipe(recipe)  # check_recipe_here, in a forked child where that applies
        return run_dir


def check_shape(recipe: Recipe) -> None:
    """The checks of :func:`preflight` that read nothing and start nothing (``kerasdist
    validate`` runs them too): the cluster kind's own (:meth:`ClusterKind.check
    <kerasdist.launch.clusters.base.ClusterKind.check>`: a local cluster's tasks against this
    machine's cores), and the strategy's (:meth:`~kerasdist.strategies.base.Strategy.preflight`:
    the global batch against the replicas known in advance).

    Raises:
        RecipeError, ClusterError: bad input (exit code 2), naming the fields and their values.
    """
    clusters.of(recipe).check(recipe)
    registry.for_recipe(recipe).preflight(recipe)


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


def run_recipe(recipe: Recipe, *, overwrite: bool = False, verbose=None, tf_config: TFConfig | None = None,
               callbacks=(), echo: bool = True) -> RunResult | None:
    """Run ``recipe``; returns the :class:`RunResult` in the process that owns the outputs
    (the chief), ``None`` in other tasks.

    Args:
        recipe: a validated :class:`kerasdist.config.Recipe`.
        overwrite: discard checkpoints in ``output.run_dir`` that this run cannot resume.
        verbose: Keras progress verbosity and log level (0, 1, 2); default the recipe's.
        tf_config: this task's role on a real cluster; default: from its environment
            (``TF_CONFIG``, the ``SLURM_*`` or JobSet variables, as its kind reads them).
        callbacks: extra Keras callbacks; a local cluster takes only those a task can rebuild
            (:func:`send_callbacks_by_path`) unless its coordinator runs here, exposed.
        echo: on a local cluster, show the chief task's new log lines on the console while it
            runs (default True; ``fit --quiet``: False).

    Raises:
        RecipeError, DataError, RunDirError, ClusterError: bad input, before anything starts (also:
            a local cluster that cannot be isolated without ``cluster.allow_network_exposure``).
        TaskFailedError: a task was lost (named), after the restarts allowed.
        TrainingError: a task of a local cluster failed deterministically (its own message).
    """
    _log.ensure_configured()
    return clusters.of(recipe).run(recipe, overwrite=overwrite, verbose=verbose,
                                   callbacks=callbacks, echo=echo, tf_config=tf_config)
