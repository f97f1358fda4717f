"""The one supervisor (kerasdist.launch.supervisor) with plain Python tasks (no TensorFlow: each
test takes seconds): success, one restart budget, grow-back, elastic shrink, refusals, server
workers restarted alone, the body's run ended by a dead ps or a worker lost with no restart
left, one line per task.

The task program reads its role from ``TF_CONFIG`` and a rule per task from its argument:
``always`` (SIGKILLs itself at every start: a worker that never comes back), ``once`` (only at its
first start), ``fatal`` (reports a deterministic error in its status file, exits 1). Servers bind
their port and wait; members sleep briefly and exit 0. Every start leaves a file
``ran-<task>-<workers>-<ns>`` so the tests count what ran at which size.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from pathlib import Path

import pytest

from kerasdist._signals import Terminated
from kerasdist.cluster.spec import local_cluster
from kerasdist.errors import TaskFailedError, TrainingError
from kerasdist.launch.plan import LaunchSpec, TaskPlan, parse_worker_range
from kerasdist.launch.supervisor import Supervisor

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

TASK = r"""
import json, os, signal, socket, sys, time
cfg = json.loads(os.environ["TF_CONFIG"])
name = f"{cfg['task']['type']}:{cfg['task']['index']}"
workers = len(cfg["cluster"]["worker"])
rules, folder, serve = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3] == "serve"
open(os.path.join(folder, f"ran-{name}-{workers}-{time.time_ns()}"), "w").close()
rule = rules.get(f"{name}@{workers}") or rules.get(name)
marker = os.path.join(folder, f"died-{name}-{workers}")
if rule == "fatal":
    with open(os.environ["KERASDIST_STATUS_FILE"], "w") as fh:
        json.dump({"class": "fatal", "exit_code": 1, "error": "ValueError",
                   "message": "label 12 is out of range [0, 10)"}, fh)
    sys.exit(1)
if rule == "preempted":
    with open(os.environ["KERASDIST_STATUS_FILE"], "w") as fh:
        json.dump({"class": "preempted", "exit_code": 130, "error": "Preempted",
                   "message": "preempted: checkpoint saved at global step 10"}, fh)
    sys.exit(130)
if rule == "always" or (rule == "once" and not os.path.exists(marker)):
    open(marker, "w").close()
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
if serve:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("localhost", int(cfg["cluster"][cfg["task"]["type"]][cfg["task"]["index"]].rsplit(":", 1)[1])))
    sock.listen()
    if rule and rule.startswith("late"):  # die once, after listening
        if not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)
time.sleep(0.5)
"""


def _spec(tmp_path: Path, rules: dict, *, workers: int, ps: int = 0, **kwargs) -> LaunchSpec:
    program = tmp_path / "task.py"
    program.write_text(TASK)
    import json

    def plan(n: int, attempt: int) -> list[TaskPlan]:
        cluster = local_cluster(workers=n, ps=ps, chief=ps > 0)
        mode = "serve" if ps else "member"
        argv = (sys.executable, str(program), json.dumps(rules), str(tmp_path), mode)
        return [TaskPlan(cluster.for_task(job, i), argv, server=ps > 0)
                for job in (("ps", "worker") if ps else ("worker",)) for i in range(cluster.num(job))]

    return LaunchSpec(plan=plan, workers=workers, log_dir=tmp_path / "logs", survivor_grace_s=1.0,
                      stop_grace_s=5.0, **kwargs)


def _ran(tmp_path: Path) -> list[str]:
    return [p.name for p in tmp_path.glob("ran-*")]


def test_every_member_exits_0_in_one_attempt(tmp_path):
    supervisor = Supervisor(_spec(tmp_path, {}, workers=2))
    assert supervisor.run() is None
    assert [a.as_dict() for a in supervisor.attempts] == [{"workers": 2, "ended": "succeeded"}]
    assert len(_ran(tmp_path)) == 2


def test_a_lost_worker_restarts_the_cluster_and_every_task_gets_one_line(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="kerasdist")
    supervisor = Supervisor(_spec(tmp_path, {"worker:1": "once"}, workers=3, max_restarts=1))
    supervisor.run()
    assert [a.workers for a in supervisor.attempts] == [3, 3]
    assert supervisor.restarts_left == 0
    assert "task worker:1 was killed by SIGKILL" in supervisor.attempts[0].ended
    stopped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("the cluster stopped")]
    assert len(stopped) == 1
    lines = stopped[0].splitlines()[1:]
    assert sorted(line.split()[0] for line in lines) == ["worker:0", "worker:1", "worker:2"]
    assert any(line.split()[0] == "worker:1" and "SIGKILL" in line and "no status: lost" in line
               for line in lines), lines


def test_without_min_workers_a_worker_that_never_comes_back_fails_the_run(tmp_path):
    supervisor = Supervisor(_spec(tmp_path, {"worker:2": "always"}, workers=3, max_restarts=1))
    with pytest.raises(TaskFailedError, match=r"failed after 2 attempt\(s\): task worker:2 was "
                                              "killed by SIGKILL"):
        supervisor.run()
    assert [a.workers for a in supervisor.attempts] == [3, 3]


def test_a_worker_that_never_comes_back_leaves_the_run_on_the_others(tmp_path):
    supervisor = Supervisor(_spec(tmp_path, {"worker:2": "always"}, workers=3, min_workers=2,
                                  max_restarts=1))
    supervisor.run()
    # restarted once at full size; lost again right after its restart: on 2 workers from then on
    assert [a.workers for a in supervisor.attempts] == [3, 3, 2]
    assert supervisor.attempts[-1].ended == "succeeded"
    ran = _ran(tmp_path)
    assert sum(name.startswith("ran-worker:2-3-") for name in ran) == 2  # started twice, lost twice
    assert sorted(name.rsplit("-", 1)[0] for name in ran if "-2-" in name) == [
        "ran-worker:0-2", "ran-worker:1-2"]


def test_with_no_budget_the_run_shrinks_at_once_and_never_below_min_workers(tmp_path):
    supervisor = Supervisor(_spec(tmp_path, {"worker:2": "always"}, workers=3, min_workers=2))
    supervisor.run()
    assert [a.workers for a in supervisor.attempts] == [3, 2]
    (tmp_path / "b").mkdir()
    both = Supervisor(_spec(tmp_path / "b", {"worker:2": "always", "worker:1@2": "always"},
                            workers=3, min_workers=2))
    with pytest.raises(TaskFailedError, match=r"failed after 2 attempt\(s\)"):
        both.run()
    assert [a.workers for a in both.attempts] == [3, 2]


def test_a_preempted_worker_is_not_a_lost_one_and_never_shrinks_the_cluster(tmp_path):
    supervisor = Supervisor(_spec(tmp_path, {"worker:1": "preempted"}, workers=3, min_workers=2))
    with pytest.raises(TaskFailedError, match=r"failed after 1 attempt\(s\): task worker:1 was "
                                              r"preempted"):
        supervisor.run()
    assert [a.workers for a in supervisor.attempts] == [3]


def test_the_next_restart_grows_the_cluster_back_to_full_size(tmp_path):
    rules = {"worker:2": "always", "worker:1@2": "once"}
    supervisor = Supervisor(_spec(tmp_path, rules, workers=3, min_workers=2, max_restarts=2))
    supervisor.run()
    # 3 (worker:2 lost) -> restart at 3 -> lost again: shrink to 2 -> worker:1 lost: the restart
    # grows back to 3 -> worker:2 lost, no restart left: shrink to 2 -> done
    assert [a.workers for a in supervisor.attempts] == [3, 3, 2, 3, 2]
    assert supervisor.restarts_left == 0


def test_a_worker_count_the_batch_does_not_divide_is_refused_before_it_starts(tmp_path):
    def check(workers: int) -> None:
        if 40 % workers:
            raise TaskFailedError(f"cannot go on with {workers} workers: data.batch_size=40")

    supervisor = Supervisor(_spec(tmp_path, {}, workers=3, check_workers=check))
    with pytest.raises(TaskFailedError, match="cannot go on with 3 workers"):
        supervisor.run()
    assert not _ran(tmp_path)  # refused before anything started
    ok = Supervisor(_spec(tmp_path, {"worker:3": "always"}, workers=4, min_workers=3,
                          check_workers=check))
    with pytest.raises(TaskFailedError, match="cannot go on with 3 workers: data.batch_size=40"):
        ok.run()
    assert [a.workers for a in ok.attempts] == [4]


def test_a_deterministic_error_is_not_restarted_and_keeps_its_message(tmp_path):
    supervisor = Supervisor(_spec(tmp_path, {"worker:1": "fatal"}, workers=2, min_workers=1,
                                  max_restarts=3))
    with pytest.raises(TrainingError, match=r"task worker:1 exited with code 1; log \S+worker-1.log; "
                                            r"not restarted \(a fatal error .*label 12 is out of "
                                            r"range"):
        supervisor.run()
    assert len(supervisor.attempts) == 1


def test_a_server_worker_is_restarted_alone_while_the_body_runs(tmp_path):
    supervisor = Supervisor(_spec(tmp_path, {"worker:1": "late"}, workers=2, ps=1, max_restarts=1))

    def body(tf_config):
        assert tf_config.for_task("chief", 0).task_name == "chief:0"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(
                name.startswith("ran-worker:1-") for name in _ran(tmp_path)) < 2:
            time.sleep(0.1)
        return 42

    assert supervisor.run(body) == 42
    assert supervisor.restarted == ["worker:1"]
    assert sum(name.startswith("ran-worker:1-") for name in _ran(tmp_path)) == 2
    assert sum(name.startswith("ran-worker:0-") for name in _ran(tmp_path)) == 1


def _wait_forever():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
    raise AssertionError("the body was not interrupted")


def test_a_server_worker_lost_with_no_restart_left_ends_the_body_s_run(tmp_path):
    """A coordinator cannot go on without one of its workers (TF's ClusterCoordinator waits for it
    to come back): beyond the budget a dead server worker ends the body's run by name."""
    supervisor = Supervisor(_spec(tmp_path, {"worker:1": "late"}, workers=2, ps=1))
    with pytest.raises(TaskFailedError, match=r"task worker:1 was killed by SIGKILL and no "
                                              r"restart is left; the coordinator cannot go on "
                                              r"without one of its workers"):
        supervisor.run(lambda tf_config: _wait_forever())
    assert supervisor.restarted == []


def test_a_body_that_ignores_the_interrupt_is_ended_by_stopping_its_tasks(tmp_path, monkeypatch):
    """Like TF's coordinator waiting for a lost worker: the body survives the interrupt and only
    returns (with an error) once its tasks are gone; the supervisor stops them after BODY_STOP_S."""
    from kerasdist.launch import supervisor as module

    monkeypatch.setattr(module, "BODY_STOP_S", 1.0)
    supervisor = Supervisor(_spec(tmp_path, {"worker:1": "late"}, workers=2, ps=1))

    def wedged(tf_config):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if all(t.returncode() is not None for t in supervisor._launcher.tasks):
                    raise ConnectionError("every task is gone")
                time.sleep(0.05)
            except KeyboardInterrupt:
                continue  # ignored, as a blocked remote call would
        raise AssertionError("the tasks were not stopped")

    began = time.monotonic()
    with pytest.raises(TaskFailedError, match=r"task worker:1 was killed by SIGKILL and no restart "
                                              r"is left.*training stopped \(ConnectionError\)"):
        supervisor.run(wedged)
    assert time.monotonic() - began < 30


def test_a_body_still_blocked_after_its_tasks_stopped_is_abandoned_naming_the_worker(
        tmp_path, monkeypatch):
    """TF's failure handler can hold every worker thread of the coordinator, so that stopping the
    tasks fails no call and the body never returns: BODY_ABANDON_S after the stop, the failure
    goes to LaunchSpec.abandon (the CLI's default reports it and ends the process)."""
    import threading

    from kerasdist.launch import supervisor as module

    monkeypatch.setattr(module, "BODY_STOP_S", 1.0)
    monkeypatch.setattr(module, "BODY_ABANDON_S", 1.0)
    abandoned: list[BaseException] = []
    released = threading.Event()

    def abandon(err):
        abandoned.append(err)
        released.set()

    supervisor = Supervisor(_spec(tmp_path, {"worker:1": "late"}, workers=2, ps=1,
                                  abandon=abandon))
    stopped_at: list[float] = []

    def blocked(tf_config):
        while not released.is_set():
            try:
                if not stopped_at and all(t.returncode() is not None
                                          for t in supervisor._launcher.tasks):
                    stopped_at.append(time.monotonic())
                released.wait(0.05)
            except KeyboardInterrupt:
                continue  # ignored, as a blocked remote call would
        return "returned only once abandoned"

    assert supervisor.run(blocked) == "returned only once abandoned"
    assert len(abandoned) == 1 and isinstance(abandoned[0], TaskFailedError)
    assert str(abandoned[0]).startswith("task worker:1 was killed by SIGKILL and no restart is "
                                        "left; the coordinator cannot go on without one of its "
                                        "workers; training stopped (the coordinator stayed "
                                        "blocked in TensorFlow 1 s after every task was stopped)")
    assert stopped_at, "the tasks were not stopped before the body was abandoned"


def test_abandon_reports_to_the_innermost_reporter_and_exits_with_the_failure_s_code(tmp_path):
    """kerasdist._exit.abandon in a real process: the innermost reporter gets the error, the
    process ends at once (a blocked thread left where it is) with exit code 1."""
    import subprocess

    program = tmp_path / "abandon.py"
    program.write_text(
        "import threading, sys\n"
        "from kerasdist import _exit\n"
        "from kerasdist.errors import TaskFailedError\n"
        "threading.Thread(target=threading.Event().wait).start()  # never ends on its own\n"
        "with _exit.reporting_to(lambda e: print('outer', e)), "
        "_exit.reporting_to(lambda e: print('inner', e)):\n"
        "    _exit.abandon(TaskFailedError('worker:2 lost'))\n"
        "print('not reached')\n")
    done = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stdout == "inner worker:2 lost\n"


def test_a_lost_coordinator_task_is_not_a_lost_worker(tmp_path):
    """An elastic parameter-server recipe runs its coordinator as member chief:0 beside the ps and
    worker servers: its loss must not shrink the cluster (it was counted as a lost worker, so
    with min_workers 1 the run 'continued' on 1 worker); with no restart left the run fails
    naming it."""
    import json

    program = tmp_path / "task.py"
    program.write_text(TASK)

    def plan(n: int, attempt: int) -> list[TaskPlan]:
        cluster = local_cluster(workers=n, ps=1, chief=True)
        argv = (sys.executable, str(program), json.dumps({"chief:0": "always"}), str(tmp_path))
        return [TaskPlan(cluster.for_task(job, i), (*argv, "serve"), server=True)
                for job in ("ps", "worker") for i in range(cluster.num(job))] + \
            [TaskPlan(cluster.for_task("chief", 0), (*argv, "member"))]

    supervisor = Supervisor(LaunchSpec(plan=plan, workers=2, min_workers=1, max_restarts=0,
                                       log_dir=tmp_path / "logs", survivor_grace_s=1.0,
                                       stop_grace_s=5.0))
    with pytest.raises(TaskFailedError, match="task chief:0 was killed by SIGKILL"):
        supervisor.run()
    assert [a.workers for a in supervisor.attempts] == [2]


STOP_PROBE = r"""
import json, os, signal, socket, sys, time
cfg = json.loads(os.environ["TF_CONFIG"])
ps = cfg["cluster"]["ps"][0].rsplit(":", 1)
def on_term(signum, frame):  # a coordinator saving its checkpoint: it needs its ps
    try:
        socket.create_connection((ps[0], int(ps[1])), timeout=2).close()
        answer = "ps reachable"
    except OSError:
        answer = "ps gone"
    open(os.path.join(sys.argv[1], "at-stop"), "w").write(answer)
    sys.exit(130)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(sys.argv[1], "started"), "w").close()
time.sleep(600)
"""


def test_an_interrupted_cluster_stops_its_coordinator_task_while_its_ps_still_serves(tmp_path):
    """Ctrl-C/SIGTERM to a cluster whose coordinator is a member task (an elastic recipe's
    chief:0): the coordinator is stopped first, so that its checkpoint save still reaches the ps;
    the servers are stopped after it."""
    import json
    import threading

    server, probe = tmp_path / "task.py", tmp_path / "probe.py"
    server.write_text(TASK)
    probe.write_text(STOP_PROBE)

    def plan(n: int, attempt: int) -> list[TaskPlan]:
        cluster = local_cluster(workers=n, ps=1, chief=True)
        serve = (sys.executable, str(server), json.dumps({}), str(tmp_path), "serve")
        return [TaskPlan(cluster.for_task(job, i), serve, server=True)
                for job in ("ps", "worker") for i in range(cluster.num(job))] + \
            [TaskPlan(cluster.for_task("chief", 0), (sys.executable, str(probe), str(tmp_path)))]

    supervisor = Supervisor(LaunchSpec(plan=plan, workers=1, log_dir=tmp_path / "logs",
                                       stop_grace_s=10.0))

    def interrupt_once_started():
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        import _thread

        _thread.interrupt_main()

    threading.Thread(target=interrupt_once_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        supervisor.run()
    assert (tmp_path / "at-stop").read_text() == "ps reachable"
    assert all(t.returncode() is not None for t in supervisor._launcher.tasks)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_landing_in_a_weakref_callback_still_stops_the_cluster(
        tmp_path, monkeypatch, signal_in_a_weakref_callback, signum):
    # a handler that raised there lost the stop: the members went on to exit 0 (the run
    # "succeeded")
    polls = []

    def poll(supervisor, original=Supervisor._poll):
        polls.append(1)
        if len(polls) == 1:
            signal_in_a_weakref_callback(signum)
        return original(supervisor)

    monkeypatch.setattr(Supervisor, "_poll", poll)
    supervisor = Supervisor(_spec(tmp_path, {}, workers=2))
    with pytest.raises(KeyboardInterrupt) as raised:
        supervisor.run()
    assert isinstance(raised.value, Terminated) == (signum == signal.SIGTERM)
    assert supervisor.attempts[-1].ended == "interrupted"


def test_a_dead_ps_ends_the_body_s_run_naming_it(tmp_path):
    supervisor = Supervisor(_spec(tmp_path, {"ps:0": "late"}, workers=1, ps=1, max_restarts=2))
    with pytest.raises(TaskFailedError, match="parameter server ps:0 died"):
        supervisor.run(lambda tf_config: _wait_forever())
    assert supervisor.restarted == []  # a ps is never restarted


@pytest.mark.parametrize(("text", "expected"), [("3", (3, 3)), ("2:4", (2, 4)), ("1:1", (1, 1))])
def test_worker_ranges(text, expected):
    assert parse_worker_range(text) == expected


@pytest.mark.parametrize("text", ["0", "3:2", "a", "2:", ":3", "0:2"])
def test_bad_worker_ranges_are_refused_naming_the_value(text):
    from kerasdist.errors import ClusterError

    with pytest.raises(ClusterError, match=f"Received: --workers '{text}'"):
        parse_worker_range(text)
