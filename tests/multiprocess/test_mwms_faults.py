"""Multi-worker training with real worker processes: determinism, a killed worker, SIGTERM, a hang.

All runs use recipes/linear_mwms.yaml made small and deterministic (64 steps per epoch x 2 epochs,
a backup every 10 steps; see mwms_support.linear_recipe), so a run takes seconds after the ~30 s
TensorFlow start-up of its workers.
"""

from __future__ import annotations

import re
import time

import mwms_support as mw
import numpy as np
import psutil
import pytest

from kerasdist.keras.backup import temp_dir

pytestmark = pytest.mark.multiprocess
TOTAL_STEPS = 2 * 64


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Two identical fault-free runs, started together: ``(run_dir_a, run_dir_b, output_a)``."""
    tmp = tmp_path_factory.mktemp("mwms_reference")
    recipes = [mw.linear_recipe(tmp, name) for name in ("a", "b")]
    processes = [mw.launch(r) for r in recipes]
    outputs = [mw.finish(p, timeout_s=240) for p in processes]
    for process, out in zip(processes, outputs, strict=True):
        assert process.returncode == 0, out[-6000:]
    return tmp / "a", tmp / "b", outputs[0]


@pytest.mark.timeout(300)
def test_deterministic_runs_agree_and_workers_stay_identical(reference):
    run_a, run_b, _ = reference
    for run in (run_a, run_b):
        chief = mw.epoch_digests(run / "logs" / "worker-0.log")
        assert sorted(chief) == [1, 2]
        assert chief == mw.epoch_digests(run / "logs" / "worker-1.log")  # identical every epoch
        assert mw.metrics(run)["global_steps"] == TOTAL_STEPS
    for a, b in zip(mw.final_weights(run_a), mw.final_weights(run_b), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    kernel, bias = mw.final_weights(run_a)
    assert abs(kernel.item() - 2.0) < 0.1 and abs(bias.item() - 10.0) < 0.1
    # chief-aware outputs: only the chief's run directory content, no per-task leftovers
    assert sorted(p.name for p in run_a.iterdir()) == ["checkpoints", "logs", "metrics.json",
                                                       "model.keras", "run.json"]


@pytest.mark.timeout(300)
def test_killed_worker_restarts_and_finishes_with_exact_steps(tmp_path, reference):
    recipe = mw.linear_recipe(tmp_path, "kill")
    run_dir = tmp_path / "kill"
    process = mw.launch(recipe)
    try:
        mw.wait_for_checkpoint(run_dir, process, min_step=10, timeout_s=180)
        mw.worker_process(process.pid, 1).kill()  # SIGKILL, mid-epoch 1
        out = mw.finish(process, timeout_s=240)
    finally:
        mw.kill_tree(process.pid)
    assert process.returncode == 0, out[-6000:]
    assert "task worker:1 was killed by SIGKILL" in out
    assert "attempt 1/2 failed" in out and "restarting the cluster" in out
    result = mw.metrics(run_dir)
    assert result["global_steps"] == TOTAL_STEPS  # no step lost, none replayed
    assert not temp_dir(run_dir / "checkpoints", "worker:1").exists()  # scratch of the killed task
    assert 0 < result["start_step"] < 64  # resumed inside epoch 1
    assert mw.epoch_digests(run_dir / "logs" / "worker-0.log")[2] == \
        mw.epoch_digests(run_dir / "logs" / "worker-1.log")[2]
    for faulty, clean in zip(mw.final_weights(run_dir), mw.final_weights(reference[0]),
                             strict=True):
        np.testing.assert_allclose(faulty, clean, rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(300)
def test_sigterm_saves_then_next_launch_finishes(tmp_path):
    recipe = mw.linear_recipe(tmp_path, "term", trainer={"epochs": 3})
    run_dir = tmp_path / "term"
    process = mw.launch(recipe)
    try:
        mw.wait_for_checkpoint(run_dir, process, min_step=10, timeout_s=180)
        workers = [mw.worker_process(process.pid, i).pid for i in (0, 1)]
        mw.sigterm(process)
        out = mw.finish(process, timeout_s=90)
    finally:
        mw.kill_tree(process.pid)
    assert process.returncode == 130, out[-6000:]
    assert mw.no_processes_left(workers)
    logs = [(run_dir / "logs" / f"worker-{i}.log").read_text() for i in (0, 1)]
    assert all("SIGTERM received" in log or "preempted" in log for log in logs)
    saved = max(mw.checkpoint_steps(run_dir))
    assert f"preempted: checkpoint at global step {saved} saved" in logs[0]
    assert saved % 10 == 0  # agreed at a vote step, every PREEMPTION_CHECK_STEPS
    again = mw.launch(recipe)
    out = mw.finish(again, timeout_s=240)
    assert again.returncode == 0, out[-6000:]
    result = mw.metrics(run_dir)
    assert result["start_step"] == saved and result["global_steps"] == 3 * 64


@pytest.mark.timeout(300)
def test_hung_worker_fails_the_cluster_in_bounded_time_naming_it(tmp_path):
    recipe = mw.linear_recipe(tmp_path, "hang", strategy={"timeout_s": 10},
                              cluster={"max_restarts": 0}, trainer={"epochs": 50})
    run_dir = tmp_path / "hang"
    process = mw.launch(recipe)
    try:
        mw.wait_for_checkpoint(run_dir, process, min_step=10, timeout_s=180)
        hung = mw.worker_process(process.pid, 1)
        survivor = mw.worker_process(process.pid, 0)
        hung.suspend()  # SIGSTOP
        stopped = time.monotonic()
        out = mw.finish(process, timeout_s=120)
        elapsed = time.monotonic() - stopped
    finally:
        mw.kill_tree(process.pid)
    assert process.returncode != 0
    assert elapsed < 60, f"cluster took {elapsed:.0f} s to fail"
    assert "task worker:0" in out and "lost task worker:1" in out, out[-4000:]
    assert "failed after 1 attempt" in out
    log = (run_dir / "logs" / "worker-0.log").read_text()
    assert re.search(r"task worker:0: lost task worker:1( \(hung\))? during training", log), log[-3000:]
    psutil.wait_procs([p for p in (hung, survivor) if p.is_running()], timeout=15)
    assert mw.no_processes_left([hung.pid, survivor.pid])
    assert not temp_dir(run_dir / "checkpoints", "worker:1").exists()  # the launcher cleaned it
