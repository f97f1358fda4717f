"""A child started with :func:`kerasdist._parent_death.session_ending_with` ends with its parent,
and at once when its parent has already ended (Linux)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from kerasdist._parent_death import session_ending_with

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_child_whose_parent_has_already_ended_gets_the_signal_at_once():
    not_its_parent = os.getppid()  # the child's parent is this process, so this one "ended"
    child = subprocess.Popen(SLEEP, preexec_fn=session_ending_with(not_its_parent))
    try:
        assert child.wait(timeout=30) == -signal.SIGTERM
    finally:
        child.kill()


def test_a_child_gets_the_signal_when_its_parent_dies():
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, subprocess
        from kerasdist._parent_death import session_ending_with
        child = subprocess.Popen({SLEEP!r}, preexec_fn=session_ending_with(os.getpid()))
        print(child.pid, flush=True)
        os._exit(0)
        """)], stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    parent.wait(timeout=30)
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the child {pid} outlived its parent by 30 s")
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
