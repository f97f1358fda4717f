"""Multi-worker training with real worker processes: determinism, a killed worker, SIGTERM, a hang.

All runs use recipes/linear_mwms.yaml made small and deterministic (64 steps per epoch x 2 epochs,
a backup every 10 steps; see mwms_support.linear_recipe), so a run takes seconds after the ~30 s
TensorFlow start-up of its workers.

What each fault may cost (asserted below): nothing. A worker or the chief SIGKILLed (even while
the backup store is writing a checkpoint) or the cluster preempted by SIGTERM resumes from the
newest complete checkpoint, restores its weights and optimizer state bit for bit (the digest
recorded when it was saved), ends at exactly the requested global step, and its final weights are
bit for bit those of a fault-free run (``weights_sha256``): only the time since that checkpoint
is spent again. Evaluation counts every example of the held-out split once, also when the split
does not divide evenly over the workers and the batch.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import mwms_support as mw
import numpy as np
import psutil
import pytest
import yaml

from kerasdist.keras import state_digest
from kerasdist.keras.backup import temp_dir

pytestmark = pytest.mark.multiprocess
TOTAL_STEPS = 2 * 64
UNEVEN_EVAL = 1025
"""Held-out examples of the reference runs: 513 + 512 over the 2 workers, so worker:0 has one
more batch (of 1 example) than worker:1 at 16 examples per worker and batch."""


def _resumed_exactly(run_dir, saved: dict[str, str], latest: int, reference_run) -> None:
    """The run in ``run_dir`` resumed from checkpoint ``latest`` (the newest complete one),
    restored it bit for bit (``saved``: the digests recorded at save time), ran exactly the
    requested steps and ended with the fault-free reference run's weights, bit for bit."""
    result = mw.metrics(run_dir)
    assert result["start_step"] == latest
    assert result["restore_verified"] is True
    assert result["restored_state_sha256"] == saved[f"ckpt-{latest}"]
    assert result["global_steps"] == TOTAL_STEPS  # no step lost, none replayed
    assert result["weights_sha256"] == mw.metrics(reference_run)["weights_sha256"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Two identical fault-free runs, started together: ``(run_dir_a, run_dir_b, output_a)``."""
    tmp = tmp_path_factory.mktemp("mwms_reference")
    recipes = [mw.linear_recipe(tmp, name, data={"eval_split": f"test[:{UNEVEN_EVAL}]"},
                                model={"metrics": ["mae"]}) for name in ("a", "b")]
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
    # chief-aware outputs: only the chief's run directory content, no per-task leftovers; the
    # run-directory lock is released (empty)
    assert sorted(p.name for p in run_a.iterdir()) == [".kerasdist.lock", "checkpoints", "logs",
                                                       "metrics.json", "model.keras", "run.json"]
    assert (run_a / ".kerasdist.lock").read_bytes() == b""
    assert mw.metrics(run_a)["weights_sha256"] == mw.metrics(run_b)["weights_sha256"]


@pytest.mark.timeout(300)
def test_evaluation_equals_a_single_process_evaluation_with_uneven_shards(reference):
    run_a = reference[0]
    assert UNEVEN_EVAL % 2 and (UNEVEN_EVAL // 2) % 16 == 0  # 513 + 512: one worker has 1 more
    result = mw.metrics(run_a)
    single = mw.evaluate_single_process(run_a, run_a.with_suffix(".yaml"))
    assert sorted(result["evaluation"]) == sorted(single) == ["loss", "mae"]
    for key, value in single.items():
        assert result["evaluation"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
        # the last epoch's validation saw the same weights
        assert result["history"][f"val_{key}"][-1] == pytest.approx(value, rel=1e-5, abs=1e-7)


@pytest.mark.timeout(300)
def test_killed_worker_restarts_and_finishes_with_exact_steps(tmp_path, reference):
    recipe = mw.linear_recipe(tmp_path, "kill")
    run_dir = tmp_path / "kill"
    process = mw.launch(recipe)
    try:
        mw.wait_for_checkpoint(run_dir, process, min_step=10, timeout_s=180)
        chief = mw.worker_process(process.pid, 0)
        # SIGKILL worker:1 while it writes its (scratch) copy of a backup
        mw.kill_mid_save(process, mw.worker_process(process.pid, 1),
                         temp_dir(run_dir / "checkpoints", "worker:1"))
        psutil.wait_procs([chief], timeout=60)  # the attempt is over: no more checkpoints
        saved = state_digest.read(run_dir / "checkpoints")
        latest = max(mw.checkpoint_steps(run_dir))
        out = mw.finish(process, timeout_s=240)
    finally:
        mw.kill_tree(process.pid)
    assert process.returncode == 0, out[-6000:]
    assert "task worker:1 was killed by SIGKILL" in out
    assert "attempt 1/2 failed" in out and "restarting the cluster" in out
    assert not temp_dir(run_dir / "checkpoints", "worker:1").exists()  # scratch of the killed task
    assert 0 < latest < TOTAL_STEPS
    _resumed_exactly(run_dir, saved, latest, reference[0])
    assert mw.epoch_digests(run_dir / "logs" / "worker-0.log")[2] == \
        mw.epoch_digests(run_dir / "logs" / "worker-1.log")[2]
    for faulty, clean in zip(mw.final_weights(run_dir), mw.final_weights(reference[0]),
                             strict=True):
        np.testing.assert_array_equal(faulty, clean)


@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.timeout(360)
def test_chief_killed_while_saving_a_backup_resumes_from_the_previous_one(tmp_path, reference):
    # a backup every 2 steps: many saves to catch one in progress
    recipe = mw.linear_recipe(tmp_path, "save", trainer={"checkpoint": {"every_steps": 2}})
    run_dir = tmp_path / "save"
    checkpoints = run_dir / "checkpoints"
    process = mw.launch(recipe)
    try:
        mw.wait_for_checkpoint(run_dir, process, min_step=2, timeout_s=180)
        other = mw.worker_process(process.pid, 1)
        caught = mw.kill_mid_save(process, mw.worker_process(process.pid, 0), checkpoints,
                                  min_step=10)
        # the chief died inside BackupStore.save: its checkpoint is cut off, the previous one
        # (and its recorded digest) is the newest complete checkpoint
        latest = max(mw.checkpoint_steps(run_dir))
        saved = state_digest.read(checkpoints)
        assert caught == f"ckpt-{latest + 2}", (caught, latest)
        assert not (checkpoints / f"{caught}.index").exists()
        assert (checkpoints / f"{caught}_temp").exists()
        # digests are recorded before each checkpoint's files: the cut-off one has an entry too
        assert sorted(saved) == sorted([caught, *(f"ckpt-{s}" for s in mw.checkpoint_steps(run_dir))])
        psutil.wait_procs([other], timeout=60)
        out = mw.finish(process, timeout_s=240)
    finally:
        mw.kill_tree(process.pid)
    assert process.returncode == 0, out[-6000:]
    assert "task worker:0 was killed by SIGKILL" in out and "restarting the cluster" in out
    _resumed_exactly(run_dir, saved, latest, reference[0])
    assert not [p.name for p in checkpoints.iterdir() if "_temp" in p.name]  # cleaned on restart
    for faulty, clean in zip(mw.final_weights(run_dir), mw.final_weights(reference[0]),
                             strict=True):
        np.testing.assert_array_equal(faulty, clean)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("asynchronous", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["sync", "async"])
def test_sigterm_saves_then_next_launch_finishes(tmp_path, reference, asynchronous):
    """Also with ``trainer.checkpoint.async``: the stop's background write is complete before
    the tasks exit, and the re-run resumes it exactly."""
    recipe = mw.linear_recipe(tmp_path, "term", trainer={
        "epochs": 3, "checkpoint": {"every_steps": 10, "async": asynchronous}})
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
    assert saved < TOTAL_STEPS  # preempted before the end of epoch 2
    digests = state_digest.read(run_dir / "checkpoints")
    again = mw.launch(recipe)
    out = mw.finish(again, timeout_s=240)
    assert again.returncode == 0, out[-6000:]
    result = mw.metrics(run_dir)
    assert result["start_step"] == saved and result["global_steps"] == 3 * 64
    assert result["restore_verified"] is True
    assert result["restored_state_sha256"] == digests[f"ckpt-{saved}"]
    # the preempted run's weights after epoch 2 are bit for bit the fault-free run's
    reference_digest = mw.epoch_digests(reference[0] / "logs" / "worker-0.log")[2]
    for worker in (0, 1):
        assert mw.epoch_digests(run_dir / "logs" / f"worker-{worker}.log")[2] == reference_digest


@pytest.mark.extended
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
    assert re.search(r"task worker:0: lost task worker:1 \((hung, )?localhost:\d+\) during training",
                     log), log[-3000:]
    psutil.wait_procs([p for p in (hung, survivor) if p.is_running()], timeout=15)
    assert mw.no_processes_left([hung.pid, survivor.pid])
    assert not temp_dir(run_dir / "checkpoints", "worker:1").exists()  # the launcher cleaned it


@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.timeout(560)
def test_a_worker_late_at_an_epoch_boundary_does_not_time_out_its_peer(tmp_path, monkeypatch):
    """Issue 33 (8): between a worker's last training step and its validation nothing is
    all-reduced, and a worker of a loaded host can spend longer there than ``strategy.timeout_s``
    (measured 10.4 s with ``timeout_s: 10``): its peer's first validation collective timed out.
    Here worker:1 pauses 8 s before validation with ``timeout_s: 5``: the epoch-boundary barrier
    (3 x timeout_s) absorbs it and the run ends at exactly the requested step."""
    import slow_peer

    from kerasdist.strategies.multi_worker import BOUNDARY_TIMEOUT_FACTOR

    assert 5 < slow_peer.PAUSE_S < BOUNDARY_TIMEOUT_FACTOR * 5
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    recipe = mw.linear_recipe(tmp_path, "late", strategy={"timeout_s": 5},
                              cluster={"max_restarts": 0})
    raw = yaml.safe_load(recipe.read_text())
    raw["callbacks"] = ["slow_peer:PauseBeforeValidation"]
    recipe.write_text(yaml.safe_dump(raw))
    process = mw.launch(recipe)
    try:
        out = mw.finish(process, timeout_s=500)  # a loaded machine
    finally:
        mw.kill_tree(process.pid)
    log = (tmp_path / "late" / "logs" / "worker-1.log").read_text()
    assert "worker:1 pauses" in log
    assert process.returncode == 0, out[-4000:]
    assert mw.metrics(tmp_path / "late")["global_steps"] == TOTAL_STEPS
