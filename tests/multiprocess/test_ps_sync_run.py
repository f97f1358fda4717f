"""Synchronous parameter-server runs (``strategy.sync``) as users start them: ``kerasdist fit`` of
recipes/linear_ps_sync.yaml on a local cluster (1 ps, workers and the coordinator as processes).

* interrupted (SIGINT) and run again, a K = N run resumes at the step its checkpoint holds
  (the applied-update count, ``optimizer.iterations``) and ends with the weights of the run that
  was never interrupted, bit for bit (2 workers: a mean of two floats does not depend on their
  order);
* with K < N and one worker killed mid-run, the run goes on (the worker is restarted and rejoins)
  and ends at exactly the requested step (only the coordinator applies updates: a call run again
  cannot apply twice); metrics.json and the summary give K, N and the gradients dropped;
* with K < N and no restart left, a killed worker is a backup worker lost for good: the run goes
  on with the other workers' calls and ends at exactly the requested step.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import mwms_support as mw
import pytest
import yaml

pytestmark = pytest.mark.multiprocess
REPO = Path(__file__).parents[2]
STEPS = 64  # per epoch


def _recipe(tmp_path: Path, name: str, *, workers: int = 2, k: int = 2, batch: int = 32,
            max_restarts: int = 1, min_workers: int | None = None) -> Path:
    raw = yaml.safe_load((REPO / "recipes" / "linear_ps_sync.yaml").read_text())
    raw["data"]["source"]["num_examples"] = 8192
    raw["data"]["batch_size"] = batch
    raw["strategy"]["sync"]["replicas_to_aggregate"] = k
    raw["cluster"].update(workers=workers, max_restarts=max_restarts)
    if min_workers is not None:  # elastic: the coordinator is task chief:0, a process of its own
        raw["cluster"]["min_workers"] = min_workers
    raw["trainer"].update(epochs=2, steps_per_epoch=STEPS, checkpoint={"every_steps": 10})
    raw["output"] = {"run_dir": str(tmp_path / name), "tensorboard": False}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def _start(recipe: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kerasdist", "fit", str(recipe)],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, cwd=REPO,
                            env={**__import__("os").environ, **mw.QUIET})


def _wait_for(log: Path, pattern: str, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not re.search(pattern, log.read_text(errors="replace") if log.exists() else ""):
        assert proc.poll() is None, f"run ended early ({proc.returncode}):\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {pattern!r} in:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


def _finish(proc: subprocess.Popen, log: Path, timeout_s: float = 300) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"run did not end in {timeout_s} s:\n{log.read_text()[-3000:]}") from None


def _run_killing_worker_2(recipe: Path, log: Path) -> str:
    """Run ``recipe``, SIGKILL task worker:2 two seconds into the first epoch, expect exit 0;
    return the run's console."""
    proc = _start(recipe, log)
    _wait_for(log, r"Epoch 1/2", proc)
    time.sleep(2.0)
    worker = mw.task_process(proc.pid, "worker:2")
    assert worker is not None
    worker.send_signal(signal.SIGKILL)
    assert _finish(proc, log) == 0, log.read_text()[-3000:]
    return log.read_text()


def _metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_interrupted_sync_run_resumes_at_its_saved_step_with_the_uninterrupted_weights(tmp_path):
    whole = _recipe(tmp_path, "whole")
    assert _finish(_start(whole, tmp_path / "whole.log"), tmp_path / "whole.log") == 0
    reference = _metrics(tmp_path / "whole")
    assert reference["global_steps"] == 2 * STEPS
    # run again when complete: nothing trained, and the summary claims no mode it did not run
    assert _finish(_start(whole, tmp_path / "again.log"), tmp_path / "again.log") == 0
    again = (tmp_path / "again.log").read_text()
    assert "strategy           parameter_server (2 worker(s))\n" in again, again[-2000:]

    recipe, log = _recipe(tmp_path, "cut"), tmp_path / "cut.log"
    proc = _start(recipe, log)
    _wait_for(log, r"Epoch 2/2", proc)  # mid-run: past the first epoch's checkpoints
    proc.send_signal(signal.SIGINT)
    assert _finish(proc, log) == 130, log.read_text()[-3000:]
    saved = int(re.search(r"preempted: checkpoint saved at global step (\d+)",
                          log.read_text()).group(1))
    assert STEPS <= saved < 2 * STEPS
    assert _finish(_start(recipe, log), log) == 0, log.read_text()[-3000:]
    resumed = _metrics(tmp_path / "cut")
    assert resumed["start_step"] == saved and resumed["restore_verified"] is True
    assert resumed["parameter_server"]["global_step"] == resumed["global_steps"] == 2 * STEPS
    assert resumed["parameter_server"]["sync"]["gradients"] == 2 * (2 * STEPS - saved)
    assert resumed["weights_sha256"] == reference["weights_sha256"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_k_below_n_goes_on_past_a_killed_worker_and_counts_what_it_dropped(tmp_path):
    recipe, log = _recipe(tmp_path, "backup", workers=3, k=2, batch=48), tmp_path / "backup.log"
    text = _run_killing_worker_2(recipe, log)
    assert "task worker:2 was killed by SIGKILL; restarting it" in text, text[-3000:]
    metrics = _metrics(tmp_path / "backup")
    ps = metrics["parameter_server"]
    sync = ps["sync"]
    assert ps["global_step"] == metrics["global_steps"] == 2 * STEPS  # no update applied twice
    assert (sync["replicas_to_aggregate"], sync["num_workers"]) == (2, 3)
    assert sync["gradients"] == 3 * 2 * STEPS
    assert 2 * 2 * STEPS <= sync["aggregated"] <= sync["gradients"]
    assert sync["dropped"] == sync["gradients"] - sync["aggregated"] > 0
    assert f"synchronous: 2 of 3 gradients per step, {sync['dropped']} dropped" in text
    assert metrics["evaluation"]["loss"] < 0.2, metrics["evaluation"]  # noise: 0.33^2 = 0.11


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("min_workers", [None, 2], ids=["coordinator_here", "elastic"])
def test_k_below_n_goes_on_without_a_worker_lost_for_good(tmp_path, min_workers):
    # elastic: before, the lost worker failed the attempt and the run restarted on 2 workers
    recipe = _recipe(tmp_path, "spare", workers=3, k=2, batch=48, max_restarts=0,
                     min_workers=min_workers)
    log = tmp_path / "spare.log"
    text = _run_killing_worker_2(recipe, log)
    assert "task worker:2 was killed by SIGKILL and no restart is left; the run goes on without it" \
        in text, text[-3000:]
    metrics = _metrics(tmp_path / "spare")
    ps = metrics["parameter_server"]
    assert ps["global_step"] == metrics["global_steps"] == 2 * STEPS
    assert ps["left_tasks"] == ["worker:2"] and ps.get("restarted_tasks", []) == []
    if min_workers is not None:
        assert [a["workers"] for a in metrics["supervisor"]["attempts"]] == [3], metrics["supervisor"]
    assert ps["sync"]["gradients"] == 3 * 2 * STEPS
    assert metrics["evaluation"]["loss"] < 0.2, metrics["evaluation"]
