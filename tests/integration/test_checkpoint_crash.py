"""A process killed while writing a checkpoint leaves the previous checkpoint as the one resumed.

The child saves checkpoint 1 through kerasdist's one checkpoint store (``BackupStore``, used by
every strategy), changes the weights, and starts checkpoint 2 of a ~256 MiB model; the test
SIGKILLs it while that save is being written, then resumes in a fresh process, which restores
checkpoint 1 bit for bit (its state digest equals the one recorded when it was saved).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CHILD = r"""
import json, sys
from pathlib import Path
import keras, numpy as np
from kerasdist.keras.backup import BackupStore

run_dir, mode = Path(sys.argv[1]), sys.argv[2]
model = keras.Sequential([keras.Input((8192,)), keras.layers.Dense(8192, use_bias=False)])
model.compile(optimizer="sgd", loss="mse")
model.optimizer.build(model.trainable_variables)
store = BackupStore(model=model, directory=run_dir / "checkpoints", is_chief=True,
                    task_name="chief:0", max_to_keep=3, steps_per_epoch=1)
if mode == "resume":
    step = store.restore()
    from kerasdist.keras import state_digest
    print(json.dumps({"step": step, "first": float(model.weights[0][0, 0]),
                      "all_first": bool(np.all(model.weights[0].numpy() == 1.0)),
                      "latest": store._manager.latest_checkpoint,
                      "verified": store.restore_verified, "digest": store.restored_digest,
                      "recorded": state_digest.read(store.directory)}), flush=True)
    sys.exit(0)
model.weights[0].assign(np.full((8192, 8192), 1.0, np.float32))
model.optimizer.iterations.assign(1)
store.save(1)
model.weights[0].assign(np.full((8192, 8192), 2.0, np.float32))
model.optimizer.iterations.assign(2)
print("SAVING", flush=True)
store.save(2)
print("SAVED", flush=True)
"""


def _child(run_dir, mode):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", CHILD, str(run_dir), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)


def test_sigkill_during_checkpoint_save_resumes_from_the_previous_one(tmp_path):
    run_dir = tmp_path / "run"
    child = _child(run_dir, "train")
    try:
        for line in child.stdout:
            if line.strip() == "SAVING":
                break
        else:
            pytest.fail(f"child ended before saving checkpoint 2 (exit {child.wait()})")
        deadline = time.monotonic() + 60  # the digest is recorded first, then TF writes files
        while not any(p.name.startswith("ckpt-2") for p in (run_dir / "checkpoints").iterdir()):
            assert time.monotonic() < deadline and child.poll() is None, "no ckpt-2 write seen"
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)  # inside the ~256 MiB write
        rest = child.stdout.read()
    finally:
        child.kill()
        child.wait()
    assert "SAVED" not in rest, "the save finished before the kill: the test proved nothing"
    ckpt_dir = run_dir / "checkpoints"
    # Checkpoint 2 was cut off mid-write; the pointer still names checkpoint 1.
    assert not (ckpt_dir / "ckpt-2.index").exists()
    assert any(p.name.startswith("ckpt-2") for p in ckpt_dir.iterdir()), sorted(ckpt_dir.iterdir())

    resumed = _child(run_dir, "resume")
    out, _ = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, out
    state = json.loads(out.strip().splitlines()[-1])
    assert state["step"] == 1  # the global step (optimizer.iterations) of checkpoint 1
    assert state["first"] == 1.0  # checkpoint 1's weights, not a mix with the cut-off save
    assert state["latest"].endswith("ckpt-1")
    # bit for bit: weights + optimizer state hash to the digest recorded when checkpoint 1 was
    # saved (the cut-off save's digest, recorded before its files, belongs to no checkpoint)
    assert state["all_first"] and state["verified"] is True
    assert state["recorded"]["ckpt-1"] == state["digest"]
    assert state["recorded"]["ckpt-2"] != state["digest"]
