"""Parameter-server fault tolerance with real processes: kill a worker, the ps, the coordinator."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.multiprocess
REPO = Path(__file__).parents[2]
EPOCHS, STEPS = 4, 30


def _command(run_dir: Path) -> list[str]:
    sets = [f"trainer.epochs={EPOCHS}", f"trainer.steps_per_epoch={STEPS}",
            "data.eval_split=test[9000:9512]", "cluster.max_restarts=1",
            "output.tensorboard=false", f"output.run_dir={run_dir}"]
    return [sys.executable, "-m", "kerasdist", "fit", str(REPO / "recipes" / "mnist_cnn_ps.yaml"),
            *[a for s in sets for a in ("--set", s)], "--verbose", "2"]


def _start(run_dir: Path, log: Path) -> subprocess.Popen:
    handle = open(log, "ab")
    return subprocess.Popen(_command(run_dir), stdout=handle, stderr=subprocess.STDOUT, cwd=REPO)


def _task(coordinator: subprocess.Popen, name: str) -> psutil.Process:
    """The child process whose TF_CONFIG names task ``name`` (e.g. 'worker:1')."""
    for child in psutil.Process(coordinator.pid).children(recursive=True):
        try:
            task = json.loads(child.environ().get("TF_CONFIG", "{}")).get("task", {})
        except (psutil.Error, ValueError):
            continue
        if f"{task.get('type')}:{task.get('index')}" == name:
            return child
    raise AssertionError(f"no process for task {name}")


def _wait_for_checkpoint(run_dir: Path, number: int, proc: subprocess.Popen) -> None:
    """Wait until the checkpoint pointer file names checkpoint ``number`` (or a later one): the
    ``.index`` file appears before the pointer is replaced, and a kill in between correctly
    leaves the previous checkpoint as the latest."""
    pointer = run_dir / "checkpoints" / "checkpoint"
    deadline = time.monotonic() + 180
    while True:
        text = pointer.read_text() if pointer.exists() else ""
        found = [int(n) for n in re.findall(r'^model_checkpoint_path: ".*ckpt-(\d+)"', text, re.M)]
        if found and found[0] >= number:
            return
        assert proc.poll() is None, f"run ended early with code {proc.returncode}"
        assert time.monotonic() < deadline, f"checkpoint {number} did not appear: {text!r}"
        time.sleep(0.2)


def _finish(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


@pytest.mark.timeout(300)
def test_killed_worker_is_restarted_and_training_completes(tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "out.log"
    proc = _start(run_dir, log)
    _wait_for_checkpoint(run_dir, STEPS, proc)  # checkpoints are numbered by global step
    victim = _task(proc, "worker:1")
    victim.send_signal(signal.SIGKILL)
    assert _finish(proc, 240) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "task worker:1 was killed by SIGKILL; restarting it (1/1)" in text
    metrics = json.loads((run_dir / "metrics.json").read_text())
    ps = metrics["parameter_server"]
    assert ps["global_step"] >= EPOCHS * STEPS  # at-least-once: every requested step completed
    assert ps["restarted_tasks"] == ["worker:1"]
    assert metrics["history"]["ps_steps"][-1] == STEPS
    assert not victim.is_running()


@pytest.mark.timeout(480)
def test_coordinator_and_ps_failures_resume_from_the_last_checkpoint(tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "out.log"
    # 1. The coordinator is SIGKILLed: its tasks die with it.
    proc = _start(run_dir, log)
    _wait_for_checkpoint(run_dir, STEPS, proc)
    tasks = [_task(proc, name) for name in ("ps:0", "worker:0", "worker:1")]
    proc.kill()
    proc.wait(30)
    gone, alive = psutil.wait_procs(tasks, timeout=15)
    assert not alive, f"tasks outlived their coordinator: {alive}"
    # 2. Re-run: resumes; then the ps is killed: bounded failure naming ps:0.
    proc = _start(run_dir, log)
    _wait_for_checkpoint(run_dir, 2 * STEPS, proc)
    killed_at = time.monotonic()
    _task(proc, "ps:0").send_signal(signal.SIGKILL)
    code = _finish(proc, 180)
    elapsed = time.monotonic() - killed_at
    text = log.read_text()
    readable = "\n".join(line for line in text.splitlines() if "grpc" not in line.lower()
                         and "remote" not in line)
    assert code == 1 and "parameter server ps:0 died" in text, readable[-3000:]
    assert elapsed < 150
    # 3. Re-run with the ps back: resumes from the last checkpoint and finishes.
    proc = _start(run_dir, log)
    assert _finish(proc, 240) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert text.count("kerasdist: resuming from checkpoint") == 2
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["initial_epoch"] >= 2
    history_steps = metrics["history"]["ps_global_step"]
    # the global step continues from the checkpoint, it never goes back past it
    assert history_steps[0] >= (metrics["initial_epoch"] + 1) * STEPS
    assert metrics["parameter_server"]["global_step"] >= EPOCHS * STEPS
