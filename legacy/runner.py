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

The runner picks free ports with portpicker, starts every task in its own
process group with its output in ``<run_dir>/<job>-<index>.log``, waits with
an overall timeout, and always stops every process it started (success,
failure, timeout, Ctrl-C).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
_FINISHED = re.compile(r"Optimization Finished: W=([-+\d.eE]+), b=([-+\d.eE]+)")
_ACCURACY = re.compile(r"held-out accuracy=([\d.]+)")
_TRAIN_S = re.compile(r"train_wall_s=([\d.]+)")


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
class Task:
    job: str
    index: int
    argv: list
    log: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.job}:{self.index}"


@dataclass
class Fault:
    """Fault injection for tests: SIGKILL ``task`` ``after_s`` seconds after ``marker``
    first shows in its log (or after its start when marker is empty)."""

    task: str
    after_s: float = 0.0
    marker: str = ""
    seen_at: float | None = field(default=None, repr=False)


def _child_env(threads: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.update({
        "PYTHONUNBUFFERED": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "GRPC_VERBOSITY": "ERROR",
        "OMP_NUM_THREADS": str(threads),
        "TF_NUM_INTRAOP_THREADS": str(threads),
        "TF_NUM_INTEROP_THREADS": str(threads),
    })
    return env


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


def pick_ports(n: int) -> list:
    import portpicker  # noqa: PLC0415

    ports: list = []
    while len(ports) < n:
        port = portpicker.pick_unused_port()
        if port not in ports:
            ports.append(port)
    return ports


class LocalRun:
    """A set of task processes: start, watch, stop. Use as a context manager."""

    def __init__(self, tasks, threads: int = 1, fault: Fault | None = None, echo=print):
        self.tasks = tasks
        self.env = _child_env(threads)
        self.fault = fault
        self.echo = echo
        self.pids: list = []

    # -- lifecycle ---------------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self) -> None:
        for task in self.tasks:
            fh = open(task.log, "wb")  # noqa: SIM115 - owned by the child
            try:
                task.proc = subprocess.Popen(
                    task.argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    cwd=str(REPO_ROOT), env=self.env, start_new_session=True)
            finally:
                fh.close()
            task.started = time.time()
            self.pids.append(task.proc.pid)
            self.echo(f"  started {task.name:<9} pid {task.proc.pid:<7} log {task.log}")

    def stop(self, grace_s: float = 3.0) -> None:
        """SIGTERM every task's process group, then SIGKILL what is left; reap all."""
        live = [t for t in self.tasks if t.proc is not None]
        for task in live:
            _signal_group(task.proc.pid, signal.SIGTERM)
        deadline = time.time() + grace_s
        for task in live:
            try:
                task.proc.wait(timeout=max(deadline - time.time(), 0.05))
            except subprocess.TimeoutExpired:
                pass
        for task in live:
            _signal_group(task.proc.pid, signal.SIGKILL)
            try:
                task.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
                self.echo(f"  warning: {task.name} pid {task.proc.pid} did not die")

    # -- watching ----------------------------------------------------------
    def wait(self, done_jobs, timeout_s: float) -> float:
        """Wait until every task of ``done_jobs`` exited 0; return the wall time.

        Fails (ClusterRunError) as soon as any task exits non-zero, a task of
        another job (the ps) exits at all, or the timeout passes.
        """
        t0 = min(t.started for t in self.tasks)
        while True:
            self._inject_fault()
            pending = self._check_exits(done_jobs)
            if not pending:
                return time.time() - t0
            if time.time() - t0 > timeout_s:
                names = ", ".join(t.name for t in pending)
                raise self._error(f"timed out after {timeout_s:.0f} s; still running: {names}",
                                  task=pending[0].name)
            time.sleep(0.1)

    def _check_exits(self, done_jobs):
        pending = []
        for task in self.tasks:
            code = task.proc.poll()
            if code is None:
                if task.job in done_jobs:
                    pending.append(task)
                continue
            if code != 0:
                raise self._error(f"{task.name} exited with code {code}", task.name, code)
            if task.job not in done_jobs:
                raise self._error(f"{task.name} exited early (code 0)", task.name, code)
        return pending

    def _inject_fault(self) -> None:
        fault = self.fault
        if fault is None:
            return
        task = self.task(fault.task)
        if task.proc.poll() is not None:
            return
        if fault.seen_at is None:
            if fault.marker and fault.marker not in read_log(task):
                return
            fault.seen_at = time.time()
        if time.time() - fault.seen_at >= fault.after_s:
            self.echo(f"  fault injection: SIGKILL {task.name} (pid {task.proc.pid})")
            _signal_group(task.proc.pid, signal.SIGKILL)
            task.proc.wait(timeout=10)
            self.fault = None

    def task(self, name: str) -> Task:
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(name)

    def logs(self) -> dict:
        return {t.name: str(t.log) for t in self.tasks}

    def _error(self, message, task=None, code=None) -> ClusterRunError:
        return ClusterRunError(message, task=task, returncode=code, pids=self.pids,
                               logs=self.logs(), run_dir=str(self.tasks[0].log.parent))


def _signal_group(pid: int, sig) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def read_log(task: Task) -> str:
    try:
        return task.log.read_text(errors="replace")
    except FileNotFoundError:
        return ""


_TF_NOISE = re.compile(r"^([IWE]\d{4} |WARNING: All log messages before absl)")


def tail(text: str, n: int = 15) -> str:
    """The last ``n`` lines of a task log, without TF's C++ start-up chatter."""
    lines = [line for line in text.splitlines() if not _TF_NOISE.match(line)]
    return "\n".join("    | " + line for line in lines[-n:])


# ---------------------------------------------------------------------------
# flows
# ---------------------------------------------------------------------------

def _cluster_tasks(module, run_dir: Path, workers: int, ps: int, args: list, task_args=None):
    ports = pick_ports(ps + workers)
    ps_hosts = ",".join(f"localhost:{p}" for p in ports[:ps])
    worker_hosts = ",".join(f"localhost:{p}" for p in ports[ps:])
    task_args = task_args or {}
    tasks = []
    for job, count in (("ps", ps), ("worker", workers)):
        for i in range(count):
            name = f"{job}:{i}"
            argv = [sys.executable, "-m", f"legacy.{module}", f"--job_name={job}",
                    f"--task_index={i}", f"--ps_hosts={ps_hosts}",
                    f"--worker_hosts={worker_hosts}", *args, *task_args.get(name, [])]
            tasks.append(Task(job, i, argv, run_dir / f"{job}-{i}.log"))
    return tasks


def _execute(flow, tasks, done_jobs, timeout_s, fault=None, threads=1, echo=print):
    """Start tasks, wait, always stop them. Returns (wall_s, {task name: log text}, logs, pids)."""
    run = LocalRun(tasks, threads=threads, fault=fault, echo=echo)
    echo(f"[{flow}] run folder {tasks[0].log.parent}")
    try:
        with run:
            run.start()
            try:
                wall = run.wait(done_jobs, timeout_s)
            except ClusterRunError as err:
                bad = run.task(err.task) if err.task else None
                if bad is not None:
                    echo(f"[{flow}] FAILED: {err}\n  last lines of {bad.log}:\n"
                         f"{tail(read_log(bad))}")
                raise
    except KeyboardInterrupt:
        echo(f"[{flow}] interrupted; all {len(run.pids)} task processes stopped")
        raise
    texts = {t.name: read_log(t) for t in tasks}
    return wall, texts, run.logs(), run.pids


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
    tasks = _cluster_tasks("sync_replicas", run_dir, workers, 1, args, task_args)
    wall, texts, logs, pids = _execute("sync-replicas", tasks, {"worker"}, timeout_s, fault,
                                       echo=echo)
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
    tasks = [Task("single", 0, argv, run_dir / "single-0.log")]
    wall, texts, logs, pids = _execute("single-linear", tasks, {"single"}, timeout_s,
                                       threads=threads, echo=echo)
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
    tasks = _cluster_tasks("async_cnn", run_dir, workers, 1, args, task_args)
    wall, texts, logs, pids = _execute("async-cnn", tasks, {"worker"}, timeout_s, fault,
                                       echo=echo)
    acc = _parse_or_fail(_ACCURACY, texts["worker:0"], "held-out accuracy", "worker:0", logs, pids)
    names = [f"worker:{i}" for i in range(workers)]
    train_s = _train_seconds(texts, names)
    return dict(accuracy=float(acc), wall_s=wall, train_s=train_s, train_wall_s=train_s,
                logs=logs, pids=pids, run_dir=str(run_dir), steps=steps, global_steps=steps,
                workers=workers, batch_size=batch_size,
                checkpoint_dir=str(run_dir / "checkpoints"))


def run_towers(devices: int = 2, steps: int = 300, batch_size: int = 50,
               learning_rate: float = 0.01, timeout_s: float = 300, run_dir=None,
               threads: int = 2, seed: int = 1, echo=print) -> dict:
    """Seed 004 in one process with ``devices`` towers."""
    run_dir = make_run_dir("towers", run_dir)
    argv = [sys.executable, "-m", "legacy.towers", f"--num_devices={devices}",
            f"--max_steps={steps}", f"--batch_size={batch_size}",
            f"--learning_rate={learning_rate}", f"--threads={threads}", f"--seed={seed}",
            f"--data_dir={run_dir / 'tfrecords'}"]
    tasks = [Task("towers", 0, argv, run_dir / "towers-0.log")]
    wall, texts, logs, pids = _execute("towers", tasks, {"towers"}, timeout_s, threads=threads,
                                       echo=echo)
    text = texts["towers:0"]
    acc = _parse_or_fail(_ACCURACY, text, "held-out accuracy", "towers:0", logs, pids)
    placed = re.findall(r"(tower_\d+) on (\S+?)[,\n]", text)
    return dict(accuracy=float(acc), wall_s=wall, train_s=_train_seconds(texts, ["towers:0"]),
                towers=dict(placed), logs=logs, pids=pids, run_dir=str(run_dir), steps=steps)


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


def _raise_interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)  # stop the cluster on `kill` too
    try:
        ok = _dispatch(a)
    except ClusterRunError as err:
        print(f"error: {err}  (logs in {err.run_dir})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
