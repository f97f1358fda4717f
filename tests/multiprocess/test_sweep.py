"""``kerasdist sweep`` with real ``kerasdist fit`` trials (issue 44): a 4-trial sweep whose
best.yaml trains; a driver SIGKILLed mid-trial leaves no process behind, and the same command
then resumes the interrupted trial at its checkpoint's step and ends with exactly ``trials``
finished; (extended) multi-worker trials on 2 workers pruned at one epoch boundary on every task;
a parameter-server trial pruned by its coordinator (limited by its progress, not the wall
clock); MLflow parent and child runs on a real ``mlflow server``; the Ray backend on a local Ray,
and a SIGKILLed Ray driver whose local Ray and trial end with it (the trial saving first)."""

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
from progress_watch import run_while_progressing

optuna = pytest.importorskip("optuna")
pytestmark = pytest.mark.multiprocess

try:  # a real mlflow server (its fixture), for the tracking test
    from test_recipe_callbacks_tracking import mlflow_server  # noqa: F401
except pytest.skip.Exception:  # mlflow not installed: that test is skipped
    @pytest.fixture
    def mlflow_server():
        pytest.skip("mlflow is not installed")

QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}

LINEAR = {
    "model": {"name": "linear"},
    "data": {"source": {"kind": "synthetic_linear", "num_examples": 256}, "train_split": "train",
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


def _kerasdist(tmp_path: Path, *args: str, timeout_s: float,
               env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kerasdist", *args], cwd=tmp_path, text=True,
                          capture_output=True, timeout=timeout_s,
                          env={**os.environ, **QUIET, **(env or {})})


def _study(tmp_path: Path):
    return optuna.load_study(study_name="kerasdist-sweep",
                             storage=f"sqlite:///{tmp_path / 'out' / 'study.db'}")


@pytest.mark.slow
@pytest.mark.timeout(1500)  # 150 s at load 10 here; at load ~20 (nice 19) 2 of 4 trials in 540 s
def test_a_four_trial_sweep_writes_its_outputs_and_best_yaml_trains(tmp_path):
    _files(tmp_path, LINEAR, trials=4, parallel=2, sampler={"name": "random", "seed": 0},
           space={"optimizer.learning_rate": {"type": "float", "low": 0.001, "high": 0.1,
                                              "log": True},
                  "data.batch_size": {"type": "categorical", "choices": [8, 16]}})
    started = time.monotonic()
    done = _kerasdist(tmp_path, "sweep", "sweep.yaml", timeout_s=1000)
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
    assert len(rows) == 5 and rows[0].startswith("number,state,value,")
    assert {"optimizer.learning_rate", "data.batch_size", "dir"} <= set(rows[0].split(","))
    assert _hparams_runs(out) == [f"trial-{n:04d}" for n in range(4)]
    for plot in ("optimization_history", "param_importances", "parallel_coordinate"):
        assert (out / f"{plot}.png").stat().st_size > 10_000, plot
    best = min(trials, key=lambda t: t.value)
    best_recipe = yaml.safe_load((out / "best.yaml").read_text())
    assert best_recipe["optimizer"]["learning_rate"] == best.params["optimizer.learning_rate"]
    status = _kerasdist(tmp_path, "sweep", "sweep.yaml", "--status", timeout_s=300)
    assert "4 of 4 trials finished (COMPLETE 4)" in status.stdout, status.stdout + status.stderr
    assert f"best: trial {best.number}" in status.stdout
    fit = _kerasdist(tmp_path, "fit", "out/best.yaml", "--quiet", timeout_s=600)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert (out / "best" / "metrics.json").is_file()


def _hparams_runs(out: Path) -> list[str]:
    """The runs of TensorBoard's HParams view in ``out``, each holding one event file."""
    runs = sorted((out / "tensorboard").iterdir())
    assert all(len(list(run.glob("events.out.tfevents.*"))) == 1 for run in runs), runs
    return [run.name for run in runs]


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.extended  # the README suite keeps one real sweep (above): 134 s at load 10 here
@pytest.mark.timeout(1500)
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
        _wait_for(lambda: (trial0 / "gate" / "epoch-0001.decision").exists(), 600,
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

    again = _kerasdist(tmp_path, "sweep", "sweep.yaml", timeout_s=800)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resuming 1 interrupted trial(s): 0" in again.stdout
    trials = _study(tmp_path).trials
    assert [(t.number, t.state.name) for t in trials] == [(0, "COMPLETE"), (1, "COMPLETE")]
    metrics = json.loads((trial0 / "run" / "metrics.json").read_text())
    assert metrics["start_step"] == step and metrics["global_steps"] == 120, metrics
    assert sorted(trials[0].intermediate_values) == [1, 2, 3]
    assert _hparams_runs(tmp_path / "out") == ["trial-0000", "trial-0001"]  # once each


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_stopped_sweep_with_a_pruner_ends_in_seconds_and_resumes_by_whole_epochs(tmp_path):
    # Ctrl-C lands in epoch 2: the trial saves, reports no half epoch and waits for no decision
    # (it waited for one until its SIGKILL 30 s later); the re-run reports epoch 2 whole
    steps = 3000  # about 4 s an epoch here: the signal lands inside epoch 2
    recipe = {**LINEAR, "trainer": {"epochs": 3, "steps_per_epoch": steps, "seed": 1}}
    _files(tmp_path, recipe, trials=1, parallel=1, sampler={"name": "random", "seed": 0},
           pruner={"name": "median", "options": {"n_startup_trials": 10}},  # waits, never prunes
           space={"optimizer.learning_rate": {"type": "float", "low": 0.01, "high": 0.05}})
    log = open(tmp_path / "driver.log", "w")  # noqa: SIM115 - closed below
    driver = subprocess.Popen([sys.executable, "-m", "kerasdist", "sweep", "sweep.yaml"],
                              cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, **QUIET}, start_new_session=True)
    gate = tmp_path / "out" / "trial-0000" / "gate"
    try:
        _wait_for(lambda: (gate / "epoch-0001.decision").exists(), 600, "trial 0's first epoch")
        time.sleep(1.0)  # into epoch 2
        os.kill(driver.pid, signal.SIGINT)
        started = time.monotonic()
        code = driver.wait(timeout=120)
        took = time.monotonic() - started
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        log.close()
    first = (tmp_path / "out" / "trial-0000" / "trial.log").read_text()
    print(f"stopped in {took:.1f} s")
    assert code == 130, (tmp_path / "driver.log").read_text()[-3000:]
    from kerasdist.sweep.processes import STOP_GRACE_S

    # 4-8 s here; a trial still waiting at the gate is SIGKILLed STOP_GRACE_S (30 s) after
    assert took < STOP_GRACE_S - 5, f"{took:.1f} s: the trial waited at the gate ({first[-2000:]})"
    saved = re.search(r"preempted: checkpoint at global step (\d+) saved", first)
    assert saved and steps < int(saved.group(1)) < 2 * steps, first[-3000:]  # mid-epoch 2
    assert not (gate / "epoch-0002.value.json").exists()  # the half epoch is not reported

    again = _kerasdist(tmp_path, "sweep", "sweep.yaml", timeout_s=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    (trial,) = _study(tmp_path).trials
    assert trial.state.name == "COMPLETE" and sorted(trial.intermediate_values) == [1, 2, 3]
    second = json.loads((gate / "epoch-0002.value.json").read_text())
    assert second["step"] == 2 * steps  # written at the whole epoch's end, after the resume
    assert trial.intermediate_values[2] == pytest.approx(second["value"])


@pytest.mark.slow
@pytest.mark.extended  # two 2-worker clusters: about 3 min here
@pytest.mark.timeout(900)
def test_multi_worker_trials_are_pruned_at_one_epoch_boundary_on_every_task(tmp_path):
    recipe = {**LINEAR, "strategy": {"kind": "multi_worker", "timeout_s": 60},
              "cluster": {"kind": "local", "workers": 2, "threads_per_task": 1},
              "data": {**LINEAR["data"], "auto_shard": "data"},
              "trainer": {"epochs": 4, "steps_per_epoch": 5, "seed": 1}}
    # ThresholdPruner with upper 0: every value is over it, so every trial is pruned at the
    # first epoch past the warmup (epoch 2)
    _files(tmp_path, recipe, trials=2, parallel=1, sampler={"name": "random", "seed": 0},
           pruner={"name": "threshold", "warmup_epochs": 1, "options": {"upper": 0.0}},
           space={"optimizer.learning_rate": {"type": "float", "low": 0.01, "high": 0.1}})
    done = _kerasdist(tmp_path, "sweep", "sweep.yaml", timeout_s=840)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trials = _study(tmp_path).trials
    assert [t.state.name for t in trials] == ["PRUNED", "PRUNED"]
    for trial in trials:
        assert sorted(trial.intermediate_values) == [1, 2]
        run = tmp_path / "out" / f"trial-{trial.number:04d}" / "run"
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["global_steps"] == 10 and metrics["num_replicas"] == 2, metrics
        assert metrics["stopped"] == {"reason": "early_stop", "epoch": 2, "step": 10,
                                      "by": "SweepPruneGate"}
        logs = sorted((run / "logs").glob("worker-*.log"))
        assert len(logs) == 2, list((run / "logs").iterdir())
        digests = set()
        for log in logs:  # both workers stopped after epoch 2, with the same weights
            found = re.search(r"done at global step 10; weights sha256 (\w+)", log.read_text())
            assert found, log
            digests.add(found.group(1))
        assert len(digests) == 1, digests
    assert "pruned after epoch 2" in done.stdout


@pytest.mark.slow
@pytest.mark.extended  # an mlflow server and 2 trials: about 2 min here
@pytest.mark.timeout(600)
def test_a_tracked_sweep_has_one_parent_mlflow_run_and_a_child_run_per_trial(tmp_path,
                                                                           mlflow_server):
    mlflow = pytest.importorskip("mlflow")
    uri = mlflow_server
    recipe = {**LINEAR, "output": {**LINEAR["output"], "tracking": {
        "kind": "mlflow", "uri": uri, "experiment": "sweep44"}}}
    _files(tmp_path, recipe, trials=2, parallel=1, sampler={"name": "random", "seed": 0},
           space={"optimizer.learning_rate": {"type": "float", "low": 0.01, "high": 0.1}})
    done = _kerasdist(tmp_path, "sweep", "sweep.yaml", timeout_s=480,
                      env={"MLFLOW_DISABLE_TELEMETRY": "true"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("sweep44")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.info.run_name == "kerasdist-sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED", runs
    parent = parents[0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 2 == len(runs) - 1
    trials = {t.number: t for t in _study(tmp_path).trials}
    for child in children:
        trial = trials[int(child.data.tags["kerasdist.sweep.trial"])]
        assert child.data.tags["kerasdist.sweep.state"] == "COMPLETE"
        assert child.data.metrics["objective"] == pytest.approx(trial.value)
        assert float(child.data.params["optimizer.learning_rate"]) == pytest.approx(
            trial.params["optimizer.learning_rate"])
    best = min(trials.values(), key=lambda t: t.value)
    assert parent.data.metrics["best_value"] == pytest.approx(best.value)
    assert parent.data.tags["kerasdist.sweep.best_trial"] == str(best.number)
    assert "space.optimizer.learning_rate" in parent.data.params


@pytest.mark.slow
@pytest.mark.extended  # a local Ray and 2 trials: about 2 min here
@pytest.mark.timeout(600)
def test_the_ray_backend_runs_each_trial_as_a_ray_task_on_a_local_ray(tmp_path):
    import importlib.util

    if importlib.util.find_spec("ray") is None:  # (importing ray here would set RAY_* variables)
        pytest.skip("ray is not installed")
    _files(tmp_path, LINEAR, trials=2, parallel=2, backend="ray",
           sampler={"name": "random", "seed": 0},
           space={"optimizer.learning_rate": {"type": "float", "low": 0.01, "high": 0.1}})
    done = _kerasdist(tmp_path, "sweep", "sweep.yaml", timeout_s=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trials = _study(tmp_path).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    for trial in trials:
        folder = tmp_path / "out" / f"trial-{trial.number:04d}"
        assert "ray task, 1 CPU" in (folder / "trial.log").read_text()
        assert json.loads((folder / "run" / "metrics.json").read_text())["global_steps"] == 6
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not leftovers, leftovers  # no trial process outlives the sweep


@pytest.mark.slow
@pytest.mark.extended  # a cluster of 4 tasks: 64 s at load 9; over 840 s once at load 25
@pytest.mark.timeout(7200)  # a backstop only: the limit is the run's progress (below)
def test_a_parameter_server_trial_is_pruned_at_an_epoch_boundary_by_its_coordinator(tmp_path):
    # Limits tied to the run's progress, not to the wall clock: at nice 19 beside other work on
    # this 2-core machine a ps once took over 120 s to start (cluster.start_timeout_s: the
    # trial FAILed) and the whole sweep once took over 840 s, while the run needs 40 CPU s.
    # The recipe's own wall-clock limits are raised out of the way (start, liveness probes,
    # trial) and the watcher fails the test when nothing is written and little CPU is used
    # for 600 s, or past 600 CPU s.
    recipe = {**LINEAR, "strategy": {"kind": "parameter_server", "task_timeout_s": 3600},
              "cluster": {"kind": "local", "workers": 2, "ps": 1, "threads_per_task": 1,
                          "start_timeout_s": 3600},
              "trainer": {"epochs": 4, "steps_per_epoch": 5, "seed": 1}}
    _files(tmp_path, recipe, trials=1, parallel=1, sampler={"name": "random", "seed": 0},
           pruner={"name": "threshold", "warmup_epochs": 1, "options": {"upper": 0.0}},
           space={"optimizer.learning_rate": {"type": "float", "low": 0.01, "high": 0.1}},
           trial_timeout_s=7200)
    done = run_while_progressing([sys.executable, "-m", "kerasdist", "sweep", "sweep.yaml"],
                                 cwd=tmp_path, env={**os.environ, **QUIET},
                                 watch=[tmp_path], stall_s=600, cpu_budget_s=600)
    print(f"parameter-server pruning sweep: {done.wall_s:.0f} s wall, {done.cpu_s:.0f} CPU s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (trial,) = _study(tmp_path).trials
    assert trial.state.name == "PRUNED" and sorted(trial.intermediate_values) == [1, 2]
    run = tmp_path / "out" / f"trial-{trial.number:04d}" / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["stopped"]["reason"] == "early_stop", metrics["stopped"]
    assert metrics["stopped"]["epoch"] == 2 and metrics["stopped"]["by"] == "SweepPruneGate"
    assert 10 <= metrics["global_steps"] < 15, metrics["global_steps"]
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not leftovers, leftovers  # the ps and the workers ended with the trial



def _tree_of(pid: int) -> set[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return {root, *root.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _alive(procs) -> list[str]:
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{proc.pid} {proc.name()} {' '.join(proc.cmdline())[:160]}")
        except psutil.NoSuchProcess:
            pass
    return out


def _ray_driver(tmp_path: Path, until, timeout_s: float, seen: set) -> subprocess.Popen:
    """Start ``kerasdist sweep`` (a Ray backend) and poll until ``until()`` or its end, adding
    every process of its tree to ``seen`` as they come (Ray's own processes are its children)."""
    log = open(tmp_path / "driver.log", "a")  # noqa: SIM115 - the child holds it
    driver = subprocess.Popen([sys.executable, "-m", "kerasdist", "sweep", "sweep.yaml"],
                              cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, **QUIET}, start_new_session=True)
    log.close()
    deadline = time.monotonic() + timeout_s
    while driver.poll() is None and not until():
        seen.update(_tree_of(driver.pid))
        assert time.monotonic() < deadline, f"timed out; {(tmp_path / 'driver.log').read_text()}"
        time.sleep(0.2)
    return driver


@pytest.mark.slow
@pytest.mark.extended  # a local Ray, a killed driver, then the re-run: about 4 min here
@pytest.mark.timeout(2400)
def test_a_killed_ray_driver_takes_its_local_ray_and_trials_with_it_and_the_rerun_resumes(
        tmp_path):
    import importlib.util

    if importlib.util.find_spec("ray") is None:  # (importing ray here would set RAY_* variables)
        pytest.skip("ray is not installed")
    _files(tmp_path, CNN, trials=2, parallel=1, backend="ray",
           sampler={"name": "random", "seed": 0},
           pruner={"name": "median", "options": {"n_startup_trials": 10}},  # waits, never prunes
           space={"model.params.dropout": {"type": "float", "low": 0.1, "high": 0.6}})
    trial0 = tmp_path / "out" / "trial-0000"
    seen: set[psutil.Process] = set()
    driver = None
    try:
        driver = _ray_driver(tmp_path, (trial0 / "gate" / "epoch-0001.decision").exists, 900,
                             seen)
        assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
        seen.update(_tree_of(driver.pid))
        names = {p.name() for p in seen if p.is_running()}
        assert {"gcs_server", "raylet"} <= names, names  # a local Ray, started by the driver
        assert any("fit" in line for line in _alive(seen)), _alive(seen)  # the trial
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
        psutil.wait_procs([p for p in seen if p.pid != driver.pid], timeout=180)
        assert not _alive(seen), f"processes outlived the killed driver: {_alive(seen)}"
        first = (trial0 / "trial.log").read_text()
        saved = re.search(r"checkpoint saved at global step (\d+)", first)
        assert saved, first[-3000:]  # the trial got SIGTERM (not SIGKILL) and saved
        step = int(saved.group(1))
        assert 40 <= step < 120, step
        assert _study(tmp_path).trials[0].state.name == "RUNNING"

        again = _ray_driver(tmp_path, lambda: False, 1200, seen)
        out = (tmp_path / "driver.log").read_text()
        assert again.returncode == 0, out[-3000:]
        assert "resuming 1 interrupted trial(s): 0" in out
        trials = _study(tmp_path).trials
        assert [(t.number, t.state.name) for t in trials] == [(0, "COMPLETE"), (1, "COMPLETE")]
        metrics = json.loads((trial0 / "run" / "metrics.json").read_text())
        assert metrics["start_step"] == step and metrics["global_steps"] == 120, metrics
        psutil.wait_procs(list(seen), timeout=60)
        assert not _alive(seen), f"processes outlived the sweep: {_alive(seen)}"
    finally:  # remove whatever is left when the test fails
        for proc in seen | (_tree_of(driver.pid) if driver else set()):
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
