"""MLflow tracking of a recipe run: one MLflow run per kerasdist run, logged by one task through
``mlflow.MlflowClient`` (never MLflow's process-wide active run). What is logged, and where the
run's id is kept: docs/own-model-and-data.md, "Tracking with MLflow".
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import keras

from kerasdist._files import read_json, write_json_atomic
from kerasdist._log import get_logger
from kerasdist.tracking.mlflow_store import (
    MLFLOW_ARTIFACTS,
    NETWORK_SCHEMES,
    TRACKING_FILE,
    client_for,
    default_uri,
    require_mlflow,
)

if TYPE_CHECKING:
    from kerasdist.config import Recipe

log = get_logger("tracking")

@contextlib.contextmanager
def _no_stray_folder(uri: str):
    """MLflow 3 creates the parent folder of a ``sqlite:///`` database from the URI's text
    without decoding it (``mlflow.store.db.utils._make_parent_dirs_if_sqlite``): a run directory
    named ``a?b`` gets an empty ``a%3Fb`` beside it, while the database itself goes to ``a?b``.
    Remove that folder again when it was made here and is empty."""
    stray = Path(uri.removeprefix("sqlite:///")).parent if uri.startswith("sqlite:///") else None
    made = stray is not None and "%" in str(stray) and not stray.exists()
    try:
        yield
    finally:
        if made:
            with contextlib.suppress(OSError):  # not empty, or gone: leave it
                stray.rmdir()


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``; lists and scalars become JSON text."""
    if isinstance(value, dict) and value:
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    text = value if isinstance(value, str) else json.dumps(value)
    return {prefix: text[:6000]}


def _tags(recipe: Recipe, run_dir: Path) -> dict[str, str]:
    import tensorflow as tf

    from kerasdist._version import __version__

    return {"kerasdist.strategy": recipe.strategy.kind, "kerasdist.cluster_kind":
            recipe.cluster.kind, "kerasdist.workers": str(recipe.cluster.workers),
            "kerasdist.ps": str(recipe.cluster.ps), "kerasdist.version": __version__,
            "tensorflow.version": tf.__version__, "keras.version": keras.__version__,
            "kerasdist.run_dir": str(Path(run_dir).absolute())}


class MlflowTracker(keras.callbacks.Callback):
    """A Keras callback logging a recipe run to MLflow (see module docs). Build it with
    :meth:`start` on the one task that writes the run directory.

    Args:
        client: an ``mlflow.MlflowClient``.
        run_id: the MLflow run logged to.
        global_batch_size: examples per step (``data.batch_size``).

    Attributes:
        meter: the run's :class:`~kerasdist.keras.callbacks.ThroughputMeter` (placed before this
            callback), source of ``examples_per_sec`` and the per-task ``tasks/<task>/steps`` and
            ``tasks/<task>/steps_per_sec``; None: not logged.
    """

    def __init__(self, client, run_id: str, *, global_batch_size: int):
        super().__init__()
        self.client, self.run_id, self.batch, self.meter = client, run_id, global_batch_size, None

    @classmethod
    def start(cls, recipe: Recipe, *, run_dir: Path, num_replicas: int | None,
              launcher: bool = False) -> MlflowTracker:
        """Create (or, when ``<run_dir>/tracking.json`` names one, continue) the MLflow run.

        Args:
            recipe: the recipe as this process runs it.
            run_dir: the run directory.
            num_replicas: replicas in sync (tag ``kerasdist.replicas``); None in a launcher.
            launcher: called by the launcher of a local or Ray cluster, with the user's recipe,
                before its tasks start: it creates the run (params and tags from the user's
                recipe, not the tasks' rewritten one, ``cluster.kind: tf_config``) and records
                that in ``tracking.json``; the chief task then only logs into it.

        Raises:
            RecipeError: MLflow missing.
            mlflow.exceptions.MlflowException: the tracking server refused or cannot be reached.
        """
        require_mlflow()
        run_dir = Path(run_dir)
        config = recipe.output.tracking
        uri = config.uri or default_uri(run_dir)
        with _no_stray_folder(uri):  # MLflow opens (and creates) the store here
            client = client_for(uri)
        record = _read_record(run_dir)
        params = flatten(recipe.model_dump(mode="json"))
        if record and record.get("uri") == uri:
            run_id = record["run_id"]
            client.update_run(run_id, status="RUNNING")
            if launcher or not record.get("launched"):  # a launched run's tasks leave the params
                _log_changed_params(client, run_id, params)
            log.info(f"tracking: continuing MLflow run {run_id} at {uri}")
        else:
            run_id = _create_run(client, recipe, run_dir, uri, params, launcher=launcher)
        if num_replicas is not None:
            client.set_tag(run_id, "kerasdist.replicas", str(num_replicas))
        return cls(client, run_id, global_batch_size=recipe.data.batch_size)

    # ------------------------------------------------------------------------------- callback
    def on_epoch_end(self, epoch, logs=None):
        from mlflow.entities import Metric

        step = _global_step(self.model)
        now = int(time.time() * 1000)
        values = {k: float(v) for k, v in (logs or {}).items() if _is_number(v)}
        if self.meter is not None:
            values["examples_per_sec"] = self.meter.clock.epoch_examples_per_sec[-1]
            for task, figures in self.meter.tasks.items():
                values.update({f"tasks/{task}/{k}": v[-1] for k, v in figures.items()})
        values["epoch"] = float(epoch + 1)
        metrics = [Metric(key, value, now, step) for key, value in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    # ----------------------------------------------------------------------------- the end
    def finish(self, *, evaluation: dict[str, float], step: int, artifacts=()) -> None:
        """Log the held-out figures (``final_<name>``) and the artifacts; set FINISHED."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(f"final_{k}", float(v), now, step) for k, v in evaluation.items()
                   if _is_number(v)]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)
        for path in artifacts:
            if path is not None and Path(path).is_file():
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, status="FINISHED")

    def fail(self, status: str = "FAILED") -> None:
        """Mark the MLflow run ``status`` (FAILED, KILLED); never raises (the run's own error
        is the one to report)."""
        try:
            self.client.set_terminated(self.run_id, status=status)
        except Exception as err:  # noqa: BLE001 - a tracking error must not hide the real one
            log.warning(f"tracking: could not mark MLflow run {self.run_id} {status}: {err}")


def _create_run(client, recipe: Recipe, run_dir: Path, uri: str, params: dict[str, str], *,
                launcher: bool) -> str:
    """A new MLflow run with the recipe's params and tags, recorded in ``tracking.json``."""
    config = recipe.output.tracking
    experiment_id = _experiment_id(client, config.experiment, uri, run_dir)
    run = client.create_run(experiment_id, run_name=config.run_name or run_dir.name,
                            tags=_tags(recipe, run_dir))
    _log_params(client, run.info.run_id, params)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / TRACKING_FILE, {
        "kind": "mlflow", "uri": uri, "run_id": run.info.run_id, "experiment_id": experiment_id,
        "launched": launcher})
    log.info(f"tracking: MLflow run {run.info.run_id} at {uri}")
    return run.info.run_id


def _experiment_id(client, name: str, uri: str, run_dir: Path) -> str:
    """The id of experiment ``name``, created when missing; when another run created it
    meanwhile (MLflow's ``RESOURCE_ALREADY_EXISTS``), that one."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    location = None if uri.startswith(NETWORK_SCHEMES) else \
        (run_dir / MLFLOW_ARTIFACTS).absolute().as_uri()  # percent-encoded, as the store
    try:
        return client.create_experiment(name, artifact_location=location)
    except MlflowException as err:
        experiment = client.get_experiment_by_name(name)
        if err.error_code != "RESOURCE_ALREADY_EXISTS" or experiment is None:
            raise
        return experiment.experiment_id


def record_move(source: Path, target: Path) -> None:
    """After ``--overwrite`` moved a run directory from ``source`` to ``target``: its MLflow run
    says where its files are now (tag ``kerasdist.run_dir``), and with the default store (which
    moved along) ``target/tracking.json`` names the moved store. Never raises: a store that
    cannot be reached or updated is logged as a warning (the move itself stands)."""
    record = _read_record(target)
    if not record or record.get("kind") != "mlflow":
        return
    try:
        uri = record["uri"]
        if uri == default_uri(source):  # the store moved with the directory
            uri = default_uri(target)
            write_json_atomic(target / TRACKING_FILE, {**record, "uri": uri})
        with _no_stray_folder(uri):
            client = client_for(uri)
        client.set_tag(record["run_id"], "kerasdist.run_dir", str(Path(target).absolute()))
    except Exception as err:  # noqa: BLE001 - MLflow raises many types; the move stands
        log.warning(f"tracking: the moved MLflow run {record.get('run_id')} still names "
                    f"{source} as its run directory (could not update it: "
                    f"{type(err).__name__}: {err})")


def _read_record(run_dir: Path) -> dict | None:
    data = read_json(run_dir / TRACKING_FILE)
    return data if isinstance(data, dict) and data.get("run_id") else None


def _log_params(client, run_id: str, params: dict[str, str]) -> None:
    from mlflow.entities import Param

    client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])  # MLflow batches


def _log_changed_params(client, run_id: str, params: dict[str, str]) -> None:
    from mlflow.entities import RunTag

    logged = client.get_run(run_id).data.params
    new = {k: v for k, v in params.items() if k not in logged}
    if new:
        _log_params(client, run_id, new)
    changed = [RunTag(f"kerasdist.changed.{k}", f"{logged[k]} -> {v}"[:5000])
               for k, v in params.items() if k in logged and logged[k] != v]
    client.log_batch(run_id, tags=changed)


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, bool)


def _global_step(model) -> int:
    import numpy as np

    optimizer = getattr(model, "optimizer", None)
    return int(np.asarray(optimizer.iterations)) if optimizer is not None else 0
