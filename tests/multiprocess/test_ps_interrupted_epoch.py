"""A parameter-server epoch ended by a stop request (here SIGINT, sent by a recipe callback on
the coordinator once a global step is passed) is not a finished epoch: no CSVLogger row and no
validation for it; the checkpoint at the step reached is written, and the re-run writes every
epoch once, from a whole epoch. Asynchronous and synchronous (``strategy.sync``) modes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mwms_support as mw
import pytest
import yaml
from interrupted_epoch_support import MODULE, rows

from kerasdist.errors import EXIT_INTERRUPTED

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(600)]
REPO = Path(__file__).parents[2]
STEPS = 64  # per epoch (more than the calls the coordinator schedules ahead)


def _recipe(tmp_path: Path, sync: bool) -> Path:
    raw = yaml.safe_load((REPO / "recipes" / "linear_ps_sync.yaml").read_text())
    if not sync:
        del raw["strategy"]["sync"]
    raw["trainer"].update(epochs=3, steps_per_epoch=STEPS, checkpoint={})
    raw["output"] = {"run_dir": str(tmp_path / "run"), "tensorboard": False}
    raw["callbacks"] = [
        {"class_name": "CSVLogger", "config": {"filename": "train.csv", "append": True}},
        {"class_name": "kd_n5_interrupt:InterruptAt",
         "config": {"step": STEPS + 4, "record": str(tmp_path / "validations.jsonl"),
                    "once": str(tmp_path / "interrupted")}}]
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def _fit(recipe: Path, tmp_path: Path) -> tuple[int, str]:
    env = {**os.environ, **mw.QUIET,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "kerasdist", "fit", str(recipe)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=500)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_an_interrupted_ps_epoch_is_not_a_finished_epoch(tmp_path, sync):
    (tmp_path / "kd_n5_interrupt.py").write_text(MODULE)
    recipe, run_dir = _recipe(tmp_path, sync), tmp_path / "run"
    code, out = _fit(recipe, tmp_path)
    assert code == EXIT_INTERRUPTED, out[-3000:]
    validations = lambda: [json.loads(v) for v in  # noqa: E731
                           (tmp_path / "validations.jsonl").read_text().splitlines()]
    assert [epoch for epoch, _ in rows(run_dir / "train.csv")] == [0], out[-3000:]
    assert validations() == [STEPS]
    saved = sorted(int(p.stem.split("-")[1]) for p in (run_dir / "checkpoints").glob("ckpt-*.index"))
    assert saved[0] == STEPS and STEPS + 4 <= saved[-1] < 2 * STEPS, saved
    code, out = _fit(recipe, tmp_path)
    assert code == 0, out[-3000:]
    assert [epoch for epoch, _ in rows(run_dir / "train.csv")] == [0, 1, 2]
    assert validations() == [STEPS, 2 * STEPS, 3 * STEPS]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["start_step"] == saved[-1] and metrics["global_steps"] == 3 * STEPS
