"""The trials' processes: how long a stopped trial has, the wait for a trial's end and whether a
process lives (a leaf module: :mod:`kerasdist.sweep.backends` and :mod:`kerasdist.sweep.ray_backend`
both use it; a trial is tied to the driver by :func:`kerasdist._parent_death.session_ending_with`)."""

from __future__ import annotations

import os
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
