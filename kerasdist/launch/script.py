"""``kerasdist launch``: run a user's own Keras script as a local cluster (torchrun for Keras 3).

* **Multi-worker** (``--ps 0``, the default): ``--workers N`` tasks (plus ``chief:0`` with
  ``--chief``) each run the script with its own ``TF_CONFIG``; the script builds its
  ``MultiWorkerMirroredStrategy`` from it, as on real machines.
* **Parameter server** (``--ps M``): ``M`` ps and ``N`` worker tasks run kerasdist's TensorFlow
  servers; the script runs once, as ``chief:0``, the coordinator of its ``ParameterServerStrategy``.

Every script task runs ``python -m kerasdist.launch.script_task SCRIPT ARGS`` (kerasdist enabled
before the script's first line; see :mod:`kerasdist.launch.script_task`). The launcher is the one
recipes use (:class:`~kerasdist.launch.processes.LocalLauncher`, status files, failure classes):

* every task's output goes to ``<log_dir>/<type>-<index>.log`` and is echoed to the console with
  its task as prefix (``[worker:1] ...``);
* the first failing task is named with how it ended and its last lines; every process is stopped
  on a failure, on Ctrl-C and on SIGTERM (exit code 130);
* a lost task (killed, or its script failed because a peer was lost) restarts the cluster up to
  ``--max-restarts`` times (the script resumes from its own ``BackupAndRestore``/checkpoints); a
  script error (class ``fatal``) is not restarted. Under parameter server a dead *worker* server
  is restarted alone and the coordinator carries on (``ClusterCoordinator`` re-runs its steps).

The cluster runs in a private network namespace (:mod:`kerasdist.launch.isolation`): its servers
are unreachable from other machines, and so is the network from the script (prepare datasets
first). ``--allow-network-exposure`` runs without it.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kerasdist._log import get_logger
from kerasdist._native_log import is_noise
from kerasdist._signals import terminate_on_sigterm
from kerasdist.cluster.spec import TFConfig, check_ports_free, local_cluster
from kerasdist.errors import RETRYABLE, ClusterError
from kerasdist.launch.peers import Failure, describe_failure
from kerasdist.launch.processes import LocalLauncher, Task

log = get_logger("launch")

TASK_MODULE = "kerasdist.launch.script_task"
STOP_GRACE_S = 30.0


@dataclass(frozen=True)
class ScriptCluster:
    """What ``kerasdist launch`` runs. ``workers`` >= 1; ``ps`` >= 0 (0: multi-worker)."""

    script: str
    args: tuple[str, ...] = ()
    workers: int = 2
    ps: int = 0
    chief: bool = False
    max_restarts: int = 0
    log_dir: Path = Path("kerasdist-logs")
    threads_per_task: int = 0
    start_timeout_s: float = 120.0

    def __post_init__(self):
        if not Path(self.script).is_file():
            raise ClusterError(f"script: no such file. Received: script='{self.script}'")
        for name, low in (("workers", 1), ("ps", 0), ("max_restarts", 0)):
            if getattr(self, name) < low:
                raise ClusterError(f"--{name.replace('_', '-')} must be >= {low}. "
                                   f"Received: {name}={getattr(self, name)}")

    @property
    def parameter_server(self) -> bool:
        return self.ps > 0

    def spec(self) -> TFConfig:
        """The local cluster (free localhost ports; a chief whenever there are ps tasks)."""
        return local_cluster(workers=self.workers, ps=self.ps,
                             chief=self.chief or self.parameter_server)

    def commands(self, spec: TFConfig) -> list[tuple[TFConfig, list[str]]]:
        """``(task's TF_CONFIG, argv)`` of every task, servers first."""
        python = [sys.executable, "-m", TASK_MODULE]
        script = [*python, str(Path(self.script).resolve()), *self.args]
        jobs = [("ps", [*python, "--serve"]), ("worker", [*python, "--serve"]),
                ("chief", script)] if self.parameter_server else [("chief", script),
                                                                  ("worker", script)]
        return [(spec.for_task(job, i), argv) for job, argv in jobs for i in range(spec.num(job))]


def dry_run(cluster: ScriptCluster) -> str:
    """Each task's ``TF_CONFIG`` and command, one block per task (nothing is started)."""
    spec = cluster.spec()
    return "\n".join(f"[{task.task_name}]\n  TF_CONFIG='{task.to_json()}'\n  {' '.join(argv)}"
                     for task, argv in cluster.commands(spec))


class _Echo:
    """Echo new lines of the tasks' log files to stdout, prefixed with the task name."""

    def __init__(self, verbose: bool = False):
        self.verbose = verbose  # keep TensorFlow's start-up noise (kerasdist._native_log)
        self._offsets: dict[Path, int] = {}
        self._names: dict[Path, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kerasdist-echo", daemon=True)

    def add(self, task: Task) -> None:
        self._names[task.log_path] = task.name
        self._offsets.setdefault(task.log_path, task.log_path.stat().st_size
                                 if task.log_path.exists() else 0)

    def __enter__(self) -> _Echo:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.flush()

    def flush(self) -> None:
        for path, offset in list(self._offsets.items()):
            try:
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read()
            except OSError:
                continue
            complete = data.rfind(b"\n") + 1
            if complete:
                self._offsets[path] = offset + complete
                prefix = f"[{self._names[path]}] "
                text = data[:complete].decode("utf-8", "replace")
                sys.stdout.write("".join(prefix + line + "\n" for line in text.splitlines()
                                         if self.verbose or not is_noise(line)))
                sys.stdout.flush()


def _attempt(cluster: ScriptCluster, restarts_left: list[int]) -> Failure | None:
    spec = cluster.spec()
    check_ports_free(spec)
    with LocalLauncher(log_dir=cluster.log_dir, threads_per_task=cluster.threads_per_task) as \
            launcher, terminate_on_sigterm(), _Echo() as echo:
        def start(task_spec: TFConfig, argv: list[str]) -> Task:
            task = launcher.start_process(task_spec.task_name, argv, tf_config=task_spec,
                                          env={"TF_CONFIG": task_spec.to_json()})
            echo.add(task)
            return task

        commands = cluster.commands(spec)
        servers = [start(s, a) for s, a in commands if cluster.parameter_server and
                   s.task_type in ("ps", "worker")]
        if servers:
            launcher.wait_listening(servers, timeout_s=cluster.start_timeout_s)
        scripts = [start(s, a) for s, a in commands if not (cluster.parameter_server and
                                                           s.task_type in ("ps", "worker"))]
        log.info(f"launch: {len(servers)} server(s), {len(scripts)} script task(s); "
                 f"logs in {cluster.log_dir}")
        try:
            by_name = {task_spec.task_name: (task_spec, argv) for task_spec, argv in commands}
            first = _watch(launcher, scripts, servers, by_name, restarts_left, start)
        except KeyboardInterrupt:
            log.warning(f"interrupted: stopping every task (up to {STOP_GRACE_S:.0f} s)")
            launcher.stop_all(grace_s=STOP_GRACE_S)
            raise
        if first is None:
            return None
        time.sleep(2.0)  # let the other tasks fail on their own, so their logs say why
        launcher.stop_all()
        return describe_failure(launcher, first)


def _watch(launcher, scripts, servers, commands, restarts_left, start) -> Task | None:
    """Wait until every script task exits 0 (None) or one task fails (returned). Under parameter
    server a dead worker server is restarted while restarts are left."""
    while True:
        if all(t.returncode() == 0 for t in scripts):
            return None
        for task in [*scripts, *servers]:
            code = task.returncode()
            if code is None or (code == 0 and task in scripts):
                continue
            if task in servers and task.name.startswith("worker:") and restarts_left[0] > 0:
                restarts_left[0] -= 1
                log.warning(f"task {task.name} ended ({code}); restarting it "
                            f"({restarts_left[0]} restart(s) left)")
                servers[servers.index(task)] = start(*commands[task.name])
                continue
            return task
        time.sleep(0.2)


def launch(cluster: ScriptCluster) -> None:
    """Run the script cluster until it succeeds, fails in a way a restart cannot mend, or the
    restarts are spent.

    Raises:
        TaskFailedError: a task was lost and no restart is left (names it, how it ended).
        TrainingError: the script failed by itself (class ``fatal``): its own message.
        ClusterError: bad input (no script, a taken port) before anything started (exit 2).
        KeyboardInterrupt: Ctrl-C or SIGTERM; every task was stopped.
    """
    from kerasdist.errors import TaskFailedError, TrainingError

    restarts_left = [cluster.max_restarts]
    attempt = 0
    while True:
        attempt += 1
        failure = _attempt(cluster, restarts_left)
        if failure is None:
            log.info("every script task exited 0")
            return
        first_line = failure.report.splitlines()[0]
        if failure.failure_class not in RETRYABLE:
            raise TrainingError(f"{failure.report.rstrip()}\nnot restarted (a "
                                f"{failure.failure_class} error fails the same way again): "
                                f"{failure.error}: {failure.message}")
        if restarts_left[0] <= 0:
            raise TaskFailedError(f"kerasdist launch failed after {attempt} attempt(s): "
                                  f"{failure.report}")
        restarts_left[0] -= 1
        log.warning(f"attempt {attempt} failed: {first_line}; restarting the cluster "
                    f"({restarts_left[0]} restart(s) left)")


__all__ = ["ScriptCluster", "dry_run", "launch"]
