#!/usr/bin/env python3
"""Past one machine, on paper: predicted step time, examples/s and scaling efficiency of the seed CNN
for 2-128 workers on 10/25/100 Gb/s networks, calibrated on pieces measured on this machine
(``tools/profile_rows.py``).

Model (every assumption is a parameter of :class:`Calibration` or of the functions):

* A worker computes like one core of the development VM running alone: its training step on ``b``
  examples takes ``t_comp(b) = fixed_s + per_example_s * b``, the line through the fastest measured
  1-thread steps at batch 64 and 128 (154 GFLOP/s at 128, the core's matmul speed). A worker with
  more or faster cores computes faster and so scales worse: divide ``t_comp`` to see it. Input
  preparation is left out (about 1 ms per batch, overlapped by prefetch).
* Every byte a worker sends or receives costs ``8 / bandwidth`` seconds on the wire PLUS
  ``cpu_s_per_byte`` of serialisation and copying in TF's gRPC runtime (measured on localhost,
  where the wire is free), with no overlap of the two, nor of transfer with compute (TF's
  all-reduce of Keras gradients starts after the backward pass), and ``latency_s`` per message.
* multi_worker, ring all-reduce (Patarasuk & Yuan 2009; Horovod's paper, Sergeev & Del Balso
  2018): each worker sends and receives ``2 (n-1) / n * bytes`` in ``2 (n-1)`` messages. With
  gradient accumulation ``k``, one all-reduce per ``k`` micro-batches. bf16 halves the bytes; its
  per-byte cost is measured separately (it includes the casts).
* parameter_server (asynchronous): a worker step pulls every variable and pushes every gradient
  (``2 * bytes``, sequentially, through the worker's link) and pays the coordinator's round trip.
  The cluster is capped by the busiest ps (its link and its CPU carry its variables' bytes in and
  out per step, for every worker's step) and by the coordinator's sustained scheduling rate.
  Without partitioning TF places whole variables round-robin over the ps tasks; with
  ``variable_partitioning`` each variable over 256 KiB is split evenly over the ps tasks, yet
  every ps holding a shard receives the variable's whole gradient from each worker step
  (measured on simulated hosts with 2 ps): partitioning spreads the reads, not the writes.
* Scaling efficiency = examples/s of n workers / (n * examples/s of one worker computing alone).

Usage::

    python tools/scaling_model.py                          # defaults: the 2026-11-23 calibration
    python tools/scaling_model.py --profile runs/profile_rows.json   # recalibrate
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

WORKERS = (2, 4, 8, 16, 32, 64, 128)
NETWORKS_GBPS = (10, 25, 100)
ACCUMULATION = (1, 2, 4, 8, 16, 32, 64)
# The seed CNN's trainable variables in creation order (elements): conv1 k, b; conv2 k, b;
# dense 3136x1024 k, b; dense 1024x10 k, b. 3,274,634 in all.
SEED_VARIABLES = (800, 32, 51_200, 64, 3_211_264, 1024, 10_240, 10)


@dataclass(frozen=True)
class Calibration:
    """Measured constants (seconds, bytes). Defaults: the best of three ``tools/profile_rows.py``
    runs on 2026-11-23 (2-core VM loaded by other jobs, load average 5-15; docs/benchmarks-log.md)."""

    fixed_s: float = 0.0109          # t_comp intercept, s per step (1 thread)
    per_example_s: float = 0.000446  # t_comp slope, s per example (1 thread)
    cpu_s_per_byte_f32: float = 2.72e-9  # 2-process all-reduce of 13.1 MB float32: CPU per worker
    cpu_s_per_byte_bf16: float = 2.60e-9  # the same gradients in bf16 (6.5 MB), casts included
    ps_cpu_s_per_byte: float = 1.47e-9   # ps read + update, 13.1 MB each way: 38.6 ms
    coordinator_s: float = 0.00182   # coordinator round trip per scheduled step (latency)
    coordinator_rate_s: float = 0.00113  # coordinator time per step when steps are pipelined
    latency_s: float = 50e-6         # per message on a data-centre network (assumed, not measured)
    variables: tuple[int, ...] = SEED_VARIABLES
    bytes_per_element: int = 4
    # Bytes on the wire per byte of payload: a full 1500-byte-MTU TCP segment carries 1448 bytes
    # in a 1514-byte Ethernet frame (14 Ethernet + 20 IPv4 + 32 TCP with timestamps). Measured
    # on simulated hosts: 1.046-1.048 x the ring all-reduce's bytes (docs/benchmarks.md).
    frame_overhead: float = 1514 / 1448
    # The fraction of a link's rate TF's gRPC runtime keeps busy while it moves tensors (1.0:
    # the whole link). Measured on simulated hosts (docs/benchmarks.md): much less than 1 on a
    # CPU-loaded machine; give the figure measured on yours.
    link_efficiency: float = 1.0

    @property
    def gradient_bytes(self) -> int:
        return sum(self.variables) * self.bytes_per_element

    def t_comp(self, batch: int) -> float:
        """Seconds of one worker's training step (forward, backward, update) on ``batch``."""
        return self.fixed_s + self.per_example_s * batch


def ring_allreduce_bytes(n: int, nbytes: float) -> float:
    """Bytes each worker sends (and receives) in a ring all-reduce of ``nbytes`` over ``n``
    workers: ``2 (n - 1) / n * nbytes`` (reduce-scatter, then all-gather). 0 for one worker."""
    if n < 1:
        raise ValueError(f"n must be >= 1. Received: n={n}")
    return 2 * (n - 1) / n * nbytes


def per_byte_s(gbps: float, cpu_s_per_byte: float, wire_factor: float = 1.0) -> float:
    """Seconds per byte moved: the wire (8 bits / bandwidth, times ``wire_factor``) plus the
    runtime's CPU per byte."""
    return 8 * wire_factor / (gbps * 1e9) + cpu_s_per_byte


def wire_factor(cal: Calibration) -> float:
    """Wire time per payload byte over the ideal ``8 / bandwidth``: the frame headers over the
    link efficiency."""
    if not 0 < cal.link_efficiency <= 1:
        raise ValueError(f"link_efficiency must be within (0, 1]. Received: {cal.link_efficiency}")
    return cal.frame_overhead / cal.link_efficiency


def shared_cores(tasks: int, cores: int | None) -> float:
    """How much slower a CPU-bound task runs when ``tasks`` single-threaded tasks share ``cores``
    cores: ``max(1, tasks / cores)``; 1 when ``cores`` is None (a core per task)."""
    if cores is None:
        return 1.0
    if cores < 1 or tasks < 1:
        raise ValueError(f"tasks and cores must be >= 1. Received: tasks={tasks}, cores={cores}")
    return max(1.0, tasks / cores)


def multi_worker(cal: Calibration, n: int, gbps: float, *, batch: int = 64, k: int = 1,
                 bf16: bool = False, cores: int | None = None,
                 cpu_step_s: float | None = None) -> dict:
    """One update of ``n`` synchronous workers, ``batch`` examples each per micro-batch, ``k``
    micro-batches per all-reduce. ``gbps``: each worker's link, each direction (``math.inf``: no
    wire time). ``cores``: the cores all workers share (None: a core per worker, separate
    machines); the CPU parts (compute, the runtime's per-byte cost) stretch by
    :func:`shared_cores`, the wire does not. ``cpu_step_s``: a measured step time without wire
    time (e.g. the same cluster on uncapped links) in place of the calibrated CPU parts, so
    that only the wire time is modelled. Returns step_s (one update), comm_s, wire_s,
    examples_per_s, efficiency (against one worker computing alone on its own core)."""
    nbytes = cal.gradient_bytes / (2 if bf16 else 1)
    cpu = cal.cpu_s_per_byte_bf16 if bf16 else cal.cpu_s_per_byte_f32
    stretch = shared_cores(n, cores)
    comm = wire = 0.0
    if n > 1:
        ring = ring_allreduce_bytes(n, nbytes)
        wire = ring * 8 * wire_factor(cal) / (gbps * 1e9) + 2 * (n - 1) * cal.latency_s
        comm = ring * cpu * stretch + wire
    step = k * cal.t_comp(batch) * stretch + comm
    if cpu_step_s is not None:
        step = cpu_step_s + wire
    rate = n * k * batch / step
    return {"step_s": step, "comm_s": comm, "wire_s": wire, "examples_per_s": rate,
            "limit": "wire" if wire > step / 2 else "cpu",
            "efficiency": rate / (n * batch / cal.t_comp(batch))}


def ps_bytes(cal: Calibration, num_ps: int, partitioned: bool) -> float:
    """Bytes of variables on the busiest ps task."""
    load = [0.0] * num_ps
    if partitioned:
        for i, elements in enumerate(cal.variables):
            nbytes = elements * cal.bytes_per_element
            if nbytes > 256 << 10:
                load = [x + nbytes / num_ps for x in load]
            else:
                load[i % num_ps] += nbytes
    else:
        for i, elements in enumerate(cal.variables):  # TF's default: round-robin, whole variables
            load[i % num_ps] += elements * cal.bytes_per_element
    return max(load)


def ps_in_bytes(cal: Calibration, num_ps: int, partitioned: bool) -> float:
    """Gradient bytes the busiest ps task receives per worker step: its whole variables'
    gradients, and the *whole* gradient of every partitioned variable (over 256 KiB, ``num_ps``
    > 1), not just its shard's. Measured on simulated hosts (docs/benchmarks.md): 2 ps,
    ``variable_partitioning: min_size``, each ps received 12.9-13.1 MB per step of 13.1 MB of
    gradients."""
    load = [0.0] * num_ps
    for i, elements in enumerate(cal.variables):
        nbytes = elements * cal.bytes_per_element
        if partitioned and num_ps > 1 and nbytes > 256 << 10:
            load = [x + nbytes for x in load]
        else:
            load[i % num_ps] += nbytes
    return max(load)


def ps_push_bytes(cal: Calibration, num_ps: int, partitioned: bool) -> float:
    """Bytes a worker sends per step: every gradient once, except that the whole gradient of a
    partitioned variable (over 256 KiB, ``num_ps`` > 1) goes to every ps holding a shard of it
    (:func:`ps_in_bytes`). Measured on simulated hosts (docs/benchmarks.md): with 2 ps and
    ``variable_partitioning: min_size`` each worker sent 2.0 x its 13.1 MB of gradients per
    step, while the ps sent the variables once; with 1 ps, 1.0 x. More than 2 ps: not measured,
    the same rule assumed."""
    total = 0.0
    for elements in cal.variables:
        nbytes = elements * cal.bytes_per_element
        copies = num_ps if partitioned and num_ps > 1 and nbytes > 256 << 10 else 1
        total += copies * nbytes
    return total


def parameter_server(cal: Calibration, n: int, gbps: float, *, num_ps: int = 1,
                     partitioned: bool = False, batch: int = 128, k: int = 1,
                     cores: int | None = None, cpu_step_s: float | None = None) -> dict:
    """``n`` asynchronous workers, ``num_ps`` ps tasks; ``k`` local micro-batches per pull/push
    (hypothetical: kerasdist refuses gradient accumulation for parameter_server). ``cores``: the
    cores every task shares (None: a machine per task); with it the cluster is also capped by
    the CPU one global step needs (a worker's compute, the ps transfer's per-byte cost, the
    coordinator's time per step) over the cores (limit ``"cpu"``). ``cpu_step_s``: the measured
    seconds per global step of the same cluster without wire time (uncapped links) in place of
    the calibrated CPU parts: a worker's step is then ``n x cpu_step_s`` plus its wire time, and
    the cluster is capped at ``1 / cpu_step_s`` steps/s (limit ``"cpu"``)."""
    nbytes = cal.gradient_bytes
    factor = wire_factor(cal)
    moved = nbytes + ps_push_bytes(cal, num_ps, partitioned)  # variables in, gradients out
    worker_step = (k * cal.t_comp(batch)
                   + moved * per_byte_s(gbps, cal.ps_cpu_s_per_byte, factor)
                   + 2 * cal.latency_s + cal.coordinator_s)
    busiest = max(ps_bytes(cal, num_ps, partitioned), ps_in_bytes(cal, num_ps, partitioned))
    ps_steps = 1 / max(busiest * 8 * factor / (gbps * 1e9), 2 * busiest * cal.ps_cpu_s_per_byte)
    limits = {"workers": n / worker_step, "ps": ps_steps, "coordinator": 1 / cal.coordinator_rate_s}
    if cpu_step_s is not None:
        wire = moved * 8 * factor / (gbps * 1e9) + 2 * cal.latency_s
        ps_wire = busiest * 8 * factor / (gbps * 1e9)
        limits = {"workers": n / (n * cpu_step_s + wire),
                  "ps": 1 / ps_wire if ps_wire > 0 else math.inf, "cpu": 1 / cpu_step_s}
    elif cores is not None:
        cpu_per_step = (k * cal.t_comp(batch) + 2 * nbytes * cal.ps_cpu_s_per_byte
                        + cal.coordinator_rate_s)
        limits["cpu"] = cores / cpu_per_step
    limit = min(limits, key=limits.get)
    steps = limits[limit]
    rate = steps * k * batch
    return {"step_s": n / steps, "examples_per_s": rate, "limit": limit,
            "efficiency": rate / (n * batch / cal.t_comp(batch))}


def best_multi_worker(cal: Calibration, n: int, gbps: float, *, target: float = 0.8,
                      batch: int = 64) -> str:
    """The smallest ``k`` (float32 first, then bf16 at its own smallest k) reaching ``target``."""
    found = []
    for bf16 in (False, True):
        for k in ACCUMULATION:
            if multi_worker(cal, n, gbps, batch=batch, k=k, bf16=bf16)["efficiency"] >= target:
                found.append(f"{'bf16' if bf16 else 'f32'} k={k}")
                break
    return ", ".join(found) or f"none up to k={ACCUMULATION[-1]}"


def best_parameter_server(cal: Calibration, n: int, gbps: float, *, target: float = 0.8) -> str:
    """The fewest ps tasks (1-8, partitioned) reaching ``target`` at the smallest per-worker batch
    of 128 x k (``data.batch_size``: a parameter-server worker step is one global batch; kerasdist
    refuses gradient accumulation there, and a k-times larger batch moves the same bytes)."""
    for k in ACCUMULATION:
        for num_ps in range(1, 9):
            if parameter_server(cal, n, gbps, num_ps=num_ps, partitioned=True,
                                k=k)["efficiency"] >= target:
                label = "1 ps" if num_ps == 1 else f"{num_ps} ps, partitioned"
                return label + f", batch {128 * k}"
    return "none (coordinator-bound)"


def calibrate(profile: dict) -> Calibration:
    """A :class:`Calibration` from a ``tools/profile_rows.py`` JSON result."""
    pieces = profile["pieces"]
    comp = {c["batch"]: c["step_ms"] / 1e3 for c in pieces["compute"] if c["threads"] == 1}
    slope = (comp[128] - comp[64]) / 64
    ar = {a["dtype"]: a for a in pieces["allreduce"] if a["bytes_per_pack"] == 0}
    cpu = {d: sum(a["cpu_ms_per_worker"]) / len(a["cpu_ms_per_worker"]) / 1e3 / a["bytes"]
           for d, a in ar.items()}  # CPU, not wall: here both workers share 2 cores
    ps = pieces["ps"]
    return replace(Calibration(), fixed_s=max(comp[64] - 64 * slope, 0.0), per_example_s=slope,
                   cpu_s_per_byte_f32=cpu["float32"], cpu_s_per_byte_bf16=cpu["bfloat16"],
                   ps_cpu_s_per_byte=ps["read_and_update_ms"] / 1e3 / (2 * ps["bytes_each_way"]),
                   coordinator_s=ps["noop_ms"] / 1e3,
                   coordinator_rate_s=ps.get("noop_pipelined_ms", ps["noop_ms"]) / 1e3)


def tables(cal: Calibration) -> str:
    out = [f"calibration: {cal}", "",
           "multi_worker (ring all-reduce, 64 examples per worker per micro-batch)", "",
           "| workers | Gb/s | f32 step ms | f32 examples/s | f32 eff. | bf16 step ms | bf16 eff. "
           "| settings for >= 80 % |", "| --- " * 8 + "|"]
    for gbps in NETWORKS_GBPS:
        for n in WORKERS:
            f32 = multi_worker(cal, n, gbps)
            b16 = multi_worker(cal, n, gbps, bf16=True)
            out.append(f"| {n} | {gbps} | {f32['step_s'] * 1e3:.1f} | {f32['examples_per_s']:,.0f} | "
                       f"{f32['efficiency']:.0%} | {b16['step_s'] * 1e3:.1f} | {b16['efficiency']:.0%} "
                       f"| {best_multi_worker(cal, n, gbps)} |")
    out += ["", "parameter_server (asynchronous, 128 examples per worker step)", "",
            "| workers | Gb/s | 1 ps: examples/s, eff. (limit) | 8 ps unpartitioned | "
            "8 ps partitioned | settings for >= 80 % |", "| --- " * 6 + "|"]
    for gbps in NETWORKS_GBPS:
        for n in WORKERS:
            cells = []
            for num_ps, part in ((1, False), (8, False), (8, True)):
                r = parameter_server(cal, n, gbps, num_ps=num_ps, partitioned=part)
                cells.append(f"{r['examples_per_s']:,.0f}, {r['efficiency']:.0%} ({r['limit']})")
            out.append(f"| {n} | {gbps} | {' | '.join(cells)} | "
                       f"{best_parameter_server(cal, n, gbps)} |")
    return "\n".join(out)


# Points measured on this machine (docs/benchmarks-log.md): examples/s, medians.
MEASURED_HERE = {
    ("multi_worker", 1, 128, False): (1157.8, "run A sweep, 2026-11-21"),
    ("multi_worker", 2, 128, False): (618.3, "run B, 2026-11-21 (run A: 586.5)"),
    ("parameter_server", 1, 128, False): (863.4, "run A sweep"),
    ("parameter_server", 2, 128, False): (917.0, "run B (run A: 918.7)"),
    ("parameter_server", 3, 128, False): (1017.5, "run A sweep"),
    ("multi_worker", 2, 64, False): (347.7, "mnist_cnn_mwms none, 4 runs, 2026-11-23, load 5-15"),
    ("multi_worker", 2, 64, True): (305.4, "mnist_cnn_mwms bf16, 4 runs, 2026-11-23, load 5-15"),
    ("multi_worker", 4, 128, False): (563.9, "1 run, 2 epochs, 1 thread per task, 2026-11-23 "
                                              "(2 workers alike: 674.0)"),
    ("parameter_server", 4, 128, False): (1493.5, "1 run, 2 x 62 steps, 2026-11-23 "
                                                  "(2 workers alike: 939.1)"),
}


def local_check(cal: Calibration, *, cpu_per_step: dict, all_cores: dict, ps_transfer_s: float,
                cores: int = 2, measured: dict | None = None) -> list[dict]:
    """Predictions for points measured on this machine, where every task shares ``cores`` cores
    and the wire is free: a CPU budget.

    One worker runs alone on every core: ``t_comp`` (``all_cores``) plus, for parameter_server,
    the ps transfer and the coordinator's round trip in series. With 2 or more workers the cores
    are taken to be busy all the time, so a global step takes the CPU it needs divided by the
    cores: every worker's compute CPU (``cpu_per_step``, measured on 1 thread) plus its CPU for
    the all-reduce (ring bytes x ``cpu_s_per_byte``), or for parameter_server the ps transfer and
    the coordinator's CPU per step. A measured rate below the prediction is time the cores sat
    idle (waiting on peers) or work the pieces leave out (Keras ``fit``, the launcher, evaluation).

    Args:
        cal: the calibration (per-byte costs, coordinator).
        cpu_per_step: {batch: CPU seconds of one training step on 1 intra-op thread}.
        all_cores: {batch: wall seconds of one training step on every core, alone}.
        ps_transfer_s: wall seconds of a ps read + update of every variable (one process).
        cores: cores of this machine.
        measured: {(strategy, workers, global batch, bf16): (examples/s, source)}.
    """
    def interp(table, batch):
        (b1, s1), (b2, s2) = sorted(table.items())
        return s1 + (s2 - s1) * (batch - b1) / (b2 - b1)

    measured = MEASURED_HERE if measured is None else measured
    rows = []
    points = sorted({*measured, ("multi_worker", 4, 128, False), ("parameter_server", 4, 128, False)})
    for kind, n, glob, bf16 in points:
        if kind == "multi_worker" and n == 1:
            rate = glob / interp(all_cores, glob)
        elif kind == "multi_worker":
            cpu_byte = cal.cpu_s_per_byte_bf16 if bf16 else cal.cpu_s_per_byte_f32
            nbytes = cal.gradient_bytes / (2 if bf16 else 1)
            cpu = n * (interp(cpu_per_step, glob // n) + ring_allreduce_bytes(n, nbytes) * cpu_byte)
            rate = glob / (cpu / cores)
        elif n == 1:
            rate = glob / (interp(all_cores, glob) + ps_transfer_s + cal.coordinator_s)
        else:
            cpu = interp(cpu_per_step, glob) + ps_transfer_s + cal.coordinator_rate_s
            rate = glob / (cpu / cores)
        got = measured.get((kind, n, glob, bf16))
        rows.append({"strategy": kind, "workers": n, "global_batch": glob, "bf16": bf16,
                     "predicted": rate, "measured": got[0] if got else None,
                     "source": got[1] if got else "not measured"})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", type=Path, help="tools/profile_rows.py JSON to calibrate on")
    parser.add_argument("--byte-cost-scale", type=float, default=1.0,
                        help="multiply the measured CPU cost per byte (all-reduce and ps) by this: "
                        "e.g. the factor an end-to-end run shows over the isolated pieces")
    args = parser.parse_args(argv)
    cal = Calibration()
    # least / median wall seconds of the lone steps and the ps transfer (2026-11-23 profiles)
    cpu_step = {64: 0.0615, 128: 0.0951}
    best = {"all_cores": {64: 0.0334, 128: 0.0544}, "ps": 0.0386}
    typical = {"all_cores": {64: 0.0641, 128: 0.1872}, "ps": 0.0517}
    if args.profile:
        profile = json.loads(args.profile.read_text(encoding="utf-8"))
        cal = calibrate(profile)
        comp = profile["pieces"]["compute"]
        cpu_step = {c["batch"]: c["cpu_ms"] / 1e3 for c in comp if c["threads"] == 1}
        ps = profile["pieces"]["ps"]
        best = {"all_cores": {c["batch"]: c["step_ms"] / 1e3 for c in comp
                              if c["threads"] == "default"}, "ps": ps["read_and_update_ms"] / 1e3}
        typical = {"all_cores": {c["batch"]: c.get("median_ms", c["step_ms"]) / 1e3 for c in comp
                                 if c["threads"] == "default"},
                   "ps": ps.get("read_and_update_median_ms", ps["read_and_update_ms"]) / 1e3}
    if args.byte_cost_scale != 1.0:
        scale = args.byte_cost_scale
        cal = replace(cal, cpu_s_per_byte_f32=cal.cpu_s_per_byte_f32 * scale,
                      cpu_s_per_byte_bf16=cal.cpu_s_per_byte_bf16 * scale,
                      ps_cpu_s_per_byte=cal.ps_cpu_s_per_byte * scale)
    print(tables(cal))
    print("\nCheck on this machine (2 shared cores, no wire; a CPU budget, see local_check), from "
          "the pieces' least times and from their medians:\n")
    print("| strategy | workers | global batch | bf16 | predicted (least) | predicted (median) | "
          "measured | source |\n" + "| --- " * 8 + "|")
    rows = [local_check(cal, cpu_per_step=cpu_step, all_cores=v["all_cores"], ps_transfer_s=v["ps"])
            for v in (best, typical)]
    for r, t in zip(*rows, strict=True):
        print(f"| {r['strategy']} | {r['workers']} | {r['global_batch']} | {r['bf16']} | "
              f"{r['predicted']:.0f} | {t['predicted']:.0f} | {r['measured'] or '–'} | "
              f"{r['source']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
