"""Nobody let in: the task servers of a local cluster (and its coordinator) run in a private network
namespace, unreachable from this machine's network addresses, and a local cluster that cannot be
isolated is refused (exit 2, nothing written or started) unless the recipe allows the exposure."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import mwms_support as mw
import psutil
import pytest
import yaml

pytestmark = [pytest.mark.multiprocess]


def _host_address() -> str | None:
    """A non-loopback IPv4 address of this machine (None if it has none)."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                             capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            return line.split()[3].split("/")[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        pass
    try:
        for address in socket.gethostbyname_ex(socket.gethostname())[2]:
            if not address.startswith("127."):
                return address
    except OSError:
        pass
    return None


def _netns(pid: int | str) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def _reachable(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=2):
            return True
    except OSError:
        return False


def _names(timeline: Path) -> dict[int, str]:
    """``{pid: task name}`` from the run's ``KERASDIST_TIMELINE`` marks (a forked task's
    ``/proc/PID/environ`` is the command's: its TF_CONFIG cannot be read from outside)."""
    names = {}
    for line in timeline.read_text().splitlines() if timeline.is_file() else ():
        try:
            mark = json.loads(line)
        except ValueError:  # a line being written
            continue
        if ":" in mark["task"]:
            names[mark["pid"]] = mark["task"]
    return names


def _listening_ports(pid: int) -> set[int]:
    """TCP ports process ``pid`` listens on, in its own network namespace (``/proc``)."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
                  if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
    except OSError:
        return set()
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN, held by this process
                ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports


def _tasks(launcher_pid: int, timeline: Path) -> dict[str, tuple[int, set[int]]]:
    """``{task name: (pid, ports it listens on)}`` of the launcher's descendants that are tasks."""
    names = _names(timeline)
    found = {}
    try:
        children = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.Error:
        return found
    for child in children:
        ports = _listening_ports(child.pid) if child.pid in names else set()
        if ports:
            found[names[child.pid]] = (child.pid, ports)
    return found


def _inner_launchers(launcher_pid: int, timeline: Path) -> dict[int, str]:
    """``{pid: network namespace}`` of the local cluster's launcher: the parent of its tasks (the
    command's namespace child, forked from it or started as ``unshare --net python -m
    kerasdist.launch.isolation``). Read while a task listens, i.e. after the launcher's
    unshare(2) returned."""
    found = {}
    for pid, _ in _tasks(launcher_pid, timeline).values():
        try:
            parent = psutil.Process(pid).ppid()
            if parent != launcher_pid:
                found[parent] = _netns(parent)
        except (psutil.Error, OSError):
            pass
    return found


def _ps_recipe(tmp_path: Path, name: str) -> Path:
    """The linear model as a local parameter-server run: 1 ps + 2 workers + the coordinator."""
    raw = yaml.safe_load(mw.linear_recipe(tmp_path, name).read_text())
    raw["strategy"] = {"kind": "parameter_server"}
    raw["cluster"] = {"kind": "local", "workers": 2, "ps": 1, "threads_per_task": 1}
    # long enough that every task is seen listening before the run ends, on a quiet machine too
    raw["trainer"] = {"epochs": 3, "steps_per_epoch": 150, "seed": 1}
    raw["data"].pop("auto_shard", None)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind, expected, fork", [
    # 171 s in the README suite (2026-11-26): the extended tier; parameter_server stays. The
    # parameter-server run takes the default path (its launcher forked into the namespace, its
    # tasks forked from it: launch/forking/netns.py); the multi-worker run starts them as new
    # interpreters (KERASDIST_FORK_TASKS=0: unshare --net python -m kerasdist.launch.isolation).
    pytest.param("multi_worker", {"worker:0", "worker:1"}, False, marks=pytest.mark.extended),
    ("parameter_server", {"ps:0", "worker:0", "worker:1"}, True),
])
def test_local_cluster_is_unreachable_from_the_network(tmp_path, monkeypatch, kind, expected,
                                                       fork):
    host = _host_address()
    if host is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    recipe = (mw.linear_recipe(tmp_path, "run", trainer={"epochs": 3}) if kind == "multi_worker"
              else _ps_recipe(tmp_path, "run"))
    timeline = tmp_path / "timeline.jsonl"
    monkeypatch.setenv("KERASDIST_TIMELINE", str(timeline))
    monkeypatch.setenv("KERASDIST_FORK_TASKS", "1" if fork else "0")
    process = mw.launch(recipe)
    checked: dict[str, set[int]] = {}
    launchers: dict[int, str] = {}  # newest network namespace of the launcher's child, per pid
    try:
        deadline = time.monotonic() + 240
        while set(checked) != expected and process.poll() is None and time.monotonic() < deadline:
            launchers.update(_inner_launchers(process.pid, timeline))
            for name, (pid, ports) in _tasks(process.pid, timeline).items():
                if name in checked or name not in expected:
                    continue
                # The task's server is up (its own listening socket), yet its port cannot be
                # reached through this machine's network address: it is in another namespace.
                for port in ports:
                    assert not _reachable(host, port), \
                        f"task {name}: {host}:{port} accepts connections"
                assert _netns(pid) != _netns("self"), f"task {name} runs in this network namespace"
                checked[name] = ports
            time.sleep(0.05)
        launchers.update(_inner_launchers(process.pid, timeline))  # every task checked at once
        out = mw.finish(process, timeout_s=300)
    finally:
        mw.kill_tree(process.pid)
    assert set(checked) == expected, f"tasks checked while listening: {checked}\n{out[-4000:]}"
    assert process.returncode == 0, out[-4000:]
    # The local launcher (for parameter_server also the coordinator) ran in the tasks' namespace.
    # (read while the tasks listened, i.e. after the launcher's unshare(2) had returned)
    assert launchers and _netns("self") not in launchers.values()
    assert "private network namespace, loopback only" in out
    forked = {json.loads(line)["task"] for line in timeline.read_text().splitlines()
              if json.loads(line)["mark"] in ("forked", "launcher forked")}
    assert forked == ({"cli", *expected} if fork else set())  # the path this case is about
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["strategy"] == kind and metrics["num_replicas"] == 2
    if kind == "parameter_server":  # the ps task found for its peak RSS, forked or started
        assert metrics["parameter_server"]["ps_placement"][0]["peak_rss_bytes"] > 50 * 2**20
    assert "kerasdist run summary" in out  # the launching process printed the RunResult


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_no_isolation_refused_unless_exposure_is_allowed(tmp_path):
    recipe = mw.linear_recipe(tmp_path, "exposed", trainer={"epochs": 1})
    env = dict(os.environ, **mw.QUIET, KERASDIST_NO_NETNS="1")

    def fit(*args):
        return subprocess.run([sys.executable, "-m", "kerasdist", "fit", str(recipe), *args],
                              cwd=mw.REPO, env=env, text=True, capture_output=True, timeout=240)

    refused = fit()
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert "cannot isolate the local cluster in a private network namespace" in refused.stderr
    assert "KERASDIST_NO_NETNS is set" in refused.stderr
    assert "cluster.allow_network_exposure: true" in refused.stderr
    assert "local cluster" not in refused.stdout  # nothing started ...
    assert not (tmp_path / "exposed").exists()  # ... nothing written
    allowed = fit("--set", "cluster.allow_network_exposure=true")
    assert allowed.returncode == 0, allowed.stdout[-3000:] + allowed.stderr[-3000:]
    assert "cluster.allow_network_exposure is set" in allowed.stdout
    assert "reachable from the network" in allowed.stdout  # the launcher says what is true
    assert json.loads((tmp_path / "exposed" / "metrics.json").read_text())["num_replicas"] == 2


@pytest.mark.timeout(120)
def test_api_refuses_extra_callbacks_for_an_isolated_local_cluster(tmp_path):
    import kerasdist
    from kerasdist.errors import ClusterError
    from kerasdist.launch.isolation import unavailable_reason

    if unavailable_reason():
        pytest.skip(f"no network namespaces here: {unavailable_reason()}")
    recipe = kerasdist.load_recipe(_ps_recipe(tmp_path, "cb"))
    with pytest.raises(ClusterError, match="callbacks cannot be sent into a local cluster"):
        kerasdist.fit(recipe, callbacks=[object()])
    assert not (tmp_path / "cb").exists()


def test_child_errors_come_back_with_their_class():
    from kerasdist.errors import (
        DataError,
        Preempted,
        RunDirError,
        TaskFailedError,
        TrainingError,
        classify,
        exit_code,
    )
    from kerasdist.launch.status import rebuild

    def back(err):
        return rebuild({"error": type(err).__name__, "module": type(err).__module__,
                        "message": str(err), "step": getattr(err, "step", None)})

    for err, code in ((RunDirError("in use"), 2), (DataError("bad split"), 2),
                      (TaskFailedError("worker:1 lost"), 1), (TrainingError("label 12"), 1),
                      (Preempted(40), 130), (KeyboardInterrupt(), 130), (ValueError("v"), 1)):
        again = back(err)
        assert type(again) is type(err) and str(again) == str(err)
        assert exit_code(classify(again)) == code
    odd = back(type("Odd", (Exception,), {})("strange"))
    assert isinstance(odd, TrainingError) and str(odd) == "Odd: strange"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("reported", ['{"ok": true}', '{"ok": false, "error": "TaskFailedError", '
                                      '"module": "kerasdist.errors", "message": "worker:2 lost"}'])
def test_a_child_that_reported_but_does_not_exit_is_killed_and_its_report_stands(
        monkeypatch, tmp_path, reported):
    """A namespace child whose teardown blocks after it reported (TF's runtime still waiting for a
    lost task) is killed REPORTED_EXIT_S later, with its tasks; the report decides the outcome."""
    import threading

    import kerasdist
    from kerasdist.errors import TaskFailedError
    from kerasdist.launch import isolation as child_side
    from kerasdist.launch.processes import die_with_parent
    from kerasdist.training.rundir import RunDir

    monkeypatch.setattr(child_side, "REPORTED_EXIT_S", 1.0)
    recipe = kerasdist.load_recipe(_ps_recipe(tmp_path, "run"))
    read_fd, write_fd = os.pipe()
    code = (f"import os, subprocess, sys, time\n"
            f"task = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
            f"print(task.pid, flush=True)\n"
            f"os.write({write_fd}, {reported.encode()!r}); os.close({write_fd})\n"
            f"time.sleep(300)  # a teardown that never ends\n")
    child = subprocess.Popen([sys.executable, "-c", code], pass_fds=(write_fd,),
                             stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    os.close(write_fd)
    task_pid = int(child.stdout.readline())
    reply: list[bytes] = []
    reader = threading.Thread(target=child_side._read_all, args=(read_fd, reply), daemon=True)
    reader.start()
    began = time.monotonic()
    assert child_side._wait_for(child, reader) is True
    assert time.monotonic() - began < 20 and child.returncode == -9
    deadline = time.monotonic() + 10  # the task got the same SIGKILL (its process group)
    while psutil.pid_exists(task_pid) and psutil.Process(task_pid).status() != "zombie":
        assert time.monotonic() < deadline, "the child's task outlived it"
        time.sleep(0.1)
    reader.join(timeout=10)
    if '"ok": true' in reported:  # the run's result is read from its metrics.json
        monkeypatch.setattr(child_side.RunResult, "from_metrics", staticmethod(lambda path: path))
        result = child_side._outcome(recipe, child, b"".join(reply), None, True)
        assert result == RunDir.of(recipe).metrics
        with pytest.raises(TaskFailedError, match="without reporting"):  # not killed so: no success
            child_side._outcome(recipe, child, b"".join(reply), None, False)
    else:
        with pytest.raises(TaskFailedError, match="worker:2 lost"):
            child_side._outcome(recipe, child, b"".join(reply), None, True)


@pytest.mark.timeout(60)
def test_isolated_argv_runs_a_program_with_loopback_only():
    """The helper other local-cluster starters (bench's tf_keras baseline, legacy/) can use."""
    from kerasdist.launch.isolation import isolated_argv, unavailable_reason

    if unavailable_reason():
        pytest.skip(f"no network namespaces here: {unavailable_reason()}")
    code = ("import socket\n"
            "server = socket.socket(); server.bind(('127.0.0.1', 0)); server.listen()\n"
            "socket.create_connection(server.getsockname(), timeout=5).close()\n"
            "print(sorted(name for _, name in socket.if_nameindex()))")
    done = subprocess.run(isolated_argv([sys.executable, "-c", code]), capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['lo']"  # loopback up and working, nothing else
