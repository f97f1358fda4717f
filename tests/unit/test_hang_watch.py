"""The supervisor's hung-task rule (:class:`kerasdist.cluster.watch.HangWatch`), without processes: a server
task is lost once it has answered no probe for ``timeout_s``; only 'hung' counts (issue 33, 1)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from kerasdist.cluster.spec import local_cluster
from kerasdist.cluster.watch import HangWatch


def _task(name: str):
    job, index = name.split(":")
    spec = local_cluster(workers=2, ps=1, chief=True).for_task(job, int(index))
    return SimpleNamespace(name=name, tf_config=spec, returncode=lambda: None)


def test_a_task_silent_for_the_timeout_is_overdue_and_an_answer_resets_it():
    states = {"worker:1": "hung", "worker:0": "dead", "ps:0": "alive"}
    tasks = [_task(n) for n in states]
    by_address = {t.tf_config.address: t.name for t in tasks}
    watch = HangWatch(0.5, period_s=0.0,
                      prober=lambda address, timeout_s: states[by_address[address]])
    assert watch.overdue(tasks) == []  # silent from now on
    time.sleep(0.6)
    overdue = watch.overdue(tasks)
    assert [t.name for t, _ in overdue] == ["worker:1"] and overdue[0][1] >= 0.5
    states["worker:1"] = "alive"  # it answered: the clock starts again
    watch.overdue(tasks)
    states["worker:1"] = "hung"
    assert watch.overdue(tasks) == []
    assert [t.name for t in watch.hung_now(tasks)] == ["worker:1"]


def test_no_timeout_probes_nothing():
    calls = []
    watch = HangWatch(None, prober=lambda *a, **k: calls.append(a) or "hung")
    assert watch.overdue([_task("worker:0")]) == [] and calls == []


def test_probes_are_spaced_by_the_period():
    calls = []
    watch = HangWatch(60.0, prober=lambda *a, **k: calls.append(a) or "alive")
    assert watch.period_s == 5.0
    watch.overdue([_task("worker:0")])
    watch.overdue([_task("worker:0")])
    assert len(calls) == 1


def test_a_ps_script_cluster_watches_its_servers_and_passes_the_bound_to_its_namespace_child(
        tmp_path):
    """``kerasdist launch --ps N`` scripts get the recipes' frozen-server watch
    (``--task-timeout-s``, default 60 s); multi-worker scripts have no server tasks to watch."""
    from kerasdist.launch.script import ScriptCluster

    script = tmp_path / "train.py"
    script.write_text("")
    ps = ScriptCluster(script=str(script), ps=1, task_timeout_s=12.5)
    assert ps.launch_spec().hang_timeout_s == 12.5
    args = ps.cli_args()
    assert args[args.index("--task-timeout-s") + 1] == "12.5"
    assert ScriptCluster(script=str(script), ps=1).launch_spec().hang_timeout_s == 60.0
    off = ScriptCluster(script=str(script), ps=1, task_timeout_s=None)
    assert off.launch_spec().hang_timeout_s is None
    assert off.cli_args()[off.cli_args().index("--task-timeout-s") + 1] == "none"
    assert ScriptCluster(script=str(script), ps=0).launch_spec().hang_timeout_s is None
