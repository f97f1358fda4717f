"""Experiment tracking of recipe runs (``output.tracking``): one tracker run per kerasdist run,
written by the task that writes the outputs (:func:`kerasdist.training.run_session`) and kept in
``<run_dir>/tracking.json``, so a resumed, restarted or elastic run continues it. MLflow
(:mod:`kerasdist.tracking.mlflow_tracker`) needs ``pip install 'kerasdist[mlflow]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kerasdist._timeline import mark
from kerasdist.errors import RecipeError

if TYPE_CHECKING:
    from kerasdist.config import Recipe


def start(recipe: Recipe, *, run_dir, num_replicas: int | None = None, launcher: bool = False):
    """The tracker of ``recipe`` (a Keras callback with ``finish``/``fail``), or None when
    ``output.tracking`` is unset (:meth:`MlflowTracker.start
    <kerasdist.tracking.mlflow_tracker.MlflowTracker.start>`).

    Args:
        recipe: the recipe as this process runs it.
        run_dir: the run directory.
        num_replicas: replicas in sync, on the task that logs; None in a launcher.
        launcher: the launcher's part (a local or Ray cluster, before its tasks start): create
            or continue the tracker run with the user's recipe; the chief task logs into it.

    Raises:
        RecipeError: the tracker's package is not installed (names the extra to install).
    """
    if recipe.output.tracking is None:
        return None
    from kerasdist.tracking.mlflow_tracker import MlflowTracker

    return MlflowTracker.start(recipe, run_dir=run_dir, num_replicas=num_replicas,
                               launcher=launcher)


def check(recipe: Recipe, *, isolated: bool = False) -> Recipe:
    """Bad-input checks of ``output.tracking`` before anything starts or is written: MLflow is
    installed, the URI suits the cluster, and the tracking store answers within a few seconds
    (:func:`~kerasdist.tracking.mlflow_store.unreachable`, one request, no retry).

    Args:
        recipe: the validated recipe.
        isolated: the run's tasks run in a private network namespace (a local cluster), where
            only file-based tracking URIs can be reached.

    Returns:
        ``recipe``; or, when the store cannot be used and ``output.tracking.required`` is false,
        ``recipe`` without ``output.tracking`` (a warning says so: the run goes on untracked).

    Raises:
        RecipeError: the tracker's package is missing; an isolated local cluster was given a
            network URI it cannot reach; the store cannot be used (unreachable server, unknown
            scheme, missing directory) and ``output.tracking.required`` is true (the default).
    """
    tracking = recipe.output.tracking
    if tracking is None:
        return recipe
    from kerasdist.tracking.mlflow_store import PROBE_TIMEOUT_S, check_uri, require_mlflow, unreachable

    require_mlflow()
    check_uri(tracking.uri, isolated=isolated)
    mark("tracking probe")
    why = unreachable(tracking.uri)
    if why is None:
        return recipe
    problem = (f"output.tracking.uri: the MLflow tracking store cannot be used ({why}; checked "
               f"with a {PROBE_TIMEOUT_S} s timeout, no retry)")
    if tracking.required:
        raise RecipeError(f"{problem}. Start the server or fix the URI, or set "
                          "output.tracking.required: false to train without tracking then. "
                          f"Received: uri={tracking.uri!r}")
    from kerasdist._log import get_logger

    get_logger("tracking").warning(f"{problem}; output.tracking.required is false: training "
                                   f"without tracking. Received: uri={tracking.uri!r}")
    output = recipe.output.model_copy(update={"tracking": None})
    return recipe.model_copy(update={"output": output})


def watch_task(recipe: Recipe, task: str):
    """A context manager that logs this task's system metrics into the run's MLflow run, as
    node ``task`` with ``:`` as ``-`` (``worker-1``), from when ``<run_dir>/tracking.json``
    names the run (:class:`~kerasdist.tracking.mlflow_store.TaskMonitor`); a no-op when
    ``output.tracking`` is unset."""
    import contextlib

    if recipe.output.tracking is None:
        return contextlib.nullcontext()
    from kerasdist.tracking.mlflow_store import TaskMonitor

    return TaskMonitor(recipe.output.run_dir, task.replace(":", "-"))


__all__ = ["check", "start", "watch_task"]
