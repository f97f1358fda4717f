"""Tasks forked from the launching command (:mod:`kerasdist.launch.forking`, issue 42 item 8): a
local run forks its check, its launcher (isolated: into a private network namespace,
:mod:`kerasdist.launch.forking.netns`) and its tasks from the process that imported TensorFlow once,
trains to the same weights as started tasks do, and bad input still starts nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mwms_support as mw
import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

EXPOSED = {"KERASDIST_NO_NETNS": "1"}  # the launcher runs in the command's own process


def _fit(recipe: Path, timeline: Path, *, fork: bool,
         exposed: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, **mw.QUIET, **(EXPOSED if exposed else {}),
           "KERASDIST_TIMELINE": str(timeline), "KERASDIST_FORK_TASKS": "1" if fork else "0"}
    return subprocess.run([sys.executable, "-m", "kerasdist", "fit", str(recipe)], cwd=mw.REPO,
                          env=env, text=True, capture_output=True, timeout=400)


def _marks(timeline: Path, name: str) -> set[str]:
    if not timeline.is_file():
        return set()
    return {m["task"] for m in map(json.loads, timeline.read_text().splitlines())
            if m["mark"] == name}


def _weights(run_dir: Path) -> str:
    return mw.metrics(run_dir)["weights_sha256"]  # the chief's final weights


@pytest.mark.timeout(900)
def test_forked_tasks_train_to_the_weights_started_tasks_reach(tmp_path):
    """Three ways, the same weights: isolated (the default where a network namespace can be made:
    the launcher forked into one, its tasks forked from it), exposed and forked (the launcher is
    the command), and started tasks (``KERASDIST_FORK_TASKS=0``, isolated)."""
    from kerasdist.launch import isolation

    ways = {"isolated, forked": (True, False), "exposed, forked": (True, True)}
    if isolation.unavailable_reason() is None:
        ways["isolated, started"] = (False, False)
    else:  # the reference is then an exposed run of started tasks
        ways = {"exposed, forked": (True, True), "exposed, started": (False, True)}
    runs = {}
    for number, (way, (fork, exposed)) in enumerate(ways.items()):
        name = f"way{number}"
        recipe = mw.linear_recipe(tmp_path, name, cluster={"allow_network_exposure": exposed})
        timeline = tmp_path / f"{name}.jsonl"
        result = _fit(recipe, timeline, fork=fork, exposed=exposed)
        out = result.stdout + result.stderr
        assert result.returncode == 0, f"{way}: {out[-4000:]}"
        runs[way] = (_weights(tmp_path / name), _marks(timeline, "forked"),
                     _marks(timeline, "launcher forked"))
    for way, (_, tasks, launcher) in runs.items():
        forked = way.endswith("forked")
        assert tasks == ({"worker:0", "worker:1"} if forked else set()), way  # tasks forked or not
        assert launcher == ({"cli"} if way == "isolated, forked" else set()), way
    assert len({weights for weights, _, _ in runs.values()}) == 1, runs  # the same weights


@pytest.mark.timeout(600)
def test_a_forked_check_refuses_bad_labels_as_before_and_starts_nothing(tmp_path):
    errors = {}
    for fork in (True, False):
        name = f"bad{int(fork)}"
        recipe = mw.bad_label_recipe(tmp_path, name, allow_network_exposure=True)
        timeline = tmp_path / f"{name}.jsonl"
        result = _fit(recipe, timeline, fork=fork)
        assert result.returncode == 2, (result.stdout + result.stderr)[-4000:]
        assert not (tmp_path / name).exists()  # nothing written
        assert not _marks(timeline, "forked") and not any(  # no task started
            m.startswith("spawn") for m in map(lambda line: json.loads(line)["mark"],
                                               timeline.read_text().splitlines()))
        errors[fork] = [line for line in result.stderr.splitlines()
                        if line.startswith("kerasdist: error:")]
    assert errors[True] and errors[True] == errors[False]
    assert "12" in errors[True][0] and "data.train_split" in errors[True][0]
