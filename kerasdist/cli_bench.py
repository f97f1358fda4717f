"""``kerasdist bench``: the command's checks of its flags and its report (the benchmark itself is
:mod:`kerasdist.bench`)."""

from __future__ import annotations

import sys

from kerasdist.errors import EXIT_FAILED, EXIT_OK


def _split(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def run(args) -> int:
    """``kerasdist bench``: check the worker counts and strategies given, run the benchmark
    (:func:`kerasdist.bench.command.run_bench`), print its table; exit 1 when a run failed."""
    from kerasdist.errors import RecipeError

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
    from kerasdist.bench.command import run_bench
    from kerasdist.bench.report import markdown_table
    from kerasdist.bench.scaling import parse_counts

    scaling = parse_counts(args.coordinator_scaling) if args.coordinator_scaling else []

    result = run_bench(recipe_path=args.recipe, overrides=args.overrides,
                       strategies=_split(args.strategies), baselines=_split(args.baselines),
                       repeats=args.repeats, workers=args.workers, sweep_workers=sweep,
                       out_dir=args.out, target=args.target_accuracy, timeout_s=args.timeout,
                       coordinator_scaling=scaling)
    print(markdown_table(result))
    print(f"kerasdist: bench.json, bench.md and plots in {args.out}")
    failed = [n for n, r in result["rows"].items() if r["summary"]["succeeded"] < r["summary"]["runs"]]
    failed += [f"sweep {p['strategy']} x{p['workers']}" for p in result["sweep"]
               if p["succeeded"] < p["runs"]]
    if failed:
        print(f"kerasdist: runs failed in: {', '.join(failed)} (see {args.out}/logs)", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
