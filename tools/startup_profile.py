"""Time to first step (issue 42, item 8): where a local 2-worker and a 1 ps + 2 worker
``kerasdist fit`` spend their start, beside the floor of TensorFlow and Keras alone.

    python tools/startup_profile.py [--repeats 3] [--kinds multi_worker,parameter_server]
        [--variants default,default-fork-off,exposed-fork-off,exposed-fork-on]

Round-robin (repeat r of every row before repeat r+1 of any), each row its own process tree:

* ``import`` -- the tasks' ``python -c "import tensorflow, keras"``, started at once (2 or 4
  processes, as the cluster has tasks): the slowest one's wall time.
* ``floor`` -- ``tools/startup_floor.py``: the same cluster (TF_CONFIG by hand, ports from
  portpicker), TensorFlow's strategy, the same one-unit Dense model and a plain ``tf.function``
  first step: no kerasdist code. Time from the first process's start to the first step's end.
* ``kerasdist`` -- ``kerasdist fit recipes/linear_mwms.yaml`` (the parameter-server row: the
  same recipe under ``strategy.kind: parameter_server`` with ``cluster.ps: 1``), one epoch, with
  ``KERASDIST_TIMELINE`` set (:mod:`kerasdist._timeline`): the command's process start to the
  chief's first step, split into phases. ``--variants`` runs it several ways, side by side in
  each repeat: ``default`` (as a user runs it: isolated in a network namespace where one can be
  made, its launcher and tasks forked from the command: :mod:`kerasdist.launch.forking.netns`),
  ``default-fork-off`` (the same with ``KERASDIST_FORK_TASKS=0``: the launcher and the tasks
  started as new interpreters), ``exposed-fork-off`` / ``exposed-fork-on`` (``KERASDIST_NO_NETNS=1`` and
  ``cluster.allow_network_exposure: true``, the launcher in the command's process, with
  ``KERASDIST_FORK_TASKS`` 0 or 1: :mod:`kerasdist.launch.forking`).

Prints one table per kind (median over repeats, seconds) and ``kerasdist's own`` = kerasdist's
time to first step minus the floor's, as a share of kerasdist's. Figures are for this machine
at this moment: compare rows of one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import portpicker

REPO = Path(__file__).resolve().parent.parent
# as kerasdist's launcher sets for cluster.threads_per_task: 1 (intra-op only)
THREADS = {"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
PHASES = (  # (label, from mark, to mark); marks of kerasdist._timeline, in time order
    ("command: interpreter + kerasdist CLI imports", ("cli", "process"), ("cli", "main")),
    ("command: recipe checks + run dir (preflight)", ("cli", "main"), ("cli", "preflight")),
    ("command: isolation plan + tracking check", ("cli", "preflight"), ("cli", "launching")),
    ("launch: to the first task's spawn", ("cli", "launching"), ("spawn", "first")),
    ("chief task: interpreter + imports", ("chief", "process"), ("chief", "session")),
    ("chief task: strategy (cluster formation)", ("chief", "session"), ("chief", "strategy")),
    ("chief task: input (data checks, datasets)", ("chief", "strategy"), ("chief", "input")),
    ("chief task: model build + compile", ("chief", "input"), ("chief", "model")),
    ("chief task: to the first step's end (restore, run dir, trace)", ("chief", "model"),
     ("chief", "first step")),
)


def _env(**extra) -> dict:
    env = dict(os.environ, **THREADS, **extra)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] \
        if path.is_file() else []


def run_import(tasks: int) -> float:
    start = time.time()
    procs = [subprocess.Popen([sys.executable, "-c", "import tensorflow, keras"], env=_env())
             for _ in range(tasks)]
    for proc in procs:
        proc.wait(timeout=300)
    return time.time() - start


def _cluster(kind: str) -> dict:
    ports = iter(portpicker.pick_unused_port() for _ in range(4))
    if kind == "multi_worker":
        return {"worker": [f"localhost:{next(ports)}" for _ in range(2)]}
    return {"chief": [f"localhost:{next(ports)}"], "ps": [f"localhost:{next(ports)}"],
            "worker": [f"localhost:{next(ports)}" for _ in range(2)]}


def run_floor(kind: str, work: Path) -> float:
    out = work / "floor.jsonl"
    out.unlink(missing_ok=True)
    cluster = _cluster(kind)
    procs, first = [], None
    for job, hosts in cluster.items():
        for index in range(len(hosts)):
            tf_config = json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})
            env = _env(TF_CONFIG=tf_config,
                       FLOOR_KIND="mirrored" if kind == "multi_worker" else "ps")
            procs.append(subprocess.Popen([sys.executable, str(REPO / "tools/startup_floor.py"),
                                           str(out)], env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
    chief = "worker:0" if kind == "multi_worker" else "chief:0"
    try:
        procs[0].wait(timeout=300)  # worker:0, or the chief (the coordinator)
        if kind == "multi_worker":
            procs[1].wait(timeout=60)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    marks = _read(out)
    first = min(m["t"] for m in marks if m["mark"] == "process")
    step = next(m["t"] for m in marks if m["task"] == chief and m["mark"] == "first step")
    return step - first


VARIANTS = {  # name -> (environment, recipe fields)
    "default": ({}, {}),
    "default-fork-off": ({"KERASDIST_FORK_TASKS": "0"}, {}),
    "exposed-fork-off": ({"KERASDIST_NO_NETNS": "1", "KERASDIST_FORK_TASKS": "0"},
                         {"cluster.allow_network_exposure": True}),
    "exposed-fork-on": ({"KERASDIST_NO_NETNS": "1", "KERASDIST_FORK_TASKS": "1"},
                        {"cluster.allow_network_exposure": True}),
}


def _recipe_args(kind: str, run_dir: Path, variant: str = "default") -> list[str]:
    sets = {**VARIANTS[variant][1], "output.run_dir": str(run_dir), "trainer.epochs": 1, "trainer.verbose": 0,
            "output.tensorboard": False}
    if kind == "parameter_server":
        sets.update({"strategy": {"kind": "parameter_server"}, "cluster.ps": 1})
    args = [str(REPO / "recipes/linear_mwms.yaml"), "--overwrite", "--quiet"]
    for key, value in sets.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    return args


def run_kerasdist(kind: str, work: Path, repeat: int = 0, variant: str = "default") -> dict:
    """A user's first run of the recipe: a new run directory each repeat (and variant)."""
    timeline = work / "timeline.jsonl"
    timeline.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "kerasdist", "fit",
           *_recipe_args(kind, work / f"run-{variant}-{repeat}", variant)]
    env = _env(KERASDIST_TIMELINE=str(timeline), **VARIANTS[variant][0])
    subprocess.run(cmd, env=env, cwd=work, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    return phases(_read(timeline), chief="worker:0" if kind == "multi_worker" else "chief:0")


def phases(marks: list[dict], *, chief: str) -> dict:
    """Seconds per phase of :data:`PHASES` and ``total`` (the command's start to the chief's first
    step) from a timeline's marks."""
    cli_pid = min((m for m in marks if m["task"] == "cli" and m["mark"] == "process"),
                  key=lambda m: m["t"])["pid"]

    def at(who: str, name: str) -> float:
        if who == "spawn":
            return min(m["t"] for m in marks if m["mark"].startswith("spawn "))
        if who == "cli":
            return next(m["t"] for m in marks if m["pid"] == cli_pid and m["mark"] == name)
        pid = next(m["pid"] for m in marks if m["task"] == chief)  # a PS coordinator names
        return next(m["t"] for m in marks if m["pid"] == pid and m["mark"] == name)  # itself late

    out = {label: at(*b) - at(*a) for label, a, b in PHASES}
    out["total"] = at("chief", "first step") - at("cli", "process")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kinds", default="multi_worker,parameter_server")
    p.add_argument("--variants", default="default",
                   help=f"comma list of kerasdist rows, of {', '.join(VARIANTS)}")
    args = p.parse_args(argv)
    kinds = args.kinds.split(",")
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown --variants {unknown}; known: {', '.join(VARIANTS)}")
    rows: dict = {k: {"import": [], "floor": [], "kerasdist": {v: [] for v in variants}}
                  for k in kinds}
    with tempfile.TemporaryDirectory(prefix="kerasdist-startup-") as tmp:
        for repeat in range(args.repeats):
            for kind in kinds:
                work = Path(tmp) / kind
                work.mkdir(exist_ok=True)
                tasks = 2 if kind == "multi_worker" else 4
                rows[kind]["import"].append(run_import(tasks))
                rows[kind]["floor"].append(run_floor(kind, work))
                for variant in variants:
                    rows[kind]["kerasdist"][variant].append(
                        run_kerasdist(kind, work, repeat, variant))
                shown = ", ".join(f"kerasdist {v} {rows[kind]['kerasdist'][v][-1]['total']:.1f} s"
                                  for v in variants)
                print(f"repeat {repeat + 1} {kind}: import {rows[kind]['import'][-1]:.1f} s, "
                      f"floor {rows[kind]['floor'][-1]:.1f} s, {shown}", flush=True)
    for kind in kinds:
        report(kind, rows[kind])
    return 0


def report(kind: str, row: dict) -> None:
    med = statistics.median
    floor = med(row["floor"])
    variants = list(row["kerasdist"])
    print(f"\n{kind}: time to first step, median of {len(row['floor'])} (s)")
    print(f"  {'import tensorflow, keras (all tasks at once)':64s} {med(row['import']):6.1f}")
    print(f"  {'floor: TF + Keras alone, same cluster and model':64s} {floor:6.1f}")
    print(f"  {'':64s} " + " ".join(f"{v[-18:]:>18s}" for v in variants))
    totals = {v: med(r["total"] for r in row["kerasdist"][v]) for v in variants}
    print(f"  {'kerasdist fit, command start to the first step':64s} "
          + " ".join(f"{totals[v]:18.1f}" for v in variants))
    for label, _, _ in PHASES:
        print(f"    {label:62s} " + " ".join(
            f"{med(r[label] for r in row['kerasdist'][v]):18.1f}" for v in variants))
    print(f"  {'kerasdist own (kerasdist - floor), share of kerasdist':64s} " + " ".join(
        f"{f'{totals[v] - floor:.1f} ({(totals[v] - floor) / totals[v]:.0%})':>18s}"
        for v in variants))


if __name__ == "__main__":
    sys.exit(main())
