"""The trials' processes: how long a stopped trial has, and the ``preexec_fn`` that ties a trial
to the driver (a leaf module: :mod:`kerasdist.sweep.backends` and
:mod:`kerasdist.sweep.ray_backend` both use it)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

STOP_GRACE_S = 30.0
"""Seconds a trial has after SIGTERM before its process group gets SIGKILL."""


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
