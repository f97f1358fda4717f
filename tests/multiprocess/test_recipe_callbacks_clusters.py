"""Recipe callbacks on the cluster kinds whose tasks kerasdist does not start itself: a Slurm job
step (a fake ``srun`` here: one ``kerasdist fit`` per rank with the ``SLURM_*`` variables Slurm
sets) and Ray (a local Ray started by the run). On both, an EarlyStopping stops every worker at the
same epoch, only the chief writes CSVLogger's file, and a TensorBoard with ``profile_batch``
writes a profile (``plugins/profile``) under MultiWorkerMirroredStrategy."""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import mwms_support as mw
import portpicker
import pytest
import yaml

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.extended]

# min_delta 1e9: no epoch improves enough, so EarlyStopping stops after epoch 1 + patience 1
CALLBACKS = [{"class_name": "EarlyStopping", "config": {"monitor": "loss", "patience": 1,
                                                         "min_delta": 1.0e9}},
             {"class_name": "CSVLogger", "config": {"filename": "train.csv"}},
             {"class_name": "TensorBoard", "config": {"profile_batch": 3}}]
DONE = r"done at global step (\d+); weights sha256 ([0-9a-f]{64})"


def _recipe(tmp_path: Path, name: str, cluster: dict) -> Path:
    path = mw.linear_recipe(tmp_path, name, trainer={"epochs": 3})
    raw = yaml.safe_load(path.read_text())
    raw["cluster"] = cluster
    raw["callbacks"] = CALLBACKS
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def _consecutive_free_ports() -> int:
    """A port ``p`` with ``p + 1`` free too (Slurm's resolver numbers a node's tasks from
    ``cluster.port_base``)."""
    for _ in range(50):
        port = portpicker.pick_unused_port()
        if port < 65535 and portpicker.is_port_free(port + 1):
            return port
    raise AssertionError("no two consecutive free ports")


def _fake_srun(recipe: Path, tmp_path: Path, ntasks: int) -> list[subprocess.Popen]:
    """What ``srun --ntasks=N --nodes=1 kerasdist fit recipe`` starts: N tasks on this node
    (``localhost``), each with its rank; each with a run directory of its own (a node's disk)."""
    processes = []
    for rank in range(ntasks):
        env = {**os.environ, **mw.QUIET, "SLURM_PROCID": str(rank),
               "SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_STEP_NODELIST": "localhost",
               "SLURM_STEP_TASKS_PER_NODE": str(ntasks)}
        out = open(tmp_path / f"rank-{rank}.out", "w")  # noqa: SIM115 - closed by _finish
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "kerasdist", "fit", str(recipe), "--verbose", "2", "--set",
             f"output.run_dir={tmp_path / f'run-{rank}'}"],
            cwd=mw.REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True))
        out.close()
    return processes


def _check_callbacks(chief_run_dir: Path, out: str, *, workers: int) -> None:
    metrics = mw.metrics(chief_run_dir)
    steps = metrics["steps_per_epoch"]
    assert metrics["global_steps"] == 2 * steps, metrics  # stopped after epoch 2 of 3
    done = re.findall(DONE, out)
    assert len(done) == workers and {int(s) for s, _ in done} == {2 * steps}, out[-4000:]
    assert {h for _, h in done} == {metrics["weights_sha256"]}  # every worker, same weights
    with open(chief_run_dir / "train.csv") as handle:
        assert [row["epoch"] for row in csv.DictReader(handle)] == ["0", "1"]
    profiles = list((chief_run_dir / "tensorboard").glob("**/plugins/profile/*/*.xplane.pb"))
    assert profiles, sorted(str(p) for p in (chief_run_dir / "tensorboard").rglob("*"))


@pytest.mark.timeout(600)
def test_recipe_callbacks_on_a_slurm_step_of_two_workers(tmp_path):
    cluster = {"kind": "slurm", "port_base": _consecutive_free_ports(), "threads_per_task": 1}
    processes = _fake_srun(_recipe(tmp_path, "slurm", cluster), tmp_path, 2)
    try:
        for process in processes:
            process.wait(timeout=450)
    finally:
        for process in processes:
            mw.kill_tree(process.pid)
    out = "\n".join((tmp_path / f"rank-{r}.out").read_text() for r in (0, 1))
    assert [p.returncode for p in processes] == [0, 0], out[-6000:]
    _check_callbacks(tmp_path / "run-0", out, workers=2)
    assert not (tmp_path / "run-1" / "train.csv").exists()  # one writer: the chief
    assert not list((tmp_path / "run-1").glob("tensorboard/**/*.xplane.pb"))


@pytest.mark.timeout(900)
def test_recipe_callbacks_on_ray(tmp_path):
    if importlib.util.find_spec("ray") is None:  # (importing ray here would set RAY_* variables)
        pytest.skip("ray is not installed")
    cluster = {"kind": "ray", "workers": 2, "cpus_per_worker": 1, "gpus_per_worker": 0,
               "threads_per_task": 1}
    process = mw.launch(_recipe(tmp_path, "ray", cluster))
    try:
        out = mw.finish(process, timeout_s=800)
    finally:
        mw.kill_tree(process.pid)
    assert process.returncode == 0, out[-6000:]
    _check_callbacks(tmp_path / "ray", out, workers=2)
