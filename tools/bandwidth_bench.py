#!/usr/bin/env python3
"""Scaling where the network is the limit: kerasdist's recipes on 2-4 simulated hosts
(``kerasdist.testing.hosts``) at link caps of 100 Mbit/s, 1 Gbit/s and uncapped, each row beside
the scaling model's prediction (``tools/scaling_model.py``). Needs root.

Each row is one cluster run as users run it on machines: one ``python -m kerasdist fit RECIPE
--set cluster.kind=tf_config`` per task, with its ``TF_CONFIG`` naming the hosts' addresses, one
worker per host (parameter_server: the chief and ps:0 on host 0, ps:1 on its own host, a worker
on each other host). Rows (``--rows``, comma list of row names; default :data:`DEFAULT_ROWS`, trimmed by
:func:`grid`):

* ``mw-f32``, ``mw-bf16``, ``mw-pack``: ``recipes/mnist_cnn_mwms.yaml`` (32 examples per worker
  per step), float32 gradients, ``strategy.gradient_compression: bf16``, float32 with
  ``strategy.bytes_per_pack`` (:data:`PACK_BYTES`);
* ``ps1``, ``ps2``: ``recipes/mnist_cnn_ps.yaml`` (64 examples per worker step), 2 workers,
  1 ps, or 2 ps with ``strategy.variable_partitioning: min_size``; ``steps_per_execution: 1``
  (the recipe's 4 would stamp every 4th step only);
* ``emb`` (only when named in ``--rows``): ``recipes/embedding_ps.yaml``, 2 workers, 2 ps, 20,000
  generated impressions; measured figures only (the model knows dense variables only);

each at ``--hosts`` (multi_worker) and ``--caps``.

What a row measures, in one epoch, from the end of its second step (parameter_server: of its
fourth, two per worker) to the end of its last (the tracing, the iterator's and the
collectives' start-up left out):
**examples/s** (steps x global batch / seconds between the chief's step ends, from the
``bandwidth_stamps:StepStamps`` callback) and **bytes sent per step**: every host's link
counter (the switch port's ``rx_bytes``, what the host sent, sampled every ``--sample-s`` from
``ip -s -j link`` in the switch namespace) at those step ends, interpolated, summed over the
hosts, divided by the steps (and the same with ``tx_bytes``: what each host received). Beside
it: the model's bytes and examples/s (:func:`predict`), the ratio measured / model, and for a
capped row the model with the same row's uncapped step as its CPU part (:func:`remodel`).

Usage::

    python tools/bandwidth_bench.py --out runs/bandwidth              # the whole grid
    python tools/bandwidth_bench.py --rows mw-f32 --hosts 2 --caps 100 --out /tmp/bw
    python tools/bandwidth_bench.py --link-check --caps 100,1000   # plain TCP on the same links
    python tools/bandwidth_bench.py --from-json runs/bandwidth/bandwidth.json --link-efficiency 0.5 \\
        --png docs/bandwidth_scaling.png          # the table and plot again, the model recalibrated

Writes ``OUT/bandwidth.json`` (every row, with the settings) after each row and prints one
markdown table line per row as it ends. Exit codes: 0 every row ran, 1 a row failed (its error
is in the JSON and the table), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tools"

_spec = importlib.util.spec_from_file_location("scaling_model", TOOLS / "scaling_model.py")
sm = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("scaling_model", sm)
_spec.loader.exec_module(sm)

CAPS_MBIT = (100, 1000, None)  # None: uncapped
MW_HOSTS = (2, 3, 4)
PACK_BYTES = 4 << 20
MW_BATCH_PER_WORKER = 32
PS_BATCH = 64
EMB_BATCH = 256  # recipes/embedding_ps.yaml's global batch
EMB_EXAMPLES = 20_000
PS_WORKERS = 2
SKIP_STEPS = 2  # steps at the start of the measured epoch left out (tracing, set-up)
CORES = os.cpu_count() or 1
TASK_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
VARIANTS = {"ps1": "parameter_server, 2 workers, 1 ps",
            "ps2": "parameter_server, 2 workers, 2 ps, variable_partitioning min_size",
            "mw-f32": "float32 gradients", "mw-bf16": "bf16 gradient compression",
            "mw-pack": f"float32, bytes_per_pack {PACK_BYTES >> 20} MiB",
            "emb": "recipes/embedding_ps.yaml, 2 workers, 2 ps (no model figures)"}
DEFAULT_ROWS = ("ps1", "ps2", "mw-f32", "mw-bf16", "mw-pack")  # emb: asked for by name


@dataclass(frozen=True)
class Row:
    """One cluster run: ``name`` a key of :data:`VARIANTS`, ``workers`` worker tasks (one per
    host), ``cap_mbit`` every link's cap in Mbit/s (None: uncapped)."""

    name: str
    workers: int
    cap_mbit: float | None

    @property
    def strategy(self) -> str:
        return "parameter_server" if self.name.startswith(("ps", "emb")) else "multi_worker"

    @property
    def num_ps(self) -> int:
        if self.name == "emb":
            return 2
        return int(self.name[2:]) if self.strategy == "parameter_server" else 0

    @property
    def num_hosts(self) -> int:
        # parameter_server: chief + ps:0 on host 0, further ps on hosts of their own
        return self.workers + max(self.num_ps, 1) if self.num_ps else self.workers

    @property
    def global_batch(self) -> int:
        if self.name == "emb":
            return EMB_BATCH
        return PS_BATCH if self.num_ps else MW_BATCH_PER_WORKER * self.workers

    @property
    def steps_per_epoch(self) -> int:
        """Enough steps for a few seconds of the last epoch at the expected rate."""
        if self.num_ps:
            return 30 if self.cap_mbit is None else 12 if self.cap_mbit <= 100 else 20
        if self.cap_mbit is None:
            return 16
        return 8 if self.cap_mbit <= 100 else 12

    @property
    def skip(self) -> int:
        """Stamped step ends left out at the start: parameter_server, two per worker (each
        worker traces its function in its first step)."""
        return 2 * self.workers if self.num_ps else SKIP_STEPS

    def label(self) -> str:
        cap = "uncapped" if self.cap_mbit is None else f"{self.cap_mbit:g} Mbit/s"
        return f"{self.name} {self.num_hosts} hosts {cap}"


# The grid trimmed to run in about 30 min on 2 cores (a row takes 60-90 s, most of it the
# TensorFlow start-up of every task): bf16 at 2 and 4 hosts, bytes_per_pack at 4 hosts only.
TRIMMED_HOSTS = {"mw-bf16": (2, 4), "mw-pack": (4,)}


def grid(names=DEFAULT_ROWS, hosts=MW_HOSTS, caps=CAPS_MBIT, *, trim: bool = True) -> list[Row]:
    """The rows in run order: per cap, every variant (parameter_server first) and host count;
    ``trim`` keeps only :data:`TRIMMED_HOSTS`' host counts of those variants."""
    rows = []
    for cap in caps:
        for name in names:
            counts = [PS_WORKERS] if name.startswith(("ps", "emb")) else hosts
            if trim and name in TRIMMED_HOSTS:
                counts = [n for n in counts if n in TRIMMED_HOSTS[name]]
            rows += [Row(name, n, cap) for n in counts]
    return rows


# -- pure logic: counters, windows, the model -------------------------------------------------
def parse_link_bytes(text: str) -> dict[str, tuple[int, int]]:
    """``{ifname: (rx_bytes, tx_bytes)}`` from ``ip -s -j link`` output (JSON).

    Raises:
        ValueError: not that JSON (names what was missing).
    """
    try:
        links = json.loads(text)
        return {ln["ifname"]: (int(ln["stats64"]["rx"]["bytes"]), int(ln["stats64"]["tx"]["bytes"]))
                for ln in links}
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"not `ip -s -j link` output ({type(err).__name__}: {err}). "
                         f"Received: {text[:200]!r}") from err


def interpolate(samples: list[tuple[float, float]], t: float) -> float:
    """The counter at time ``t`` from ``(time, value)`` samples in time order, linear between the
    two around ``t``.

    Raises:
        ValueError: fewer than 2 samples, or ``t`` outside the sampled span.
    """
    if len(samples) < 2 or not samples[0][0] <= t <= samples[-1][0]:
        span = f"{samples[0][0]:.3f}..{samples[-1][0]:.3f}" if samples else "none"
        raise ValueError(f"time {t:.3f} is outside the sampled span ({span}, {len(samples)} "
                         "samples)")
    for (t0, v0), (t1, v1) in zip(samples, samples[1:], strict=False):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    raise AssertionError("unreachable")


def parse_stamps(text: str) -> list[tuple[int, int, float]]:
    """``(epoch, batch, time)`` lines of ``bandwidth_stamps.StepStamps``; a torn last line (the
    process killed while writing) is skipped."""
    stamps = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            try:
                stamps.append((int(parts[0]), int(parts[1]), float(parts[2])))
            except ValueError:
                continue
    return stamps


def steady_window(stamps: list[tuple[int, int, float]], skip: int = SKIP_STEPS
                  ) -> tuple[float, float, int]:
    """``(t_start, t_end, steps)``: the last epoch from the end of its ``skip``-th stamped step to
    the end of its last (the first steps hold the tracing, the iterator start and, for the
    all-reduce, the first collective's set-up); ``steps`` counts the batches in between.

    Raises:
        ValueError: ``skip + 1`` or fewer steps stamped in the last epoch, or ``skip < 1``.
    """
    if skip < 1:
        raise ValueError(f"skip must be >= 1. Received: {skip}")
    if not stamps:
        raise ValueError("no step was stamped")
    last = max(e for e, _, _ in stamps)
    ends = sorted((t, b) for e, b, t in stamps if e == last)
    if len(ends) <= skip or ends[-1][1] <= ends[skip - 1][1]:
        raise ValueError(f"epoch {last} has {len(ends)} stamped step(s); more than {skip} are "
                         "needed")
    return ends[skip - 1][0], ends[-1][0], ends[-1][1] - ends[skip - 1][1]


def bytes_per_step(samples: dict[str, list[tuple[float, float]]], t_start: float, t_end: float,
                   steps: int) -> dict[str, float]:
    """Per link: (counter at ``t_end`` - counter at ``t_start``) / ``steps``."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1. Received: {steps}")
    return {name: (interpolate(s, t_end) - interpolate(s, t_start)) / steps
            for name, s in samples.items()}


def model_bytes(row: Row, cal=None) -> float:
    """Bytes on the wire the model has all hosts send per step, frame headers included
    (``Calibration.frame_overhead``): ring all-reduce ``n x 2 (n-1)/n x G`` (multi_worker, G the
    gradient bytes, halved by bf16); parameter_server ``G`` (the ps send the variables to the
    worker) plus what the worker sends back (:func:`scaling_model.ps_push_bytes`: ``G`` with 1
    ps, more with partitioned variables)."""
    cal = cal or sm.Calibration()
    grad = cal.gradient_bytes
    if row.strategy == "multi_worker":
        payload = row.workers * sm.ring_allreduce_bytes(
            row.workers, grad / (2 if row.name == "mw-bf16" else 1))
    else:
        payload = grad + sm.ps_push_bytes(cal, row.num_ps, row.num_ps > 1)
    return payload * cal.frame_overhead


def predict(row: Row, cal=None, *, cores: int | None = CORES,
            cpu_step_s: float | None = None) -> dict:
    """The scaling model's examples/s for ``row`` (``tools/scaling_model.py``).

    The link's cap is the model's bandwidth (uncapped: no wire time). ``cores``: the CPU cores
    every task of the row shares (all hosts simulated on one machine): the model's per-worker
    CPU time (compute plus per-byte runtime cost) is stretched by ``tasks / cores`` when more
    compute-bound tasks than cores run (:func:`scaling_model.shared_cores`); None: each worker
    has a core of its own (the model as written for separate machines). ``cpu_step_s``: the
    measured seconds per step of the same row uncapped, in place of the model's CPU parts
    (only the wire time is then modelled).
    """
    cal = cal or sm.Calibration()
    gbps = math.inf if row.cap_mbit is None else row.cap_mbit / 1e3
    if row.strategy == "multi_worker":
        return sm.multi_worker(cal, row.workers, gbps, batch=MW_BATCH_PER_WORKER,
                               bf16=row.name == "mw-bf16", cores=cores, cpu_step_s=cpu_step_s)
    return sm.parameter_server(cal, row.workers, gbps, num_ps=row.num_ps,
                               partitioned=row.num_ps > 1, batch=PS_BATCH, cores=cores,
                               cpu_step_s=cpu_step_s)


# -- running a row -----------------------------------------------------------------------------
class Sampler(threading.Thread):
    """Polls the switch namespace's port counters every ``interval_s``: ``samples[port]`` is a
    list of ``(time.time(), rx_bytes)`` (the bytes the host on that port sent), ``received[port]``
    the same with ``tx_bytes`` (the bytes delivered to the host)."""

    def __init__(self, switch_ns: str, ports: list[str], interval_s: float):
        super().__init__(daemon=True)
        self.switch_ns, self.ports, self.interval_s = switch_ns, ports, interval_s
        self.samples: dict[str, list[tuple[float, float]]] = {p: [] for p in ports}
        self.received: dict[str, list[tuple[float, float]]] = {p: [] for p in ports}
        self._halt = threading.Event()

    def sample(self) -> None:
        out = subprocess.run(["ip", "-n", self.switch_ns, "-s", "-j", "link", "show"],
                             capture_output=True, text=True, timeout=10)
        now = time.time()
        if out.returncode == 0:
            counters = parse_link_bytes(out.stdout)
            for p in self.ports:
                if p in counters:
                    self.samples[p].append((now, counters[p][0]))
                    self.received[p].append((now, counters[p][1]))

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=15)
        self.sample()


def _recipe(row: Row, run_dir: Path) -> dict:
    import yaml

    base = ("embedding_ps.yaml" if row.name == "emb" else
            "mnist_cnn_ps.yaml" if row.num_ps else "mnist_cnn_mwms.yaml")
    recipe = yaml.safe_load((REPO / "recipes" / base).read_text(encoding="utf-8"))
    recipe["data"].update(batch_size=row.global_batch, eval_split=None)
    if row.name == "emb":  # fewer generated impressions: the start-up, not the table, shrinks
        recipe["data"].update(shuffle_buffer=EMB_EXAMPLES)
        recipe["data"]["source"]["num_examples"] = EMB_EXAMPLES
    recipe["cluster"] = {"kind": "tf_config", "threads_per_task": 1}
    recipe["trainer"] = {"epochs": 1, "steps_per_epoch": row.steps_per_epoch, "seed": 42,
                         "validation": False, "checkpoint": {"enabled": False}}
    recipe["output"] = {"run_dir": str(run_dir), "tensorboard": False, "save_model": False}
    recipe["callbacks"] = ["bandwidth_stamps:StepStamps"]
    strategy = recipe["strategy"]
    if row.strategy == "multi_worker":
        strategy.update(gradient_compression="bf16" if row.name == "mw-bf16" else "none",
                        bytes_per_pack=PACK_BYTES if row.name == "mw-pack" else 0, timeout_s=120)
    else:
        # one step per scheduled call, so that the coordinator stamps every step (the recipe's
        # default of 4 stamps every 4th, and a call at 100 Mbit/s lasts ~10 s)
        strategy["steps_per_execution"] = 1
        if row.num_ps > 1:
            strategy["variable_partitioning"] = "min_size"
    return recipe


def _tasks(row: Row, hosts) -> tuple[dict, list[tuple[int, str, int]]]:
    import portpicker

    def addr(h: int) -> str:
        return f"{hosts.address(h)}:{portpicker.pick_unused_port()}"

    if row.strategy == "multi_worker":
        cluster = {"worker": [addr(h) for h in range(row.workers)]}
        return cluster, [(h, "worker", h) for h in range(row.workers)]
    ps_hosts = [0] + list(range(1, row.num_ps))
    worker_hosts = list(range(row.num_ps, row.num_ps + row.workers))
    cluster = {"chief": [addr(0)], "ps": [addr(h) for h in ps_hosts],
               "worker": [addr(h) for h in worker_hosts]}
    tasks = [(h, "ps", i) for i, h in enumerate(ps_hosts)]
    tasks += [(h, "worker", i) for i, h in enumerate(worker_hosts)] + [(0, "chief", 0)]
    return cluster, tasks


def run_row(row: Row, out: Path, *, sample_s: float = 0.1, timeout_s: float = 300) -> dict:
    """Run one row on a new :class:`~kerasdist.testing.hosts.HostSet` (removed at the end) and
    return its figures (``error`` set, and the tail of the chief's log, when it failed)."""
    import yaml

    from kerasdist.testing.hosts import HostSet

    tag = row.label().replace(" ", "_").replace("/", "")
    work = out / "rows" / tag
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    run_dir, stamps_path = work / "run", work / "stamps.txt"
    recipe_path = work / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(_recipe(row, run_dir)), encoding="utf-8")
    result = {**asdict(row), "label": row.label(), "hosts": row.num_hosts,
              "global_batch": row.global_batch, "steps_per_epoch": row.steps_per_epoch}
    started = time.monotonic()
    with HostSet(row.num_hosts, rate_mbit=row.cap_mbit, log_dir=work / "logs", prefix="kdbw") as hosts:
        cluster, tasks = _tasks(row, hosts)
        sampler = Sampler(hosts.switch_ns, [hosts.switch_if(h) for h in range(row.num_hosts)],
                          sample_s)
        sampler.start()
        procs = {}
        env_path = f"{REPO}{os.pathsep}{TOOLS}"
        for host, job, index in tasks:
            env = dict(TASK_ENV, PYTHONPATH=env_path, TF_CONFIG=json.dumps(
                {"cluster": cluster, "task": {"type": job, "index": index}}))
            chief = (job, index) == (("chief", 0) if row.num_ps else ("worker", 0))
            if chief:
                env["KERASDIST_STEP_STAMPS"] = str(stamps_path)
            argv = [sys.executable, "-m", "kerasdist", "fit", str(recipe_path), "--verbose", "0"]
            procs[f"{job}:{index}"] = hosts.run(host, argv, env, timeout_s=timeout_s, cwd=REPO)
        chief_name = "chief:0" if row.num_ps else "worker:0"
        waited = [procs[chief_name]] if row.num_ps else list(procs.values())
        deadline = time.monotonic() + timeout_s
        for proc in waited:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        sampler.stop()
        codes = {name: p.poll() for name, p in procs.items()}
        chief_log = hosts.output(procs[chief_name])
    result["wall_s"] = time.monotonic() - started
    result["exit_codes"] = codes
    try:
        waited_names = [chief_name] if row.num_ps else list(procs)
        failed = [n for n in waited_names if codes[n] != 0]
        if failed:
            raise RuntimeError(f"{', '.join(failed)} exited {[codes[n] for n in failed]} "
                               f"(of {waited_names})")
        stamps = parse_stamps(stamps_path.read_text(encoding="utf-8"))
        t0, t1, steps = steady_window(stamps, row.skip)
        per_link = bytes_per_step(sampler.samples, t0, t1, steps)
        predicted = predict(row)
        sent = sum(per_link.values())
        result["run_bytes_by_host"] = [s[-1][1] - s[0][1] for s in sampler.samples.values()]
        result.update(
            steps=steps, seconds=t1 - t0, examples_per_s=steps * row.global_batch / (t1 - t0),
            bytes_per_step=sent, bytes_per_step_by_host=list(per_link.values()),
            received_per_step_by_host=list(bytes_per_step(sampler.received, t0, t1, steps).values()),
            link_mbit_by_host=[b * 8 * steps / (t1 - t0) / 1e6 for b in per_link.values()],
            model_bytes_per_step=model_bytes(row), model_examples_per_s=predicted["examples_per_s"],
            model_limit=predicted.get("limit"),
            model_separate_machines=predict(row, cores=None)["examples_per_s"])
        result["ratio"] = result["examples_per_s"] / result["model_examples_per_s"]
        metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
        result["metrics_examples_per_s"] = metrics["throughput"]["examples_per_sec"]
    except (RuntimeError, ValueError, OSError, KeyError) as err:
        result["error"] = f"{type(err).__name__}: {err}"
        result["chief_log_tail"] = chief_log[-3000:]
    return result


HEADER = ("| row | hosts | link cap | steps | examples/s | MB sent/step (all hosts) | model MB/step "
          "| busiest link Mbit/s | model examples/s | measured / model "
          "| model on the uncapped step | measured / that |\n" + "| --- " * 12 + "|")


def uncapped_steps(rows: list[dict]) -> dict[tuple[str, int], float]:
    """``{(name, workers): seconds per step}`` of the uncapped rows that ran."""
    return {(r["name"], r["workers"]): r["global_batch"] / r["examples_per_s"]
            for r in rows if r["cap_mbit"] is None and "error" not in r}


def remodel(r: dict, cal=None, uncapped: dict | None = None) -> dict:
    """``r`` (a row of bandwidth.json) with the model's columns computed again with ``cal``
    (e.g. another ``link_efficiency``), and, when ``uncapped`` (:func:`uncapped_steps`) holds
    the same row uncapped, the model with that measured step as its CPU part
    (``model_on_uncapped_examples_per_s``); a failed row is returned as it is."""
    if "error" in r:
        return r
    row = Row(r["name"], r["workers"], r["cap_mbit"])
    if row.name == "emb":  # the model knows the seed CNN's dense variables only
        return {**r, "model_bytes_per_step": None, "model_examples_per_s": None,
                "model_limit": None, "ratio": None}
    cal = cal or sm.Calibration()
    predicted = predict(row, cal)
    out = {**r, "model_bytes_per_step": model_bytes(row, cal),
           "model_examples_per_s": predicted["examples_per_s"], "model_limit": predicted["limit"],
           "ratio": r["examples_per_s"] / predicted["examples_per_s"]}
    step = (uncapped or {}).get((row.name, row.workers))
    if step is not None:
        hybrid = predict(row, cal, cpu_step_s=step)["examples_per_s"]
        out.update(model_on_uncapped_examples_per_s=hybrid,
                   ratio_on_uncapped=r["examples_per_s"] / hybrid)
    return out


def table_line(r: dict) -> str:
    cap = "uncapped" if r["cap_mbit"] is None else (
        f"{r['cap_mbit'] / 1000:g} Gbit/s" if r["cap_mbit"] >= 1000 else f"{r['cap_mbit']:g} Mbit/s")
    if "error" in r:
        return f"| {r['name']} | {r['hosts']} | {cap} | failed: {r['error'][:120]} |"
    hybrid = r.get("model_on_uncapped_examples_per_s")
    on_uncapped = (f"{hybrid:.1f} | {r['ratio_on_uncapped']:.2f}" if hybrid and r["cap_mbit"]
                   else "– | –")
    if r.get("model_examples_per_s") is None:
        return (f"| {r['name']} | {r['hosts']} | {cap} | {r['steps']} | {r['examples_per_s']:.1f} | "
                f"{r['bytes_per_step'] / 1e6:.2f} | – | {max(r['link_mbit_by_host']):.0f} | – | – "
                "| – | – |")
    return (f"| {r['name']} | {r['hosts']} | {cap} | {r['steps']} | {r['examples_per_s']:.1f} | "
            f"{r['bytes_per_step'] / 1e6:.2f} | {r['model_bytes_per_step'] / 1e6:.2f} | "
            f"{max(r['link_mbit_by_host']):.0f} | {r['model_examples_per_s']:.1f} | "
            f"{r['ratio']:.2f} | {on_uncapped} |")


def plot(result: dict, png: Path) -> Path:
    """Measured examples/s (solid) and the model's (dashed): multi_worker float32 and bf16
    against hosts, one line per link cap; then every row kind at its largest host count against
    the link cap (parameter_server, bytes_per_pack beside float32)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if "error" not in r]
    if not rows:
        raise ValueError("no row without an error to plot")
    caps = [100, 1000, None]
    cap_names = {100: "100 Mbit/s", 1000: "1 Gbit/s", None: "uncapped"}
    colours = {100: "tab:red", 1000: "tab:blue", None: "tab:green"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, name in zip(axes[:2], ("mw-f32", "mw-bf16"), strict=True):
        for cap in caps:
            pts = sorted((r["hosts"], r["examples_per_s"], r["model_examples_per_s"])
                         for r in rows if r["name"] == name and r["cap_mbit"] == cap)
            if pts:
                xs = [p[0] for p in pts]
                ax.plot(xs, [p[1] for p in pts], "o-", color=colours[cap],
                        label=f"{cap_names[cap]} measured")
                ax.plot(xs, [p[2] for p in pts], "x--", color=colours[cap], alpha=0.6,
                        label=f"{cap_names[cap]} model")
            hybrid = sorted((r["hosts"], r["model_on_uncapped_examples_per_s"]) for r in rows
                            if r["name"] == name and r["cap_mbit"] == cap and cap is not None
                            and r.get("model_on_uncapped_examples_per_s"))
            if hybrid:
                ax.plot([p[0] for p in hybrid], [p[1] for p in hybrid], "+:", color=colours[cap],
                        label=f"{cap_names[cap]} uncapped step + wire")
        ax.set(title=f"multi_worker, {VARIANTS[name]}", xlabel="hosts (1 worker each)",
               ylabel="examples/s", yscale="log")
        ax.set_xticks(sorted({r["hosts"] for r in rows if r["name"] == name}) or [2])
        ax.legend(fontsize=7)
    ax = axes[2]
    markers = {"ps1": ("tab:purple", "ps 1 ps (3 hosts)"), "ps2": ("tab:brown", "ps 2 ps (4 hosts)"),
               "mw-f32": ("tab:gray", "mw float32"), "mw-pack": ("tab:olive", "mw bytes_per_pack")}
    for name, (colour, label) in markers.items():
        sized = [r for r in rows if r["name"] == name]
        if not sized:
            continue
        most = max(r["hosts"] for r in sized)
        pts = [(caps.index(r["cap_mbit"]), r["examples_per_s"], r["model_examples_per_s"])
               for r in sized if r["hosts"] == most and r["cap_mbit"] in caps]
        pts.sort()
        if name.startswith("mw"):
            label += f" ({most} hosts)"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=colour, label=label)
        ax.plot([p[0] for p in pts], [p[2] for p in pts], "x--", color=colour, alpha=0.5)
    ax.set_xticks(range(3), [cap_names[c] for c in caps])
    ax.set(title="by link cap (dashed: model)", ylabel="examples/s", yscale="log")
    ax.legend(fontsize=7)
    eff = result.get("calibration", {}).get("link_efficiency", 1.0)
    fig.suptitle("kerasdist on simulated hosts sharing one 2-core machine: measured (solid), "
                 f"scaling model (dashed, link_efficiency {eff:g}), the row's uncapped step + "
                 "modelled wire time (dotted)", fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


# --link-check: what a capped link carries without TensorFlow (plain TCP from Python).
_SERVER = r"""
import socket, sys, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen(8); print("listening", flush=True)
def serve(c):
    first = c.recv(16)
    if first.strip() == b"sink":                 # a stream: read to EOF, answer
        while c.recv(1 << 16):
            pass
        c.sendall(b"ok")
    else:                                        # pulls: each request names a size, send it
        data, req = b"y" * (64 << 20), first
        while req:
            c.sendall(data[:int(req)]); req = c.recv(16)
    c.close()
while True:
    conn, _ = srv.accept(); threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""
_CLIENT = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2]))); mode, size = sys.argv[3], int(sys.argv[4])
t, done = time.monotonic(), 0
if mode == "stream":
    s.sendall(b"sink".rjust(16)); buf = b"x" * (1 << 20)
    while done < size:
        s.sendall(buf); done += len(buf)
    s.shutdown(socket.SHUT_WR); s.recv(8)
else:
    chunk = int(mode)
    while done < size:
        s.sendall(str(chunk).encode().rjust(16)); need = chunk
        while need:
            need -= len(s.recv(min(need, 1 << 20)))
        done += chunk
print(done * 8 / (time.monotonic() - t) / 1e6, flush=True)
"""


def link_check(rate_mbit: float, *, size: int = 26 << 20, pull: int = 2 << 20) -> dict:
    """Payload Mbit/s plain TCP reaches between 2 simulated hosts whose links are capped at
    ``rate_mbit``: one stream one way; a stream each way at once; ``pull``-byte request/response
    pulls each way at once (the pattern of TF's RecvTensor)."""
    import portpicker

    from kerasdist.testing.hosts import HostSet

    with HostSet(2, rate_mbit=rate_mbit, prefix="kdbw") as hosts:
        ports = [portpicker.pick_unused_port() for _ in range(2)]
        servers = [hosts.run(i, [sys.executable, "-c", _SERVER, hosts.address(i), str(ports[i])],
                             timeout_s=300) for i in range(2)]
        deadline = time.monotonic() + 30
        while not all("listening" in hosts.output(p) for p in servers):
            if time.monotonic() > deadline:
                raise RuntimeError("the link-check servers did not start")
            time.sleep(0.05)

        def go(mode: str, pairs) -> list[float]:
            procs = [hosts.run(a, [sys.executable, "-c", _CLIENT, hosts.address(b), str(ports[b]),
                                   mode, str(size)], timeout_s=120, capture=True)
                     for a, b in pairs]
            return [float(p.communicate(timeout=130)[0].strip().splitlines()[-1]) for p in procs]

        return {"rate_mbit": rate_mbit, "stream_one_way": go("stream", [(0, 1)]),
                "stream_both_ways": go("stream", [(0, 1), (1, 0)]),
                f"pulls_of_{pull >> 20}MiB_both_ways": go(str(pull), [(0, 1), (1, 0)])}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                        help="comma list of: " + ", ".join(VARIANTS))
    parser.add_argument("--hosts", default="2,3,4", help="multi_worker host counts (2-8)")
    parser.add_argument("--caps", default="100,1000,none", help="link caps in Mbit/s; none = uncapped")
    parser.add_argument("--out", type=Path, default=Path("runs/bandwidth"))
    parser.add_argument("--sample-s", type=float, default=0.1, help="counter sampling interval, s")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per row")
    parser.add_argument("--full", action="store_true",
                        help="every host count for bf16 and bytes_per_pack too (see TRIMMED_HOSTS)")
    parser.add_argument("--from-json", type=Path, help="no runs: print the table of this "
                        "bandwidth.json with the model computed again (--link-efficiency) and plot it")
    parser.add_argument("--link-check", action="store_true",
                        help="no TensorFlow: plain TCP over 2 hosts at each capped --caps value")
    parser.add_argument("--link-efficiency", type=float, default=1.0,
                        help="the model's Calibration.link_efficiency (0 < x <= 1; default 1)")
    parser.add_argument("--png", type=Path, default=None, help="plot file (default OUT/bandwidth.png)")
    return parser


def parse_grid(rows: str, hosts: str, caps: str) -> tuple[list[str], list[int], list[float | None]]:
    """``--rows``, ``--hosts``, ``--caps`` as lists.

    Raises:
        ValueError: an unknown row name, a host count outside 2..8, a cap <= 0 or not a number
            (the message shows what was received).
    """
    try:
        names = [n.strip() for n in rows.split(",") if n.strip()]
        bad = [n for n in names if n not in VARIANTS]
        counts = [int(h) for h in hosts.split(",")]
        cap_list = [None if c.strip().lower() == "none" else float(c) for c in caps.split(",")]
        if bad or not names or any(not 2 <= h <= 8 for h in counts) or any(
                c is not None and c <= 0 for c in cap_list):
            raise ValueError(f"unknown rows {bad}" if bad else "hosts 2-8, caps > 0")
    except ValueError as err:
        raise ValueError(f"--rows/--hosts/--caps: {err}. Received: --rows {rows!r} --hosts "
                         f"{hosts!r} --caps {caps!r}") from err
    return names, counts, cap_list


def _from_json(path: Path, cal, png: Path | None) -> int:
    result = json.loads(path.read_text(encoding="utf-8"))
    uncapped = uncapped_steps(result["rows"])
    result["rows"] = [remodel(r, cal, uncapped) for r in result["rows"]]
    result["calibration"] = asdict(cal)
    print(f"{result['command']} ({result['date']}), model link_efficiency "
          f"{cal.link_efficiency:g}\n{HEADER}")
    for r in result["rows"]:
        print(table_line(r))
    print(plot(result, png or path.with_suffix(".png")))
    return 0


def _run_grid(rows: list[Row], args, argv, cal) -> int:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    result = {"command": " ".join(["python", "tools/bandwidth_bench.py", *(argv or sys.argv[1:])]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": CORES,
              "calibration": asdict(cal), "rows": []}
    print(f"{len(rows)} rows on {CORES} cores\n{HEADER}", flush=True)
    started = time.monotonic()
    for row in rows:
        load = os.getloadavg()[0]
        r = remodel(run_row(row, out, sample_s=args.sample_s, timeout_s=args.timeout), cal)
        r["load_average_1min"] = [load, os.getloadavg()[0]]  # before and after the row
        result["rows"].append(r)
        print(table_line(r) + f" <!-- {r['wall_s']:.0f} s -->", flush=True)
        (out / "bandwidth.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    result["total_s"] = time.monotonic() - started
    uncapped = uncapped_steps(result["rows"])
    result["rows"] = [remodel(r, cal, uncapped) for r in result["rows"]]
    (out / "bandwidth.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    if any("error" not in r for r in result["rows"]):
        plot(result, args.png or out / "bandwidth.png")
    print(f"total {result['total_s']:.0f} s")
    return 1 if any("error" in r for r in result["rows"]) else 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        if not 0 < args.link_efficiency <= 1:
            raise ValueError(f"--link-efficiency must be within (0, 1]. Received: "
                             f"{args.link_efficiency}")
        names, counts, caps = parse_grid(args.rows, args.hosts, args.caps)
    except ValueError as err:
        print(f"bandwidth_bench: error: {err}", file=sys.stderr)
        return 2
    cal = replace(sm.Calibration(), link_efficiency=args.link_efficiency)
    if args.from_json:
        return _from_json(args.from_json, cal, args.png)
    if os.geteuid() != 0:
        print("bandwidth_bench: error: simulated hosts need root", file=sys.stderr)
        return 2
    # SIGTERM (a timeout, an orchestrator) unwinds like an exception, so the HostSet of the row
    # running removes its namespaces and processes
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.link_check:
        for cap in caps:
            if cap is not None:
                print(json.dumps(link_check(cap)), flush=True)
        return 0
    return _run_grid(grid(names, counts, caps, trim=not args.full), args, argv, cal)


if __name__ == "__main__":
    raise SystemExit(main())
