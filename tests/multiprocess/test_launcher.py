"""The local launcher never leaves processes behind and names the task that failed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from kerasdist.launch.processes import LocalLauncher, describe_exit
from kerasdist.cluster.spec import local_cluster
from kerasdist.errors import ClusterError

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
