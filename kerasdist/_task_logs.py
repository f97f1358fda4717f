"""Where a local cluster's task writes its output, and which task a process is, read back from it.

Every task of a local cluster (:class:`kerasdist.launch.processes.LocalLauncher`) writes its
standard output and error to ``<run_dir>/logs/<type>-<index>.log`` (:func:`task_log_name`); a
process is therefore known as a task by the file its fd 1 is (:func:`local_task`), whether it
was started (``TF_CONFIG`` in its ``/proc/PID/environ``) or forked from its launcher
(:mod:`kerasdist.launch.forking`: its ``/proc/PID/environ`` is the launcher's).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_TASK_LOG = re.compile(r"(?P<type>[a-z_]+)-(?P<index>\d+)\.log")


def task_log_name(task: str) -> str:
    """``'worker:1'`` -> ``'worker-1.log'``."""
    return f"{task.replace(':', '-')}.log"


def local_task(pid: int) -> tuple[Path, str] | None:
    """``(log folder, task name)`` of a local cluster's task process, e.g.
    ``(<run_dir>/logs, 'worker:1')``, read from the log its standard output goes to
    (``<log folder>/worker-1.log``): a started and a forked task alike. None for any other
    process, or one this user cannot read (Linux ``/proc``; None elsewhere). A process a task
    started shares its log and is named the same: compare with its parent where that matters."""
    try:
        target = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None
    match = _TASK_LOG.fullmatch(os.path.basename(target))
    if match is None:
        return None
    return Path(target).parent, f"{match['type']}:{match['index']}"


__all__ = ["local_task", "task_log_name"]
