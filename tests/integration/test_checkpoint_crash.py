"""A process killed while writing a checkpoint leaves the previous checkpoint as the one resumed.

The child saves checkpoint 1 through kerasdist's own path (``restore_checkpoint`` +
``EpochCheckpoint``), changes the weights, and starts checkpoint 2 of a ~256 MiB model; the test
SIGKILLs it while that save is being written, then resumes in a fresh process.
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
from kerasdist.config import validate_recipe
from kerasdist.training.callbacks import EpochCheckpoint
from kerasdist.training.fit import restore_checkpoint

run_dir, mode = Path(sys.argv[1]), sys.argv[2]
recipe = validate_recipe({"model": {"name": "linear"},
                          "data": {"source": "synthetic_linear", "train_split": "train",
                                   "eval_split": "test", "num_examples": 64, "batch_size": 8},
                          "trainer": {"epochs": 3}, "output": {"run_dir": str(run_dir)}})
model = keras.Sequential([keras.Input((8192,)), keras.layers.Dense(8192, use_bias=False)])
model.compile(optimizer="sgd", loss="mse")
manager, epoch_var, initial = restore_checkpoint(recipe, model, run_dir, resumable=True,
                                                 overwrite=False)
if mode == "resume":
    print(json.dumps({"initial_epoch": initial, "first": float(model.weights[0][0, 0]),
                      "latest": manager.latest_checkpoint}), flush=True)
    sys.exit(0)
saver = EpochCheckpoint(manager, epoch_var)
model.weights[0].assign(np.full((8192, 8192), 1.0, np.float32))
saver.on_epoch_end(0)
model.weights[0].assign(np.full((8192, 8192), 2.0, np.float32))
print("SAVING", flush=True)
saver.on_epoch_end(1)
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
        time.sleep(0.1)  # inside the ~256 MiB write
        child.send_signal(signal.SIGKILL)
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
    assert state["initial_epoch"] == 1
    assert state["first"] == 1.0  # checkpoint 1's weights, not a mix with the cut-off save
    assert state["latest"].endswith("ckpt-1")
