"""Run a recipe wherever its ``strategy`` and ``cluster`` sections say.

===================  ==============  ===================================================
strategy             cluster.kind    what this process does
===================  ==============  ===================================================
default, mirrored    this_process    trains (``training.fit``)
parameter_server     local           starts ps + worker subprocesses, runs the coordinator
parameter_server     tf_config       ps/worker: serves; chief: runs the coordinator
multi_worker         local           starts the workers, supervises and restarts them
multi_worker         tf_config       is one worker of the synchronous cluster
multi_worker         slurm           the same, its role from SlurmClusterResolver
===================  ==============  ===================================================
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kerasdist.cluster.spec import TFConfig, parse_tf_config
from kerasdist.errors import ClusterError, TaskFailedError
from kerasdist.training.fit import RunResult, say
from kerasdist.training.mw_launch import run_attempt


def run(recipe, *, overwrite: bool = False, verbose=None, tf_config: TFConfig | None = None,
        callbacks=()) -> RunResult | None:
    """Run ``recipe``; returns the :class:`RunResult` in the process that owns the outputs
    (the chief), ``None`` in other tasks.

    Args:
        tf_config: this task's role on a real cluster; default: parsed from ``TF_CONFIG`` when
            ``cluster.kind`` is ``tf_config``, resolved from the ``SLURM_*`` variables when it is
            ``slurm``.

    Raises:
        RecipeError, DataError, RunDirError: bad input, before anything starts.
        ClusterError: bad cluster spec, or a task that failed (named in the message).
    """
    kind, cluster = recipe.strategy.kind, recipe.cluster.kind
    if kind in ("default", "mirrored"):
        from kerasdist.training.fit import fit

        return fit(recipe, overwrite=overwrite, callbacks=callbacks, verbose=verbose)
    if cluster == "local":
        runner = _local_parameter_server if kind == "parameter_server" else _local_multi_worker
        return runner(recipe, overwrite=overwrite, verbose=verbose, callbacks=callbacks)
    if tf_config is None and cluster == "slurm":
        from kerasdist.cluster.slurm import tf_config_from_slurm

        tf_config = tf_config_from_slurm(strategy_kind=kind, num_ps=recipe.cluster.ps,
                                         port_base=recipe.cluster.port_base)
    if tf_config is None:
        tf_config = parse_tf_config(os.environ.get("TF_CONFIG"),
                                    require_ps=kind == "parameter_server")
    if kind == "parameter_server":
        return _tf_config_parameter_server(recipe, tf_config, overwrite=overwrite,
                                           verbose=verbose, callbacks=callbacks)
    from kerasdist.training.multi_worker import fit_worker

    return fit_worker(recipe, tf_config=tf_config, overwrite=overwrite, verbose=verbose,
                      callbacks=callbacks)


def _tf_config_parameter_server(recipe, tf_config: TFConfig, **kwargs) -> RunResult | None:
    if tf_config.task_type in ("ps", "worker"):
        from kerasdist.cluster.server import serve

        serve(tf_config, intra_op_threads=recipe.cluster.threads_per_task)
        return None
    if tf_config.task_type != "chief":
        raise ClusterError(f"strategy 'parameter_server': task type '{tf_config.task_type}' has "
                           "no role here (expected chief, worker or ps)")
    from kerasdist.training.ps import fit_recipe

    return fit_recipe(recipe, cluster_resolver=tf_config.cluster_resolver(), **kwargs)


def _child_args(recipe, log_dir: Path) -> list[str]:
    """Arguments of ``python -m kerasdist`` for a task: the resolved recipe as a JSON file."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / "recipe.json"
    data = recipe.model_dump(mode="json")
    data["cluster"]["kind"] = "tf_config"
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return ["fit", str(path), "--verbose", "2"]


def _preflight(recipe, overwrite: bool) -> None:
    """Bad-input checks that must pass before any task starts or anything is written."""
    from kerasdist.data.sources import load_split
    from kerasdist.training import outputs

    load_split(recipe.data, recipe.data.train_split)
    if recipe.data.eval_split:
        load_split(recipe.data, recipe.data.eval_split)
    outputs.check_run_dir(Path(recipe.output.run_dir), recipe, overwrite=overwrite)


def _local_parameter_server(recipe, *, overwrite, verbose, callbacks) -> RunResult:
    from kerasdist.training.ps_launch import run_local_parameter_server

    _preflight(recipe, overwrite)
    args = _child_args(recipe, Path(recipe.output.run_dir) / "logs")
    return run_local_parameter_server(recipe, args=args, overwrite=overwrite, verbose=verbose,
                                      callbacks=callbacks)


def _local_multi_worker(recipe, *, overwrite, verbose, callbacks) -> RunResult:
    _preflight(recipe, overwrite)
    if callbacks:
        raise ClusterError("extra Python callbacks cannot be sent to local worker processes")
    log_dir = Path(recipe.output.run_dir) / "logs"
    args = _child_args(recipe, log_dir)
    if overwrite:
        args.append("--overwrite")
    attempts = recipe.cluster.max_restarts + 1
    for attempt in range(1, attempts + 1):
        failure = run_attempt(recipe, args, log_dir)
        if failure is None:
            return RunResult.from_metrics(Path(recipe.output.run_dir) / "metrics.json")
        say(f"attempt {attempt}/{attempts} failed: {failure}")
        if attempt < attempts:
            say(f"restarting the cluster (cluster.max_restarts={recipe.cluster.max_restarts}); "
                "the workers resume from the last backup")
        if "--overwrite" in args:
            args.remove("--overwrite")  # restarts resume, they never discard the new checkpoints
    raise TaskFailedError(f"multi-worker training failed after {attempts} attempt(s): {failure}")
