"""Issue 31, item 2: kerasdist run as users run it on real machines, on simulated hosts
(kerasdist.testing.hosts): ``kerasdist launch --this-task`` with a user's own script on each host,
the shipped recipes trained to their full accuracy targets with one ``kerasdist fit`` per host,
and the sidecar evaluator (``kerasdist evaluate --watch``) following a run from a host of its own.

Every test is heavy (a TensorFlow cluster of 3 or 4 processes on this machine's cores) and in the
extended tier. Needs root (network namespaces); skipped otherwise. Run alone with
``python -m pytest -q -n 0 -m "extended or not extended" tests/multiprocess/test_hosts_as_users_run.py``
(docs/hosts.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import portpicker
import pytest
from test_hosts import _wait

from kerasdist.testing.hosts import HostSet, leftovers

REPO = Path(__file__).parents[2]
SCRIPTS = REPO / "tests" / "scripts"
DATA = REPO / "kerasdist" / "data" / "sample"
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.extended,
              pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root")]

# One intra-op thread per task (what `--threads-per-task 1` / `cluster.threads_per_task: 1` set).
TASK_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
            "TF_NUM_INTRAOP_THREADS": "1"}


def _cluster(hosts: HostSet, layout: dict[str, int]) -> dict[str, list[str]]:
    """The cluster spec of ``layout`` (task name -> host): each task at its host's address and a
    free port."""
    cluster: dict[str, list[str]] = {}
    for name, host in layout.items():
        job, index = name.split(":")
        assert int(index) == len(cluster.setdefault(job, []))
        cluster[job].append(f"{hosts.address(host)}:{portpicker.pick_unused_port()}")
    return cluster


def _start(hosts: HostSet, layout: dict[str, int], cluster: dict, argv: list[str], *,
           timeout_s: float) -> dict[str, subprocess.Popen]:
    """Start ``argv`` once per task of ``layout`` on its host, with that task's TF_CONFIG (the
    cluster spec naming the hosts' addresses), in ``layout``'s order."""
    processes = {}
    for name, host in layout.items():
        job, index = name.split(":")
        tf_config = {"cluster": cluster, "task": {"type": job, "index": int(index)}}
        processes[name] = hosts.run(host, argv, dict(TASK_ENV, TF_CONFIG=json.dumps(tf_config)),
                                    timeout_s=timeout_s, cwd=REPO)
    return processes



def _logs(hosts: HostSet, processes: dict, tail: int = 3000) -> str:
    return "\n".join(f"--- {name} (exit {p.poll()}):\n{hosts.output(p)[-tail:]}"
                     for name, p in processes.items())


def _epoch_losses(log: str) -> list[float]:
    """The per-epoch training losses Keras's ``verbose=2`` prints (``... - loss: 0.4321``), after
    the ``[worker:N] `` prefix ``launch --this-task`` gives a multi-worker script's lines."""
    return [float(x) for x in re.findall(r"^(?:\[\S+\] )?\d+/\d+ - .*\bloss: ([\d.]+)", log,
                                         re.M)]


# ------------------------------------------------------------- kerasdist launch --this-task
MW_LAYOUT = {"worker:0": 0, "worker:1": 1, "worker:2": 2}


@pytest.mark.timeout(600)
def test_this_task_runs_a_multi_worker_script_on_three_hosts(tmp_path):
    """``kerasdist launch --this-task tests/scripts/mnist_multi_worker.py`` on each of 3 hosts,
    each with its TF_CONFIG naming the hosts' addresses (as a scheduler would start it): the
    script's MultiWorkerMirroredStrategy (after kerasdist.enable()) trains the CNN 2 epochs in
    sync on the 3 workers; every host exits 0, the loss falls, all three report the same held-out
    accuracy; nothing is left behind."""
    epochs = 2
    argv = [sys.executable, "-m", "kerasdist", "launch", "--this-task",
            str(SCRIPTS / "mnist_multi_worker.py"), str(DATA), str(epochs)]
    with HostSet(3, log_dir=tmp_path / "logs") as hosts:
        suffix = hosts.suffix
        cluster = _cluster(hosts, MW_LAYOUT)
        started = time.monotonic()
        processes = _start(hosts, MW_LAYOUT, cluster, argv, timeout_s=540)
        _wait(processes.values(), started + 540)
        elapsed = time.monotonic() - started
        codes = {name: p.poll() for name, p in processes.items()}
        logs = _logs(hosts, processes)
        own = {name: hosts.output(p) for name, p in processes.items()}
    assert leftovers(suffix) == []
    print(f"\n--this-task on 3 hosts {cluster['worker']}: exits {codes} after {elapsed:.0f} s")
    assert codes == dict.fromkeys(MW_LAYOUT, 0), logs
    accuracy = {}
    for name, log in own.items():
        (value,) = re.findall(rf"^\[{name}\] task {name} held-out accuracy: ([\d.]+)$", log,
                              re.M)  # each line prefixed with its task (issue 42 item 2)
        accuracy[name] = float(value)
    losses = _epoch_losses(own["worker:0"])
    print(f"epoch losses (worker:0) {losses}; held-out accuracy {accuracy}")
    assert len(losses) == epochs and losses[-1] < losses[0], logs
    assert len(set(accuracy.values())) == 1, accuracy  # in sync: one model
    assert accuracy["worker:0"] >= 0.9, accuracy


PS_SCRIPT_LAYOUT = {"ps:0": 0, "worker:0": 1, "worker:1": 2, "chief:0": 1}
"""ps on host 0, a worker on hosts 1 and 2, the coordinator (chief) beside worker:0 on host 1."""


@pytest.mark.timeout(600)
def test_this_task_runs_a_parameter_server_script_on_three_hosts(tmp_path):
    """``kerasdist launch --this-task tests/scripts/mnist_parameter_server.py`` for each task of
    1 ps + 2 workers + the chief on 3 hosts: the ps and worker tasks serve (a TensorFlow server
    at their own address), the chief (coordinator, beside worker:0) runs the script, whose
    ParameterServerStrategy trains through ``model.fit`` 2 epochs; the chief exits 0 with its
    outputs, the loss falls, the servers serve until the orchestrator (the test) ends them, and
    nothing is left behind."""
    epochs = 2
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "kerasdist", "launch", "--this-task",
            str(SCRIPTS / "mnist_parameter_server.py"), str(DATA), str(out), str(epochs)]
    with HostSet(3, log_dir=tmp_path / "logs") as hosts:
        suffix = hosts.suffix
        cluster = _cluster(hosts, PS_SCRIPT_LAYOUT)
        started = time.monotonic()
        processes = _start(hosts, PS_SCRIPT_LAYOUT, cluster, argv, timeout_s=540)
        chief = processes["chief:0"]
        _wait([chief], started + 540)
        elapsed = time.monotonic() - started
        serving = [name for name, p in processes.items() if name != "chief:0" and p.poll() is None]
        logs = _logs(hosts, processes)
        log = hosts.output(chief)
    assert leftovers(suffix) == []
    print(f"\n--this-task, ps {cluster['ps']}, workers {cluster['worker']}, chief "
          f"{cluster['chief']}: chief exit {chief.returncode} after {elapsed:.0f} s; still "
          f"serving: {serving}")
    assert chief.returncode == 0, logs
    assert serving == ["ps:0", "worker:0", "worker:1"], logs
    (accuracy,) = re.findall(r"^coordinator held-out accuracy: ([\d.]+)$", log, re.M)
    losses = _epoch_losses(log)
    print(f"epoch losses {losses}; held-out accuracy {accuracy}")
    assert len(losses) == epochs and losses[-1] < losses[0], logs
    assert float(accuracy) >= 0.9, logs
    assert (out / "model.keras").is_file(), logs


SCRIPT_TASK_TIMEOUT_S = 20
"""``--task-timeout-s`` of the cut-off ps test (the watch probes every 5 s at this bound)."""


@pytest.mark.timeout(420)
def test_this_task_ps_script_tasks_exit_1_naming_a_cut_off_ps_within_the_task_timeout(tmp_path):
    """The parameter-server script of the test above under ``launch --this-task
    --task-timeout-s 20`` (30 epochs, far more than the test waits for), ps:0 on host 0 cut off
    (its link down: packets dropped, no reset) once the chief has saved its first epoch's
    ``model.keras``: the chief (host 1) and both workers (hosts 1, 2), whose TF calls to the ps
    would wait for ever, exit 1 within the bound plus the probe slack (kerasdist.cluster.watch:
    a probe period of 5 s and a 2 s handshake timeout per unreachable task), each naming
    ``ps:0 (unreachable, <its address>)``; nothing is left running on hosts 1 and 2. The cut-off
    ps serves on (it watches nothing: its orchestrator ends it) until the host set is removed.
    Before ``--task-timeout-s`` (or with ``none``) the chief waited for ever (docs/hosts.md)."""
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "kerasdist", "launch", "--this-task", "--task-timeout-s",
            str(SCRIPT_TASK_TIMEOUT_S), str(SCRIPTS / "mnist_parameter_server.py"), str(DATA),
            str(out), "30"]
    watchers = ["chief:0", "worker:0", "worker:1"]
    with HostSet(3, log_dir=tmp_path / "logs") as hosts:
        suffix = hosts.suffix
        cluster = _cluster(hosts, PS_SCRIPT_LAYOUT)
        processes = _start(hosts, PS_SCRIPT_LAYOUT, cluster, argv, timeout_s=400)
        deadline = time.monotonic() + 240
        while not (out / "model.keras").is_file():  # the first epoch's checkpoint
            assert all(p.poll() is None for p in processes.values()), _logs(hosts, processes)
            assert time.monotonic() < deadline, "no epoch in 240 s\n" + _logs(hosts, processes)
            time.sleep(0.2)
        hosts.link_down(0)
        cut = time.monotonic()
        ended: dict[str, float] = {}
        while len(ended) < len(watchers) and time.monotonic() < cut + SCRIPT_TASK_TIMEOUT_S + 90:
            for name in watchers:
                if name not in ended and processes[name].poll() is not None:
                    ended[name] = time.monotonic() - cut
            time.sleep(0.1)
        codes = {name: p.poll() for name, p in processes.items()}
        left = {host: hosts.pids(host) for host in (1, 2)}
        logs = _logs(hosts, processes)
        own = {name: hosts.output(p) for name, p in processes.items()}
    assert leftovers(suffix) == []
    print(f"\n--this-task --task-timeout-s {SCRIPT_TASK_TIMEOUT_S}, ps:0's host "
          f"({cluster['ps'][0]}) cut after epoch 1: exits {codes} after "
          + ", ".join(f"{n}: {t:.1f} s" for n, t in sorted(ended.items()))
          + f"; processes left on hosts 1, 2: {left}")
    for line in logs.splitlines():
        if "lost task" in line:
            print(line.strip()[:300])
    assert sorted(ended) == watchers, "a task waited on the cut-off ps:\n" + logs
    assert {name: codes[name] for name in watchers} == dict.fromkeys(watchers, 1), logs
    assert codes["ps:0"] is None, logs  # the cut-off ps serves on until its orchestrator ends it
    # the bound, plus a 5 s probe period and 2 s probe timeouts (watch.py), plus exit slack
    assert all(t < SCRIPT_TASK_TIMEOUT_S + 20 for t in ended.values()), (ended, logs)
    assert left == {1: [], 2: []}, logs
    for name in watchers:
        assert re.search(rf"lost task ps:0 \(unreachable, {re.escape(cluster['ps'][0])}\)",
                         own[name]), logs


# ------------------------------------------------ the recipes' full accuracy targets on 3 hosts
def _target(recipe: Path) -> float:
    """The held-out accuracy the recipe promises on its ``# Target:`` line."""
    (value,) = re.findall(r"^# Target: held-out accuracy >= ([\d.]+)", recipe.read_text(), re.M)
    return float(value)


def _fit_argv(recipe: Path, settings: dict) -> list[str]:
    argv = [sys.executable, "-m", "kerasdist", "fit", str(recipe), "--verbose", "0"]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    return argv


@pytest.mark.timeout(1500)
def test_the_multi_worker_recipe_reaches_its_target_on_three_hosts(tmp_path):
    """``recipes/mnist_cnn_mwms.yaml`` in full (5 epochs) on 3 hosts, one ``kerasdist fit ...
    --set cluster.kind=tf_config`` per host with its TF_CONFIG and its own run_dir: every host
    exits 0 and the chief's held-out accuracy meets the recipe's target. The one change besides
    the cluster kind: the global batch is 96 (the recipe's 32 per replica on 3 workers; its 64 is
    not divisible by 3)."""
    recipe = REPO / "recipes" / "mnist_cnn_mwms.yaml"
    target = _target(recipe)
    with HostSet(3, log_dir=tmp_path / "logs") as hosts:
        suffix = hosts.suffix
        cluster = _cluster(hosts, MW_LAYOUT)
        started = time.monotonic()
        processes = {}
        for name, host in MW_LAYOUT.items():  # each host its own "disk"
            argv = _fit_argv(recipe, {"cluster.kind": "tf_config", "data.batch_size": 96,
                                      "output.run_dir": tmp_path / f"host{host}" / "run"})
            processes.update(_start(hosts, {name: host}, cluster, argv, timeout_s=1400))
        _wait(processes.values(), started + 1400)
        elapsed = time.monotonic() - started
        codes = {name: p.poll() for name, p in processes.items()}
        logs = _logs(hosts, processes)
    assert leftovers(suffix) == []
    print(f"\n{recipe.name} on 3 hosts {cluster['worker']}: exits {codes} after {elapsed:.0f} s")
    assert codes == dict.fromkeys(MW_LAYOUT, 0), logs
    result = json.loads((tmp_path / "host0" / "run" / "metrics.json").read_text())
    accuracy = result["evaluation"]["accuracy"]
    print(f"held-out accuracy {accuracy:.4f} (target {target}), global steps "
          f"{result['global_steps']}, {result['throughput']['examples_per_sec']:.0f} examples/s, "
          f"wall time {result['wall_time_s']:.0f} s")
    assert result["num_replicas"] == 3 and result["global_steps"] == 5 * (8000 // 96), result
    assert accuracy >= target, result


def _json_list(text: str) -> list:
    """The JSON list ``kerasdist evaluate --json`` prints last (log lines come before it)."""
    lines = text.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "[")
    return json.loads("\n".join(lines[start:]))


PS_LAYOUT = {"ps:0": 0, "worker:0": 1, "worker:1": 2, "chief:0": 0}
EVALUATOR_HOST = 3


@pytest.mark.timeout(1500)
def test_the_ps_recipe_reaches_its_target_on_three_hosts_and_a_sidecar_evaluator_follows(tmp_path):
    """``recipes/mnist_cnn_ps.yaml`` in full (5 x 125 global steps, unchanged but for
    ``cluster.kind=tf_config``) on 3 hosts: the chief (coordinator) and the ps on host 0, a worker
    on hosts 1 and 2, one ``kerasdist fit`` per task with its TF_CONFIG, the run_dir on a
    filesystem every host mounts. On a 4th host, with a host name of its own (as another machine
    has: the run-directory lock is then held "from another machine"), ``kerasdist evaluate
    RUN_DIR --watch``, started before the run, evaluates each new checkpoint and ends when the
    run ends. The chief meets the recipe's target; the evaluator exits 0, its last evaluation is
    the final step's checkpoint with the chief's own held-out accuracy."""
    recipe = REPO / "recipes" / "mnist_cnn_ps.yaml"
    target = _target(recipe)
    run_dir = tmp_path / "run"
    argv = _fit_argv(recipe, {"cluster.kind": "tf_config", "output.run_dir": run_dir})
    with HostSet(4, log_dir=tmp_path / "logs") as hosts:
        suffix = hosts.suffix
        watch = (f"hostname kd-evaluator && exec {sys.executable} -m kerasdist evaluate {run_dir} "
                 "--watch --poll-s 1 --json --idle-timeout-s 900")
        evaluator = hosts.run(EVALUATOR_HOST, ["unshare", "--uts", "sh", "-c", watch],
                              dict(TASK_ENV), timeout_s=1400, cwd=REPO)
        cluster = _cluster(hosts, PS_LAYOUT)
        started = time.monotonic()
        processes = _start(hosts, PS_LAYOUT, cluster, argv, timeout_s=1400)
        chief = processes["chief:0"]
        first_evaluation = None  # seconds from the start to the sidecar's first evaluation
        while chief.poll() is None and time.monotonic() < started + 1400:
            if first_evaluation is None and (run_dir / "eval.json").exists():
                first_evaluation = time.monotonic() - started
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        _wait([evaluator], time.monotonic() + 120)
        after = time.monotonic() - started - elapsed
        serving = [name for name, p in processes.items() if name != "chief:0" and p.poll() is None]
        logs = _logs(hosts, {**processes, "evaluator": evaluator})
        watched_out = hosts.output(evaluator)
    assert leftovers(suffix) == []
    print(f"\n{recipe.name}: ps {cluster['ps']}, workers {cluster['worker']}, chief "
          f"{cluster['chief']}: chief exit {chief.returncode} after {elapsed:.0f} s; evaluator "
          f"(host {EVALUATOR_HOST}) exit {evaluator.returncode} {after:.0f} s later; its first "
          f"evaluation written {first_evaluation or -1:.0f} s after the start (-1: none)")
    assert chief.returncode == 0, logs
    assert serving == ["ps:0", "worker:0", "worker:1"], logs
    result = json.loads((run_dir / "metrics.json").read_text())
    accuracy = result["evaluation"]["accuracy"]
    print(f"held-out accuracy {accuracy:.4f} (target {target}), global steps "
          f"{result['global_steps']}, {result['throughput']['examples_per_sec']:.0f} examples/s, "
          f"wall time {result['wall_time_s']:.0f} s")
    assert result["global_steps"] >= 5 * 125, result
    assert accuracy >= target, result
    assert evaluator.returncode == 0, logs
    watched = _json_list(watched_out)
    print("sidecar: " + ", ".join(f"step {r['global_step']} accuracy {r['accuracy']:.4f}"
                                  for r in watched))
    assert len(watched) >= 2, watched
    assert first_evaluation is not None, logs  # it evaluated while the run trained
    steps = [r["global_step"] for r in watched]
    assert steps == sorted(set(steps)), watched
    assert steps[-1] == result["global_steps"], (watched, result)
    assert watched[-1]["accuracy"] == pytest.approx(accuracy, abs=1e-6), (watched, result)
    recorded = json.loads((run_dir / "eval.json").read_text())["evaluations"]
    assert {r["checkpoint"] for r in watched} <= {r["checkpoint"] for r in recorded}
