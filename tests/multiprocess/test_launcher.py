"""The local launcher never leaves processes behind, names the task that failed, counts only a task's
own listener as started and refuses a taken port naming the task and port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from kerasdist.cluster.spec import local_cluster
from kerasdist.errors import ClusterError
from kerasdist.launch.processes import LocalLauncher, describe_exit, listens

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(60)]
SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


def test_tasks_are_stopped_on_exit_and_on_error(tmp_path):
    spec = local_cluster(workers=2, ps=1)
    with pytest.raises(RuntimeError, match="boom"):
        with LocalLauncher(log_dir=tmp_path) as launcher:
            tasks = [launcher.start(spec.for_task(j, i), [], program=SLEEP)
                     for j, i in (("worker", 0), ("worker", 1), ("ps", 0))]
            assert all(_alive(t.pid) for t in tasks)
            raise RuntimeError("boom")
    assert not any(_alive(t.pid) for t in tasks)
    assert sorted(p.name for p in tmp_path.glob("*.log")) == ["ps-0.log", "worker-0.log",
                                                              "worker-1.log"]


def test_child_gets_tf_config_only_in_its_environment(tmp_path):
    spec = local_cluster(workers=1)
    program = [sys.executable, "-c", "import os; print(os.environ['TF_CONFIG'])"]
    with LocalLauncher(log_dir=tmp_path) as launcher:
        task = launcher.start(spec, [], program=program)
        task.process.wait(30)
    assert "TF_CONFIG" not in os.environ
    assert '"type": "worker"' in task.log_path.read_text()


def test_failed_task_is_named(tmp_path):
    spec = local_cluster(workers=2)
    with LocalLauncher(log_dir=tmp_path) as launcher:
        launcher.start(spec, [], program=SLEEP)
        victim = launcher.start(spec.for_task("worker", 1), [], program=SLEEP)
        os.kill(victim.pid, signal.SIGKILL)
        victim.process.wait(10)
        assert [t.name for t in launcher.failed()] == ["worker:1"]
        assert describe_exit(victim.returncode()) == "was killed by SIGKILL"


def test_wait_listening_names_a_task_that_exits(tmp_path):
    spec = local_cluster(workers=1)
    program = [sys.executable, "-c", "import sys; print('bad flag'); sys.exit(3)"]
    with LocalLauncher(log_dir=tmp_path) as launcher:
        task = launcher.start(spec, [], program=program)
        with pytest.raises(ClusterError, match="task worker:0 exited with code 3") as err:
            launcher.wait_listening([task], timeout_s=20)
    assert "bad flag" in str(err.value)


def test_children_die_when_the_launcher_is_killed(tmp_path):
    """Even a SIGKILLed launcher leaves nothing behind (PR_SET_PDEATHSIG)."""
    script = textwrap.dedent(f"""
        import sys, time
        from kerasdist.launch.processes import LocalLauncher
        from kerasdist.cluster.spec import local_cluster
        launcher = LocalLauncher(log_dir={str(tmp_path)!r})
        task = launcher.start(local_cluster(workers=1), [], program={SLEEP!r})
        print(task.pid, flush=True)
        time.sleep(120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())
    assert _alive(child_pid)
    parent.kill()
    parent.wait(10)
    deadline = time.monotonic() + 10
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child_pid)


LISTEN = textwrap.dedent("""
    import json, os, socket, time
    port = int(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][0].rpartition(":")[2])
    with socket.socket(socket.AF_INET6) as sock:  # dual-stack, every interface, as gRPC binds
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::", port))
        sock.listen()
        time.sleep(120)
""")


def test_wait_listening_accepts_only_the_task_own_listener(tmp_path):
    """Another process listening on the task's port does not make the task 'started'."""
    from kerasdist.cluster.spec import validate

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        spec = validate({"worker": [f"localhost:{port}"]}, "worker", 0)
        with LocalLauncher(log_dir=tmp_path) as launcher:
            task = launcher.start(spec, [], program=SLEEP)
            with pytest.raises(ClusterError, match=f"did not start listening on localhost:{port} "
                               rf"within 2 s; port {port} is held by another process \(pid "
                               f"{os.getpid()}\\)"):
                launcher.wait_listening([task], timeout_s=2)
    free = local_cluster(workers=1)
    with LocalLauncher(log_dir=tmp_path) as launcher:
        task = launcher.start(free, [], program=[sys.executable, "-c", LISTEN])
        launcher.wait_listening([task], timeout_s=30)  # its own listener counts
        assert listens(task.pid, int(free.address.rpartition(":")[2]))
        bystander = launcher.start_process("worker:9", SLEEP)
        assert not listens(bystander.pid, int(free.address.rpartition(":")[2]))


def test_task_whose_port_is_taken_is_named_with_its_port(tmp_path):
    """A task that refuses its taken port (as ``serve`` does) is reported with its own message."""
    program = [sys.executable, "-c", textwrap.dedent("""
        import json, os, sys
        from kerasdist.cluster.spec import check_port_free
        from kerasdist.launch import status
        task = json.loads(os.environ["TF_CONFIG"])
        try:
            check_port_free(task["cluster"]["ps"][0], "ps:0")
        except Exception as err:
            status.report(err)
            sys.exit(2)
    """)]
    with socket.socket() as squatter:
        squatter.bind(("", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        spec = validate_ps(port)
        with LocalLauncher(log_dir=tmp_path) as launcher:
            task = launcher.start(spec, [], program=program)
            with pytest.raises(ClusterError, match=f"task ps:0 could not start: task ps:0: port "
                               f"{port} on 'localhost' is already in use"):
                launcher.wait_listening([task], timeout_s=30)


def validate_ps(port: int):
    from kerasdist.cluster.spec import validate

    return validate({"ps": [f"localhost:{port}"], "worker": ["localhost:1"]}, "ps", 0)


@pytest.mark.parametrize("kind, module", [("multi_worker", "peers"),
                                          ("parameter_server", "coordinator")])
def test_port_taken_when_the_launcher_starts_exits_2(tmp_path, monkeypatch, kind, module):
    """Without isolation (cluster.allow_network_exposure), a port taken on this machine between
    picking and starting stops the run before any task starts: exit 2, naming task and port."""
    import importlib

    import kerasdist
    from kerasdist.errors import classify, exit_code

    monkeypatch.setenv("KERASDIST_NO_NETNS", "1")
    recipe = kerasdist.load_recipe(_linear_recipe(tmp_path, kind))
    with socket.socket() as squatter:
        squatter.bind(("", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        launch_module = importlib.import_module(f"kerasdist.launch.{module}")
        real = launch_module.local_cluster

        def taken(**counts):
            spec = real(**counts)
            cluster = {job: list(addresses) for job, addresses in spec.cluster.items()}
            cluster["worker"][1] = f"localhost:{port}"
            return spec.__class__(cluster=cluster, task_type=spec.task_type,
                                  task_index=spec.task_index)

        monkeypatch.setattr(launch_module, "local_cluster", taken)
        # as in the CLI's own process: a library call would run an exposed parameter-server
        # coordinator in a child (issue 33), out of this monkeypatch's reach
        from kerasdist import _exit

        with pytest.raises(ClusterError, match=f"task worker:1: port {port} on 'localhost' is "
                           "already in use") as err, _exit.reporting_to(lambda err: None):
            kerasdist.fit(recipe)
    assert exit_code(classify(err.value)) == 2
    assert not list((tmp_path / "run" / "logs").glob("*.log"))  # no task started


def _linear_recipe(tmp_path, kind: str):
    import yaml

    raw = {"model": {"name": "linear"},
           "data": {"source": {"kind": "synthetic_linear", "num_examples": 256},
                    "train_split": "train", "batch_size": 32},
           "optimizer": {"name": "sgd", "learning_rate": 0.05},
           "strategy": {"kind": kind},
           "cluster": {"kind": "local", "workers": 2, "ps": 1 if kind == "parameter_server" else 0,
                       "allow_network_exposure": True},
           "trainer": {"epochs": 1},
           "output": {"run_dir": str(tmp_path / "run"), "tensorboard": False}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path
