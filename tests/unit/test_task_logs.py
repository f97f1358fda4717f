"""Which task a process of a local cluster runs, from the log its standard output goes to
(:mod:`kerasdist._task_logs`): the same for a started and a forked task, whose
``/proc/PID/environ`` is its launcher's (no ``TF_CONFIG`` there)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kerasdist._task_logs import local_task, task_log_name

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.mark.timeout(60)
def test_a_task_is_known_by_its_log_and_anything_else_is_not(tmp_path):
    logs = tmp_path / "run" / "logs"
    logs.mkdir(parents=True)
    assert task_log_name("ps:0") == "ps-0.log"
    procs = []
    try:
        with open(logs / task_log_name("ps:0"), "ab") as log:
            procs.append(subprocess.Popen(SLEEP, stdout=log, stderr=subprocess.STDOUT))
        with open(tmp_path / "notes.log", "ab") as other:  # a log, but no task's
            procs.append(subprocess.Popen(SLEEP, stdout=other))
        procs.append(subprocess.Popen(SLEEP, stdout=subprocess.PIPE))
        pid = os.fork()
        if pid == 0:  # a forked task: its environ is this process's; its fd 1 is its log
            fd = os.open(logs / task_log_name("worker:1"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.dup2(fd, 1)
            time.sleep(60)
            os._exit(0)
        try:
            deadline = time.monotonic() + 10
            while local_task(pid) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert local_task(pid) == (logs, "worker:1")
        finally:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        assert local_task(procs[0].pid) == (logs, "ps:0")
        assert local_task(procs[1].pid) is None
        assert local_task(procs[2].pid) is None
        assert local_task(2 ** 22 + 12345) is None  # no such process
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
