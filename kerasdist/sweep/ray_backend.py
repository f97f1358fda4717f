"""``backend: ray``: each trial's ``kerasdist fit`` runs inside a Ray task that reserves the CPUs
the trial takes (``num_cpus`` = its tasks, :func:`kerasdist.sweep.plan.trial_cores`), so Ray's
own scheduler places the trials on its resources and holds back a trial that does not fit.

With ``ray_address`` unset the driver starts a local Ray (no dashboard; :data:`KILL_CHILDREN_ENV`
``false`` unless set, so a trial is ended by its ``PR_SET_PDEATHSIG`` SIGTERM and saves) and stops
it at the end; ``auto`` or ``HOST:PORT`` joins a running cluster and leaves it running. The Ray
task starts ``kerasdist fit`` as its child with ``PR_SET_PDEATHSIG``: when Ray ends the task (the
driver gone, or :meth:`RayTrial.stop`) the trial gets SIGTERM and saves its checkpoint, as on the
local backend (``docs/sweep.md`` says why). Needs ``pip install 'kerasdist[ray]'``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kerasdist.errors import ClusterError

KILL_CHILDREN_ENV = "RAY_kill_child_processes_on_worker_exit"
"""Ray's switch: a worker SIGKILLs its child processes when it exits (default true)."""
_TASK = None
_STARTED_HERE = False


def connect(*, address: str | None, cores_per_trial: int, parallel: int,
            oversubscribe: bool) -> None:
    """Start (or join) Ray for the sweep and check a trial fits its CPUs.

    Raises:
        RecipeError: Ray is not installed (exit code 2).
        ClusterError: Ray cannot be reached, or its CPUs cannot hold one trial, or ``parallel``
            trials unless ``allow_oversubscription`` (exit code 2).
    """
    global _STARTED_HERE
    from kerasdist.launch.clusters.ray import OBJECT_STORE_BYTES, _quiet, require_ray
    from kerasdist.sweep.plan import machine_cores

    ray = require_ray()
    if not ray.is_initialized():
        try:
            if address is None:
                cpus = max(machine_cores(), cores_per_trial)  # a trial of more tasks than
                # cores runs over-subscribed, as `kerasdist fit` would run it here
                os.environ.setdefault(KILL_CHILDREN_ENV, "false")  # the raylet and workers
                # inherit it: a trial ends by its PDEATHSIG SIGTERM and saves (module docs)
                ray.init(address="local", num_cpus=cpus, include_dashboard=False,
                         object_store_memory=OBJECT_STORE_BYTES, log_to_driver=False,
                         configure_logging=False, logging_config=_quiet(ray))
                _STARTED_HERE = True
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False,
                         logging_config=_quiet(ray))
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise ClusterError(f"ray_address {address!r}: cannot join a Ray cluster there: "
                               f"{err}. Received: ray_address={address!r}") from None
    cpus = float(ray.cluster_resources().get("CPU", 0.0))
    if cores_per_trial > cpus or (parallel > max(1, cpus // cores_per_trial) and not oversubscribe):
        shutdown()
        raise ClusterError(f"parallel={parallel} trials of {cores_per_trial} CPU(s) each need "
                           f"{parallel * cores_per_trial} CPUs; the Ray cluster has {cpus:g}. "
                           f"Received: parallel={parallel}")


def shutdown() -> None:
    """Stop a local Ray started by :func:`connect`; disconnect from a joined one."""
    global _STARTED_HERE
    import ray

    if ray.is_initialized():
        ray.shutdown()
    _STARTED_HERE = False


def _run_fit(command: list[str], log: str, cwd: str, env: dict[str, str]) -> int:
    """Inside the Ray task: run the trial's ``kerasdist fit`` and return its exit code. A
    cancelled task (``KeyboardInterrupt``) sends the trial SIGTERM and waits for it."""
    from kerasdist._parent_death import session_ending_with
    from kerasdist.sweep.processes import STOP_GRACE_S

    with open(log, "ab") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                                preexec_fn=session_ending_with(os.getpid()))
    try:
        return proc.wait()
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()


class RayTrial:
    """A trial's ``kerasdist fit`` in a Ray task reserving ``cores`` CPUs (see module docs);
    the same ``poll``/``stop``/``wait`` as :class:`kerasdist.sweep.backends.LocalTrial`."""

    def __init__(self, recipe: Path, log: Path, *, cores: int, cwd: Path):
        global _TASK
        import ray

        from kerasdist.sweep.gate import DRIVER_ENV

        if _TASK is None:
            _TASK = ray.remote(max_retries=0)(_run_fit)
        command = [sys.executable, "-m", "kerasdist", "fit", str(recipe), "--quiet"]
        driver = str(os.getpid()) if _STARTED_HERE else "0"  # a pid means nothing on other nodes
        env = {**os.environ, DRIVER_ENV: driver}
        with open(log, "ab") as sink:
            sink.write(f"\n=== kerasdist sweep (ray task, {cores} CPU): {' '.join(command)} at "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        self.ref = _TASK.options(num_cpus=cores).remote(command, str(log), str(cwd), env)
        self._ray, self._code, self._cancelled = ray, None, None

    def poll(self) -> int | None:
        """The trial's exit code, or None while it runs (or waits for Ray's CPUs)."""
        if self._code is not None:
            return self._code
        ready, _ = self._ray.wait([self.ref], timeout=0)
        if not ready:
            if self._cancelled is not None and time.monotonic() - self._cancelled > 40:
                self._ray.cancel(self.ref, force=True)
            return None
        try:
            self._code = int(self._ray.get(self.ref))
        except self._ray.exceptions.TaskCancelledError:
            self._code = -signal.SIGTERM
        except self._ray.exceptions.RayError:
            self._code = 1
        return self._code

    def stop(self) -> None:
        """Cancel the task: the trial gets SIGTERM and saves its checkpoint."""
        if self._cancelled is None and self.poll() is None:
            self._cancelled = time.monotonic()
            self._ray.cancel(self.ref, force=False)

    def wait(self, timeout_s: float = 70.0) -> int | None:
        """Wait for the end (after :meth:`stop`); the exit code."""
        from kerasdist.sweep.processes import poll_until_exit

        code = poll_until_exit(self.poll, timeout_s)
        if code is not None:
            return code
        self._ray.cancel(self.ref, force=True)
        return self.poll()
