"""What each Ray Train worker runs (:mod:`kerasdist.launch.clusters.ray` is the driver's side).

Ray's TensorFlow backend writes a worker-only ``TF_CONFIG`` and ``TF_USE_LEGACY_KERAS=1`` into the
worker's environment; the loops drop the latter (kerasdist trains Keras 3), apply
:func:`kerasdist.enable`, then :func:`recipe_loop` runs kerasdist's lifecycle as one multi-worker
task under the driver's run-directory lock, reporting each epoch to Ray (:func:`ray_report`), and
:func:`script_loop` runs a user's script (``launch --ray``). Each worker writes
``<run_dir>/logs/ray-worker-<rank>.json`` (pid, host, Ray node, group size, TF task address).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from pathlib import Path


def _prepare(config: dict) -> None:
    os.environ.pop("TF_USE_LEGACY_KERAS", None)
    threads = int(config.get("threads") or 0)
    if threads:
        os.environ["TF_NUM_INTRAOP_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(threads)
    from kerasdist.keras import enable  # kerasdist.enable(), without importing the package's top

    enable()


def _record_worker(log_dir: Path, index: int, tf_config: dict) -> None:
    """Write ``ray-worker-<index>.json``: pid, host name, the Ray node's IP address and id, the
    group's size and this worker's TF task address (rewritten by every attempt of the group)."""
    import ray

    log_dir.mkdir(parents=True, exist_ok=True)
    workers = tf_config.get("cluster", {}).get("worker", [])
    record = {"pid": os.getpid(), "host": socket.gethostname(),
              "node_ip": ray.util.get_node_ip_address(),
              "node_id": ray.get_runtime_context().get_node_id(),
              "world_size": len(workers),
              "task_address": workers[index] if index < len(workers) else None}
    (log_dir / f"ray-worker-{index}.json").write_text(json.dumps(record), encoding="utf-8")


def recipe_loop(config: dict) -> None:
    """One Ray worker of a ``cluster.kind: ray`` recipe (config from
    :func:`kerasdist.launch.clusters.ray.train_on_ray`).

    Raises:
        whatever :func:`kerasdist.training.run_session` raises (Ray reports it to the driver).
    """
    _prepare(config)
    from kerasdist.cluster.spec import parse_tf_config
    from kerasdist.config.loader import validate_recipe
    from kerasdist.training import run_session
    from kerasdist.training.rundir_lock import LOCK_TOKEN_ENV

    if config.get("lock_token"):
        os.environ[LOCK_TOKEN_ENV] = config["lock_token"]
    recipe = validate_recipe(config["recipe"], source="<ray driver>")
    tf_config = parse_tf_config(os.environ.get("TF_CONFIG"), require_ps=False)
    from kerasdist import _log

    # every worker logs (its lines are prefixed with its task): Ray shows them all on the driver
    _log.configure(config.get("verbose"), task=tf_config.task_name, is_chief=True)
    from kerasdist.training.rundir import RunDir

    run_dir = Path(recipe.output.run_dir)
    _record_worker(RunDir(run_dir).logs, tf_config.task_index,
                   json.loads(os.environ.get("TF_CONFIG") or "{}"))
    # --overwrite was done by the driver (it moved the old run aside under its lock): never again
    run_session(recipe, tf_config=tf_config, overwrite=False, verbose=config.get("verbose"),
                entry_checked=True,  # by the driver (RayKind.run)
                callbacks=[ray_report(run_dir, is_chief=tf_config.is_chief)])


def script_loop(config: dict) -> None:
    """One Ray worker of ``kerasdist launch --ray``: the user's script as ``__main__``.

    Raises:
        TaskFailedError: the script exited with a non-zero code; the script's own exception.
    """
    _prepare(config)
    from kerasdist.errors import TaskFailedError
    from kerasdist.launch.script_task import run_script

    code = run_script(config["script"], list(config.get("args", ())))
    if code:
        raise TaskFailedError(f"the script {config['script']} exited with code {code} on "
                              f"{json.loads(os.environ.get('TF_CONFIG', '{}')).get('task')}")


def ray_report(run_dir: Path, *, is_chief: bool):
    """A Keras callback reporting each epoch to Ray Train (``ray.train.report``): the epoch's logs
    (floats) with ``epoch`` (1-based) and ``global_step`` (``optimizer.iterations``); on the chief
    also the newest kerasdist checkpoint of ``<run_dir>/checkpoints`` (Ray copies it into its
    storage; kerasdist's own callbacks run first, so it is this epoch's). Every worker reports
    once per epoch, as Ray requires. Built here so that Keras is imported after :func:`_prepare`.

    Args:
        run_dir: the run directory (``pathlib.Path``).
        is_chief: whether this worker writes the outputs (reports the checkpoint).
    """
    import keras
    import ray.train

    class RayReport(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            metrics = {k: float(v) for k, v in (logs or {}).items() if _is_number(v)}
            metrics.update(epoch=epoch + 1,
                           global_step=int(self.model.optimizer.iterations.numpy()))
            copy = _newest_checkpoint_copy(Path(run_dir)) if is_chief else None
            try:
                checkpoint = ray.train.Checkpoint.from_directory(copy) if copy else None
                ray.train.report(metrics, checkpoint=checkpoint)
            finally:
                if copy:
                    shutil.rmtree(copy, ignore_errors=True)

    return RayReport()


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _newest_checkpoint_copy(run_dir: Path) -> str | None:
    """A temporary folder holding the newest checkpoint's files, its pointer and digests."""
    import tensorflow as tf

    from kerasdist.training.rundir import RunDir

    layout = RunDir(run_dir)
    folder = layout.checkpoints
    prefix = tf.train.latest_checkpoint(str(folder))
    if prefix is None:
        return None
    copy = tempfile.mkdtemp(prefix="kerasdist-ray-ckpt-")
    for path in [*Path(prefix).parent.glob(Path(prefix).name + ".*"), folder / "checkpoint",
                 layout.state_digests]:
        if path.is_file():
            shutil.copy2(path, copy)
    return copy
