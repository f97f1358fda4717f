"""The one run lifecycle across strategies: continue a run under another strategy at the exact
step, refuse run directories it cannot restore, refuse bad input before any process starts, and do
not restart a cluster after a deterministic error."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import mwms_support as mw
import pytest
import yaml

pytestmark = [pytest.mark.multiprocess]


def _fit(recipe: Path, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kerasdist", "fit", str(recipe), *args],
                          cwd=mw.REPO, env={**__import__("os").environ, **mw.QUIET}, text=True,
                          capture_output=True, timeout=timeout_s)


def _tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _as_default(recipe: Path) -> Path:
    """The same recipe as one process with the default strategy."""
    raw = yaml.safe_load(recipe.read_text())
    raw["strategy"], raw["cluster"] = {"kind": "default"}, {"kind": "this_process"}
    raw["data"]["auto_shard"] = "auto"  # one input pipeline: nothing to shard
    path = recipe.with_name(recipe.stem + "_default.yaml")
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_default_run_continues_under_multi_worker_at_the_exact_step(tmp_path):
    recipe = mw.linear_recipe(tmp_path, "switch", optimizer={"name": "adam", "learning_rate": 0.05},
                              trainer={"epochs": 1, "checkpoint": {"every_steps": None}})
    first = _fit(_as_default(recipe))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    run_dir = tmp_path / "switch"
    before = json.loads((run_dir / "metrics.json").read_text())
    assert before["strategy"] == "default" and before["global_steps"] == 64
    # Same epochs under multi_worker: restores model + Adam state (assert_existing_objects_matched
    # fails on any unmatched optimizer slot) at step 64 on both workers and only evaluates.
    same = _fit(recipe, "--set", "trainer.epochs=1")
    assert same.returncode == 0, same.stdout[-3000:] + same.stderr[-3000:]
    evaluated = json.loads((run_dir / "metrics.json").read_text())
    assert evaluated["strategy"] == "multi_worker" and evaluated["num_replicas"] == 2
    assert evaluated["start_step"] == evaluated["global_steps"] == 64
    assert evaluated["weights_sha256"] == before["weights_sha256"]  # the saved weights, exactly
    saved = json.loads((run_dir / "checkpoints" / "state-sha256.json").read_text())
    # ... and the optimizer's slots and iterations: every worker compared the restored state with
    # the digest recorded at save time (a mismatch fails the run)
    assert evaluated["restore_verified"] is True
    assert evaluated["restored_state_sha256"] == saved["ckpt-64"]
    for log in (run_dir / "logs").glob("worker-*.log"):
        assert "resuming from checkpoint" in log.read_text() and "(global step 64)" in log.read_text()
    # One more epoch under multi_worker: starts at step 64, ends at 128, both workers identical.
    more = _fit(recipe, "--set", "trainer.epochs=2")
    assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
    after = json.loads((run_dir / "metrics.json").read_text())
    assert after["start_step"] == 64 and after["global_steps"] == 128 and after["initial_epoch"] == 1
    assert json.loads((run_dir / "run.json").read_text())["strategy"] == "multi_worker"


@pytest.mark.timeout(300)
def test_other_model_or_older_schema_is_refused_naming_both(tmp_path):
    recipe = mw.linear_recipe(tmp_path, "foreign")
    run_dir = tmp_path / "foreign"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "ckpt-5.index").write_bytes(b"not ours to touch")
    raw = yaml.safe_load(recipe.read_text())
    old_info = {"fingerprint": {"model": {"name": raw["model"]["name"], "params": {}, "loss": None,
                                          "metrics": None}},
                "recipe": {"strategy": {"kind": "default"}}}
    (run_dir / "run.json").write_text(json.dumps(old_info))
    snapshot = _tree_digest(run_dir)
    older = _fit(recipe)
    assert older.returncode == 2, older.stdout[-2000:] + older.stderr[-2000:]
    assert "schema 'kerasdist-0.1 (no schema version)' (strategy 'default')" in older.stderr
    assert "strategy 'multi_worker' (schema 'kerasdist-step-v2')" in older.stderr
    assert _tree_digest(run_dir) == snapshot and not (run_dir / "logs").exists()
    other = _fit(recipe, "--set", "model.params={units: 2}")
    assert other.returncode == 2 and "different model" in other.stderr, other.stderr[-2000:]
    assert "'units': 2" in other.stderr and "strategy 'multi_worker'" in other.stderr
    assert _tree_digest(run_dir) == snapshot and not (run_dir / "logs").exists()


@pytest.mark.timeout(300)
def test_bad_input_exits_2_before_any_process_starts_or_file_is_written(tmp_path):
    recipe = mw.linear_recipe(tmp_path, "badbatch", cluster={"workers": 3},
                              data={"batch_size": 32})
    result = _fit(recipe)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "must be divisible by the number of replicas (3). Received: batch_size=32" in result.stderr
    assert "local cluster" not in result.stdout  # the launcher never started
    assert not (tmp_path / "badbatch").exists()
    # The parameter-server recipe, with its own bad input: a split smaller than one global batch.
    ps_run = tmp_path / "badps"
    result = _fit(mw.REPO / "recipes" / "mnist_cnn_ps.yaml", "--set", f"output.run_dir={ps_run}",
                  "--set", "data.train_split=test[:50]", "--set", "data.batch_size=64")
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "has 50 examples, fewer than one global batch. Received: batch_size=64" in result.stderr
    assert "local cluster" not in result.stdout and not ps_run.exists()


@pytest.mark.timeout(400)
def test_bad_labels_are_refused_before_any_process_starts(tmp_path):
    recipe = mw.bad_label_recipe(tmp_path, "badlabel")  # train label 12 for 10 classes
    result = _fit(recipe)
    assert result.returncode == 2, (result.stdout + result.stderr)[-4000:]
    assert "12" in result.stderr and "data.train_split" in result.stderr
    assert "local cluster" not in result.stdout and not (tmp_path / "badlabel").exists()


@pytest.mark.timeout(400)
def test_deterministic_error_is_reported_and_not_restarted(tmp_path):
    # A diverging run: the loss becomes non-finite on every worker (class fatal, not a lost peer).
    recipe = mw.linear_recipe(tmp_path, "diverge", optimizer={"name": "sgd", "learning_rate": 1e30},
                              cluster={"max_restarts": 2})
    result = _fit(recipe)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-4000:]
    assert "the training loss became" in result.stderr and "task worker:" in result.stderr
    assert "not restarted" in result.stderr and "restart the cluster" not in result.stderr
    assert "attempt 1/3 failed" in out and "attempt 2/3" not in out
    assert "restarting the cluster" not in out
    status = json.loads((tmp_path / "diverge" / "logs" / "worker-1.status.json").read_text())
    assert status["class"] == "fatal" and status["error"] == "TrainingError"
    assert not list((tmp_path / "diverge" / "checkpoints").glob("ckpt-*.index"))  # nothing saved
