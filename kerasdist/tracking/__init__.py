"""Experiment tracking of recipe runs (``output.tracking``): one tracker run per kerasdist run.

Only the task that writes the run directory's outputs tracks: the chief of a multi-worker
cluster, the coordinator of a parameter-server one, the one process otherwise
(:func:`kerasdist.training.run_session`). The tracker run's id is kept in
``<run_dir>/tracking.json``, so a resumed run, a restarted cluster and an elastic run that goes on
with fewer workers all continue the same tracker run.

* :mod:`kerasdist.tracking.mlflow_tracker`: MLflow, through ``mlflow.MlflowClient`` (no global
  MLflow state); needs ``pip install 'kerasdist[mlflow]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kerasdist.config import Recipe


def start(recipe: Recipe, *, run_dir, num_replicas: int):
    """The tracker of ``recipe`` (a Keras callback with ``finish``/``fail``), or None when
    ``output.tracking`` is unset.

    Raises:
        RecipeError: the tracker's package is not installed (names the extra to install).
    """
    tracking = recipe.output.tracking
    if tracking is None:
        return None
    from kerasdist.tracking.mlflow_tracker import MlflowTracker

    return MlflowTracker.start(recipe, run_dir=run_dir, num_replicas=num_replicas)


def start_launch(recipe: Recipe, *, run_dir):
    """The launcher's part (a local or Ray cluster, before its tasks start): create or continue
    the tracker run with the user's recipe (see :meth:`MlflowTracker.start
    <kerasdist.tracking.mlflow_tracker.MlflowTracker.start>`); None when ``output.tracking`` is
    unset. The chief task logs into that run."""
    if recipe.output.tracking is None:
        return None
    from kerasdist.tracking.mlflow_tracker import MlflowTracker

    return MlflowTracker.start(recipe, run_dir=run_dir, num_replicas=None, launcher=True)


def check(recipe: Recipe, *, isolated: bool = False) -> None:
    """Bad-input checks of ``output.tracking`` before anything starts.

    Args:
        isolated: the run's tasks run in a private network namespace (a local cluster), where
            only file-based tracking URIs can be reached.

    Raises:
        RecipeError: the tracker's package is missing, or an isolated local cluster was given a
            network URI it cannot reach.
    """
    tracking = recipe.output.tracking
    if tracking is None:
        return
    from kerasdist.tracking.mlflow_tracker import check_uri, require_mlflow

    require_mlflow()
    check_uri(tracking.uri, isolated=isolated)


__all__ = ["check", "start", "start_launch"]
