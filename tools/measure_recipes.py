#!/usr/bin/env python3
"""Run shipped recipes N times each and check that every run reaches the recipe's stated target.

Each run is ``kerasdist fit RECIPE --set trainer.seed=<seed> --set output.run_dir=<temp dir>``
(seeds ``--seed-base``, ``--seed-base + 1``, ...), in its own process tree, one at a time;
``--vary KEY`` (repeatable) sets other keys to the seed instead (e.g. ``data.shuffle_seed``). The
target is read from the recipe's ``# Target:`` comment line, one of:

    # Target: held-out accuracy >= 0.98 in every run ...
    # Target: W within 0.1 of 2 and b within 0.1 of 10 in every run ...

For an accuracy target the measured value is ``evaluation.accuracy`` from ``<run_dir>/metrics.json``;
for a W/b target it is the larger of ``|W - w0|`` and ``|b - b0|`` of the saved ``model.keras``
(the table shows W and b too). Prints a table (recipe, runs, min, median, max, target, MET/MISSED)
and writes every run's figures as JSON.

Usage (2 shared cores: be nice)::

    nice -n 10 python tools/measure_recipes.py recipes/*.yaml --runs 5 --out runs/recipe_accuracy.json

Exit status: 0 when every run of every recipe met its target, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ACCURACY = re.compile(r"^#\s*Target:\s*held-out accuracy\s*>=\s*([0-9.]+)", re.M | re.I)
LINEAR = re.compile(r"^#\s*Target:\s*W within ([0-9.]+) of ([-0-9.]+) and b within ([0-9.]+) of "
                    r"([-0-9.]+)", re.M | re.I)


def read_target(recipe: Path, override: str | None = None) -> dict:
    """The recipe's ``# Target:`` line, or ``override`` written the same way (without '# ')."""
    text = f"# {override}" if override else recipe.read_text(encoding="utf-8")
    if m := ACCURACY.search(text):
        return {"kind": "accuracy", "min": float(m.group(1)),
                "text": f"accuracy >= {float(m.group(1)):g}"}
    if m := LINEAR.search(text):
        tol_w, w0, tol_b, b0 = (float(g) for g in m.groups())
        if tol_w != tol_b:
            raise SystemExit(f"{recipe}: W and b tolerances must match to gate one figure")
        return {"kind": "linear", "w": w0, "b": b0, "tol": tol_w,
                "text": f"max(abs(W-{w0:g}), abs(b-{b0:g})) <= {tol_w:g}"}
    raise SystemExit(f"{recipe}: no '# Target:' comment line (see tools/measure_recipes.py)")


def _linear_weights(model_path: Path) -> tuple[float, float]:
    import keras  # only for linear recipes; slow to import

    model = keras.saving.load_model(model_path)
    kernel, bias = (float(v.numpy().ravel()[0]) for v in model.layers[0].weights)
    return kernel, bias


def run_once(recipe: Path, seed: int, target: dict, sets: list[str], timeout: float,
             keep: Path | None, vary: tuple[str, ...] = ("trainer.seed",)) -> dict:
    with tempfile.TemporaryDirectory(prefix="measure_recipe_") as tmp:
        run_dir = (keep / f"{recipe.stem}-seed{seed}") if keep else Path(tmp) / "run"
        overrides = [*(f"{key}={seed}" for key in vary), f"output.run_dir={run_dir}", *sets]
        cmd = [sys.executable, "-m", "kerasdist", "fit", str(recipe), "--verbose", "2"]
        for item in overrides:
            cmd += ["--set", item]
        t0 = time.monotonic()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            rc, tail = done.returncode, (done.stdout[-1500:] + done.stderr[-1500:])
        except subprocess.TimeoutExpired:
            rc, tail = "timeout", ""
        wall = time.monotonic() - t0
        row = {"seed": seed, "rc": rc, "wall_s": round(wall, 1)}
        if rc != 0:
            row["error"] = tail
            return row
        metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
        evaluation = metrics.get("evaluation") or {}
        row["evaluation"] = evaluation
        row["global_steps"] = metrics.get("global_steps")
        if target["kind"] == "accuracy":
            row["value"] = float(evaluation["accuracy"])
            row["met"] = row["value"] >= target["min"]
        else:
            w, b = _linear_weights(run_dir / "model.keras")
            row.update(W=w, b=b, value=max(abs(w - target["w"]), abs(b - target["b"])))
            row["met"] = row["value"] <= target["tol"]
        return row


def summarize(recipe: Path, target: dict, rows: list[dict]) -> dict:
    values = [r["value"] for r in rows if "value" in r]
    failed = [r["seed"] for r in rows if r["rc"] != 0]
    out = {"recipe": str(recipe), "runs": len(rows), "completed": len(values), "failed_seeds": failed,
           "target": target["text"], "runs_detail": rows}
    if values:
        out.update(min=min(values), median=statistics.median(values), max=max(values),
                   stdev=statistics.stdev(values) if len(values) > 1 else 0.0,
                   wall_s_median=statistics.median(r["wall_s"] for r in rows if "value" in r))
    out["met"] = bool(values) and not failed and all(r["met"] for r in rows)
    if target["kind"] == "linear" and values:
        for key in ("W", "b"):
            xs = [r[key] for r in rows if key in r]
            out[key] = {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}
    return out


def table(summaries: list[dict]) -> str:
    lines = ["| recipe | runs | min | median | max | target | result |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in summaries:
        if "min" in s:
            figures = f"{s['min']:.4f} | {s['median']:.4f} | {s['max']:.4f}"
        else:
            figures = "– | – | –"
        runs = f"{s['completed']}/{s['runs']}"
        lines.append(f"| `{Path(s['recipe']).name}` | {runs} | {figures} | {s['target']} | "
                     f"{'MET' if s['met'] else 'MISSED'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes", nargs="*", type=Path)
    parser.add_argument("--table", nargs="+", type=Path, metavar="JSON",
                        help="run nothing: print the table of earlier --out files, each recipe "
                        "judged against its current '# Target:' line")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed-base", type=int, default=1, help="seeds seed-base .. +runs-1")
    parser.add_argument("--set", dest="sets", action="append", default=[],
                        help="extra --set override for every run (e.g. trainer.epochs=6)")
    parser.add_argument("--target", default=None,
                        help="replace the recipe's target, e.g. 'Target: held-out accuracy >= 0.97' "
                        "(to measure a test gate that runs a shortened recipe)")
    parser.add_argument("--vary", action="append", default=None,
                        help="recipe key set to the run's seed (repeatable; default trainer.seed). "
                        "linear_mwms: add data.shuffle_seed, which also seeds its synthetic data")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    parser.add_argument("--keep", type=Path, default=None, help="keep run dirs under this folder")
    parser.add_argument("--out", type=Path, default=Path("runs/recipe_accuracy.json"))
    args = parser.parse_args(argv)

    if args.table:
        return retable(args.table)
    if not args.recipes:
        parser.error("name at least one recipe (or --table JSON...)")
    started = time.monotonic()
    summaries = []
    for recipe in args.recipes:
        target = read_target(recipe, args.target)
        rows = []
        for seed in range(args.seed_base, args.seed_base + args.runs):
            row = run_once(recipe, seed, target, args.sets, args.timeout, args.keep,
                           tuple(args.vary or ("trainer.seed",)))
            rows.append(row)
            shown = f"{row['value']:.4f}" if "value" in row else f"FAILED rc={row['rc']}"
            print(f"{recipe.name} seed={seed}: {shown} ({row['wall_s']} s)", flush=True)
        summaries.append(summarize(recipe, target, rows))
        args.out.parent.mkdir(parents=True, exist_ok=True)  # write as we go
        args.out.write_text(json.dumps(_report(args, summaries, started), indent=2) + "\n")
    print(table(summaries))
    print(f"wrote {args.out}; {time.monotonic() - started:.0f} s in all")
    return 0 if all(s["met"] for s in summaries) else 1


def retable(paths: list[Path]) -> int:
    summaries = []
    for path in paths:
        for old in json.loads(path.read_text(encoding="utf-8"))["recipes"]:
            recipe = Path(old["recipe"])
            target = read_target(recipe) if recipe.exists() else None
            if target is None:
                summaries.append(old)
                continue
            rows = old["runs_detail"]
            for row in rows:
                if "value" in row:
                    row["met"] = (row["value"] >= target["min"] if target["kind"] == "accuracy"
                                  else row["value"] <= target["tol"])
            summaries.append(summarize(recipe, target, rows))
    print(table(summaries))
    return 0 if all(s["met"] for s in summaries) else 1


def _report(args, summaries, started) -> dict:
    return {"date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "host": {"python": platform.python_version(), "machine": platform.machine()},
            "seconds": round(time.monotonic() - started, 1), "sets": args.sets,
            "vary": args.vary or ["trainer.seed"],
            "recipes": summaries}


if __name__ == "__main__":
    sys.exit(main())
