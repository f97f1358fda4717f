"""Where a trial's ``kerasdist fit`` runs: a child process of the driver (``backend: local``).

A trial is started as ``python -m kerasdist fit <trial>/recipe.yaml --quiet`` in a session of
its own, its output appended to ``<trial>/trial.log``, with ``PR_SET_PDEATHSIG`` (Linux) set to
SIGTERM: when the driver ends, however it ends (SIGKILL included), every trial gets SIGTERM,
saves a checkpoint where its strategy can and stops its cluster (whose tasks die with their
launcher), so no trial process outlives the driver.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kerasdist._parent_death import session_ending_with
from kerasdist.sweep.processes import STOP_GRACE_S, poll_until_exit


class LocalTrial:
    """A trial's ``kerasdist fit`` as a child process of the driver.

    Args:
        recipe: the trial's recipe file.
        log: the file its output is appended to.
        cwd: the working directory (the driver's, so the recipe's relative paths mean the same).
    """

    def __init__(self, recipe: Path, log: Path, *, cwd: Path | None = None):
        self.log = log
        command = [sys.executable, "-m", "kerasdist", "fit", str(recipe), "--quiet"]
        with open(log, "ab") as sink:
            sink.write(f"\n=== kerasdist sweep: {' '.join(command)} at "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
            sink.flush()
            from kerasdist.sweep.gate import DRIVER_ENV

            env = {**os.environ, DRIVER_ENV: str(os.getpid())}
            self.proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                                         preexec_fn=session_ending_with(os.getpid()))
        self._term_at: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        """The exit code, or None while it runs; SIGKILLs its group 30 s after :meth:`stop`."""
        code = self.proc.poll()
        if code is None and self._term_at is not None and \
                time.monotonic() - self._term_at > STOP_GRACE_S:
            self._signal(signal.SIGKILL)
        return code

    def stop(self) -> None:
        """SIGTERM (the trial saves a checkpoint and stops its cluster); SIGKILL later."""
        if self._term_at is None and self.proc.poll() is None:
            self._term_at = time.monotonic()
            self._signal(signal.SIGTERM)

    def wait(self, timeout_s: float = STOP_GRACE_S + 10) -> int | None:
        """Wait for the exit (after :meth:`stop`, SIGKILL at its grace); the exit code."""
        code = poll_until_exit(self.poll, timeout_s)
        if code is not None:
            return code
        self._signal(signal.SIGKILL)
        return self.proc.wait(timeout=10)

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)


def start_trial(backend: str, *, recipe: Path, log: Path, cores: int):
    """Start a trial on ``backend`` (``local``, ``ray``); an object with ``poll``, ``stop``,
    ``wait``."""
    if backend == "ray":
        from kerasdist.sweep.ray_backend import RayTrial

        return RayTrial(recipe, log, cores=cores, cwd=Path.cwd())
    return LocalTrial(recipe, log, cwd=Path.cwd())
