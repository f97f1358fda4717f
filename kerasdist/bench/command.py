"""The ``kerasdist bench`` command: the checks of its flags (:func:`run`), then every row run,
ratios computed, bench.json, the table and plots written (:func:`run_bench`)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kerasdist.bench import report
from kerasdist.bench import targets as bench_targets
from kerasdist.bench.runner import (
    CLUSTER_STRATEGIES,
    Measurement,
    _figures_from_metrics,
    environment,
    python,
    run_json_job,
    run_measured,
    strategy_recipe,
    summarize,
    validate_names,
)
from kerasdist.config import load_recipe, validate_recipe
from kerasdist.errors import EXIT_FAILED, EXIT_OK, RecipeError
from kerasdist.launch.isolation import isolated_argv


def _write_recipe(data: dict, path: Path) -> Path:
    validate_recipe(data)  # every generated row recipe is valid before anything runs
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def stream_data(raw: dict, recipe, out: Path) -> dict:
    """``raw`` for the ``default_stream`` row: the recipe's training and evaluation splits
    (loaded here, as the ``default`` row loads them) written as TFRecord files in the MNIST layout
    (``<out>/stream-data/{train,test}.tfrecord``, :func:`kerasdist.data.sources.write_tfrecord`)
    and the recipe's ``data`` pointed at them (``source: tfrecord``, whole split names: the
    streaming path), every other setting kept.

    Raises:
        RecipeError: the recipe's examples are not uint8 square images (``(N, H, H)``) or it has
            no ``data.eval_split``.
    """
    import numpy as np

    from kerasdist.data.inputs import load_split
    from kerasdist.data.readers import write_tfrecord

    folder = out / "stream-data"
    splits = {"train": recipe.data.train_split, "test": recipe.data.eval_split}
    if not splits["test"]:
        raise RecipeError("--strategies default_stream needs a recipe with data.eval_split. "
                          "Received: eval_split=None")
    for name, split in splits.items():
        x, y = load_split(recipe.data, split)
        if x.dtype != np.uint8 or x.ndim != 3 or x.shape[1] != x.shape[2]:
            raise RecipeError(f"--strategies default_stream writes the recipe's data as MNIST-layout "
                              f"TFRecords: it needs uint8 square images (N, H, H). Received: "
                              f"{x.dtype} {tuple(x.shape)} from data.source '{recipe.data.kind}'")
        write_tfrecord(x, y, folder / f"{name}.tfrecord")
    data = {**raw["data"], "source": {"kind": "tfrecord", "path": str(folder)},
            "train_split": "train", "eval_split": "test"}
    return {**raw, "data": data}


def _run_strategy(raw, strategy, *, workers, out: Path, tag: str, timeout_s) -> Measurement:
    run_dir = out / "runs" / tag
    shutil.rmtree(run_dir, ignore_errors=True)
    recipe_path = _write_recipe(strategy_recipe(raw, strategy, workers=workers, run_dir=run_dir),
                                out / "recipes" / f"{tag}.json")
    log = out / "logs" / f"{tag}.log"
    code, wall, rss = run_measured(tag, [python(), "-m", "kerasdist", "fit", str(recipe_path),
                                         "--verbose", "0"], log_path=log, timeout_s=timeout_s)
    metrics = run_dir / "metrics.json"
    figures = _figures_from_metrics(metrics) if code == 0 and metrics.exists() else {}
    return Measurement(tag, code, wall, rss, figures, str(log))


def _run_baseline(raw, name, *, workers, out: Path, tag: str, timeout_s,
                  kinds=CLUSTER_STRATEGIES) -> list[Measurement]:
    """Run one repeat of baseline ``name``; one Measurement per row it makes.

    ``tf_keras`` makes a row per cluster kind in ``kinds`` (``tf_keras_<kind>``); ``keras_enable``
    a row per strategy kind in ``kinds`` (``keras_enable_<kind>``: a user's own ``fit`` with only
    ``kerasdist.enable()``, :mod:`kerasdist.bench.enable_job`); the others one row each.
    """
    if name in ("tf_keras", "keras_enable"):
        if name == "tf_keras" and importlib.util.find_spec("tf_keras") is None:
            return []
        from kerasdist.bench.enable_job import KINDS

        rows = []
        for kind in kinds:
            if name == "keras_enable" and kind not in KINDS:
                continue
            recipe_path = _write_recipe(strategy_recipe(raw, kind, workers=workers,
                                                        run_dir=out / "runs" / tag),
                                        out / "recipes" / f"{tag}-{kind}.json")
            if kind in CLUSTER_STRATEGIES:
                argv = isolated_argv([python(), "-m", "kerasdist.bench.baseline_cluster", name, kind,
                                  str(recipe_path), str(workers)])
            else:
                argv = [python(), "-m", "kerasdist.bench.enable_job", kind, str(recipe_path)]
            rows.append(run_json_job(f"{tag}-{kind}", argv, out, timeout_s=timeout_s))
        return rows
    recipe_path = _write_recipe(strategy_recipe(raw, "default", workers=1,
                                                run_dir=out / "runs" / tag),
                                out / "recipes" / f"{tag}.json")
    return [run_json_job(tag, [python(), "-m", "kerasdist.bench.baselines", name,
                                str(recipe_path)], out, timeout_s=timeout_s)]


def _run_legacy(recipe, *, workers, out: Path, tag: str, timeout_s) -> Measurement:
    """The TF1 async CNN flow from legacy/ (between-graph, replica_device_setter)."""
    # Global steps (all workers' updates together), as kerasdist's parameter_server row counts.
    steps = (recipe.trainer.steps_per_epoch or 8000 // recipe.data.batch_size) * recipe.trainer.epochs
    # legacy/ is installed with the project (pyproject's packages), so no sys.path editing.
    code = ("import json,sys; from legacy.runner import run_async_cnn; "
            "r = run_async_cnn(workers=%d, steps=%d, batch_size=%d); "
            "json.dump({k: v for k, v in r.items() if isinstance(v, (int, float, str))}, "
            "open(sys.argv[1], 'w'))") % (workers, steps, recipe.data.batch_size)
    m = run_json_job(tag, isolated_argv([python(), "-c", code]), out, timeout_s=timeout_s)
    if m.figures:
        train_s = m.figures.get("train_wall_s") or m.figures.get("wall_s") or m.wall_time_s
        m.figures = {"throughput": {"examples_per_sec": steps * recipe.data.batch_size / train_s,
                                    "epoch_end_s": []},
                     "final_accuracy": m.figures.get("accuracy"), "legacy": m.figures}
    return m


def _check_inputs(recipe, strategies, baselines, *, repeats, workers, sweep_workers) -> None:
    validate_names(strategies, baselines)
    if repeats < 1:
        raise RecipeError(f"--repeats must be >= 1. Received: repeats={repeats}")
    if "ray" in strategies:  # the ray row needs Ray Train installed: refuse before any row runs
        from kerasdist.launch.clusters.ray import require_ray

        require_ray()
    if {"multi_worker", "multi_worker_bf16", "ray"} & set(strategies):
        uneven = [n for n in {workers, *sweep_workers} if recipe.data.batch_size % n]
        if uneven:
            raise RecipeError(
                f"multi_worker splits the global batch evenly over the workers: data.batch_size "
                f"({recipe.data.batch_size}) is not divisible by {sorted(uneven)} worker(s). "
                f"Received: workers={workers}, sweep_workers={list(sweep_workers)}")


def run_bench(*, recipe_path: str, overrides=(), strategies: list[str], baselines: list[str],
              repeats: int = 1, workers: int = 2, sweep_workers: list[int] = (),
              out_dir: str | Path = "runs/bench", target: float | None = None,
              timeout_s: float = 1800, coordinator_scaling: list[int] = (),
              scaling_steps: int = 300) -> dict[str, Any]:
    """Run the benchmark; returns the bench.json content (also written to ``out_dir``).

    ``coordinator_scaling`` (worker counts, e.g. ``[1, 2, 4, 8]``) adds the coordinator-scaling
    points (:mod:`kerasdist.bench.scaling`, ``repeats`` each, ``scaling_steps`` steps per epoch)
    after the rows. bench.json's ``targets`` holds the speed targets' verdicts
    (:mod:`kerasdist.bench.targets`).

    Raises:
        RecipeError: bad recipe, strategy or baseline names, repeats < 1, bad worker counts
            (before anything runs).
        ClusterError: coordinator scaling asked for where no network namespace can be made.
    """
    if coordinator_scaling:
        from kerasdist.bench.scaling import check_isolation, parse_counts

        coordinator_scaling = parse_counts(",".join(str(n) for n in coordinator_scaling))
        check_isolation()
    recipe = load_recipe(recipe_path, overrides)
    _check_inputs(recipe, strategies, baselines, repeats=repeats, workers=workers,
                  sweep_workers=sweep_workers)
    target = target if target is not None else 0.98
    raw = recipe.model_dump(mode="json")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[Measurement]] = {}
    kinds: dict[str, str] = {name: "strategy" for name in strategies}
    streamed = stream_data(raw, recipe, out) if "default_stream" in strategies else None
    # Round-robin: repeat r of every row runs before repeat r+1 of any (order: repeat_order), so
    # a slow spell of the machine lands on all rows alike instead of on one.
    for rep in range(repeats):
        for kind, name in repeat_order(baselines, strategies, rep):
            if kind == "baseline":
                per_kind = CLUSTER_STRATEGIES if name == "tf_keras" else strategies
                for m in _run_baseline(raw, name, workers=workers, out=out, tag=f"{name}-r{rep}",
                                       timeout_s=timeout_s, kinds=per_kind):
                    row = (m.name.rsplit("-r", 1)[0] if name not in ("tf_keras", "keras_enable")
                           else f"{name}_" + m.name.split("-", 2)[-1])
                    rows.setdefault(row, []).append(m)
                    kinds[row] = "baseline"
                continue
            tag = f"{name}-r{rep}"
            if name == "legacy":
                m = _run_legacy(recipe, workers=workers, out=out, tag=tag, timeout_s=timeout_s)
            else:
                m = _run_strategy(streamed if name == "default_stream" else raw, name,
                                  workers=workers, out=out, tag=tag, timeout_s=timeout_s)
            rows.setdefault(name, []).append(m)
    rows = {name: rows[name] for name in sorted(rows, key=lambda n: kinds[n] != "baseline")}
    sweep = _sweep(raw, strategies, sweep_workers, rows=rows, workers=workers, repeats=repeats,
                   out=out, target=target, timeout_s=timeout_s)
    result = _assemble(recipe, rows, kinds, sweep, target=target, workers=workers,
                       repeats=repeats)
    if coordinator_scaling:
        from kerasdist.bench.scaling import run_scaling

        result["coordinator_scaling"] = run_scaling(
            list(coordinator_scaling), steps=scaling_steps, repeats=repeats, out_dir=out,
            timeout_s=timeout_s)
        result["targets"] = bench_targets.evaluate(result)
    (out / "bench.json").write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    report.write_all(result, out)
    return result


def repeat_order(baselines, strategies, rep: int) -> list[tuple[str, str]]:
    """The order of the rows in repeat ``rep`` (0-based): ``("baseline", name)`` and
    ``("strategy", name)`` pairs, baselines first in even repeats, the whole list reversed in odd
    ones (a row that runs first, or after a given row, in one repeat does not in the next)."""
    order = [("baseline", name) for name in baselines] + [("strategy", name) for name in strategies]
    return order if rep % 2 == 0 else order[::-1]


def _sweep(raw, strategies, sweep_workers, *, rows, workers, repeats, out, target,
           timeout_s) -> list[dict]:
    """examples/s and time to target of each cluster strategy for each worker count.

    A point at the main ``workers`` count reuses that strategy's row (same recipe, same runs);
    every other point runs ``repeats`` times. All tasks run on this machine.
    """
    points = []
    for name in [s for s in strategies if s in CLUSTER_STRATEGIES]:
        for count in sweep_workers:
            if count == workers and name in rows:
                runs = rows[name]
            else:
                runs = [_run_strategy(raw, name, workers=count, out=out,
                                      tag=f"sweep-{name}-w{count}-r{rep}", timeout_s=timeout_s)
                        for rep in range(repeats)]
            s = summarize(runs, target)
            points.append({"strategy": name, "workers": count, "runs": s["runs"],
                           "succeeded": s["succeeded"],
                           "returncodes": [m.returncode for m in runs],
                           "examples_per_sec": s["examples_per_sec_median"],
                           "examples_per_sec_min": s["examples_per_sec_min"],
                           "examples_per_sec_max": s["examples_per_sec_max"],
                           "time_to_target_s": s["time_to_target_s_median"],
                           "reached_target": s["reached_target"],
                           "final_accuracy": s["final_accuracy_median"],
                           "peak_rss_mb": s["peak_rss_mb_median"],
                           "logs": [m.log for m in runs]})
    return points


def _epoch_level_only(runs: list[Measurement]) -> bool:
    return any(m.figures.get("throughput", {}).get("timed_epochs") for m in runs)


def _assemble(recipe, rows, kinds, sweep, *, target, workers, repeats) -> dict[str, Any]:
    summaries = {name: summarize(ms, target) for name, ms in rows.items()}
    baselines = [n for n, k in kinds.items() if k == "baseline"]
    for name, s in summaries.items():
        if kinds[name] != "strategy":
            continue
        s["ratio_examples_per_sec"] = {}
        for base in baselines:
            if any(base.startswith(p) and base != p + name for p in ("tf_keras_", "keras_enable_")):
                continue
            mine, theirs = s["examples_per_sec_median"], summaries[base]["examples_per_sec_median"]
            if _epoch_level_only(rows[base]):
                # tf_keras PS is timed per whole epoch: compare with our whole-epoch figure.
                mine = s["examples_per_sec_epoch_level_median"]
                s.setdefault("ratio_basis", {})[base] = "whole epochs 2..n"
            s["ratio_examples_per_sec"][base] = mine / theirs if mine and theirs else None
            if base == f"keras_enable_{name}" and mine and theirs:
                # kerasdist's own lifecycle cost: the recipe row against the same strategy
                # with only kerasdist.enable() (positive = the recipe row is slower).
                s["lifecycle_overhead"] = 1.0 - mine / theirs
        if name == "default_stream" and "default" in summaries:
            # the streaming input against the in-memory one, same run (same model and steps)
            mine, theirs = (s["examples_per_sec_median"],
                            summaries["default"]["examples_per_sec_median"])
            s["ratio_examples_per_sec"]["default"] = mine / theirs if mine and theirs else None
        mine = s["time_to_target_s_median"]
        theirs = summaries.get("plain_keras", {}).get("time_to_target_s_median")
        s["ratio_time_to_target_vs_plain_keras"] = mine / theirs if mine and theirs else None
    result = {
        "environment": environment(),
        "recipe": recipe.model_dump(mode="json"),
        "settings": {"target_accuracy": target, "workers": workers, "repeats": repeats,
                     "global_batch_size": recipe.data.batch_size},
        "rows": {name: {"kind": kinds[name], "summary": summaries[name],
                        "runs": [asdict(m) for m in ms]} for name, ms in rows.items()},
        "sweep": sweep,
    }
    result["targets"] = bench_targets.evaluate(result)
    return result


def _split(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def run(args) -> int:
    """``kerasdist bench``: check the worker counts and strategies given, run the benchmark
    (:func:`run_bench`) and print its table.

    Returns:
        ``EXIT_OK``, or ``EXIT_FAILED`` when a run failed (named on stderr).

    Raises:
        RecipeError: a worker count that is not an integer >= 1, or ``--sweep-workers`` without
            a strategy it sweeps (before anything runs); as :func:`run_bench`.
    """
    try:
        sweep = [int(n) for n in _split(args.sweep_workers)]
    except ValueError:
        raise RecipeError("--sweep-workers takes integers. "
                          f"Received: '{args.sweep_workers}'") from None
    if any(n < 1 for n in sweep) or args.workers < 1:
        raise RecipeError(f"worker counts must be >= 1. Received: workers={args.workers}, "
                          f"sweep={sweep}")
    if sweep and not {"multi_worker", "parameter_server"} & set(_split(args.strategies)):
        raise RecipeError("--sweep-workers sweeps multi_worker and parameter_server; --strategies "
                          f"has neither. Received: strategies='{args.strategies}'")
    from kerasdist.bench.scaling import parse_counts

    scaling = parse_counts(args.coordinator_scaling) if args.coordinator_scaling else []

    result = run_bench(recipe_path=args.recipe, overrides=args.overrides,
                       strategies=_split(args.strategies), baselines=_split(args.baselines),
                       repeats=args.repeats, workers=args.workers, sweep_workers=sweep,
                       out_dir=args.out, target=args.target_accuracy, timeout_s=args.timeout,
                       coordinator_scaling=scaling)
    print(report.markdown_table(result))
    print(f"kerasdist: bench.json, bench.md and plots in {args.out}")
    failed = [n for n, r in result["rows"].items() if r["summary"]["succeeded"] < r["summary"]["runs"]]
    failed += [f"sweep {p['strategy']} x{p['workers']}" for p in result["sweep"]
               if p["succeeded"] < p["runs"]]
    if failed:
        print(f"kerasdist: runs failed in: {', '.join(failed)} (see {args.out}/logs)", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
