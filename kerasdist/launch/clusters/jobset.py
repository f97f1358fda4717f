"""``cluster.kind: jobset``: each task is a pod of a Kubernetes JobSet and reads its role there.

``kerasdist export jobset`` writes one Indexed Job per task type (replicated jobs ``chief``,
``ps``, ``worker``) with DNS hostnames, ``<jobset>-<replicated job>-<job index>-<pod
index>.<subdomain>``. Each pod reads ``JOBSET_NAME`` and ``REPLICATED_JOB_NAME`` (mapped from
its annotations by the manifest), ``JOB_COMPLETION_INDEX`` (its task index) and, optionally,
``JOBSET_SUBDOMAIN``. In a Kubeflow Trainer v2 TrainJob every task is in the replicated job
``node`` and ``JOB_COMPLETION_INDEX`` is its rank (:func:`kerasdist.cluster.roles.rank_roles`).
Task counts come from the recipe, the port from ``cluster.port_base``; the result is a validated
:class:`~kerasdist.cluster.spec.TFConfig` (docs/kubernetes.md).
"""

from __future__ import annotations

import os
from typing import Mapping

from kerasdist.cluster.export_trainjob import TRAINER_NODE
from kerasdist.cluster.roles import int_env, rank_roles, scheduler_env, task_counts
from kerasdist.cluster.spec import TFConfig, validate
from kerasdist.errors import ClusterError
from kerasdist.launch.clusters.tf_config import ScheduledKind
from kerasdist.strategies import registry

JOBSET_VARIABLES = ("JOBSET_NAME", "REPLICATED_JOB_NAME", "JOB_COMPLETION_INDEX")
"""The environment variables every pod needs (see module docs)."""


def pod_host(jobset: str, replicated_job: str, index: int, subdomain: str | None = None) -> str:
    """The DNS name JobSet gives pod ``index`` of the (only) Job of ``replicated_job``."""
    return f"{jobset}-{replicated_job}-0-{index}.{subdomain or jobset}"


def tf_config_from_jobset(*, needs_ps: bool, workers: int, ps: int = 0, port: int = 8888,
                          environ: Mapping[str, str] | None = None) -> TFConfig:
    """This pod's role and cluster as a :class:`TFConfig` (see module docs).

    Args:
        needs_ps: the strategy needs ps tasks (its traits).
        workers: ``cluster.workers``; ps: ``cluster.ps``.
        port: the task servers' port (``cluster.port_base``).
        environ: default ``os.environ`` (read only).

    Raises:
        ClusterError: a variable missing or malformed (each named), a replicated job that is not
            a task type of the recipe, or an index out of range.
    """
    environ = os.environ if environ is None else environ
    scheduler_env(environ, JOBSET_VARIABLES, inside="cluster.kind 'jobset' must run in a pod of "
                  "a JobSet (kerasdist export jobset maps them)")
    counts = task_counts(needs_ps=needs_ps, workers=workers, ps=ps, where="cluster.kind 'jobset'")
    replicated = environ["REPLICATED_JOB_NAME"]
    if replicated != TRAINER_NODE and replicated not in counts:
        raise ClusterError(f"REPLICATED_JOB_NAME must name a task type of the recipe "
                           f"({', '.join(counts)}) or Trainer v2's '{TRAINER_NODE}'. "
                           f"Received: {replicated!r}")
    index = int_env(environ, "JOB_COMPLETION_INDEX")
    size = sum(counts.values()) if replicated == TRAINER_NODE else counts[replicated]
    if not 0 <= index < size:
        raise ClusterError(f"JOB_COMPLETION_INDEX must be within 0..{size - 1} for replicated "
                           f"job '{replicated}' (the recipe's count). Received: {index}")
    name, subdomain = environ["JOBSET_NAME"], environ.get("JOBSET_SUBDOMAIN") or None
    if replicated == TRAINER_NODE:  # one replicated job of every task: roles by rank
        ranks = rank_roles(counts)
        cluster = {job: [f"{pod_host(name, TRAINER_NODE, rank, subdomain)}:{port}"
                         for rank, (kind, _) in enumerate(ranks) if kind == job]
                   for job in counts}
        role, index = ranks[index]
    else:
        cluster = {job: [f"{pod_host(name, job, i, subdomain)}:{port}" for i in range(count)]
                   for job, count in counts.items()}
        role = replicated
    return validate(cluster, role, index, require_ps=needs_ps)


class JobSetKind(ScheduledKind):
    """``cluster.kind: jobset`` (see the module docs)."""

    def environment_role(self, recipe) -> TFConfig:
        """This pod's role (:func:`tf_config_from_jobset`).

        Raises:
            ClusterError: a variable missing or malformed, or roles that do not fit.
        """
        cluster = recipe.cluster
        return tf_config_from_jobset(needs_ps=registry.for_recipe(recipe).traits.needs_ps,
                                     workers=cluster.workers, ps=cluster.ps,
                                     port=cluster.port_base)


__all__ = ["JOBSET_VARIABLES", "TRAINER_NODE", "JobSetKind", "pod_host", "tf_config_from_jobset"]
