"""Start a whole local TF1 cluster (ps + workers as separate processes) with one command.

CLI (also ``python -m legacy ...``)::

    python -m legacy sync-replicas --workers 2 [--train-steps 2000]
    python -m legacy async-cnn     --workers 2 [--steps 600]
    python -m legacy towers        --devices 2 [--steps 300]
    python -m legacy compare       [--workers 2] [--train-steps 2000]

Python API: :func:`run_sync_replicas`, :func:`run_single_linear`,
:func:`run_async_cnn`, :func:`run_towers`, :func:`compare`. Each returns a dict
with the parsed result, timings, the log files and the PIDs it started, or
raises :class:`ClusterRunError` naming the task that failed.

The runner picks free ports with portpicker and starts the tasks with kerasdist's
:class:`~kerasdist.launch.processes.LocalLauncher` (each in its own process group,
killed with the runner, output in ``<run_dir>/<job>-<index>.log``). It waits with
an overall timeout and always stops every process it started (success, failure,
timeout, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from kerasdist._signals import terminate_on_sigterm
from kerasdist.launch.processes import LocalLauncher, Task

REPO_ROOT = Path(__file__).resolve().parent.parent
_FINISHED = re.compile(r"Optimization Finished: W=([-+\d.eE]+), b=([-+\d.eE]+)")
_ACCURACY = re.compile(r"held-out accuracy=([\d.]+)")
_TRAIN_S = re.compile(r"train_wall_s=([\d.]+)")
_TF_NOISE = re.compile(r"^([IWE]\d{4} |WARNING: All log messages before absl)")
_STOP_GRACE_S = 3.0  # SIGTERM, then SIGKILL after this long


class ClusterRunError(RuntimeError):
    """A task died, the run timed out, or its output could not be parsed."""

    def __init__(self, message, task=None, returncode=None, pids=(), logs=None, run_dir=None):
        super().__init__(message)
        self.task = task
        self.returncode = returncode
        self.pids = list(pids)
        self.logs = dict(logs or {})
        self.run_dir = run_dir


@dataclass
class Fault:
    """Fault injection for tests: SIGKILL ``task`` ``after_s`` seconds after ``marker``
    first shows in its log (or after its start when marker is empty)."""

    task: str
    after_s: float = 0.0
    marker: str = ""
    seen_at: float | None = field(default=None, repr=False)


def make_run_dir(flow: str, run_dir=None) -> Path:
    """``run_dir`` or a new folder runs/legacy/<flow>-<time>-<random> in the repo (git-ignored)."""
    if run_dir is None:
        base = REPO_ROOT / "runs" / "legacy"
        base.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return Path(tempfile.mkdtemp(prefix=f"{flow}-{stamp}-", dir=base))
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _read(task: Task) -> str:
    return task.log_path.read_text(errors="replace")


def _quiet_tail(launcher: LocalLauncher, task: Task, n: int = 15) -> str:
    """The last ``n`` lines of a task log, without TF's C++ start-up chatter."""
    lines = [ln for ln in launcher.tail(task, lines=200).splitlines() if not _TF_NOISE.match(ln)]
    return "\n".join("    | " + line for line in lines[-n:])


# ---------------------------------------------------------------------------
# flows
# ---------------------------------------------------------------------------

def _cluster_tasks(module, workers: int, ps: int, args: list, task_args=None) -> list:
    """``[(task name, argv)]`` for ``ps`` ps tasks and ``workers`` workers on free local ports."""
    import portpicker  # noqa: PLC0415

    ports = [portpicker.pick_unused_port() for _ in range(ps + workers)]  # distinct per process
    ps_hosts = ",".join(f"localhost:{p}" for p in ports[:ps])
    worker_hosts = ",".join(f"localhost:{p}" for p in ports[ps:])
    task_args = task_args or {}
    names = [(job, i) for job, count in (("ps", ps), ("worker", workers)) for i in range(count)]
    return [(f"{job}:{i}", [sys.executable, "-m", f"legacy.{module}", f"--job_name={job}",
                            f"--task_index={i}", f"--ps_hosts={ps_hosts}",
                            f"--worker_hosts={worker_hosts}", *args,
                            *task_args.get(f"{job}:{i}", [])])
            for job, i in names]


def _task_env(threads: int) -> dict:
    """Environment on top of LocalLauncher's (which sets PYTHONUNBUFFERED, OMP_NUM_THREADS and
    TF_NUM_INTRAOP_THREADS from threads_per_task)."""
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "2", "GRPC_VERBOSITY": "ERROR",
            "TF_NUM_INTEROP_THREADS": str(threads)}


def _inject_fault(fault: Fault, launcher: LocalLauncher, echo) -> bool:
    """SIGKILL the fault's task once it is due; True once done."""
    task = next(t for t in launcher.tasks if t.name == fault.task)
    if task.returncode() is not None:
        return False
    if fault.seen_at is None:
        if fault.marker and fault.marker not in _read(task):
            return False
        fault.seen_at = time.time()
    if time.time() - fault.seen_at < fault.after_s:
        return False
    echo(f"  fault injection: SIGKILL {task.name} (pid {task.pid})")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(task.pid, signal.SIGKILL)  # not launcher.stop: that sends SIGTERM first
    task.process.wait(timeout=10)
    return True


def _wait(launcher: LocalLauncher, done_jobs, timeout_s: float, t0: float, fault, fail, echo):
    """Wait until every task of ``done_jobs`` exited 0; return the wall time.

    Fails (``fail(...)``, a ClusterRunError) as soon as any task exits non-zero, a task of
    another job (the ps) exits at all, or the timeout passes.
    """
    while True:
        if fault is not None and _inject_fault(fault, launcher, echo):
            fault = None
        for task in launcher.failed():
            raise fail(f"{task.name} exited with code {task.returncode()}", task.name,
                       task.returncode())
        pending = []
        for task in launcher.tasks:
            code = task.returncode()
            in_done_jobs = task.name.partition(":")[0] in done_jobs
            if code is None and in_done_jobs:
                pending.append(task)
            elif code is not None and not in_done_jobs:  # the ps never ends by itself
                raise fail(f"{task.name} exited early (code {code})", task.name, code)
        if not pending:
            return time.time() - t0
        if time.time() - t0 > timeout_s:
            names = ", ".join(t.name for t in pending)
            raise fail(f"timed out after {timeout_s:.0f} s; still running: {names}",
                       pending[0].name)
        time.sleep(0.1)


def _execute(flow, run_dir: Path, tasks, done_jobs, timeout_s, fault=None, threads=1, echo=print):
    """Start ``tasks`` (``[(name, argv)]``), wait, always stop them.

    Returns (wall_s, {task name: log text}, {task name: log path}, pids).
    """
    echo(f"[{flow}] run folder {run_dir}")
    launcher = LocalLauncher(log_dir=run_dir, threads_per_task=threads)
    pids: list = []
    logs: dict = {}
    fail = partial(ClusterRunError, pids=pids, logs=logs, run_dir=str(run_dir))
    try:
        try:
            t0 = time.time()
            for name, argv in tasks:
                # the launcher appends to <type>-<index>.log; a reused run folder gets fresh logs
                (run_dir / f"{name.replace(':', '-')}.log").unlink(missing_ok=True)
                task = launcher.start_process(name, argv, env=_task_env(threads))
                pids.append(task.pid)
                logs[name] = str(task.log_path)
                echo(f"  started {name:<9} pid {task.pid:<7} log {task.log_path}")
            wall = _wait(launcher, done_jobs, timeout_s, t0, fault, fail, echo)
        except ClusterRunError as err:
            bad = next((t for t in launcher.tasks if t.name == err.task), None)
            if bad is not None:
                echo(f"[{flow}] FAILED: {err}\n  last lines of {bad.log_path}:\n"
                     f"{_quiet_tail(launcher, bad)}")
            raise
        finally:
            launcher.stop_all(grace_s=_STOP_GRACE_S)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM through terminate_on_sigterm
        echo(f"[{flow}] interrupted; all {len(pids)} task processes stopped")
        raise
    return wall, {t.name: _read(t) for t in launcher.tasks}, logs, pids


def _train_seconds(texts: dict, names) -> float | None:
    found = [float(m) for n in names for m in _TRAIN_S.findall(texts[n])]
    return max(found) if found else None


def _parse_or_fail(pattern, text, what, name, logs, pids):
    match = pattern.findall(text)
    if not match:
        raise ClusterRunError(f"{name} finished but printed no {what}", task=name,
                              pids=pids, logs=logs)
    return match[-1]


def run_sync_replicas(workers: int = 2, train_steps: int = 2000, learning_rate: float = 0.01,
                      session: str = "monitored", timeout_s: float = 300, run_dir=None,
                      seed: int = 1, task_args=None, fault: Fault | None = None,
                      echo=print) -> dict:
    """Seed 001 on 1 ps + ``workers`` workers. Returns W, b (read by the chief), timings, logs."""
    run_dir = make_run_dir("sync-replicas", run_dir)
    args = [f"--train_steps={train_steps}", f"--learning_rate={learning_rate}",
            f"--session={session}", f"--seed={seed}", f"--log_dir={run_dir / 'checkpoints'}"]
    tasks = _cluster_tasks("sync_replicas", workers, 1, args, task_args)
    wall, texts, logs, pids = _execute("sync-replicas", run_dir, tasks, {"worker"}, timeout_s,
                                       fault, echo=echo)
    per_worker = {}
    for i in range(workers):
        name = f"worker:{i}"
        w, b = _parse_or_fail(_FINISHED, texts[name], "final W, b", name, logs, pids)
        per_worker[name] = (float(w), float(b))
    w, b = per_worker["worker:0"]
    return dict(W=w, b=b, workers=per_worker, wall_s=wall,
                train_s=_train_seconds(texts, per_worker), logs=logs, pids=pids,
                run_dir=str(run_dir), train_steps=train_steps)


def run_single_linear(train_steps: int = 4000, learning_rate: float = 0.01, timeout_s: float = 300,
                      run_dir=None, seed: int = 1, threads: int = 1, echo=print) -> dict:
    """Seed 001's single-machine baseline, in its own process for a fair wall time."""
    run_dir = make_run_dir("single-linear", run_dir)
    argv = [sys.executable, "-m", "legacy.sync_replicas", f"--train_steps={train_steps}",
            f"--learning_rate={learning_rate}", f"--seed={seed}", f"--threads={threads}"]
    wall, texts, logs, pids = _execute("single-linear", run_dir, [("single:0", argv)], {"single"},
                                       timeout_s, threads=threads, echo=echo)
    w, b = _parse_or_fail(_FINISHED, texts["single:0"], "final W, b", "single:0", logs, pids)
    return dict(W=float(w), b=float(b), wall_s=wall, train_s=_train_seconds(texts, ["single:0"]),
                logs=logs, pids=pids, run_dir=str(run_dir), train_steps=train_steps)


def run_async_cnn(workers: int = 2, steps: int = 600, batch_size: int = 64,
                  learning_rate: float = 1e-3, timeout_s: float = 300, run_dir=None,
                  seed: int = 1, task_args=None, fault: Fault | None = None,
                  steps_per_worker: int | None = None, echo=print) -> dict:
    """Seeds 000 + 003 on 1 ps + ``workers`` workers.

    ``steps`` is the GLOBAL last step (StopAtStepHook): all workers' updates
    together, so each worker makes about steps / workers of them. Pass
    ``steps_per_worker`` instead to get steps = steps_per_worker * workers.
    """
    if steps_per_worker is not None:
        steps = steps_per_worker * workers
    run_dir = make_run_dir("async-cnn", run_dir)
    args = [f"--train_steps={steps}", f"--batch_size={batch_size}",
            f"--learning_rate={learning_rate}", f"--seed={seed}",
            f"--log_dir={run_dir / 'checkpoints'}"]
    tasks = _cluster_tasks("async_cnn", workers, 1, args, task_args)
    wall, texts, logs, pids = _execute("async-cnn", run_dir, tasks, {"worker"}, timeout_s, fault,
                                       echo=echo)
    acc = _parse_or_fail(_ACCURACY, texts["worker:0"], "held-out accuracy", "worker:0", logs, pids)
    names = [f"worker:{i}" for i in range(workers)]
    train_s = _train_seconds(texts, names)
    return dict(accuracy=float(acc), wall_s=wall, train_s=train_s, train_wall_s=train_s,
                logs=logs, pids=pids, run_dir=str(run_dir), steps=steps, global_steps=steps,
                workers=workers, batch_size=batch_size,
                checkpoint_dir=str(run_dir / "checkpoints"))


def run_towers(devices: int = 2, steps: int = 300, batch_size: int = 50,
               learning_rate: float = 0.005, timeout_s: float = 300, run_dir=None,
               threads: int = 2, seed: int = 1, echo=print) -> dict:
    """Seed 004 in one process with ``devices`` towers."""
    run_dir = make_run_dir("towers", run_dir)
    argv = [sys.executable, "-m", "legacy.towers", f"--num_devices={devices}",
            f"--max_steps={steps}", f"--batch_size={batch_size}",
            f"--learning_rate={learning_rate}", f"--threads={threads}", f"--seed={seed}",
            f"--data_dir={run_dir / 'tfrecords'}"]
    wall, texts, logs, pids = _execute("towers", run_dir, [("towers:0", argv)], {"towers"},
                                       timeout_s, threads=threads, echo=echo)
    text = texts["towers:0"]
    acc = _parse_or_fail(_ACCURACY, text, "held-out accuracy", "towers:0", logs, pids)
    placed = re.findall(r"(tower_\d+) on (\S+?)[,\n]", text)
    losses = [(int(step), value) for step, value in re.findall(r"step (\d+), loss = (\S+) ", text)]
    return dict(accuracy=float(acc), wall_s=wall, train_s=_train_seconds(texts, ["towers:0"]),
                towers=dict(placed), losses=losses, logs=logs, pids=pids, run_dir=str(run_dir),
                steps=steps)


def compare(workers: int = 2, train_steps: int = 2000, timeout_s: float = 300,
            echo=print) -> dict:
    """Seed 001's comparison: the same number of data points single-process and on the cluster."""
    single = run_single_linear(train_steps=train_steps * workers, timeout_s=timeout_s, echo=echo)
    cluster = run_sync_replicas(workers=workers, train_steps=train_steps, timeout_s=timeout_s,
                                echo=echo)
    return dict(single=single, cluster=cluster, workers=workers, train_steps=train_steps)


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------

def _print_sync(res, echo=print) -> bool:
    ok = abs(res["W"] - 2) < 0.1 and abs(res["b"] - 10) < 0.1
    for name, (w, b) in res["workers"].items():
        echo(f"  {name}: Optimization Finished: W={w:.9f}, b={b:.9f}")
    echo(f"W={res['W']:.6f} b={res['b']:.6f} (target W=2, b=10, tolerance 0.1: "
         f"{'OK' if ok else 'MISSED'})  wall {res['wall_s']:.1f} s, "
         f"training loop {res['train_s']:.1f} s, {res['train_steps']} global steps")
    return ok


def _print_accuracy(res, label, target, echo=print) -> bool:
    ok = res["accuracy"] >= target
    echo(f"{label}: held-out accuracy {res['accuracy']:.4f} (target >= {target}: "
         f"{'OK' if ok else 'MISSED'})  wall {res['wall_s']:.1f} s, "
         f"training loop {res['train_s']:.1f} s")
    return ok


def _print_compare(res, echo=print) -> bool:
    s, c = res["single"], res["cluster"]
    n = res["train_steps"] * res["workers"]
    echo(f"\nseed-001 comparison, {n} one-point SGD steps in total:")
    echo(f"  {'':<28}{'wall (process start->exit)':>28}{'training loop':>16}   W, b")
    echo(f"  {'single process':<28}{s['wall_s']:>26.2f} s{s['train_s']:>14.2f} s   "
         f"{s['W']:.4f}, {s['b']:.4f}")
    label = f"1 ps + {res['workers']} workers (sync)"
    echo(f"  {label:<28}{c['wall_s']:>26.2f} s{c['train_s']:>14.2f} s   "
         f"{c['W']:.4f}, {c['b']:.4f}")
    echo("  (the seed, on 3 machines: single 12.56 s, cluster 8.45 s; here every task shares "
         f"{os.cpu_count()} cores)")
    return _print_sync(c, echo=lambda *_: None)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m legacy",
                                description="Run a TF1 tutorial flow on a local cluster.")
    sub = p.add_subparsers(dest="flow", required=True)
    sr = sub.add_parser("sync-replicas", help="seed 001: SyncReplicasOptimizer, 1 ps + N workers")
    sr.add_argument("--workers", type=int, default=2)
    sr.add_argument("--train-steps", type=int, default=2000)
    sr.add_argument("--learning-rate", type=float, default=0.01)
    sr.add_argument("--session", choices=("monitored", "supervisor"), default="monitored")
    ac = sub.add_parser("async-cnn", help="seeds 000+003: async MNIST CNN, 1 ps + N workers")
    ac.add_argument("--workers", type=int, default=2)
    ac.add_argument("--steps", type=int, default=600, help="global last step")
    ac.add_argument("--batch-size", type=int, default=64)
    tw = sub.add_parser("towers", help="seed 004: one tower per device, averaged gradients")
    tw.add_argument("--devices", type=int, default=2)
    tw.add_argument("--steps", type=int, default=300)
    tw.add_argument("--batch-size", type=int, default=50)
    cp = sub.add_parser("compare", help="seed 001: single process vs 1 ps + N workers")
    cp.add_argument("--workers", type=int, default=2)
    cp.add_argument("--train-steps", type=int, default=2000)
    for sp in (sr, ac, tw, cp):
        sp.add_argument("--timeout", type=float, default=300, help="overall limit, seconds")
    for sp in (sr, ac, tw):
        sp.add_argument("--run-dir", default=None, help="folder for logs and checkpoints")
    return p


def _dispatch(a) -> bool:
    if a.flow == "sync-replicas":
        return _print_sync(run_sync_replicas(
            workers=a.workers, train_steps=a.train_steps, learning_rate=a.learning_rate,
            session=a.session, timeout_s=a.timeout, run_dir=a.run_dir))
    if a.flow == "async-cnn":
        res = run_async_cnn(workers=a.workers, steps=a.steps, batch_size=a.batch_size,
                            timeout_s=a.timeout, run_dir=a.run_dir)
        return _print_accuracy(res, f"async CNN, 1 ps + {a.workers} workers", 0.97)
    if a.flow == "towers":
        res = run_towers(devices=a.devices, steps=a.steps, batch_size=a.batch_size,
                         timeout_s=a.timeout, run_dir=a.run_dir)
        print("  " + ", ".join(f"{k} on {v}" for k, v in res["towers"].items()))
        return _print_accuracy(res, f"towers x{a.devices}", 0.95)
    return _print_compare(compare(workers=a.workers, train_steps=a.train_steps,
                                  timeout_s=a.timeout))


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    try:
        with terminate_on_sigterm():  # `kill` stops the cluster too (as Ctrl-C does)
            ok = _dispatch(a)
    except ClusterRunError as err:
        print(f"error: {err}  (logs in {err.run_dir})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
