"""Time to first step (issue 42, item 8): the local launcher starts its tasks without importing
TensorFlow or Keras (each import is seconds of a run's start, paid again by every task), and the
start-up timeline (:mod:`kerasdist._timeline`) records marks only when asked."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kerasdist import _timeline

REPO = Path(__file__).resolve().parents[2]

LAUNCHER = textwrap.dedent("""
    import sys
    from kerasdist.config.loader import load_recipe
    from kerasdist.launch import coordinator, peers

    mw = load_recipe("recipes/linear_mwms.yaml", ["output.run_dir=" + sys.argv[1] + "/mw"])
    ps = load_recipe("recipes/linear_mwms.yaml", ["output.run_dir=" + sys.argv[1] + "/ps",
                                                  "strategy={kind: parameter_server}",
                                                  "cluster.ps=1"])
    specs = [peers.launch_spec(mw, overwrite=False), coordinator.launch_spec(ps)]
    print(sorted(m for m in ("tensorflow", "keras") if m in sys.modules))
""")


@pytest.mark.timeout(120)
def test_the_local_launcher_plans_its_tasks_without_importing_tensorflow_or_keras(tmp_path):
    out = subprocess.run([sys.executable, "-c", LAUNCHER, str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_marks_are_written_only_when_the_timeline_is_asked_for(tmp_path, monkeypatch):
    monkeypatch.delenv(_timeline.ENV, raising=False)
    _timeline.mark("nothing")  # no file named: no-op
    path = tmp_path / "timeline.jsonl"
    monkeypatch.setenv(_timeline.ENV, str(path))
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {}, "task": {"type": "worker",
                                                                        "index": 1}}))
    monkeypatch.setattr(_timeline, "_started", set())
    monkeypatch.setattr(_timeline, "_named", {})  # a session earlier in this process named it
    before = time.time()
    _timeline.mark("strategy")
    _timeline.mark("first step")
    marks = [json.loads(line) for line in path.read_text().splitlines()]
    assert [m["mark"] for m in marks] == ["process", "strategy", "first step"]
    assert {m["task"] for m in marks} == {"worker:1"}
    started = marks[0]["t"]
    assert started <= before and before - started < 3600  # this process's start, from /proc
    assert before <= marks[1]["t"] <= marks[2]["t"] <= time.time()
    _timeline.set_task("chief:0")  # a PS coordinator, which has no TF_CONFIG of its own
    _timeline.mark("session")
    assert json.loads(path.read_text().splitlines()[-1])["task"] == "chief:0"


def test_process_start_time_agrees_with_a_child_started_now():
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        started = _timeline.process_start_time(child.pid)
    finally:
        child.kill()
        child.wait()
    assert started is not None and abs(started - before) < 0.5, (started, before)
