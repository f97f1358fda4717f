"""The MLflow tracking store of ``output.tracking``, without Keras or TensorFlow (the CLI checks it
before importing them): whether MLflow is installed, whether the URI suits the cluster and the
store answers (:func:`unreachable`), and the client, created under a lock for a new SQLite store
(:func:`client_for`)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
from pathlib import Path
from typing import Iterator

from kerasdist.errors import RecipeError

TRACKING_FILE = "tracking.json"
MLFLOW_DB = "mlflow.db"
MLFLOW_ARTIFACTS = "mlartifacts"
TRACKING_ENTRIES = (TRACKING_FILE, MLFLOW_DB, f"{MLFLOW_DB}-journal", MLFLOW_ARTIFACTS)
"""What ``output.tracking`` may write in the run directory, possibly before ``run.json`` (a local
cluster's launcher creates the tracker run first)."""
NETWORK_SCHEMES = ("http://", "https://", "databricks")


def require_mlflow() -> None:
    """Raises RecipeError naming ``output.tracking`` when MLflow is not installed."""
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise RecipeError("output.tracking: kind 'mlflow' needs MLflow: pip install "
                          "'kerasdist[mlflow]'. Received: kind='mlflow'") from None


def check_uri(uri: str | None, *, isolated: bool) -> None:
    """An isolated local cluster's tasks reach nothing outside their network namespace.

    Raises:
        RecipeError: a network URI for a run in a private network namespace.
    """
    if isolated and uri is not None and uri.startswith(NETWORK_SCHEMES):
        raise RecipeError(
            "output.tracking.uri: a local cluster runs in a private network namespace "
            "(kerasdist.launch.isolation) from which this tracking server cannot be reached. Use "
            "a file URI (the default, sqlite:///<run_dir>/mlflow.db, or sqlite:///PATH), or set "
            f"cluster.allow_network_exposure: true. Received: uri={uri!r}")


PROBE_TIMEOUT_S = 5
"""Seconds a tracking server gets to answer the reachability check before anything is written
(:func:`unreachable`): one request, no retry (MLflow's own ``MLFLOW_HTTP_REQUEST_TIMEOUT`` and
``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, set for that request only). Without the check, MLflow's
defaults (120 s per request, 7 retries with backoff) stall an unreachable server's run for
minutes after ``run.json`` is written."""

_SHORT_REQUEST_ENV = ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES")


@contextlib.contextmanager
def _short_requests(timeout_s: int) -> Iterator[None]:
    """Within the block, MLflow's HTTP requests time out after ``timeout_s`` seconds and are not
    retried (MLflow reads these variables at each request); the previous values are restored."""
    saved = {name: os.environ.get(name) for name in _SHORT_REQUEST_ENV}
    os.environ.update(dict(zip(_SHORT_REQUEST_ENV, (str(int(timeout_s)), "0"), strict=True)))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URI, else None."""
    from urllib.parse import unquote

    prefix = "sqlite:///"
    return (Path(unquote(uri[len(prefix):])) if uri.startswith(prefix) and len(uri) > len(prefix)
            else None)


@contextlib.contextmanager
def schema_lock(uri: str) -> Iterator[None]:
    """Within the block, no other kerasdist process on this machine opens the SQLite store
    ``uri`` for the first time: MLflow's tracking store creates a new database's tables without
    a lock, so two runs started together on one new store fail with ``table ... already exists``
    or ``duplicate column name``. An exclusive ``flock`` on a file in the temporary directory
    named after the URI (MLflow's ``ExclusiveFileLock``, as its own job and workspace stores lock
    their table creation). Other URIs: no lock."""
    if _sqlite_path(uri) is None:
        yield
        return
    from mlflow.utils.file_utils import ExclusiveFileLock

    digest = hashlib.sha256(uri.encode("utf-8")).hexdigest()[:16]
    with ExclusiveFileLock(str(Path(tempfile.gettempdir()) / f"kerasdist-mlflow-{digest}.lock")):
        yield


def client_for(uri: str):
    """``mlflow.MlflowClient(tracking_uri=uri)``, created under :func:`schema_lock` (a new SQLite
    store's tables are created when the client is)."""
    from mlflow import MlflowClient

    with schema_lock(uri):
        return MlflowClient(tracking_uri=uri)


def unreachable(uri: str | None, *, timeout_s: int = PROBE_TIMEOUT_S) -> str | None:
    """Why the tracking store ``uri`` cannot be used, or None when it answers: one request
    (``search_experiments``), no retry. The default URI (None) is not opened; a
    ``sqlite:///PATH`` store is refused when PATH's directory does not exist, else opened.

    Args:
        uri: ``output.tracking.uri``.
        timeout_s: seconds the server gets to answer (default :data:`PROBE_TIMEOUT_S`).

    Returns:
        A short reason (MLflow's message, its middle cut beyond 300 characters) or None.
    """
    if uri is None:
        return None
    path = _sqlite_path(uri)
    if path is not None and not path.parent.is_dir():
        return f"directory '{path.parent}' of the SQLite file does not exist"
    try:
        with _short_requests(timeout_s):
            client_for(uri).search_experiments(max_results=1)
    except Exception as err:  # noqa: BLE001 - MLflow, SQLAlchemy, requests raise many types
        text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        if len(text) > 300:  # MLflow's own first words, and the root cause at the end
            text = f"{text[:140]} ... {text[-150:]}"
        return f"{type(err).__name__}: {text}"
    return None


def default_uri(run_dir: Path) -> str:
    """``sqlite:///<absolute run_dir>/mlflow.db``, the path percent-encoded by MLflow's own
    ``path_to_local_sqlite_uri`` (a ``?`` or ``#`` in the run directory's name would otherwise
    start the URI's query or fragment, and the database land beside the run directory)."""
    from mlflow.utils.file_utils import path_to_local_sqlite_uri

    return path_to_local_sqlite_uri(str(Path(run_dir).absolute() / MLFLOW_DB))


class TaskMonitor(threading.Thread):
    """MLflow's system metrics of one task (``SystemMetricsMonitor`` with ``node_id``) plus this
    process's own CPU and resident memory (psutil), from when ``<run_dir>/tracking.json`` names the run
    (looked for every ``poll_s`` seconds): docs/own-model-and-data.md, "Tracking with MLflow". A
    context manager: the exit stops it and logs what was sampled since the last interval.

    Args:
        run_dir: the run directory.
        node_id: the task (``worker-1``).
        poll_s: seconds between looks for ``tracking.json``.
    """

    def __init__(self, run_dir, node_id: str, poll_s: float = 2.0):
        super().__init__(daemon=True, name=f"kerasdist-system-metrics-{node_id}")
        self.path, self.node_id, self.poll_s = Path(run_dir) / TRACKING_FILE, node_id, poll_s
        self.stopped, self.monitor = threading.Event(), None

    def run(self) -> None:
        from kerasdist._files import read_json

        record = read_json(self.path)
        while not (isinstance(record, dict) and record.get("run_id")):
            if self.stopped.wait(self.poll_s):
                return
            record = read_json(self.path)
        import logging

        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # off the console
        try:
            monitor = SystemMetricsMonitor(record["run_id"], node_id=self.node_id,
                                           tracking_uri=record["uri"], resume_logging=True)
            monitor.monitors.append(_process_monitor())
        except Exception as err:  # noqa: BLE001 - the task trains on without system metrics
            from kerasdist._log import get_logger

            get_logger("tracking").warning(f"tracking: no system metrics of {self.node_id}: "
                                           f"{type(err).__name__}: {err}")
            return
        self.monitor = monitor
        monitor.start()

    def __enter__(self) -> TaskMonitor:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.join()
        if self.monitor is not None:
            self.monitor.finish()
            last = self.monitor.aggregate_metrics()  # the samples of the last, partial interval
            if last:
                self.monitor.publish_metrics(last)
                self.monitor.mlflow_logger.flush()


def _process_monitor():
    """An MLflow metrics monitor of this process's CPU and resident memory (psutil)."""
    import psutil
    from mlflow.system_metrics.metrics.base_metrics_monitor import BaseMetricsMonitor

    class ProcessMonitor(BaseMetricsMonitor):
        def collect_metrics(self):
            self._metrics["process_cpu_utilization_percentage"].append(process.cpu_percent())
            self._metrics["process_memory_rss_megabytes"].append(process.memory_info().rss / 1e6)

        def aggregate_metrics(self):
            return {k: round(sum(v) / len(v), 1) for k, v in self._metrics.items()}

    process = psutil.Process()
    return ProcessMonitor()
