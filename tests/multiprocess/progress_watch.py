"""Run a command for as long as it makes progress: a test limit that a loaded machine does not trip.

A wall-clock limit measures the machine's load as much as the command: on the 2 shared cores
the same parameter-server sweep took 66 s at load 3 and more than 840 s at load 25. Here the
command is stopped (process tree SIGKILLed) and the test fails only when

* it made **no progress** for ``stall_s`` seconds: no file under ``watch`` grew or changed, and
  its process tree used less than ``stall_cpu_s`` CPU seconds in that window (a silent import
  or a long step under load uses CPU; a hang that polls now and then does not); or
* its process tree used more than ``cpu_budget_s`` CPU seconds in all (the work itself grew, or
  a busy loop): CPU seconds do not grow with the machine's load as wall seconds do.

CPU seconds are summed over every process of the tree ever seen (the last reading of each, so
a process that has exited keeps its share, less at most one poll).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass
class Finished:
    """How a watched command ended: exit code, output, wall and CPU seconds."""

    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    cpu_s: float


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _files(folders: list[Path]) -> dict[str, tuple[int, int]]:
    seen: dict[str, tuple[int, int]] = {}
    for folder in folders:
        for dirpath, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(dirpath, name)
                try:
                    stat = os.stat(path)
                except OSError:
                    continue
                seen[path] = (stat.st_size, stat.st_mtime_ns)
    return seen


class _Watch:
    """The progress of one process tree: its CPU seconds and the files under ``watch``."""

    def __init__(self, pid: int, watch: list[Path], stall_cpu_s: float):
        self.root, self.watch, self.stall_cpu_s = psutil.Process(pid), watch, stall_cpu_s
        self.cpu: dict[int, float] = {}
        self.files = _files(watch)
        self.cpu_at_progress = 0.0
        self.last_progress = time.monotonic()

    @property
    def used(self) -> float:
        return sum(self.cpu.values())

    def sample(self) -> None:
        for member in _tree(self.root):
            try:
                times = member.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            self.cpu[member.pid] = times.user + times.system
        files = _files(self.watch)
        if files != self.files or self.used - self.cpu_at_progress >= self.stall_cpu_s:
            self.files, self.cpu_at_progress = files, self.used
            self.last_progress = time.monotonic()

    def kill(self, timeout_s: float = 20.0) -> None:
        """SIGKILL the tree, then wait until every member is dead (gone, or a zombie left to be
        reaped): a killed process may still read as running for a moment under load (seen once
        in a CI run: ``test_a_silent_idle_command_is_stopped_as_stalled_with_its_children``)."""
        members = list(reversed(_tree(self.root)))
        for member in members:
            try:
                member.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(_alive(m) for m in members):
            time.sleep(0.05)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_while_progressing(command: list[str], *, cwd: Path, env: dict[str, str],
                          watch: list[Path], stall_s: float = 600.0, stall_cpu_s: float = 30.0,
                          cpu_budget_s: float = 3600.0, poll_s: float = 2.0) -> Finished:
    """Run ``command`` (its own session, output captured to files in ``cwd``) until it ends.

    Raises:
        AssertionError: no progress for ``stall_s`` s, or over ``cpu_budget_s`` CPU s (see the
            module docs); names which, with the output's tail. The tree is killed first.
    """
    out, err = cwd / ".watched.stdout", cwd / ".watched.stderr"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=stdout, stderr=stderr,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    watch_ = _Watch(proc.pid, watch, stall_cpu_s)
    started, why = time.monotonic(), ""
    while not why and proc.poll() is None:
        time.sleep(poll_s)
        watch_.sample()
        if watch_.used > cpu_budget_s:
            why = f"used {watch_.used:.0f} CPU s, over its budget of {cpu_budget_s:g}"
        elif time.monotonic() - watch_.last_progress > stall_s:
            why = (f"made no progress for {stall_s:g} s (no file changed under {watch}, "
                   f"< {stall_cpu_s:g} CPU s used)")
    wall = time.monotonic() - started
    if why:
        watch_.kill()
        proc.wait(timeout=60)
    text_out, text_err = out.read_text(errors="replace"), err.read_text(errors="replace")
    if why:
        raise AssertionError(f"{' '.join(command[-3:])} {why} after {wall:.0f} s wall:\n"
                             f"{text_out[-3000:]}\n{text_err[-3000:]}")
    return Finished(proc.returncode, text_out, text_err, wall, watch_.used)
