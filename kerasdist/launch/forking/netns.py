"""The namespace child of an isolated local cluster, forked from the command that checked the run
(time to first step).

Where :func:`kerasdist.launch.forking.launcher_ready` holds (a local ``fit`` from kerasdist's own
command that imported TensorFlow for its checks, :mod:`kerasdist.launch.forking`), the launcher of
an isolated local cluster (:mod:`kerasdist.launch.isolation`) is not started as a new interpreter
under ``unshare --net``; it is forked from the command (:func:`fork_launcher`), and the child:

1. stands where a started child would (:func:`kerasdist.launch.forking.process.run`: its own
   session, death with the command, the console with new streams, no descriptor of the command
   but its result pipe, the environment a started child gets);
2. moves itself into a fresh network namespace (:func:`unshare_network`: ``unshare(2)`` with
   ``CLONE_NEWNET``; where it is not root, with ``CLONE_NEWUSER`` first and its user and group
   mapped to root there, as ``unshare --net --map-root-user``) before anything else; if that
   fails it reports so and exits having started nothing, and the command starts the launcher as
   a new process as before (:class:`NotIsolated`);
3. runs the launcher's work given by the caller (:func:`kerasdist.launch.isolation.serve`: brings
   ``lo`` up, refusing a namespace with any other interface, and runs the local cluster); the
   first attempt's tasks are forked from it in turn, inside the namespace, so no task imports
   TensorFlow again.

The child is single-threaded when it calls ``unshare`` (a forked process holds only the thread
that forked it), which ``CLONE_NEWUSER`` requires. ``KERASDIST_FORK_TASKS=0`` turns this off with
the rest of the fork path.
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
