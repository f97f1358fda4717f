"""No library call of kerasdist ends the caller's interpreter (issue 33, item 5).

TF can block a parameter-server coordinator for good after a lost task; the supervisor then
*abandons* it (:mod:`kerasdist._exit`). That may end a process kerasdist owns (the CLI, the
network-namespace child), never the user's: a library call runs its coordinator in a child."""

from __future__ import annotations

import os

import pytest
import yaml

from kerasdist import _exit
from kerasdist.errors import TaskFailedError


@pytest.fixture
def exits(monkeypatch):
    codes = []
    monkeypatch.setattr(os, "_exit", codes.append)
    return codes


def test_abandon_in_a_library_call_ends_nothing(exits, caplog):
    assert not _exit.owns_process()
    _exit.abandon(TaskFailedError("worker:1 lost"))
    assert exits == []
    assert "worker:1 lost" in caplog.text and "not ended by kerasdist" in caplog.text


def test_abandon_in_a_process_kerasdist_owns_reports_and_exits_1(exits):
    reported = []
    with _exit.reporting_to(reported.append):
        assert _exit.owns_process()
        _exit.abandon(TaskFailedError("worker:1 lost"))
    assert exits == [1] and str(reported[0]) == "worker:1 lost"


def _ps_recipe(tmp_path):
    import kerasdist

    raw = {"model": {"name": "linear"},
           "data": {"source": {"kind": "synthetic_linear", "num_examples": 256},
                    "train_split": "train", "batch_size": 32},
           "strategy": {"kind": "parameter_server"},
           "cluster": {"kind": "local", "workers": 2, "ps": 1, "allow_network_exposure": True},
           "trainer": {"epochs": 1},
           "output": {"run_dir": str(tmp_path / "run"), "tensorboard": False}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return kerasdist.load_recipe(path)


@pytest.mark.parametrize("callbacks, in_child", [((), True), ((object(),), False)])
def test_an_exposed_ps_library_call_runs_its_coordinator_in_a_child(
        tmp_path, monkeypatch, callbacks, in_child):
    """Exposed (no network namespace), from a library call: the coordinator runs in a child
    process of this one (which can be ended), unless extra callbacks keep it here."""
    import kerasdist
    from kerasdist.launch import isolation
    from kerasdist.launch.clusters.local import LocalKind

    monkeypatch.setenv(isolation.NO_NETNS_ENV, "1")
    went = []
    monkeypatch.setattr(isolation, "run_isolated",
                        lambda recipe, **kw: went.append(("child", kw)) or "child")
    monkeypatch.setattr(LocalKind, "launch_here",
                        lambda self, recipe, **kw: went.append(("here", kw)) or "here")
    assert kerasdist.fit(_ps_recipe(tmp_path), callbacks=callbacks) == \
        ("child" if in_child else "here")
    if in_child:
        assert went[0][1]["isolate"] is False
    with _exit.reporting_to(lambda err: None):  # the CLI: its own process, as before
        assert kerasdist.fit(_ps_recipe(tmp_path), overwrite=True) == "here"


ABANDON_FROM_A_THREAD = """
import sys, threading, time
from kerasdist import _exit, _native_log
from kerasdist.errors import TaskFailedError

_native_log.filter_native_stderr(None)
with _exit.reporting_to(lambda err: print(f"kerasdist: failed: {err}", file=sys.stderr)):
    threading.Thread(target=_exit.abandon, args=(TaskFailedError("lost task ps:0 (unreachable, "
                     "10.77.1.2:4001)"),), daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # a busy main thread (TensorFlow's, in the real case)
        pass
"""


@pytest.mark.timeout(60)
def test_an_abandoned_process_prints_its_failure_through_the_stderr_filter():
    """A process ended by os._exit runs no atexit hook: the failure line written to stderr must
    still pass the native-log filter's pipe (kerasdist._native_log.drain), every time."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "KERASDIST_RAW_STDERR"}
    for _ in range(5):
        done = subprocess.run([sys.executable, "-c", ABANDON_FROM_A_THREAD], capture_output=True,
                              text=True, timeout=50, env=env)
        assert done.returncode == 1, done
        assert "kerasdist: failed: lost task ps:0 (unreachable, 10.77.1.2:4001)" in done.stderr, done
