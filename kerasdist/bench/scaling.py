"""The coordinator-scaling benchmark: steps/s a parameter-server coordinator sustains with 1, 2, 4,
8, ... in-process workers, kerasdist's loop against tf_keras's own parameter-server ``fit``.

Each point is one process (:mod:`kerasdist.bench.scaling_job`, in a private network namespace)
holding the coordinator, 1 ps and N worker servers; the model and input cost almost nothing, so
the figure is the rate at which the coordinator schedules steps and the workers' RPCs complete.
All points run round-robin (repeat r of every point before repeat r+1 of any), and the figures
are medians over the repeats.

Run: ``python -m kerasdist.bench.scaling 1,2,4,8 [--steps 300] [--epochs 3] [--repeats 3]
[--out runs/bench]``: adds ``coordinator_scaling`` (and re-judged ``targets``) to
``OUT/bench.json`` (made if absent), writes ``coordinator_scaling.png`` and rewrites
``bench.md``. Exit codes: 0 ok, 1 a run failed, 2 bad input (nothing run).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from kerasdist.bench import targets as bench_targets
from kerasdist.bench.runner import Measurement, python, run_json_job
from kerasdist.bench.scaling_job import IMPLEMENTATIONS
from kerasdist.errors import RecipeError

MAX_WORKERS = 32
SATURATION_GAIN = 1.1  # a doubling of workers that adds less than 10 % steps/s: saturated


def parse_counts(text: str, *, argument: str = "--coordinator-scaling") -> list[int]:
    """Worker counts from a comma list, e.g. ``"1,2,4,8"``.

    Raises:
        RecipeError: empty, not integers, out of ``1..MAX_WORKERS`` or repeated (names the
            argument and shows what was received).
    """
    items = [item.strip() for item in text.split(",") if item.strip()]
    try:
        counts = [int(item) for item in items]
    except ValueError:
        counts = []
    if not counts or any(not 1 <= n <= MAX_WORKERS for n in counts) or len(set(counts)) < len(counts):
        raise RecipeError(f"{argument} takes distinct worker counts from 1 to {MAX_WORKERS}, "
                          f"comma-separated, e.g. 1,2,4,8. Received: '{text}'")
    return sorted(counts)


def _check_positive(**values: int) -> None:
    bad = {k: v for k, v in values.items() if v < 1}
    if bad:
        raise RecipeError(", ".join(f"--{k} must be >= 1" for k in bad) + ". Received: "
                          + ", ".join(f"{k}={v}" for k, v in bad.items()))


def check_isolation() -> None:
    """Raises ClusterError (exit 2) where the points cannot run in a private network namespace
    (their in-process TF servers must not be reachable from the network)."""
    from kerasdist.errors import ClusterError
    from kerasdist.launch.isolation import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        raise ClusterError(f"the coordinator-scaling runs start TF servers and run only in a "
                           f"private network namespace: {reason}")


def _run_point(impl: str, workers: int, *, steps: int, epochs: int, out: Path, rep: int,
               timeout_s: float) -> Measurement:
    from kerasdist.launch.isolation import isolated_argv

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    if impl == "tf_keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    argv = isolated_argv([python(), "-m", "kerasdist.bench.scaling_job", impl, str(workers),
                          str(steps), str(epochs)])
    return run_json_job(f"scaling-{impl}-w{workers}-r{rep}", argv, out, timeout_s=timeout_s,
                        env=env)


def summarize_point(impl: str, workers: int, runs: list[Measurement]) -> dict[str, Any]:
    """One ``coordinator_scaling`` entry: median [min, max] steps/s over the runs that worked."""
    rates = [m.figures["steps_per_sec"] for m in runs
             if m.returncode == 0 and m.figures.get("steps_per_sec")]
    spe = next((m.figures.get("steps_per_execution") for m in runs if m.figures), None)
    return {"impl": impl, "workers": workers, "runs": len(runs), "succeeded": len(rates),
            "steps_per_sec": statistics.median(rates) if rates else None,
            "steps_per_sec_min": min(rates) if rates else None,
            "steps_per_sec_max": max(rates) if rates else None,
            "steps_per_execution": spe, "returncodes": [m.returncode for m in runs],
            "peak_rss_mb": statistics.median([m.peak_rss_mb for m in runs]) if runs else None,
            "logs": [m.log for m in runs]}


def saturation(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Per implementation: the worker count where steps/s stops growing and its peak.

    ``saturates_at`` is the first count whose next (larger) count adds less than 10 %
    (:data:`SATURATION_GAIN`); None when every step up added more (not saturated in the range).
    """
    found: dict[str, Any] = {}
    for impl in sorted({p["impl"] for p in points}):
        line = sorted((p["workers"], p["steps_per_sec"]) for p in points
                      if p["impl"] == impl and p["steps_per_sec"])
        at = next((n for (n, r), (_, r_next) in zip(line, line[1:], strict=False)
                   if r_next < SATURATION_GAIN * r), None)
        best = max(line, key=lambda item: item[1], default=(None, None))
        found[impl] = {"saturates_at": at, "peak_workers": best[0], "peak_steps_per_sec": best[1]}
    return found


def run_scaling(counts: list[int], *, steps: int = 300, epochs: int = 3, repeats: int = 3,
                out_dir: str | Path = "runs/bench", timeout_s: float = 600) -> dict[str, Any]:
    """Run every (implementation, worker count) point ``repeats`` times, round-robin.

    tf_keras points are left out when the ``tf_keras`` package is not installed.

    Returns:
        ``{"settings": {...}, "points": [summarize_point ...], "saturation": {...}}``.
    """
    _check_positive(steps=steps, repeats=repeats)
    if epochs < 2:
        raise RecipeError(f"--epochs must be >= 2 (epoch 1 holds the tracing and is not timed). "
                          f"Received: epochs={epochs}")
    impls = [i for i in IMPLEMENTATIONS
             if i != "tf_keras" or importlib.util.find_spec("tf_keras") is not None]
    out = Path(out_dir)
    runs: dict[tuple[str, int], list[Measurement]] = {}
    for rep in range(repeats):
        for workers in counts:
            for impl in impls:
                runs.setdefault((impl, workers), []).append(_run_point(
                    impl, workers, steps=steps, epochs=epochs, out=out, rep=rep,
                    timeout_s=timeout_s))
    points = [summarize_point(impl, n, ms) for (impl, n), ms in runs.items()]
    return {"settings": {"workers": counts, "steps_per_epoch": steps, "epochs": epochs,
                         "repeats": repeats, "timing": "whole epochs 2..n, steps/s",
                         "model": "dense 32-64-10, SGD, one constant batch of 32 per worker",
                         "cluster": "in-process: coordinator, 1 ps and N workers in one process"},
            "points": points, "saturation": saturation(points)}


def merge_into_bench(scaling: dict[str, Any], out: Path) -> dict[str, Any]:
    """Add ``scaling`` to ``out/bench.json`` (made if absent), re-judge the targets, rewrite the
    table and plots; returns the merged result."""
    from kerasdist.bench import report
    from kerasdist.bench.runner import environment

    path = out / "bench.json"
    result = json.loads(path.read_text()) if path.exists() else {
        "environment": environment(), "settings": {}, "rows": {}, "sweep": []}
    result["coordinator_scaling"] = scaling
    result["targets"] = bench_targets.evaluate(result)
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    report.write_all(result, out)
    return result


def main(argv=None) -> int:
    """``python -m kerasdist.bench.scaling COUNTS [--steps N] [--epochs N] [--repeats N]
    [--out DIR] [--timeout S]``; returns the exit code (0 ok, 1 a run failed, 2 bad input)."""
    from kerasdist.bench import report
    from kerasdist.errors import ClusterError

    parser = argparse.ArgumentParser(prog="python -m kerasdist.bench.scaling")
    parser.add_argument("counts", help="comma list of worker counts, e.g. 1,2,4,8")
    parser.add_argument("--steps", type=int, default=300, help="steps per epoch (all workers)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (>= 2)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per point (median)")
    parser.add_argument("--out", default="runs/bench", help="folder of bench.json")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    args = parser.parse_args(argv)
    try:
        counts = parse_counts(args.counts, argument="counts")
        _check_positive(steps=args.steps, repeats=args.repeats)
        check_isolation()
        scaling = run_scaling(counts, steps=args.steps, epochs=args.epochs,
                              repeats=args.repeats, out_dir=args.out, timeout_s=args.timeout)
    except (RecipeError, ClusterError) as err:
        print(f"kerasdist: error: {err}", file=sys.stderr)
        return 2
    result = merge_into_bench(scaling, Path(args.out))
    print(report.scaling_table(result) + report.targets_table(result))
    failed = [p for p in scaling["points"] if p["succeeded"] < p["runs"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
