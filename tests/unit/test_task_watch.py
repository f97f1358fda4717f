"""A parameter-server task's own watch on clusters kerasdist does not launch
(:mod:`kerasdist.cluster.watch`), without processes: a task unreachable or hung for
``timeout_s`` is lost; an answer resets its clock; a refused port is not a loss (issue 31)."""

from __future__ import annotations

import threading
import time

from kerasdist.cluster.spec import local_cluster
from kerasdist.cluster.watch import TaskWatch, lost_error, watched_tasks
from kerasdist.errors import PEER_LOST, classify, exit_code
from kerasdist.launch.status import STATUS_ENV


def _watch(states: dict, timeout_s: float = 0.4):
    found = threading.Event()
    lost = []

    def on_lost(*args):
        lost.append(args)
        found.set()

    addresses = {name: f"10.77.1.{i + 1}:400{i}" for i, name in enumerate(states)}
    by_address = {a: n for n, a in addresses.items()}
    watch = TaskWatch(addresses, timeout_s, on_lost=on_lost, period_s=0.02,
                      prober=lambda address, timeout_s: states[by_address[address]])
    return watch, lost, found, addresses


def test_a_task_unreachable_for_the_timeout_is_lost_once_with_its_state_and_address():
    states = {"ps:0": "alive", "worker:0": "dead", "worker:1": "unreachable"}
    watch, lost, found, addresses = _watch(states)
    started = time.monotonic()
    with watch:
        assert found.wait(5)
        took = time.monotonic() - started
        time.sleep(0.1)
    assert len(lost) == 1
    name, state, address, silent = lost[0]
    assert (name, state, address) == ("worker:1", "unreachable", addresses["worker:1"])
    assert silent >= 0.4 and took >= 0.4


def test_an_answer_resets_the_clock_and_a_refused_port_is_never_lost():
    states = {"worker:0": "hung", "ps:0": "dead"}
    watch, lost, found, _ = _watch(states, timeout_s=0.5)
    with watch:
        for _ in range(6):  # hung for 0.3 s, then one answer: never 0.5 s in a row
            time.sleep(0.3)
            states["worker:0"] = "alive"
            time.sleep(0.05)
            states["worker:0"] = "hung"
        assert not found.is_set()
        states["worker:0"] = "alive"
        time.sleep(0.7)
    assert lost == []


def test_the_failure_names_the_task_and_is_a_restartable_peer_loss():
    err = lost_error("chief:0", 30, "ps:0", "unreachable", "10.77.1.2:4001", 34.6)
    text = str(err)
    assert "task chief:0: lost task ps:0 (unreachable, 10.77.1.2:4001)" in text
    assert "strategy.task_timeout_s=30" in text and "35 s" in text
    assert err.lost_tasks == ["ps:0"]
    assert classify(err) == PEER_LOST and exit_code(classify(err)) == 1


def test_the_chief_watches_ps_and_workers_a_worker_the_ps_a_ps_nothing(monkeypatch):
    monkeypatch.delenv(STATUS_ENV, raising=False)
    spec = local_cluster(workers=2, ps=1, chief=True)
    addresses = {f"{job}:{i}": spec.for_task(job, i).address
                 for job in ("ps", "worker") for i in range(spec.num(job))}
    assert watched_tasks(spec.for_task("chief", 0), 60.0) == addresses
    assert watched_tasks(spec.for_task("worker", 1), 60.0) == {"ps:0": addresses["ps:0"]}
    assert watched_tasks(spec.for_task("ps", 0), 60.0) == {}
    assert watched_tasks(spec.for_task("chief", 0), None) == {}  # task_timeout_s: null
    # under kerasdist's own launcher, which watches every task itself (kerasdist.cluster.watch.HangWatch)
    monkeypatch.setenv(STATUS_ENV, "/nonexistent/status.json")
    assert watched_tasks(spec.for_task("chief", 0), 60.0) == {}


def test_an_empty_watch_starts_no_thread():
    watch = TaskWatch({}, 1.0, on_lost=lambda *a: None)
    with watch:
        assert not watch._thread.is_alive()
