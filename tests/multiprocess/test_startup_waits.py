"""Issue 39, point 3: bounded waits before training, as ``kerasdist fit`` subprocesses.

* SIGINT / SIGTERM during the counting pass of an endless ``python`` source (the main thread
  blocked in TensorFlow, where Python runs no signal handler) end the command within seconds
  with exit 130 / 143 and one line, not a traceback;
* an unreachable MLflow tracking server is exit 2 within seconds, naming ``output.tracking.uri``,
  with nothing written (it stalled in MLflow's retries for minutes, after ``run.json``);
* two runs started together on one new MLflow SQLite store both succeed (MLflow's tracking store
  creates a new database's tables without a lock).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time

import portpicker
import pytest
import yaml

pytestmark = pytest.mark.multiprocess
needs_mlflow = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                                  reason="needs kerasdist[mlflow]")

SLOW_ENDLESS = textwrap.dedent("""
    import os
    import time

    import numpy as np
    import tensorflow as tf

    def slow(split):
        '''An endless generator, 20 examples/s; touches $ENDLESS_MARKER at its second one.'''
        def gen():
            i = 0
            while True:
                if i == 1 and os.environ.get("ENDLESS_MARKER"):
                    open(os.environ["ENDLESS_MARKER"], "w").close()
                i += 1
                time.sleep(0.05)
                yield np.ones(1, "float32"), np.float32(3)
        spec = (tf.TensorSpec((1,), tf.float32), tf.TensorSpec((), tf.float32))
        return tf.data.Dataset.from_generator(gen, output_signature=spec)
""")


def _env(**extra) -> dict[str, str]:
    return {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "TF_CPP_MIN_LOG_LEVEL": "2",
            **extra}


def _fit(recipe, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kerasdist", "fit", str(recipe)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _stop(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_the_counting_pass_ends_fit_within_seconds(signum, code, tmp_path):
    (tmp_path / "slow_user_data.py").write_text(SLOW_ENDLESS, encoding="utf-8")
    marker, run_dir = tmp_path / "counting", tmp_path / "run"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "model": {"name": "linear"},
        "data": {"source": {"kind": "python", "function": "slow_user_data:slow"},
                 "train_split": "train", "eval_split": None, "batch_size": 16},
        "trainer": {"epochs": 1, "verbose": 0},  # no steps_per_epoch: the split is counted
        "output": {"run_dir": str(run_dir), "tensorboard": False}}))
    proc = _fit(recipe, env=_env(PYTHONPATH=str(tmp_path), ENDLESS_MARKER=str(marker)))
    try:
        deadline = time.monotonic() + 150
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "the counting pass never started"
        time.sleep(1.0)  # well inside the counting pass (100,000 examples at 20/s)
        sent = time.monotonic()
        proc.send_signal(signum)
        out, err = _stop(proc, 60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, err[-3000:]
    assert took < 10, f"{took:.1f} s"
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("kerasdist: interrupted")]
    assert len(lines) == 1 and f"{signal.Signals(signum).name} received while counting" in lines[0]
    assert not run_dir.exists()


LINEAR = {"model": {"name": "linear"},
          "data": {"source": {"kind": "synthetic_linear", "num_examples": 200},
                   "train_split": "train", "eval_split": "test", "batch_size": 50},
          "optimizer": {"name": "sgd", "learning_rate": 0.1},
          "trainer": {"epochs": 1, "verbose": 0}}


def _linear(tmp_path, name: str, tracking: dict) -> tuple:
    run_dir = tmp_path / name
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(yaml.safe_dump({**LINEAR, "output": {
        "run_dir": str(run_dir), "tensorboard": False, "tracking": tracking}}))
    return recipe, run_dir


@needs_mlflow
@pytest.mark.timeout(120)
def test_an_unreachable_tracking_server_exits_2_within_seconds_writing_nothing(tmp_path):
    uri = f"http://127.0.0.1:{portpicker.pick_unused_port()}"  # nothing listens there
    recipe, run_dir = _linear(tmp_path, "run", {"kind": "mlflow", "uri": uri})
    start = time.monotonic()
    out, err = _stop(_fit(recipe, env=_env()), 100)
    took = time.monotonic() - start
    assert "output.tracking.uri" in err and f"Received: uri='{uri}'" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert took < 30, f"{took:.1f} s"
    assert not run_dir.exists()


@needs_mlflow
@pytest.mark.timeout(300)
def test_two_runs_started_together_on_one_new_sqlite_store_both_succeed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'shared.db'}"
    runs = [_linear(tmp_path, f"run{i}", {"kind": "mlflow", "uri": uri}) for i in (0, 1)]
    procs = []
    try:
        for recipe, _ in runs:
            procs.append(_fit(recipe, env=_env()))
            time.sleep(0.2)
        outputs = [_stop(proc, 240) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("kerasdist")
    finished = [r.info.status for r in client.search_runs([experiment.experiment_id])]
    assert finished == ["FINISHED", "FINISHED"]


@pytest.mark.timeout(240)
def test_sigterm_while_a_parameter_server_chief_waits_for_its_cluster_exits_143(tmp_path):
    """The chief of a ``tf_config`` cluster whose ps and worker never start blocks in TensorFlow's
    connection to the cluster (no Python signal handler runs there): SIGTERM ended it only with
    SIGKILL before; now within seconds, 143, one line."""
    chief, worker, ps = (portpicker.pick_unused_port() for _ in range(3))
    tf_config = {"cluster": {"chief": [f"127.0.0.1:{chief}"], "worker": [f"127.0.0.1:{worker}"],
                             "ps": [f"127.0.0.1:{ps}"]}, "task": {"type": "chief", "index": 0}}
    recipe = tmp_path / "ps.yaml"
    recipe.write_text(yaml.safe_dump({
        **LINEAR, "strategy": {"kind": "parameter_server"}, "cluster": {"kind": "tf_config"},
        "trainer": {"epochs": 1, "steps_per_epoch": 2, "verbose": 0},
        "output": {"run_dir": str(tmp_path / "run"), "tensorboard": False}}))
    import json
    import socket

    proc = _fit(recipe, env=_env(TF_CONFIG=json.dumps(tf_config)))
    try:
        deadline = time.monotonic() + 150
        while proc.poll() is None and time.monotonic() < deadline:
            with socket.socket() as probe:  # the chief's own server is up: it now connects
                if probe.connect_ex(("127.0.0.1", chief)) == 0:
                    break
            time.sleep(0.2)
        time.sleep(2.0)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = _stop(proc, 60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err[-3000:]
    assert took < 10, f"{took:.1f} s"
    assert "Traceback" not in err, err[-3000:]
    assert "SIGTERM received while starting" in err
    assert not (tmp_path / "run").exists()
