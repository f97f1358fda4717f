"""A child process that ends with its parent: ``prctl(PR_SET_PDEATHSIG)`` (Linux; elsewhere
nothing is asked)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal the kernel sends this process when its parent ends."""


def signal_when_parent_dies(sig: int, parent: int | None = None) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent ends.

    Args:
        sig: the signal (``SIGTERM`` lets the child save first; ``SIGKILL`` ends it at once).
        parent: the pid of the process that started this one: a parent that ended before the
            request took effect sends nothing, so the caller is told.

    Returns:
        False when ``parent`` is given and is no longer this process's parent (the caller ends
        itself), else True. Always True off Linux.
    """
    if not sys.platform.startswith("linux"):
        return True
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    return parent is None or os.getppid() == parent


def session_ending_with(parent: int, sig: int = signal.SIGTERM):
    """A ``preexec_fn`` (:class:`subprocess.Popen`): the child gets a session of its own (its
    process group is what its starter signals) and ``sig`` when ``parent`` ends, however it ends,
    or at once when ``parent`` has already ended."""

    def preexec() -> None:  # runs in the child between fork and exec
        os.setsid()
        if not signal_when_parent_dies(sig, parent):
            os.kill(os.getpid(), sig)

    return preexec


__all__ = ["PR_SET_PDEATHSIG", "session_ending_with", "signal_when_parent_dies"]
