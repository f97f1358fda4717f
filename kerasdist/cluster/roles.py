"""Task types and counts of a cluster that a scheduler starts (Slurm, JobSet, Trainer v2), shared
by the exports that write its jobs and the resolvers that read a task's role back.

The order of ranks is TF's ``SlurmClusterResolver`` order (jobs in sorted name order): rank 0 is
the chief (the parameter-server coordinator), then the ps, then the workers; without ps every
rank is a worker (worker 0 is the chief).
"""

from __future__ import annotations

from typing import Mapping

from kerasdist.errors import ClusterError, RecipeError

ROLE_ORDER = ("chief", "ps", "worker")
"""Task types in rank order."""


def task_counts(*, needs_ps: bool, workers: int, ps: int, where: str) -> dict[str, int]:
    """Task type -> tasks: ``{'chief': 1, 'ps': ps, 'worker': workers}`` when the strategy
    needs ps, else ``{'worker': workers}``.

    Args:
        needs_ps: the strategy needs ps tasks (its traits).
        workers: worker tasks (``cluster.workers``); ps: ps tasks (``cluster.ps``).
        where: what asks, for the message (``"cluster.kind 'jobset'"``).

    Raises:
        ClusterError: fewer than 1 worker, or a parameter-server cluster with ps below 1.
    """
    if workers < 1 or (needs_ps and ps < 1):
        needs = "cluster.ps >= 1 and cluster.workers >= 1" if needs_ps else "cluster.workers >= 1"
        raise ClusterError(f"{where} with a {'parameter-server' if needs_ps else 'multi-worker'} "
                           f"strategy needs {needs}. Received: cluster.workers={workers}"
                           + (f", cluster.ps={ps}" if needs_ps else ""))
    if not needs_ps:
        return {"worker": workers}
    return {"chief": 1, "ps": ps, "worker": workers}


def rank_roles(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    """``(task type, index)`` of every rank in :data:`ROLE_ORDER`, e.g. ``{'chief': 1, 'ps': 1,
    'worker': 2}`` -> ``[('chief', 0), ('ps', 0), ('worker', 0), ('worker', 1)]``."""
    return [(job, index) for job in ROLE_ORDER for index in range(counts.get(job, 0))]


def recipe_counts(recipe, *, what: str) -> dict[str, int]:
    """:func:`task_counts` of a validated recipe, for an export.

    Raises:
        RecipeError: a strategy that runs in one process, or the counts refused, the message
            starting with ``what`` (``"export slurm"``).
    """
    traits = recipe.strategy.traits
    if traits.topology not in ("peers", "coordinator"):
        kind = recipe.strategy.kind
        raise RecipeError(f"{what}: strategy.kind '{kind}' runs in one process; a job of several "
                          f"tasks needs 'multi_worker' or 'parameter_server'. Received: "
                          f"kind='{kind}'")
    try:
        return task_counts(needs_ps=traits.needs_ps, workers=recipe.cluster.workers,
                           ps=recipe.cluster.ps, where=what)
    except ClusterError as err:
        raise RecipeError(str(err)) from None


def scheduler_env(environ: Mapping[str, str], names, *, inside: str) -> None:
    """Check that every variable of ``names`` a scheduler sets is in ``environ`` and not empty.

    Raises:
        ClusterError: ``must run {inside}; missing <names>``.
    """
    missing = [name for name in names if not environ.get(name)]
    if missing:
        raise ClusterError(f"{inside}; missing {', '.join(missing)}. Received: unset")


def int_env(environ: Mapping[str, str], name: str) -> int:
    """``environ[name]`` as an int (a scheduler's task count or index).

    Raises:
        ClusterError: the value is not an integer (names the variable and the value).
    """
    try:
        return int(environ[name])
    except ValueError:
        raise ClusterError(f"{name} must be an integer. Received: {environ[name]!r}") from None


__all__ = ["ROLE_ORDER", "int_env", "rank_roles", "recipe_counts", "scheduler_env", "task_counts"]
