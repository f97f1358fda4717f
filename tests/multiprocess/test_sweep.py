"""``kerasdist sweep`` with real ``kerasdist fit`` trials (issue 44): a 4-trial sweep whose
best.yaml trains; a driver SIGKILLed mid-trial leaves no process behind, and the same command
then resumes the interrupted trial at its checkpoint's step and ends with exactly ``trials``
finished; (extended) multi-worker trials on 2 workers pruned at one epoch boundary on every task;
MLflow parent and child runs on a real ``mlflow server``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

optuna = pytest.importorskip("optuna")
pytestmark = pytest.mark.multiprocess

QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}

LINEAR = {
    "model": {"name": "linear"},
    "data": {"source": "synthetic_linear", "num_examples": 256, "train_split": "train",
             "eval_split": "test", "batch_size": 16, "shuffle_seed": 1},
    "optimizer": {"name": "sgd", "learning_rate": 0.05},
    "trainer": {"epochs": 2, "steps_per_epoch": 3, "seed": 1},
    "output": {"run_dir": "runs/unused", "tensorboard": False, "save_model": False},
}
CNN = {
    "model": {"name": "mnist_cnn", "params": {"dropout": 0.5}},
    "data": {"source": "embedded", "train_split": "test[:20%]", "eval_split": "test[95%:]",
             "batch_size": 32, "shuffle_seed": 1},
    "optimizer": {"name": "adam", "learning_rate": 0.001},
    "trainer": {"epochs": 3, "steps_per_epoch": 40, "validation_steps": 2, "seed": 1},
    "output": {"run_dir": "runs/unused", "tensorboard": False, "save_model": False},
}


def _files(tmp_path: Path, recipe: dict, **sweep) -> Path:
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    body = {"recipe": "recipe.yaml", "objective": {"metric": "val_loss", "direction": "minimize"},
            "output": {"dir": "out"}, **sweep}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _kerasdist(tmp_path: Path, *args: str, timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kerasdist", *args], cwd=tmp_path, text=True,
                          capture_output=True, timeout=timeout_s, env={**os.environ, **QUIET})


def _study(tmp_path: Path):
    return optuna.load_study(study_name="kerasdist-sweep",
                             storage=f"sqlite:///{tmp_path / 'out' / 'study.db'}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_four_trial_sweep_writes_its_outputs_and_best_yaml_trains(tmp_path):
    _files(tmp_path, LINEAR, trials=4, parallel=2, sampler={"name": "random", "seed": 0},
           space={"optimizer.learning_rate": {"type": "float", "low": 0.001, "high": 0.1,
                                              "log": True},
                  "data.batch_size": {"type": "categorical", "choices": [8, 16]}})
    started = time.monotonic()
    done = _kerasdist(tmp_path, "sweep", "sweep.yaml", timeout_s=540)
    print(f"4-trial sweep: {time.monotonic() - started:.1f} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trials = _study(tmp_path).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
    for trial in trials:  # each a whole run in its own folder, its recipe beside it
        folder = tmp_path / "out" / f"trial-{trial.number:04d}"
        recipe = yaml.safe_load((folder / "recipe.yaml").read_text())
        assert recipe["optimizer"]["learning_rate"] == trial.params["optimizer.learning_rate"]
        metrics = json.loads((folder / "run" / "metrics.json").read_text())
        assert metrics["history"]["val_loss"][-1] == pytest.approx(trial.value)
    out = tmp_path / "out"
    rows = (out / "trials.csv").read_text().splitlines()
    assert len(rows) == 5 and rows[0].startswith("number,state,value,optimizer.learning_rate")
    for plot in ("optimization_history", "param_importances", "parallel_coordinate"):
        assert (out / f"{plot}.png").stat().st_size > 10_000, plot
    best = min(trials, key=lambda t: t.value)
    best_recipe = yaml.safe_load((out / "best.yaml").read_text())
    assert best_recipe["optimizer"]["learning_rate"] == best.params["optimizer.learning_rate"]
    status = _kerasdist(tmp_path, "sweep", "sweep.yaml", "--status", timeout_s=120)
    assert "4 of 4 trials finished (COMPLETE 4)" in status.stdout, status.stdout + status.stderr
    assert f"best: trial {best.number}" in status.stdout
    fit = _kerasdist(tmp_path, "fit", "out/best.yaml", "--quiet", timeout_s=300)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert (out / "best" / "metrics.json").is_file()


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_driver_leaves_no_process_and_the_rerun_resumes_the_trial_at_its_step(tmp_path):
    _files(tmp_path, CNN, trials=2, parallel=1, sampler={"name": "random", "seed": 0},
           pruner={"name": "median", "options": {"n_startup_trials": 10}},  # waits, never prunes
           space={"model.params.dropout": {"type": "float", "low": 0.1, "high": 0.6}})
    log = open(tmp_path / "driver.log", "w")  # noqa: SIM115 - closed below
    driver = subprocess.Popen([sys.executable, "-m", "kerasdist", "sweep", "sweep.yaml"],
                              cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, **QUIET}, start_new_session=True)
    trial0 = tmp_path / "out" / "trial-0000"
    try:
        _wait_for(lambda: (trial0 / "gate" / "epoch-0001.decision").exists(), 300,
                  "trial 0's first epoch")
        children = psutil.Process(driver.pid).children(recursive=True)
        assert children, "the trial's processes"
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
        gone, alive = psutil.wait_procs(children, timeout=90)
        assert not alive, f"trial processes outlived the driver: {alive}"
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        log.close()
    first = (trial0 / "trial.log").read_text()
    saved = re.search(r"checkpoint saved at global step (\d+)", first)
    assert saved, first[-3000:]  # SIGTERM from the driver's death: the trial saved, then exited
    step = int(saved.group(1))
    assert 40 <= step < 120, step  # in epoch 2 or at its end: mid-trial
    assert _study(tmp_path).trials[0].state.name == "RUNNING"

    again = _kerasdist(tmp_path, "sweep", "sweep.yaml", timeout_s=480)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resuming 1 interrupted trial(s): 0" in again.stdout
    trials = _study(tmp_path).trials
    assert [(t.number, t.state.name) for t in trials] == [(0, "COMPLETE"), (1, "COMPLETE")]
    metrics = json.loads((trial0 / "run" / "metrics.json").read_text())
    assert metrics["start_step"] == step and metrics["global_steps"] == 120, metrics
    assert sorted(trials[0].intermediate_values) == [1, 2, 3]
