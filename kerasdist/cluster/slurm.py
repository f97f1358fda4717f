"""Cluster roles from a Slurm job step, via TensorFlow's ``SlurmClusterResolver``.

Run one kerasdist task per Slurm task, e.g. two nodes with one worker each::

    srun --nodes=2 --ntasks-per-node=1 kerasdist fit recipe.yaml --set cluster.kind=slurm

Each task reads ``SLURM_PROCID`` (its rank), ``SLURM_STEP_NUM_TASKS``, ``SLURM_STEP_NODELIST`` and
``SLURM_STEP_TASKS_PER_NODE``; TF's resolver expands the node list, gives the tasks on a node
consecutive ports from ``cluster.port_base`` and assigns ranks to jobs in sorted job-name order
(``chief`` < ``ps`` < ``worker``). kerasdist turns the result into a validated
:class:`~kerasdist.cluster.spec.TFConfig`, so Slurm runs go through exactly the same code as
``TF_CONFIG`` runs. Source:
https://www.tensorflow.org/api_docs/python/tf/distribute/cluster_resolver/SlurmClusterResolver

GPUs: kerasdist passes ``auto_set_gpu=False`` (it never writes ``CUDA_VISIBLE_DEVICES`` into its own
environment); ask Slurm to bind GPUs per task instead (``srun --gpus-per-task=1``).
"""

from __future__ import annotations

import os

from kerasdist.cluster.roles import int_env, scheduler_env, task_counts
from kerasdist.cluster.spec import TFConfig, validate
from kerasdist.errors import ClusterError

SLURM_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST",
                   "SLURM_STEP_TASKS_PER_NODE")


def slurm_jobs(*, needs_ps: bool, num_tasks: int, num_ps: int = 0) -> dict[str, int]:
    """Tasks per job for a Slurm step of ``num_tasks`` tasks.

    Without ps (``multi_worker``): every task is a worker (worker 0 is the chief). With ps
    (``parameter_server``): rank 0 is the chief (coordinator), the next ``num_ps`` ranks are ps
    tasks, the rest are workers.

    Raises:
        ClusterError: too few tasks for the requested roles.
    """
    workers = num_tasks - (1 + num_ps if needs_ps else 0)
    if workers < 1:
        raise ClusterError(f"cluster.kind 'slurm' with a parameter-server strategy needs "
                           f"1 chief + cluster.ps (>= 1) ps + >= 1 worker Slurm tasks. Received: "
                           f"{num_tasks} task(s), ps={num_ps}")
    return task_counts(needs_ps=needs_ps, workers=workers, ps=num_ps,
                       where="cluster.kind 'slurm'")


def tf_config_from_slurm(*, needs_ps: bool, num_ps: int = 0, port_base: int = 8888,
                         num_workers: int | None = None) -> TFConfig:
    """This Slurm task's role and cluster as a :class:`TFConfig`.

    Args:
        needs_ps: the strategy needs ps tasks (its traits; see :func:`slurm_jobs`).
        num_ps: parameter-server tasks (``cluster.ps``).
        port_base: first port on each node (``cluster.port_base``).
        num_workers: the workers the recipe asks for (``cluster.workers`` when set); None
            (default): every task not chief or ps is a worker.

    Returns:
        The validated role of this task; read-only use of ``os.environ`` (``SLURM_*``).

    Raises:
        ClusterError: a ``SLURM_*`` variable is missing or malformed, or the roles do not fit
            (too few tasks, or a task count other than ``num_workers`` + ``num_ps`` + chief).
    """
    import tensorflow as tf

    environ = os.environ
    scheduler_env(environ, SLURM_VARIABLES,
                  inside="cluster.kind 'slurm' must run inside a Slurm job step (srun)")
    num_tasks = int_env(environ, "SLURM_STEP_NUM_TASKS")
    jobs = slurm_jobs(needs_ps=needs_ps, num_tasks=num_tasks, num_ps=num_ps)
    if num_workers is not None and jobs["worker"] != num_workers:
        wanted = num_workers + (1 + num_ps if needs_ps else 0)
        roles = f"cluster.workers={num_workers}" + (f" + cluster.ps={num_ps} + 1 chief"
                                                     if needs_ps else "")
        raise ClusterError(f"the Slurm step has {num_tasks} task(s) but the recipe needs {wanted} "
                           f"({roles}): run srun --ntasks={wanted}, or change the recipe. "
                           f"Received: SLURM_STEP_NUM_TASKS={num_tasks}")
    try:
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
            jobs=jobs, port_base=port_base, gpus_per_node=num_tasks, gpus_per_task=1,
            auto_set_gpu=False)
        spec = resolver.cluster_spec().as_dict()
    except (RuntimeError, ValueError) as err:
        values = {name: environ.get(name) for name in SLURM_VARIABLES}
        raise ClusterError(f"cannot resolve the Slurm cluster: {err}. Received: {values}") from None
    return validate(spec, resolver.task_type, resolver.task_id,
                    require_ps=needs_ps)
