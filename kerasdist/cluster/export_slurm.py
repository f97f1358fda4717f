"""Export a recipe as a Slurm batch script (``kerasdist export slurm recipe.yaml``).

The script asks for one Slurm task per kerasdist task and runs them all in one ``srun`` step, each
``kerasdist fit <recipe> --set cluster.kind=slurm``: every task takes its role from
``SLURM_PROCID`` (:mod:`kerasdist.launch.clusters.slurm`). ``multi_worker``: ``cluster.workers``
tasks, task 0 the chief; ``parameter_server``: the chief (task 0), then ``cluster.ps`` ps tasks,
then the workers (TF's ``SlurmClusterResolver`` order). Each line of the script and why:
docs/slurm.md.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from kerasdist._version import __version__
from kerasdist.cluster import export_checks
from kerasdist.cluster.export import job_name
from kerasdist.cluster.roles import recipe_counts
from kerasdist.config.cluster_configs import as_kind
from kerasdist.errors import RecipeError

DEFAULT_SIGNAL_S = 300
"""Seconds before the time limit at which Slurm sends ``cluster.preemption_signal``
(``--signal=USR1@300``): the time to reach the next agreed step and save."""


@dataclass(frozen=True)
class SlurmOptions:
    """What the batch script asks Slurm for; None leaves Slurm's (or the site's) default.

    Attributes:
        nodes: nodes (``--nodes``); default one node per task.
        cpus_per_task: CPUs per task (``--cpus-per-task``).
        time: the time limit (``--time``, Slurm's format, e.g. ``"02:00:00"``).
        partition: the partition (``--partition``).
        signal_s: seconds before the time limit at which Slurm sends the recipe's
            ``cluster.preemption_signal`` (:data:`DEFAULT_SIGNAL_S`); 0 = no ``--signal`` line.
        requeue: write ``--requeue`` (default True).
        name: the job name; default from the recipe file name.
        kerasdist: how a task runs kerasdist (default ``kerasdist``; e.g.
            ``/opt/venv/bin/python -m kerasdist``).
    """

    nodes: int | None = None
    cpus_per_task: int | None = None
    time: str | None = None
    partition: str | None = None
    signal_s: int = DEFAULT_SIGNAL_S
    requeue: bool = True
    name: str | None = None
    kerasdist: str = "kerasdist"


def task_counts(recipe) -> dict[str, int]:
    """``{'chief': 1, 'ps': P, 'worker': W}`` (parameter server) or ``{'worker': W}``
    (:func:`kerasdist.cluster.roles.recipe_counts`).

    Raises:
        RecipeError: a strategy that runs in one process, or a parameter-server recipe with
            ``cluster.ps`` 0.
    """
    return recipe_counts(recipe, what="export slurm")


def sbatch_script(recipe, *, recipe_path: str, options: SlurmOptions = SlurmOptions(),
                  overrides: tuple[str, ...] = ()) -> str:
    """The batch script (text) that runs ``recipe`` as one Slurm job (see module docs).

    Args:
        recipe: the validated recipe (``multi_worker`` or ``parameter_server``).
        recipe_path: the recipe's path as the tasks see it (relative to the submit directory).
        options: what to ask Slurm for (:class:`SlurmOptions`).
        overrides: extra ``--set KEY=VALUE`` passed to every task.

    Returns:
        A bash script: ``#SBATCH`` lines, the environment, one ``srun`` line.

    Raises:
        RecipeError: a one-process strategy, ``nodes`` below 1 or above the task count, a
            negative ``signal_s``, or an option Slurm would refuse or that could end a line
            (:func:`kerasdist.cluster.export_checks.export_slurm`).
    """
    counts = task_counts(recipe)
    tasks = sum(counts.values())
    nodes = options.nodes if options.nodes is not None else tasks
    if not 1 <= nodes <= tasks:
        raise RecipeError(f"export slurm: --nodes must be within 1..{tasks} (the recipe's task "
                          f"count). Received: nodes={nodes}")
    if options.signal_s < 0:
        raise RecipeError(f"export slurm: --signal-s must be >= 0. Received: {options.signal_s}")
    name = options.name or job_name(recipe_path)
    export_checks.export_slurm(name=name, options=options, recipe_path=str(recipe_path))
    lines = ["#!/bin/bash",
             f"# kerasdist {__version__}: `kerasdist export slurm {recipe_path}`",
             f"# {_layout(counts)}",
             f"#SBATCH --job-name={name}", f"#SBATCH --nodes={nodes}",
             f"#SBATCH --ntasks={tasks}", f"#SBATCH --output={name}-%j.out",
             "#SBATCH --open-mode=append"]
    lines += [f"#SBATCH --{flag}={value}" for flag, value in (
        ("cpus-per-task", options.cpus_per_task), ("time", options.time),
        ("partition", options.partition)) if value is not None]
    if options.requeue:
        lines.append("#SBATCH --requeue")
    if options.signal_s:
        signal = as_kind(recipe.cluster, "slurm").preemption_signal
        lines.append(f"#SBATCH --signal={signal}@{options.signal_s}")
    settings = ["cluster.kind=slurm", f"cluster.workers={counts['worker']}"]
    if "ps" in counts:
        settings.append(f"cluster.ps={counts['ps']}")
    command = [*shlex.split(options.kerasdist), "fit", str(recipe_path)]
    for item in (*settings, *overrides):
        command += ["--set", item]
    lines += ["set -euo pipefail", "export PYTHONUNBUFFERED=1",
              'echo "kerasdist: job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0} on '
              '${SLURM_JOB_NODELIST}"',
              f"srun --kill-on-bad-exit=1 --ntasks={tasks} --nodes={nodes} "
              + " ".join(shlex.quote(part) for part in command)]
    return "\n".join(lines) + "\n"


def _layout(counts: dict[str, int]) -> str:
    if "chief" in counts:
        ps = counts["ps"]
        return (f"tasks: 0 = chief (coordinator), 1..{ps} = ps, {ps + 1}..{ps + counts['worker']} "
                "= workers")
    return f"tasks: 0..{counts['worker'] - 1} = workers (0 is the chief)"


def write_script(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, executable (0755)."""
    import os

    from kerasdist._files import write_text_atomic

    write_text_atomic(path, text)
    os.chmod(path, 0o755)


__all__ = ["DEFAULT_SIGNAL_S", "SlurmOptions", "sbatch_script", "task_counts", "write_script"]
