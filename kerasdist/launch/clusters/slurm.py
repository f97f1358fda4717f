"""``cluster.kind: slurm``: every task of one Slurm job step (``srun``) is a kerasdist task, its
role read from Slurm (:func:`tf_config_from_slurm`); a parameter-server job ends when its chief
ends (:func:`serve_until_chief_ends`, :func:`release_servers`); a preempted job is requeued
(:func:`after_preemption`, :func:`requeue_decision`). The job script, roles, the job's end,
preemption and requeue: docs/slurm.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

from kerasdist._log import get_logger
from kerasdist.cluster.roles import int_env, scheduler_env, task_counts
from kerasdist.cluster.spec import TFConfig, validate
from kerasdist.errors import ClusterError, TaskFailedError
from kerasdist.launch.clusters.tf_config import ScheduledKind
from kerasdist.strategies import registry

log = get_logger("cluster")

SLURM_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST",
                   "SLURM_STEP_TASKS_PER_NODE")


def slurm_jobs(*, needs_ps: bool, num_tasks: int, num_ps: int = 0) -> dict[str, int]:
    """Tasks per job for a Slurm step of ``num_tasks`` tasks.

    Without ps (``multi_worker``): every task is a worker (worker 0 is the chief). With ps
    (``parameter_server``): rank 0 is the chief (coordinator), the next ``num_ps`` ranks are ps
    tasks, the rest are workers.

    Raises:
        ClusterError: too few tasks for the requested roles.
    """
    workers = num_tasks - (1 + num_ps if needs_ps else 0)
    if workers < 1:
        raise ClusterError(f"cluster.kind 'slurm' with a parameter-server strategy needs "
                           f"1 chief + cluster.ps (>= 1) ps + >= 1 worker Slurm tasks. Received: "
                           f"{num_tasks} task(s), ps={num_ps}")
    return task_counts(needs_ps=needs_ps, workers=workers, ps=num_ps,
                       where="cluster.kind 'slurm'")


def tf_config_from_slurm(*, needs_ps: bool, num_ps: int = 0, port_base: int = 8888,
                         num_workers: int | None = None) -> TFConfig:
    """This Slurm task's role and cluster as a :class:`TFConfig`.

    Args:
        needs_ps: the strategy needs ps tasks (its traits; see :func:`slurm_jobs`).
        num_ps: parameter-server tasks (``cluster.ps``).
        port_base: first port on each node (``cluster.port_base``).
        num_workers: the workers the recipe asks for (``cluster.workers`` when set); None
            (default): every task not chief or ps is a worker.

    Returns:
        The validated role of this task; read-only use of ``os.environ`` (``SLURM_*``).

    Raises:
        ClusterError: a ``SLURM_*`` variable is missing or malformed, or the roles do not fit
            (too few tasks, or a task count other than ``num_workers`` + ``num_ps`` + chief).
    """
    import tensorflow as tf

    environ = os.environ
    scheduler_env(environ, SLURM_VARIABLES,
                  inside="cluster.kind 'slurm' must run inside a Slurm job step (srun)")
    num_tasks = int_env(environ, "SLURM_STEP_NUM_TASKS")
    jobs = slurm_jobs(needs_ps=needs_ps, num_tasks=num_tasks, num_ps=num_ps)
    if num_workers is not None and jobs["worker"] != num_workers:
        wanted = num_workers + (1 + num_ps if needs_ps else 0)
        roles = f"cluster.workers={num_workers}" + (f" + cluster.ps={num_ps} + 1 chief"
                                                     if needs_ps else "")
        raise ClusterError(f"the Slurm step has {num_tasks} task(s) but the recipe needs {wanted} "
                           f"({roles}): run srun --ntasks={wanted}, or change the recipe. "
                           f"Received: SLURM_STEP_NUM_TASKS={num_tasks}")
    try:
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
            jobs=jobs, port_base=port_base, gpus_per_node=num_tasks, gpus_per_task=1,
            auto_set_gpu=False)
        spec = resolver.cluster_spec().as_dict()
    except (RuntimeError, ValueError) as err:
        values = {name: environ.get(name) for name in SLURM_VARIABLES}
        raise ClusterError(f"cannot resolve the Slurm cluster: {err}. Received: {values}") from None
    return validate(spec, resolver.task_type, resolver.task_id,
                    require_ps=needs_ps)


RELEASE_SIGNAL = signal.SIGUSR2
"""The signal the chief sends its step's tasks when it has finished successfully."""
PERIOD_S = 2.0
"""Seconds between two probes of the chief by a ps or worker task."""
GONE_AFTER_S = 6.0
"""Seconds the chief's port must stay closed (after it answered once) before a server gives up."""
START_TIMEOUT_S = 600.0
"""Default seconds a server waits for the chief's port to answer a first time."""
RELEASE_WAIT_S = 30.0
"""Seconds the chief waits for the released servers' ports to close."""
REQUEUE_WAIT_S = 60.0
"""Seconds a preempted task other than task 0 waits for task 0's requeue to end it."""


def restart_count() -> int:
    """``SLURM_RESTART_COUNT`` (0 when unset: the job's first run).

    Raises:
        ClusterError: (exit 2) not a whole number >= 0.
    """
    value = os.environ.get("SLURM_RESTART_COUNT", "0") or "0"
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 0:
        raise ClusterError(f"SLURM_RESTART_COUNT must be a whole number >= 0. Received: {value!r}")
    return count


def log_start(tf_config, max_restarts: int) -> None:
    """Log this task's Slurm job, step and restart count, and refuse a run past the requeue cap
    (a count equal to the cap is the last run allowed; docs/slurm.md, "The requeue cap").

    Raises:
        ClusterError: (exit 2) ``SLURM_RESTART_COUNT`` above ``max_restarts`` (both named), or
            not a whole number >= 0.
    """
    job = os.environ.get("SLURM_JOB_ID", "?")
    count = restart_count()
    if count > max_restarts:
        raise ClusterError(f"Slurm job {job} has been requeued {count} time(s), more than the "
                           f"recipe allows (cluster.max_restarts={max_restarts}): not starting "
                           f"again; raise cluster.max_restarts to go on from the last checkpoint. "
                           f"Received: SLURM_RESTART_COUNT={count}")
    last = " (the last run it allows: a further preemption is not requeued)" \
        if count and count == max_restarts else ""
    log.info(f"task {tf_config.task_name}: Slurm job {job} step {os.environ.get('SLURM_STEP_ID', '?')}"
             f", SLURM_RESTART_COUNT={count} (requeues allowed: cluster.max_restarts="
             f"{max_restarts}){last}")


def _job_fields(job: str) -> dict[str, str]:
    """``scontrol show job -o JOB`` as a dict (``JobState``, ``Reason``...); empty when it fails."""
    done = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        return {}
    return dict(item.partition("=")[::2] for item in done.stdout.split() if "=" in item)


def requeue_decision(fields: dict[str, str], *, count: int, max_restarts: int) -> tuple[bool, str]:
    """Whether task 0 asks Slurm to requeue its job after a preemption stop, and the line saying
    what happens to the job (the cases: docs/slurm.md, "Preemption, requeue and the exact step").

    Args:
        fields: the job's ``scontrol show job -o`` fields (empty: unknown, taken as running).
        count: ``SLURM_RESTART_COUNT`` of this run.
        max_restarts: ``cluster.max_restarts``.

    Returns:
        (requeue, line): whether to run ``scontrol requeue``; one line for the log.
    """
    state, restarts = fields.get("JobState", "RUNNING"), int(fields.get("Restarts") or count)
    if state != "RUNNING" and restarts > count:
        past = f"; past cluster.max_restarts={max_restarts}, the requeued run will refuse to " \
            "start" if restarts > max_restarts else f" of at most {max_restarts}"
        return False, f"Slurm is requeueing the job (restart {restarts}{past})"
    if state != "RUNNING" and fields.get("Reason") != "TimeLimit":
        return False, f"not requeued: the job was cancelled (JobState={state})"
    if count >= max_restarts:
        return False, f"not requeued: max_restarts reached ({max_restarts})"
    if fields.get("Requeue") == "0":
        return False, "not requeued: the job does not allow requeue (submit it with sbatch --requeue)"
    return True, f"requeued by kerasdist (restart {count + 1} of at most {max_restarts})"


def after_preemption(max_restarts: int) -> str:
    """What a task does after a preemption stop under Slurm (see module docs): task 0 logs one
    line saying what happens to the job (:func:`requeue_decision`) and requeues it when that is
    kerasdist's to do; returns the line. Other tasks wait up to :data:`REQUEUE_WAIT_S` seconds for
    the requeue to end them and return ``'waited'``."""
    job = os.environ.get("SLURM_JOB_ID", "")
    if os.environ.get("SLURM_PROCID", "0") != "0":
        time.sleep(REQUEUE_WAIT_S)
        return "waited"
    count = restart_count()
    if not job:
        requeue, line = False, "not requeued: SLURM_JOB_ID is not set"
    else:
        check_commands("scontrol")
        requeue, line = requeue_decision(_job_fields(job), count=count, max_restarts=max_restarts)
    if requeue:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True,
                              timeout=60)
        if done.returncode != 0:  # Slurm's own requeue may have begun since it was looked at
            line = "Slurm is requeueing the job" if "pending execution" in done.stderr else \
                f"not requeued: scontrol requeue {job} failed: {done.stderr.strip()}"
    log.warning(f"Slurm job {job or '?'}: {line}")
    return line


class ScriptPreempted(KeyboardInterrupt):
    """The preemption signal ended a user's script under ``kerasdist launch --this-task`` (exit
    128 + ``signum``). A ``KeyboardInterrupt``, so that the script's ``except Exception`` handlers
    let it pass, as Ctrl-C."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(f"{signal.Signals(self.signum).name} received: the script was stopped "
                         "(it resumes from its own last checkpoint)")


@contextlib.contextmanager
def signal_ends_script(signal_name: str):
    """While a user's script runs (``launch --this-task`` in a Slurm job), the preemption signal
    ``signal_name`` (``'USR1'``, ...) raises :class:`ScriptPreempted` in the main thread (the
    script resumes from its own checkpoints; a handler it installs wins). Restores the previous
    handler on exit."""
    from kerasdist.keras.preemption import signal_of

    signum = signal_of(signal_name)

    def on_signal(number, _frame):
        log.warning(f"{signal.Signals(number).name} received: stopping the script (preemption)")
        raise ScriptPreempted(number)

    previous = signal.signal(signum, on_signal)
    try:
        yield
    finally:
        signal.signal(signum, previous)


def _step_id() -> str:
    """``JOB.STEP`` of this task's Slurm step, from ``SLURM_JOB_ID`` and ``SLURM_STEP_ID``."""
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    if not job or not step:
        raise ClusterError("cluster.kind 'slurm': SLURM_JOB_ID and SLURM_STEP_ID must be set (run "
                           f"the tasks with srun). Received: SLURM_JOB_ID={job!r}, "
                           f"SLURM_STEP_ID={step!r}")
    return f"{job}.{step}"


def check_commands(*names: str) -> None:
    """Raise :class:`ClusterError` (exit 2) naming the Slurm commands missing from ``PATH``."""
    import shutil

    missing = [name for name in names if shutil.which(name) is None]
    if missing:
        raise ClusterError(f"cluster.kind 'slurm' needs the Slurm client command(s) "
                           f"{', '.join(missing)} on PATH (package slurm-client). Received: "
                           f"PATH={os.environ.get('PATH', '')!r}")


def release_servers(tf_config, *, wait_s: float = RELEASE_WAIT_S) -> list[str]:
    """The chief's end of a successful parameter-server run under Slurm: signal every task of
    this step with :data:`RELEASE_SIGNAL` and wait up to ``wait_s`` seconds for the ps and worker
    ports to close. Returns the tasks whose port still answered (logged; they then exit 1 on
    their own once this process is gone).

    Raises:
        ClusterError: ``scancel`` missing or failing, or not in a Slurm step.
    """
    from kerasdist.cluster.probe import probe

    step = _step_id()
    check_commands("scancel")
    signal.signal(RELEASE_SIGNAL, signal.SIG_IGN)  # the step's signal reaches this task too
    done = subprocess.run(["scancel", f"--signal={RELEASE_SIGNAL.name.removeprefix('SIG')}", step],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise ClusterError(f"scancel could not release the servers of step {step}: "
                           f"{done.stderr.strip()}. Received: exit code {done.returncode}")
    servers = {f"{job}:{i}": address for job in ("ps", "worker")
               for i, address in enumerate(tf_config.cluster.get(job, ()))}
    deadline = time.monotonic() + wait_s
    left = dict(servers)
    while left and time.monotonic() < deadline:
        left = {name: a for name, a in left.items() if probe(a, timeout_s=1.0) == "alive"}
        if left:
            time.sleep(0.5)
    log.info(f"released {len(servers) - len(left)} of {len(servers)} server task(s) of step "
             f"{step}" + (f"; still serving: {', '.join(sorted(left))}" if left else ""))
    return sorted(left)


def serve_until_chief_ends(tf_config, *, intra_op_threads: int = 0,
                           start_timeout_s: float = START_TIMEOUT_S,
                           preemption_signal: str = "USR1") -> None:
    """Serve this ps or worker task until the chief releases it (:data:`RELEASE_SIGNAL`, exit 0)
    or is gone (exit 1; after SIGTERM, which the task survives while the chief runs, exit 143).
    In a process kerasdist owns the process ends here with that code; in a library call the
    release returns and a gone chief raises.

    Args:
        tf_config: this task's role (a ``ps`` or ``worker`` of a cluster with a chief).
        intra_op_threads: the server's intra-op threads (0: TF's default).
        start_timeout_s: seconds to wait for the chief's port to answer a first time.
        preemption_signal: ``cluster.preemption_signal`` (default ``'USR1'``): ignored here (the
            chief saves and requeues); ``'TERM'`` is handled as SIGTERM below.

    Raises:
        TaskFailedError: the chief ended without releasing this task, or never started.
        ClusterError: this task's port is already in use.
    """
    from kerasdist import _exit
    from kerasdist.cluster.server import start_server
    from kerasdist.keras.preemption import signal_of

    released = threading.Event()
    preempt = signal_of(preemption_signal)
    previous = {sig: signal.getsignal(sig) for sig in (RELEASE_SIGNAL, signal.SIGTERM, preempt)}
    signal.signal(RELEASE_SIGNAL, lambda *_: released.set())
    if preempt != signal.SIGTERM:
        signal.signal(preempt, signal.SIG_IGN)  # the chief saves and requeues
    terminated = threading.Event()

    def on_sigterm(*_):
        terminated.set()
        log.warning(f"task {tf_config.task_name}: SIGTERM received; serving on while chief:0 "
                    "runs (it may be saving a checkpoint on this task's variables)")

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        start_server(tf_config, intra_op_threads=intra_op_threads)
        failure = _watch_chief(tf_config, released, start_timeout_s)
    finally:
        for sig, handler in previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
    if failure is None:
        log.info(f"task {tf_config.task_name}: released by chief:0 (the run finished); exit 0")
        _end(0)
        return
    if terminated.is_set():  # Slurm ends the job (cancel, requeue, time limit): not a failure
        log.warning(f"task {tf_config.task_name}: chief:0 is gone after SIGTERM (the job is being "
                    "cancelled or requeued); exit 143")
        _end(143)
        return
    _exit.abandon(failure)
    raise failure


def _end(code: int) -> None:
    """End this process with ``code`` when kerasdist owns it (TF's server threads never stop)."""
    from kerasdist import _exit

    if _exit.owns_process():
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _watch_chief(tf_config, released: threading.Event, start_timeout_s: float):
    """None once released, else the :class:`TaskFailedError` of a gone or never-started chief."""
    from kerasdist.cluster.probe import probe

    chief = tf_config.cluster.get("chief", [None])[0]
    if chief is None:
        raise ClusterError(f"task {tf_config.task_name}: a parameter-server cluster under Slurm "
                           "needs a chief task. Received: no 'chief' in the cluster")
    started = time.monotonic()
    seen_alive = False
    closed_since: float | None = None
    while not released.wait(PERIOD_S):
        state = probe(chief, timeout_s=min(2.0, PERIOD_S))
        if released.is_set():
            return None
        now = time.monotonic()
        if state == "alive":
            seen_alive, closed_since = True, None
            continue
        if not seen_alive:
            if now - started >= start_timeout_s:
                return _gone(tf_config, chief, f"never answered in {start_timeout_s:g} s")
            continue
        closed_since = closed_since if closed_since is not None else now
        if now - closed_since >= GONE_AFTER_S:
            return _gone(tf_config, chief, f"{state} for {now - closed_since:.0f} s without "
                                           "releasing this task (it failed or was killed)")
    return None


def _gone(tf_config, chief: str, what: str) -> TaskFailedError:
    failure = TaskFailedError(f"task {tf_config.task_name}: chief:0 ({chief}) {what}; this "
                              "server exits 1 so that the Slurm step fails with it")
    failure.lost_tasks = ["chief:0"]
    return failure


class SlurmKind(ScheduledKind):
    """``cluster.kind: slurm`` (see the module docs)."""

    def environment_role(self, recipe) -> TFConfig:
        """This task's role from its Slurm step (:func:`tf_config_from_slurm`); a
        parameter-server task first checks that ``scancel`` (the chief's release) is on ``PATH``.

        Raises:
            ClusterError: a ``SLURM_*`` variable missing or malformed, roles that do not fit,
                ``scancel`` missing (names what is wrong).
        """
        needs_ps = registry.for_recipe(recipe).traits.needs_ps
        cluster = recipe.cluster
        if needs_ps:
            check_commands("scancel")  # the chief releases the servers with it
        return tf_config_from_slurm(
            needs_ps=needs_ps, num_ps=cluster.ps, port_base=cluster.port_base,
            num_workers=cluster.workers if "workers" in cluster.model_fields_set else None)

    def log_start(self, recipe, tf_config: TFConfig) -> None:
        log_start(tf_config, recipe.cluster.max_restarts)

    def serve(self, recipe, tf_config: TFConfig) -> None:
        serve_until_chief_ends(tf_config, intra_op_threads=recipe.intra_op_threads(),
                               preemption_signal=recipe.cluster.preemption_signal)

    def on_preempted(self, recipe) -> None:
        after_preemption(recipe.cluster.max_restarts)  # task 0 requeues the job

    def on_success(self, recipe, tf_config: TFConfig) -> None:
        release_servers(tf_config)


__all__ = ["GONE_AFTER_S", "PERIOD_S", "RELEASE_SIGNAL", "RELEASE_WAIT_S", "REQUEUE_WAIT_S",
           "SLURM_VARIABLES", "START_TIMEOUT_S", "ScriptPreempted", "SlurmKind", "after_preemption",
           "check_commands", "log_start", "release_servers", "requeue_decision", "restart_count",
           "serve_until_chief_ends", "signal_ends_script", "slurm_jobs", "tf_config_from_slurm"]
