"""Every task in the tracker and in ``metrics.json`` (MLflow system metrics per task, each task's
steps and steps/s at each epoch end, the slow-task summary line) and ``trainer.profile``'s
TensorBoard profile of every task, on local clusters with the default SQLite store in the run
directory, read back with ``MlflowClient``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import mwms_support as mw
import psutil
import pytest
import yaml

mlflow = pytest.importorskip("mlflow")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(900)]

ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "1"}


def _recipe(tmp_path: Path, name: str, strategy=None, **sections) -> Path:
    path = mw.linear_recipe(tmp_path, name, trainer={"epochs": 2, "steps_per_epoch": 24,
                                                     "profile": {"steps": [3, 8]}}, **sections)
    raw = yaml.safe_load(path.read_text())
    raw["strategy"] = strategy or raw["strategy"]
    raw["output"]["tracking"] = {"kind": "mlflow"}  # sqlite:///<run_dir>/mlflow.db
    path.write_text(yaml.safe_dump(raw))
    return path


def _read_back(run_dir: Path, tasks: list[str], nodes: list[str]) -> dict:
    """The run's MLflow metrics and ``metrics.json``: system metrics of every node, steps and
    steps/s of every task at both epoch ends, the same figures in ``metrics.json``'s ``tasks``,
    a profile per node in ``<run_dir>/tensorboard/profile-<node>``."""
    record = json.loads((run_dir / "tracking.json").read_text())
    client = mlflow.MlflowClient(tracking_uri=record["uri"])
    (run,) = client.search_runs([record["experiment_id"]])
    for node in nodes:
        for name in ("cpu_utilization_percentage", "process_memory_rss_megabytes"):
            assert f"system/{node}/{name}" in run.data.metrics, (node, sorted(run.data.metrics))
        assert list((run_dir / "tensorboard" / f"profile-{node}").rglob("*.xplane.pb")), node
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert sorted(metrics["tasks"]) == sorted(tasks)
    for task in tasks:
        for figure in ("steps", "steps_per_sec"):
            history = client.get_metric_history(run.info.run_id, f"tasks/{task}/{figure}")
            assert [m.step for m in history] == [24, 48]  # at each epoch end's global step
            assert [m.value for m in history] == pytest.approx(metrics["tasks"][task][figure])
    return metrics


def test_two_workers_each_log_system_metrics_steps_and_a_profile(tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "kerasdist", "fit",
                                str(_recipe(tmp_path, "mwms"))], cwd=mw.REPO, text=True,
                               env={**os.environ, **mw.QUIET, **ENV},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = mw.finish(process, 600)
    assert process.returncode == 0, out[-6000:]
    tasks = ["worker-0", "worker-1"]
    metrics = _read_back(tmp_path / "mwms", tasks, tasks)
    for task in tasks:  # every worker runs every step
        assert metrics["tasks"][task]["steps"] == [24, 48]
    assert "slow task" not in out


def _throttle(launcher: int, index: int, stop: threading.Event, log: Path) -> None:
    """Once training started, run worker ``index`` 0.05 s of every second (SIGSTOP/SIGCONT)."""
    while not stop.is_set() and "training from global step" not in log.read_text(errors="replace"):
        time.sleep(0.2)
    try:
        worker = mw.worker_process(launcher, index)
        while not stop.wait(0.05):
            worker.send_signal(signal.SIGSTOP)
            stop.wait(0.95)
            worker.send_signal(signal.SIGCONT)
        worker.send_signal(signal.SIGCONT)
    except (psutil.Error, AssertionError):  # the run ended (the test says why)
        pass


@pytest.mark.extended  # a 1.5x rate threshold: under a loaded machine another worker can lag too
def test_parameter_server_names_a_throttled_worker_and_tracks_every_task(tmp_path):
    recipe = _recipe(tmp_path, "ps", cluster={"ps": 1, "workers": 3, "max_restarts": 0},
                     strategy={"kind": "parameter_server"})  # 3: a median that is a worker's
    log = tmp_path / "fit.log"
    with open(log, "w") as handle:
        process = subprocess.Popen([sys.executable, "-m", "kerasdist", "fit", str(recipe)],
                                   cwd=mw.REPO, env={**os.environ, **mw.QUIET, **ENV},
                                   stdout=handle, stderr=subprocess.STDOUT)
        stop = threading.Event()
        slower = threading.Thread(target=_throttle, args=(process.pid, 2, stop, log), daemon=True)
        slower.start()
        try:
            process.wait(timeout=600)
        except subprocess.TimeoutExpired:
            mw.kill_tree(process.pid)
        finally:
            stop.set()
            slower.join()
    out = log.read_text(errors="replace")
    assert process.returncode == 0, out[-6000:]
    tasks = ["worker-0", "worker-1", "worker-2"]
    metrics = _read_back(tmp_path / "ps", tasks, ["chief-0", "ps-0", *tasks])
    workers = metrics["parameter_server"]["steps_per_worker"]
    assert [metrics["tasks"][task]["steps"][-1] for task in tasks] == workers
    slow = [line.split()[2] for line in out.splitlines() if line.startswith("slow task")]
    assert slow == ["worker-2:"], (metrics["tasks"], out[-3000:])
