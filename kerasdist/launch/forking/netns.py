"""The namespace child of an isolated local cluster, forked from the command that checked the run.

Where :func:`kerasdist.launch.forking.launcher_ready` holds, the launcher of an isolated local
cluster is forked from the command (:func:`fork_launcher`) instead of started under
``unshare --net``. The child stands where a started child would
(:func:`kerasdist.launch.forking.process.run`), moves itself into a fresh network namespace
(:func:`unshare_network`: ``CLONE_NEWNET``, with ``CLONE_NEWUSER`` first and root mapped when
not root; it is single-threaded, as ``CLONE_NEWUSER`` requires) before anything else, then runs
the caller's work (:func:`kerasdist.launch.isolation.serve`). If the namespace cannot be made it
exits having started nothing and the command starts the launcher as before (:class:`NotIsolated`).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Callable

from kerasdist.errors import ClusterError
from kerasdist.launch.forking import process
from kerasdist.launch.forking.process import ForkedTask

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
NOT_ISOLATED_EXIT = 3
"""The forked child's exit code when it could not enter a network namespace (nothing started)."""


class NotIsolated(ClusterError):
    """The forked launcher could not move into a fresh network namespace; it started nothing."""


def unshare_network() -> None:
    """Move this process into a fresh network namespace (only ``lo``, down); where it is not
    root, into a fresh user namespace first, its user and group mapped to root there.

    Call it single-threaded (just forked). Raises:
        OSError: ``unshare(2)`` or a write of ``/proc/self/{setgroups,uid_map,gid_map}`` failed
            (errno and what failed in the message).
    """
    import ctypes

    uid, gid = os.geteuid(), os.getegid()
    libc = ctypes.CDLL(None, use_errno=True)
    flags = _CLONE_NEWNET if uid == 0 else _CLONE_NEWNET | _CLONE_NEWUSER
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        what = "CLONE_NEWNET" if uid == 0 else "CLONE_NEWUSER | CLONE_NEWNET"
        raise OSError(errno, f"unshare({what}): {os.strerror(errno)}")
    if uid != 0:
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"),
                           ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w", encoding="ascii") as file:
                file.write(text)


def fork_launcher(serve: Callable[[], int], *, env: dict, result_fd: int) -> ForkedTask:
    """Fork the launcher of an isolated local cluster (see the module docs) with the environment
    ``env``: in a fresh network namespace it runs ``serve()``, which reports how the run ended on
    ``result_fd`` (JSON, as :func:`kerasdist.launch.isolation.main` does) and returns the CLI's
    code for that end; where no namespace can be entered it reports ``{"not_isolated": why}``
    there instead. The child exits with that code."""
    process.flush()
    parent = os.getpid()
    pid = process.fork()
    if pid == 0:  # the child: never returns
        process.run(parent, lambda: _launcher(serve, result_fd=result_fd), name="kd-launcher",
                    env=env, log_fd=None, keep=(result_fd,))
    return process.ForkedTask(pid, [sys.executable, "-m", "kerasdist.launch.isolation"])


def _launcher(serve: Callable[[], int], *, result_fd: int) -> int:
    from kerasdist._timeline import mark

    try:
        unshare_network()
    except OSError as err:
        with os.fdopen(result_fd, "w", encoding="utf-8") as pipe:
            pipe.write(json.dumps({"not_isolated": str(err)}))
        return NOT_ISOLATED_EXIT
    mark("launcher forked")  # KERASDIST_TIMELINE: the namespace child was forked (tests, profile)
    return process.finish(serve())


__all__ = ["NOT_ISOLATED_EXIT", "NotIsolated", "fork_launcher", "unshare_network"]
