"""Elastic worker counts of multi-worker recipes (``cluster.min_workers``), with real workers.

recipes/linear_mwms.yaml made small (mwms_support.linear_recipe): 2048 examples, backups every
10 steps, 40 steps per epoch x 3. The recipe's accuracy target (W within 0.1 of 2, b within 0.1
of 10) is checked on the saved model.
"""

from __future__ import annotations

import threading

import mwms_support as mw
import numpy as np
import psutil
import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.extended]
STEPS = 40
TOTAL_STEPS = 3 * STEPS


def _meets_target(run_dir) -> None:
    kernel, bias = mw.final_weights(run_dir)
    assert abs(float(kernel.ravel()[0]) - 2.0) < 0.1 and abs(float(bias.ravel()[0]) - 10.0) < 0.1, \
        (kernel, bias)


class _NeverBack(threading.Thread):
    """Kill every process of the launcher's tree that runs ``worker:index``, as soon as seen: a
    worker whose machine is gone."""

    def __init__(self, launcher_pid: int, index: int):
        super().__init__(daemon=True)
        self.launcher_pid, self.index = launcher_pid, index
        self.stop = threading.Event()
        self.killed = 0

    def run(self) -> None:
        while not self.stop.wait(0.05):
            if not psutil.pid_exists(self.launcher_pid):
                return
            child = mw.task_process(self.launcher_pid, f"worker:{self.index}")
            if child is not None:
                try:
                    child.kill()
                    self.killed += 1
                except psutil.Error:
                    continue


@pytest.mark.timeout(420)
def test_a_worker_that_never_comes_back_leaves_the_run_on_two_workers_at_the_exact_step(tmp_path):
    recipe = mw.linear_recipe(tmp_path, "elastic", data={"batch_size": 48},
                              cluster={"workers": 3, "min_workers": 2, "max_restarts": 1},
                              trainer={"steps_per_epoch": STEPS, "epochs": 3})
    run_dir = tmp_path / "elastic"
    process = mw.launch(recipe)
    killer = _NeverBack(process.pid, 2)
    try:
        mw.wait_for_checkpoint(run_dir, process, min_step=10, timeout_s=240)
        killer.start()
        out = mw.finish(process, timeout_s=360)
    finally:
        killer.stop.set()
        mw.kill_tree(process.pid)
    assert process.returncode == 0, out[-6000:]
    assert killer.killed >= 2  # the first start and the restart
    assert "worker:2 was lost again after its restart: continuing on 2 workers" in out, out[-4000:]
    result = mw.metrics(run_dir)
    attempts = result["supervisor"]["attempts"]
    assert [a["workers"] for a in attempts] == [3, 3, 2], attempts
    assert "task worker:2 was killed by SIGKILL" in attempts[0]["ended"]
    assert result["supervisor"]["workers"] == 2 and result["num_replicas"] == 2
    assert result["throughput"]["global_batch_size"] == 48  # 24 per replica now, 16 before
    # resumed from a backup (every 10 steps) of the 3-worker attempt, at its exact step
    assert 10 <= result["start_step"] < TOTAL_STEPS and result["start_step"] % 10 == 0
    assert result["restore_verified"] is True
    assert result["global_steps"] == TOTAL_STEPS  # ends at the requested step
    _meets_target(run_dir)


@pytest.mark.timeout(420)
def test_a_run_started_on_two_workers_continues_on_four_at_the_exact_step(tmp_path):
    recipe = mw.linear_recipe(tmp_path, "grow", trainer={"steps_per_epoch": STEPS, "epochs": 3})
    assert TOTAL_STEPS == 3 * STEPS
    run_dir = tmp_path / "grow"
    process = mw.launch(recipe)
    try:
        mw.wait_for_checkpoint(run_dir, process, min_step=10, timeout_s=240)
        mw.sigterm(process)
        stopped = mw.finish(process, timeout_s=120)
    finally:
        mw.kill_tree(process.pid)
    assert process.returncode == 130, stopped[-6000:]
    on_disk = mw.checkpoint_steps(run_dir)
    saved = max(on_disk)
    assert 0 < saved < 3 * STEPS
    again = mw.launch(recipe, "--set", "cluster.workers=4")
    out = mw.finish(again, timeout_s=300)
    assert again.returncode == 0, out[-6000:]
    result = mw.metrics(run_dir)
    # not a step lost or replayed (CI once saw start_step 80 with only ckpt-20 found on disk
    # after the stopped run had exited; not reproduced since: the output says what was saved)
    assert result["start_step"] == saved, (
        f"on disk after the stop: {on_disk}; now: {mw.checkpoint_steps(run_dir)}\n"
        f"--- the stopped run ---\n{stopped[-5000:]}\n--- the resumed run ---\n{out[-3000:]}")
    assert result["restore_verified"] is True
    assert result["global_steps"] == 3 * STEPS
    assert result["num_replicas"] == 4 and result["supervisor"]["workers"] == 4
    assert result["throughput"]["global_batch_size"] == 32  # the same global batch: 8 per replica
    logs = [(run_dir / "logs" / f"worker-{i}.log").read_text() for i in range(4)]
    digests = [mw.epoch_digests(run_dir / "logs" / f"worker-{i}.log")[3] for i in range(4)]
    assert len(set(digests)) == 1, logs[0][-2000:]  # the 4 replicas stayed in sync
    _meets_target(run_dir)
    weights = mw.final_weights(run_dir)
    assert all(np.isfinite(w).all() for w in weights)
