"""Bench: one of 3 workers slowed ~3x, under multi_worker, synchronous parameter server with
K = N and K = N - 1 (one backup worker), and asynchronous parameter server.

Every configuration trains the seed MNIST CNN (recipes/mnist_cnn_ps.yaml: embedded digits,
Adam 1e-3) as a local cluster of 3 workers (and 1 ps) on the same examples per epoch: the
synchronous ones on global batches of ``3 x --slice`` examples for ``--steps`` steps an epoch,
asynchronous parameter server on ``--slice`` examples a step for ``3 x --steps`` steps an epoch.
Once training starts, worker:2 is slowed by a SIGSTOP/SIGCONT duty cycle (runs ``--duty`` of each
``--period`` seconds; 1/3 by default: about 3x slower while it has work). Configurations run
round-robin, ``--repeats`` times. Reported per run: global steps/s and examples/s over the whole
training (validation included), seconds to the first epoch whose held-out accuracy reaches
``--target`` (epoch-end times of ``metrics.json``'s ``throughput.epoch_end_s``), final held-out
accuracy, and for the synchronous ones the gradients dropped. Writes ``results.json`` and
``straggler.png`` (held-out accuracy against seconds) into ``--out``.

Run: ``python tools/straggler_bench.py [--repeats 1] [--steps 25] [--epochs 6] [--out DIR]``.
The machine's load changes the figures: compare configurations of one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {
    "multi_worker": {"strategy": {"kind": "multi_worker"}},
    "sync K=3": {"strategy": {"kind": "parameter_server", "sync": {"replicas_to_aggregate": 3}}},
    "sync K=2": {"strategy": {"kind": "parameter_server", "sync": {"replicas_to_aggregate": 2}}},
    "async": {"strategy": {"kind": "parameter_server"}},
}


COLORS = {"multi_worker": "tab:blue", "sync K=3": "tab:orange", "sync K=2": "tab:green",
          "async": "tab:red"}


def recipe(name: str, args, folder: Path) -> Path:
    raw = yaml.safe_load((REPO / "recipes" / "mnist_cnn_ps.yaml").read_text())
    asynchronous = name == "async"
    raw["strategy"] = dict(CONFIGS[name]["strategy"])
    raw["cluster"] = {"kind": "local", "workers": 3, "ps": 0 if name == "multi_worker" else 1,
                      "max_restarts": 0, "threads_per_task": 1,
                      "allow_oversubscription": True}
    raw["data"]["batch_size"] = args.slice if asynchronous else 3 * args.slice
    raw["trainer"] = {"epochs": args.epochs, "seed": 42,
                      "steps_per_epoch": args.steps * (3 if asynchronous else 1)}
    raw["output"] = {"run_dir": str(folder / name.replace(" ", "_").replace("=", "")),
                     "tensorboard": False}
    path = folder / f"{name.replace(' ', '_').replace('=', '')}.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def worker_process(launcher: int, name: str):
    from kerasdist._task_logs import local_task

    for child in psutil.Process(launcher).children(recursive=True):
        found = local_task(child.pid)
        if found and found[1] == name:
            parent = local_task(child.ppid())
            if parent is None or parent[1] != name:
                return child
    return None


def slow_down(proc: subprocess.Popen, log: Path, args, stop: threading.Event, seen: dict) -> None:
    """Duty-cycle worker:2 from the first epoch line on, until the run ends (``seen['cycles']``:
    how many stops it got)."""
    while not stop.is_set() and "Epoch 1/" not in log.read_text(errors="replace"):
        time.sleep(0.2)
    worker = None
    while not stop.is_set() and worker is None:
        worker = worker_process(proc.pid, "worker:2")
        time.sleep(0.2)
    try:
        while not stop.is_set():
            time.sleep(args.period * args.duty)
            worker.send_signal(signal.SIGSTOP)
            time.sleep(args.period * (1 - args.duty))
            worker.send_signal(signal.SIGCONT)
            seen["cycles"] = seen.get("cycles", 0) + 1
    except psutil.Error:
        pass
    finally:
        try:
            worker.send_signal(signal.SIGCONT)
        except (psutil.Error, AttributeError):
            pass


def run(name: str, args, folder: Path) -> dict:
    path = recipe(name, args, folder)
    log = folder / f"{path.stem}.log"
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kerasdist", "fit", str(path), "--overwrite"],
                                stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        stop, seen = threading.Event(), {}
        slower = threading.Thread(target=slow_down, args=(proc, log, args, stop, seen),
                                  daemon=True)
        if args.duty < 1:
            slower.start()
        code = proc.wait(timeout=args.timeout)
        stop.set()
    if code != 0:
        return {"config": name, "error": f"exit {code}; log {log}"}
    metrics = json.loads((Path(yaml.safe_load(path.read_text())["output"]["run_dir"]) /
                          "metrics.json").read_text())
    ends = metrics["throughput"]["epoch_end_s"]
    accuracy = metrics["history"].get("val_accuracy", [])
    reached = next((ends[i] for i, a in enumerate(accuracy) if a >= args.target), None)
    sync = (metrics.get("parameter_server") or {}).get("sync")
    steps = metrics["global_steps"]
    return {"config": name, "global_steps": steps, "seconds": ends[-1],
            "steps_per_s": steps / ends[-1],
            "examples_per_s": steps * metrics["throughput"]["global_batch_size"] / ends[-1],
            "seconds_to_target": reached, "final_accuracy": metrics["evaluation"]["accuracy"],
            "val_accuracy": accuracy, "epoch_end_s": ends, "sync": sync,
            "slow_cycles": seen.get("cycles", 0),
            "command_s": time.monotonic() - started}


def plot(results: list[dict], args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for r in results:
        if "error" not in r:
            ax.plot(r["epoch_end_s"], r["val_accuracy"], marker="o", label=r["config"],
                    color=COLORS.get(r["config"]))
    ax.axhline(args.target, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("seconds of training (validation included)")
    ax.set_ylabel("held-out accuracy")
    ax.set_title("seed CNN, 3 workers" + (", worker:2 slowed ~3x" if args.duty < 1 else ""))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--steps", type=int, default=25, help="synchronous steps per epoch")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--slice", type=int, default=32, help="examples per worker per step")
    p.add_argument("--duty", type=float, default=1 / 3, help="share of time worker:2 runs; 1: off")
    p.add_argument("--period", type=float, default=0.15, help="duty cycle, seconds")
    p.add_argument("--target", type=float, default=0.95)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", type=Path, default=Path("runs/straggler_bench"))
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for repeat in range(args.repeats):
        for name in args.configs.split(","):
            result = {**run(name, args, args.out), "repeat": repeat}
            results.append(result)
            print(json.dumps({k: v for k, v in result.items()
                              if k not in ("val_accuracy", "epoch_end_s")}), flush=True)
    (args.out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in
                                                                vars(args).items()},
                                                       "results": results}, indent=1))
    plot([r for r in results if r["repeat"] == args.repeats - 1], args, args.out / "straggler.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
