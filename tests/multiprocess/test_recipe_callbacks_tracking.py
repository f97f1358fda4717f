"""Issue 30, points 3 and 4 on local clusters: recipe callbacks (chief-aware CSVLogger, an
EarlyStopping that stops every worker at the same epoch) and one MLflow run per kerasdist run,
checked against a real ``mlflow server`` (SQLite backend, loopback, a portpicker port) read back
with ``MlflowClient``; and the same under parameter_server with the default SQLite store."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mwms_support as mw
import portpicker
import pytest
import yaml

mlflow = pytest.importorskip("mlflow")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

NO_TELEMETRY = {"MLFLOW_DISABLE_TELEMETRY": "true"}
# min_delta 1e9: no epoch improves enough, so EarlyStopping stops after epoch 1 + patience 1
CALLBACKS = [{"class_name": "EarlyStopping", "config": {"monitor": "loss", "patience": 1,
                                                         "min_delta": 1.0e9}},
             {"class_name": "CSVLogger", "config": {"filename": "train.csv"}}]


@pytest.fixture
def mlflow_server(tmp_path):
    """A real ``mlflow server`` on 127.0.0.1 with a SQLite backend; stopped at the end."""
    port = portpicker.pick_unused_port()
    folder = tmp_path / "mlflow-server"
    folder.mkdir()
    log = open(folder / "server.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
         f"sqlite:///{folder / 'mlflow.db'}", "--artifacts-destination", str(folder / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env={**os.environ, **NO_TELEMETRY}, stdout=log, stderr=subprocess.STDOUT)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240  # measured: 63 s to start on a loaded 2-core machine
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("mlflow server did not start:\n" +
                                     (folder / "server.log").read_text()[-4000:])
            time.sleep(0.5)
        yield uri
    finally:
        mw.kill_tree(server.pid)
        log.close()


def _fit(recipe: Path, timeout_s: float, **env) -> str:
    process = subprocess.Popen([sys.executable, "-m", "kerasdist", "fit", str(recipe)],
                               cwd=mw.REPO, env={**os.environ, **mw.QUIET, **NO_TELEMETRY, **env},
                               text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = mw.finish(process, timeout_s)
    assert process.returncode == 0, out[-6000:]
    return out


def _edit(recipe: Path, **top) -> Path:
    """Set top-level recipe sections (``callbacks``, ``strategy``) of a recipe file."""
    raw = yaml.safe_load(recipe.read_text())
    raw.update(top)
    recipe.write_text(yaml.safe_dump(raw))
    return recipe


def _csv_epochs(run_dir: Path) -> list[str]:
    with open(run_dir / "train.csv") as handle:
        return [row["epoch"] for row in csv.DictReader(handle)]


@pytest.mark.timeout(900)
def test_two_workers_log_one_mlflow_run_to_a_real_server_and_stop_at_one_epoch(
        tmp_path, mlflow_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    recipe = mw.linear_recipe(
        tmp_path, "mwms", trainer={"epochs": 3},
        cluster={"allow_network_exposure": True},  # the server is outside any namespace
        output={"tracking": {"kind": "mlflow", "uri": mlflow_server, "experiment": "e30"}})
    _fit(_edit(recipe, callbacks=CALLBACKS), 600, KERASDIST_NO_NETNS="1")
    run_dir = tmp_path / "mwms"
    # EarlyStopping stopped both workers after epoch 2 (of 3): same epochs, same weights
    digests = [mw.epoch_digests(run_dir / "logs" / f"worker-{i}.log") for i in (0, 1)]
    assert sorted(digests[0]) == [1, 2] and digests[0] == digests[1]
    assert _csv_epochs(run_dir) == ["0", "1"]  # one writer: the chief
    client = mlflow.MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("e30")
    (run,) = client.search_runs([experiment.experiment_id])  # one run for 2 workers
    assert run.info.status == "FINISHED"
    assert run.data.params["cluster.workers"] == "2"
    assert run.data.params["strategy.kind"] == "multi_worker"
    # the user's recipe (logged by the launcher), not the tasks' rewritten one (tf_config)
    assert run.data.params["cluster.kind"] == "local"
    assert run.data.tags["kerasdist.cluster_kind"] == "local"
    assert not any(k.startswith("kerasdist.changed.") for k in run.data.tags)
    assert run.data.params["callbacks"].startswith('[{"class_name": "EarlyStopping"')
    assert run.data.tags["kerasdist.workers"] == "2" and run.data.tags["kerasdist.replicas"] == "2"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    steps_per_epoch = metrics["steps_per_epoch"]
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in history] == [steps_per_epoch, 2 * steps_per_epoch]
    assert metrics["global_steps"] == 2 * steps_per_epoch
    speed = client.get_metric_history(run.info.run_id, "examples_per_sec")
    assert len(speed) == 2 and all(m.value > 0 for m in speed)
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == [
        "metrics.json", "model.keras"]


@pytest.mark.timeout(900)
def test_parameter_server_coordinator_runs_recipe_callbacks_and_tracks_to_the_run_dir(
        tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    recipe = mw.linear_recipe(tmp_path, "ps", trainer={"epochs": 3}, cluster={"ps": 1},
                              output={"tracking": {"kind": "mlflow"}})  # default: run dir's sqlite
    _fit(_edit(recipe, callbacks=CALLBACKS, strategy={"kind": "parameter_server"}), 600)
    run_dir = tmp_path / "ps"
    assert _csv_epochs(run_dir) == ["0", "1"]  # EarlyStopping on the coordinator: 2 of 3 epochs
    record = json.loads((run_dir / "tracking.json").read_text())
    client = mlflow.MlflowClient(tracking_uri=record["uri"])
    (run,) = client.search_runs([record["experiment_id"]])
    assert run.data.tags["kerasdist.strategy"] == "parameter_server"
    assert run.data.tags["kerasdist.ps"] == "1"
    assert run.data.tags["kerasdist.cluster_kind"] == "local"
    assert len(client.get_metric_history(run.info.run_id, "loss")) == 2
    assert "ps_global_step" in run.data.metrics
