"""kerasdist on a real Slurm (Debian's slurm-wlm + munge, started by kerasdist.testing.slurm):
the batch scripts of ``kerasdist export slurm`` submitted as written with ``sbatch``.

Skipped, naming why, where Slurm is not installed or not root (``.ci/run`` installs it on a
Debian machine). One representative run is in the README's suite (a parameter-server job that
ends when its chief ends, 1 node); the 3-node runs and the preemption runs are in the extended
tier. Run alone: ``python -m pytest -q -n 0 -m "extended or not extended"
tests/multiprocess/test_slurm_real.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kerasdist.testing.slurm import SlurmCluster, unavailable_reason

pytest_plugins = ["kerasdist.testing"]

REPO = Path(__file__).parents[2]
pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(unavailable_reason() is not None,
                                 reason=unavailable_reason() or "")]
TASK_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
KERASDIST = f"{sys.executable} -m kerasdist"


def _export(recipe: Path, tmp_path: Path, *args: str) -> Path:
    """``kerasdist export slurm recipe -o job.sh ARGS``, as a user runs it."""
    script = tmp_path / "job.sh"
    done = subprocess.run([sys.executable, "-m", "kerasdist", "export", "slurm", str(recipe),
                           "-o", str(script), "--kerasdist", KERASDIST, *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    return script


def _ps_recipe(tmp_path: Path, **trainer) -> Path:
    raw = yaml.safe_load((REPO / "recipes" / "mnist_cnn_ps.yaml").read_text())
    raw["cluster"].update(threads_per_task=1, port_base=_port_base())
    raw["trainer"].update(trainer)
    raw["output"] = {"run_dir": str(tmp_path / "run"), "tensorboard": False}
    path = tmp_path / "mnist_cnn_ps.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def _port_base() -> int:
    """A port with the next 3 free (tasks on one node use port_base, port_base + 1, ...)."""
    import portpicker

    for _ in range(100):
        port = portpicker.pick_unused_port()
        if port < 65000 and all(portpicker.is_port_free(port + i) for i in range(1, 4)):
            return port
    raise AssertionError("no 4 consecutive free ports")


def _output(tmp_path: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("*-*.out")))


def _run(slurm: SlurmCluster, script: Path, tmp_path: Path, timeout_s: float) -> dict:
    job = slurm.sbatch(script, cwd=tmp_path, env=TASK_ENV)
    try:
        info = slurm.wait(job, timeout_s=timeout_s)
    except Exception:
        print(_output(tmp_path)[-6000:])
        raise
    info["elapsed"] = time.monotonic()
    return info


@pytest.mark.timeout(120)
def test_the_fixture_runs_a_real_slurm_and_leaves_nothing(tmp_path):
    """The fixture's cluster answers srun and sbatch; after it, no daemon, job process or
    namespace of it is left."""
    from kerasdist.testing.hosts import leftovers

    with SlurmCluster(1, work_dir=tmp_path / "slurm") as slurm:
        out = slurm.command(["srun", "-n", "2", "printenv", "SLURM_PROCID"], timeout_s=60).stdout
        assert sorted(out.split()) == ["0", "1"]
        script = tmp_path / "sleep.sh"
        script.write_text("#!/bin/bash\nsleep 300\n")
        job = slurm.sbatch(script, cwd=tmp_path)
        assert slurm.wait(job, timeout_s=30, states={"RUNNING"})["JobState"] == "RUNNING"
        suffix = slurm.hosts.suffix if slurm.hosts else None
    assert slurm.stray_pids() == []
    if suffix:
        assert leftovers(suffix) == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_parameter_server_job_ends_when_its_chief_ends(tmp_path, slurm_cluster):
    """The exported script of a parameter-server recipe (chief, 1 ps, 2 workers on one node):
    the chief trains and releases the servers, every task exits 0 (srun's exit code is the
    largest of its tasks', the script's ``set -e`` makes it the job's), the job is COMPLETED
    (before kerasdist.cluster.slurm_job the ps and workers served on and the job never ended)."""
    recipe = _ps_recipe(tmp_path, epochs=1, steps_per_epoch=60)
    script = _export(recipe, tmp_path, "--nodes", "1")
    started = time.monotonic()
    info = _run(slurm_cluster, script, tmp_path, timeout_s=780)
    out = _output(tmp_path)
    print(f"\njob {info['JobId']}: {info['JobState']} exit {info['ExitCode']} after "
          f"{time.monotonic() - started:.0f} s")
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", out[-6000:]
    assert "released 3 of 3 server task(s)" in out, out[-6000:]
    result = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert result["global_steps"] == 60 and result["evaluation"]["accuracy"] > 0.8, result
