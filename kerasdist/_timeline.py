"""Start-up timeline: where a run's processes spend the time to the first step.

When the environment variable ``KERASDIST_TIMELINE`` names a file, every kerasdist process of the
run (the command, the local cluster's parent, each task) appends one JSON line per mark::

    {"task": "worker:0", "pid": 4711, "mark": "strategy", "t": 1795790000.123}

``t`` is Unix time in seconds (float). The first mark of a process is preceded by one named
``process`` whose ``t`` is the process's start time read from ``/proc`` (Linux; skipped
elsewhere), so interpreter start-up and imports are inside the timeline. ``task`` comes from
``TF_CONFIG`` (``type:index``), or is ``cli`` without one. Each mark is one short ``write`` to
the file opened with ``O_APPEND``, so the processes of a run share one file without interleaving
lines (Linux).

Unset (the default), :func:`mark` returns at once and writes nothing. ``tools/startup_profile.py``
sets it and turns the file into the table of docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

ENV = "KERASDIST_TIMELINE"
_started: set[int] = set()
_named: dict[int, str] = {}  # pid -> task, from set_task


def set_task(name: str) -> None:
    """Name this process's task for its later marks (a parameter-server coordinator runs as
    ``chief:0`` without ``TF_CONFIG`` in its environment)."""
    _named[os.getpid()] = name


def _task() -> str:
    if os.getpid() in _named:
        return _named[os.getpid()]
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return "cli"
    try:
        task = json.loads(raw).get("task", {})
        return f"{task.get('type', '?')}:{task.get('index', 0)}"
    except (ValueError, AttributeError):
        return "?"


def process_start_time(pid: int | None = None) -> float | None:
    """Unix time (s) at which process ``pid`` (default: this one) started, from ``/proc`` (its
    start in clock ticks after boot, and the boot time as now minus ``/proc/uptime``: 10 ms
    resolution; ``btime`` of ``/proc/stat`` is rounded to the second and drifts); None where
    ``/proc`` is not there (not Linux)."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # starttime, field 22 of proc(5), in clock ticks since boot
        with open("/proc/uptime") as uptime:
            booted = time.time() - float(uptime.read().split()[0])
        return booted + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def mark(name: str) -> None:
    """Append the mark ``name`` at the current time (no-op unless ``KERASDIST_TIMELINE`` is
    set). Never raises: a timeline that cannot be written is not worth failing a run for."""
    path = os.environ.get(ENV)
    if not path:
        return
    pid = os.getpid()
    lines = []
    task = _task()
    if pid not in _started:
        _started.add(pid)
        start = process_start_time()
        if start is not None:
            lines.append({"task": task, "pid": pid, "mark": "process", "t": start})
    lines.append({"task": task, "pid": pid, "mark": name, "t": time.time()})
    with contextlib.suppress(OSError):
        with open(path, "a") as out:
            out.write("".join(json.dumps(line) + "\n" for line in lines))
