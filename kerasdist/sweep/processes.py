"""The trials' processes: how long a stopped trial has, the wait for a trial's end, whether a
process lives, and the ``preexec_fn`` that ties a trial to the driver (a leaf module:
:mod:`kerasdist.sweep.backends` and :mod:`kerasdist.sweep.ray_backend` both use it)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from typing import Callable

STOP_GRACE_S = 30.0
"""Seconds a trial has after SIGTERM before its process group gets SIGKILL."""


def poll_until_exit(poll: Callable[[], int | None], timeout_s: float,
                    interval_s: float = 0.2) -> int | None:
    """Call ``poll`` (a trial's: the exit code, or None while it runs) every ``interval_s``
    seconds until it gives a code or ``timeout_s`` seconds have passed; the code, or None at
    the timeout (the caller then ends the trial its own way)."""
    deadline = time.monotonic() + timeout_s
    while True:
        code = poll()
        if code is not None or time.monotonic() >= deadline:
            return code
        time.sleep(interval_s)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _with_driver(parent: int):
    """A ``preexec_fn``: a session of its own, SIGTERM when the driver ends."""

    def preexec() -> None:  # runs in the child between fork and exec
        os.setsid()
        if sys.platform.startswith("linux"):
            with contextlib.suppress(OSError):
                ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PDEATHSIG
            if os.getppid() != parent:  # the driver ended before the prctl took effect
                os.kill(os.getpid(), signal.SIGTERM)

    return preexec
