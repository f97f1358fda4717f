"""A run's entry checks (the run directory's path, the tracking store's probe, the complete-run
notice) are made exactly once per run, where it enters (``cluster.traits.entry``): by the command
that starts a local cluster (its tasks are told, and do not repeat them), by the task itself
otherwise (``this_process``, the chief of a ``tf_config`` cluster). Counted across every process
of the run from the ``KERASDIST_TIMELINE`` marks ``entry checks`` and ``tracking probe``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import mwms_support as mw
import portpicker
import pytest
import yaml

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                                 reason="needs kerasdist[mlflow]")]

TRACKED = {"run_dir": None, "tensorboard": False, "tracking": {"kind": "mlflow"}}


def _fit(recipe: Path, timeline: Path, **env) -> dict[str, int]:
    """Run ``kerasdist fit recipe``; the number of processes that made each mark."""
    done = subprocess.run(
        [sys.executable, "-m", "kerasdist", "fit", str(recipe)], cwd=mw.REPO, text=True,
        capture_output=True, timeout=400,
        env={**os.environ, **mw.QUIET, "MLFLOW_DISABLE_TELEMETRY": "true",
             "KERASDIST_TIMELINE": str(timeline), **env})
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    marks = [json.loads(line) for line in timeline.read_text().splitlines()]
    return Counter(m["mark"] for m in marks)


def _recipe(tmp_path: Path, *, strategy: dict, cluster: dict) -> Path:
    raw = yaml.safe_load(mw.linear_recipe(tmp_path, "run").read_text())
    raw.update(strategy=strategy, cluster=cluster)
    raw["data"].update(auto_shard="auto")
    raw["trainer"].update(epochs=1)
    raw["output"] = {**TRACKED, "run_dir": str(tmp_path / "run")}
    path = tmp_path / "once.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def _assert_once(counts: dict[str, int], run_dir: Path) -> None:
    assert counts["tracking probe"] == 1, counts
    assert counts["entry checks"] == 1, counts
    assert (run_dir / "tracking.json").is_file() and (run_dir / "model.keras").is_file()


@pytest.mark.timeout(300)
def test_one_process_run_checks_once(tmp_path):
    recipe = _recipe(tmp_path, strategy={"kind": "default"}, cluster={"kind": "this_process"})
    _assert_once(_fit(recipe, tmp_path / "timeline.jsonl"), tmp_path / "run")


@pytest.mark.timeout(300)
def test_the_chief_of_a_tf_config_cluster_checks_once(tmp_path):
    recipe = _recipe(tmp_path, strategy={"kind": "multi_worker", "timeout_s": 20},
                     cluster={"kind": "tf_config"})
    tf_config = {"cluster": {"worker": [f"localhost:{portpicker.pick_unused_port()}"]},
                 "task": {"type": "worker", "index": 0}}
    counts = _fit(recipe, tmp_path / "timeline.jsonl", TF_CONFIG=json.dumps(tf_config))
    _assert_once(counts, tmp_path / "run")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_local_cluster_checks_once_in_its_launcher_and_not_in_its_tasks(tmp_path):
    recipe = _recipe(tmp_path, strategy={"kind": "multi_worker", "timeout_s": 20},
                     cluster={"kind": "local", "workers": 2, "threads_per_task": 1})
    counts = _fit(recipe, tmp_path / "timeline.jsonl")
    assert counts["session"] == 2, counts  # both workers ran the lifecycle
    _assert_once(counts, tmp_path / "run")
