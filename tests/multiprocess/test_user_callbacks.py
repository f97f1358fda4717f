"""Users' own ``keras.callbacks.BackupAndRestore`` and ``ModelCheckpoint``, unchanged, given one
shared path, under ``kerasdist launch --workers 2`` (which applies ``kerasdist.enable()``, hence
:mod:`kerasdist._compat.keras_chief_callbacks`).

Without that mend both tests fail on the first save: every worker writes the same files and one
dies of h5py's "unable to lock file" (checked by running them with the mend's install line
removed); the launcher classes it as fatal and does not restart.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).parents[2]
SCRIPT = REPO / "tests" / "scripts" / "mwms_backup_restore.py"
DATA = REPO / "kerasdist" / "data" / "sample"
pytestmark = pytest.mark.multiprocess


def _launch_argv(tmp_path: Path, *args: str) -> list[str]:
    from kerasdist.launch.isolation import unavailable_reason

    exposure = ["--allow-network-exposure"] if unavailable_reason() is not None else []
    return [sys.executable, "-m", "kerasdist", "launch", "--threads-per-task", "1", "--log-dir",
            str(tmp_path / "logs"), "--workers", "2", "--max-restarts", "1", *exposure,
            str(SCRIPT), str(DATA), str(tmp_path / "out"), *args]


def _env(tmp_path: Path) -> dict[str, str]:
    """The tasks' temp folder, so the test can see the non-chief's private copies are gone."""
    (tmp_path / "tmp").mkdir()
    return {**os.environ, "TMPDIR": str(tmp_path / "tmp")}


def _check_outputs(tmp_path: Path, *, killed: int = 0) -> None:
    """Both workers end with the same weights; the chief's checkpoint holds them; nothing of the
    saves is left behind (staging folders, the backup after a clean end, non-chief copies but
    those of ``killed`` SIGKILLed tasks, which cannot clean up)."""
    import keras

    out = tmp_path / "out"
    final = [np.load(out / f"final-worker-{i}.npy") for i in (0, 1)]
    np.testing.assert_array_equal(final[0], final[1])
    saved = keras.saving.load_model(out / "checkpoint" / "model.keras", compile=False)
    np.testing.assert_array_equal(np.concatenate([w.ravel() for w in saved.get_weights()]),
                                  final[0])
    assert os.listdir(out / "checkpoint") == ["model.keras"]
    assert not (out / "backup").exists()  # deleted by the chief at the successful end
    assert len(list((tmp_path / "tmp").glob("kerasdist-*"))) <= killed


def _starts(tmp_path: Path, name: str) -> list[int]:
    return [int(line) for line in (tmp_path / "out" / f"started-{name}.txt").read_text().split()]


@pytest.mark.timeout(150)
def test_shared_path_callbacks_write_valid_files_from_two_workers(tmp_path):
    done = subprocess.run(_launch_argv(tmp_path, "3"), cwd=tmp_path, capture_output=True,
                          text=True, timeout=140, env=_env(tmp_path))
    log = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode == 0, log
    assert "restarting" not in done.stdout + done.stderr, log
    assert _starts(tmp_path, "worker-0") == _starts(tmp_path, "worker-1") == [0]
    _check_outputs(tmp_path)


def _kill_after_first_backup(tmp_path: Path, proc: subprocess.Popen, limit: float) -> int:
    """SIGKILL worker:1 once the chief's backup records a finished epoch; returns that epoch."""
    metadata = tmp_path / "out" / "backup" / "training_metadata.json"
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        if metadata.exists():  # written atomically: complete whenever it exists
            epoch = json.loads(metadata.read_text())["epoch"]
            pid = int((tmp_path / "out" / "pid-worker-1").read_text())
            os.kill(pid, signal.SIGKILL)
            return epoch
        time.sleep(0.05)
    raise AssertionError(f"no backup within {limit} s (launcher exit code {proc.poll()})")


@pytest.mark.slow  # about 28 s on a quiet machine
@pytest.mark.timeout(200)
def test_a_killed_worker_resumes_from_the_shared_backup(tmp_path):
    proc = subprocess.Popen(_launch_argv(tmp_path, "6", "0"), cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(tmp_path))
    try:
        backed_up = _kill_after_first_backup(tmp_path, proc, limit=90)
        out, _ = proc.communicate(timeout=100)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-6000:]
    assert "task worker:1 was killed by SIGKILL" in out and "restarting the cluster" in out, out
    first, resumed = _starts(tmp_path, "worker-0")
    assert first == 0 and resumed >= backed_up >= 1, out[-4000:]
    assert _starts(tmp_path, "worker-1") == [0, resumed]
    _check_outputs(tmp_path, killed=1)
