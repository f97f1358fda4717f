"""The sidecar evaluator (``kerasdist evaluate``) beside a running parameter-server fit."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
pytestmark = pytest.mark.multiprocess


def _json_list(text: str) -> list:
    """The JSON list ``--json`` prints last (log lines come before it)."""
    lines = text.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "[")
    return json.loads("\n".join(lines[start:]))


def _kerasdist(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kerasdist", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO, **kwargs)


@pytest.mark.slow
@pytest.mark.extended  # 111 s in the README suite (2026-11-26): moved out for CI time
@pytest.mark.timeout(480)
def test_watching_evaluator_follows_a_ps_fit_and_agrees_with_a_single_evaluation(tmp_path):
    run_dir = tmp_path / "run"
    sets = ["trainer.epochs=3", "trainer.steps_per_epoch=15", "data.eval_split=test[9000:9600]",
            "output.tensorboard=false", f"output.run_dir={run_dir}"]
    fit = _kerasdist("fit", str(REPO / "recipes" / "mnist_cnn_ps.yaml"),
                     *[a for s in sets for a in ("--set", s)], "--verbose", "2")
    watcher = _kerasdist("evaluate", str(run_dir), "--watch", "--poll-s", "0.3", "--json",
                         "--idle-timeout-s", "400")
    try:
        fit_out, _ = fit.communicate(timeout=420)
        watch_out, _ = watcher.communicate(timeout=60)
    finally:
        fit.kill()
        watcher.kill()
    assert fit.returncode == 0, fit_out[-3000:]
    assert watcher.returncode == 0, watch_out[-3000:]
    watched = _json_list(watch_out)
    assert len(watched) >= 2, watched  # it evaluated checkpoints while the run trained
    assert [r["global_step"] for r in watched] == sorted(r["global_step"] for r in watched)
    assert watched[-1]["global_step"] == 45  # ... and the final one
    once = subprocess.run([sys.executable, "-m", "kerasdist", "evaluate", str(run_dir), "--json"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert once.returncode == 0, once.stdout[-2000:] + once.stderr[-2000:]
    (final,) = _json_list(once.stdout)
    assert final["checkpoint"] == watched[-1]["checkpoint"]
    assert final["accuracy"] == watched[-1]["accuracy"] and final["loss"] == watched[-1]["loss"]
    recorded = json.loads((run_dir / "eval.json").read_text())["evaluations"]
    assert {r["checkpoint"] for r in watched} <= {r["checkpoint"] for r in recorded}
    assert list((run_dir / "tensorboard" / "sidecar_eval").glob("events.out.tfevents*"))


@pytest.mark.timeout(180)
def test_evaluate_once_equals_the_runs_own_held_out_figure(tmp_path):
    run_dir = tmp_path / "run"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"""
model: {{name: linear}}
data: {{source: {{kind: synthetic_linear, num_examples: 400}}, train_split: train,
        eval_split: test, batch_size: 50}}
trainer: {{epochs: 2, verbose: 0}}
output: {{run_dir: '{run_dir}', tensorboard: false}}
""")
    fit = subprocess.run([sys.executable, "-m", "kerasdist", "fit", str(recipe)],
                         capture_output=True, text=True, timeout=150)
    assert fit.returncode == 0, fit.stderr[-2000:]
    once = subprocess.run([sys.executable, "-m", "kerasdist", "evaluate", str(run_dir), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert once.returncode == 0, once.stderr[-2000:]
    (result,) = _json_list(once.stdout)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert result["global_step"] == metrics["global_steps"]
    assert result["loss"] == pytest.approx(metrics["evaluation"]["loss"], rel=1e-6)
    started = time.monotonic()
    bad = subprocess.run([sys.executable, "-m", "kerasdist", "evaluate", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "not a kerasdist run directory" in bad.stderr
    assert time.monotonic() - started < 120
