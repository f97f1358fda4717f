"""The progress-tied test limit (progress_watch.py): a command that ends is returned whole; one
that writes nothing and uses no CPU is stopped as stalled; one that burns CPU past its budget is
stopped; both killed with their children."""

from __future__ import annotations

import os
import sys

import psutil
import pytest
from progress_watch import run_while_progressing

pytestmark = pytest.mark.multiprocess

PY = [sys.executable, "-c"]


@pytest.mark.timeout(120)
def test_a_command_that_ends_is_returned_with_its_output_and_cpu(tmp_path):
    done = run_while_progressing([*PY, "print('hello'); sum(range(10**7))"], cwd=tmp_path,
                                 env=dict(os.environ), watch=[tmp_path], stall_s=60, poll_s=0.2)
    assert done.returncode == 0 and done.stdout == "hello\n" and done.cpu_s > 0


@pytest.mark.timeout(120)
def test_a_silent_idle_command_is_stopped_as_stalled_with_its_children(tmp_path):
    script = ("import subprocess, time\n"
              "child = subprocess.Popen(['sleep', '600'])\n"
              "open('child.pid', 'w').write(str(child.pid))\n"
              "time.sleep(600)\n")
    with pytest.raises(AssertionError, match="made no progress for 3 s"):
        run_while_progressing([*PY, script], cwd=tmp_path, env=dict(os.environ),
                              watch=[tmp_path], stall_s=3, stall_cpu_s=5, poll_s=0.2)
    child = int((tmp_path / "child.pid").read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"


@pytest.mark.timeout(120)
def test_a_command_that_writes_is_progressing_and_one_that_spins_is_over_budget(tmp_path):
    writes = ("import time\nfor i in range(24):\n    open('out.txt', 'a').write('x')\n"
              "    time.sleep(0.5)\n")  # 12 s; its start-up (no write yet) must stay under 5 s
    done = run_while_progressing([*PY, writes], cwd=tmp_path, env=dict(os.environ),
                                 watch=[tmp_path], stall_s=5, stall_cpu_s=100, poll_s=0.2)
    assert done.returncode == 0 and done.wall_s > 11  # longer than stall_s, but progressing
    with pytest.raises(AssertionError, match="over its budget of 2"):
        run_while_progressing([*PY, "while True: pass"], cwd=tmp_path, env=dict(os.environ),
                              watch=[tmp_path], stall_s=600, cpu_budget_s=2, poll_s=0.2)
