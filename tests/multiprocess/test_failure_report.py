"""A failed run ends its console output with one paragraph naming the task, the step and whether
a re-run resumes, without kerasdist's traceback; a transient TensorFlow RPC error in a
parameter-server coordinator counts as a lost task for ``cluster.max_restarts`` (issue 39)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from tests.multiprocess import mwms_support as mw

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


@pytest.fixture
def importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))


def _recipe(tmp_path: Path, name: str, callbacks: list, strategy: dict | None = None,
            **sections) -> Path:
    recipe = mw.linear_recipe(tmp_path, name, **sections)
    raw = yaml.safe_load(recipe.read_text())
    raw["callbacks"] = callbacks
    if strategy is not None:
        raw["strategy"] = strategy
    raw["trainer"]["epochs"] = 3
    raw["data"]["source"]["num_examples"] = 512
    recipe.write_text(yaml.safe_dump(raw))
    return recipe


def _run(recipe: Path, timeout_s: float) -> tuple[int, str]:
    process = mw.launch(recipe)
    try:
        out = mw.finish(process, timeout_s=timeout_s)
    finally:
        mw.kill_tree(process.pid)
    return process.returncode, out


@pytest.mark.timeout(420)
def test_a_workers_own_error_ends_with_a_paragraph_that_says_it_is_not_retryable(
        tmp_path, importable):
    recipe = _recipe(tmp_path, "broken", ["flaky_peer:BrokenOnWorker1"],
                     cluster={"max_restarts": 1})
    code, out = _run(recipe, 360)
    assert code == 1, out[-3000:]
    last = out.rstrip().splitlines()[-5:]
    text = "\n".join(last)
    assert last[0] == "kerasdist: the run failed.", out[-3000:]
    assert "task worker:1" in text and "ValueError" in text, text
    step = re.search(r"latest checkpoint is at global step (\d+)", text)
    assert step and 0 < int(step.group(1)) <= 32, text  # 16 steps per epoch, failed after 2
    assert "retryable: no" in text and f"resume from global step {step.group(1)}" in text, text
    assert str(tmp_path / "broken" / "logs") in text, text
    assert "Traceback" not in out.split("kerasdist: failed:")[-1], out[-3000:]
    assert "restarting the cluster" not in out  # a deterministic error is not restarted


@pytest.mark.timeout(480)
def test_a_transient_rpc_error_of_the_coordinator_restarts_the_cluster_and_resumes(
        tmp_path, importable):
    marker = tmp_path / "raised"
    recipe = _recipe(tmp_path, "ps", [{"class_name": "flaky_peer:TransientRPCOnce",
                                       "config": {"marker": str(marker)}}],
                     strategy={"kind": "parameter_server"},
                     cluster={"max_restarts": 1, "ps": 1, "workers": 2},
                     trainer={"steps_per_epoch": 8})
    code, out = _run(recipe, 420)
    assert marker.exists(), out[-3000:]
    assert code == 0, out[-3000:]
    assert "restarting the cluster (0 restart(s) left)" in out, out[-3000:]
    assert mw.metrics(tmp_path / "ps")["global_steps"] == 24
