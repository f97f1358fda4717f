"""``kerasdist sweep sweep.yaml [--dry-run | --status]``: hyper-parameter search where every trial
is a whole ``kerasdist fit`` run (docs/sweep.md).

Exit codes: 0 when ``trials`` trials ended COMPLETE or PRUNED (and for ``--dry-run``,
``--status``); 2 bad input (the sweep file, a path not in the recipe's schema, a range, the
objective, the storage, ``parallel``), before any trial starts; 1 when more than
``max_failed_trials`` trials failed; 130 interrupted (the trials stopped with their checkpoints
and stay RUNNING in the study: run the same command again to resume them).
"""

from __future__ import annotations

import json

from kerasdist.errors import EXIT_OK, RecipeError


def add_parser(sub) -> None:
    """Register the ``sweep`` subcommand on an argparse subparsers object."""
    parser = sub.add_parser(
        "sweep", help="hyper-parameter search (Optuna) where every trial is a whole kerasdist "
                      "fit run: resumable, pruned at epoch ends, tracked")
    parser.add_argument("sweep", help="path to a sweep YAML file (docs/sweep.md)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true",
                      help="check the sweep and print its plan (the trials' folders, cores, "
                           "the first trials' parameters); starts nothing, writes nothing")
    mode.add_argument("--status", action="store_true",
                      help="print the trials of the sweep's study (state, value, parameters)")


def run(args) -> int:
    """Run the ``sweep`` subcommand (see module docs)."""
    from kerasdist.sweep.plan import load_sweep
    from kerasdist.sweep.study import require_optuna

    require_optuna()
    plan = load_sweep(args.sweep)
    if args.dry_run:
        print(dry_run_text(plan))
        return EXIT_OK
    if args.status:
        print(status_text(plan))
        return EXIT_OK
    from kerasdist.sweep.driver import Driver

    return Driver(plan, echo=lambda line: print(line, flush=True)).run()


def dry_run_text(plan) -> str:
    """What ``--dry-run`` prints: the sweep resolved and the first trials' parameters, from an
    in-memory study with the same sampler (later trials depend on the results)."""
    import optuna

    from kerasdist.sweep.plan import machine_cores
    from kerasdist.sweep.storage import check_start
    from kerasdist.sweep.study import make_pruner, make_sampler, suggest, trial_dir

    config = plan.config
    make_pruner(config)  # refuses bad options here too
    check_start(plan)  # writes nothing
    study = optuna.create_study(sampler=make_sampler(config), direction=config.objective.direction)
    first = min(config.trials, max(config.parallel, 3))
    lines = [f"# {plan.source}: valid sweep over recipe '{config.recipe}' (nothing started)",
             f"objective: {config.objective.direction} {config.objective.metric} (its value at "
             "a trial's last epoch)",
             f"sampler: {config.sampler.name} (seed {config.sampler.seed}); pruner: "
             f"{config.pruner.name} (warmup {config.pruner.warmup_epochs} epoch(s))",
             f"trials: {config.trials} to finish COMPLETE or PRUNED, {config.parallel} at once on "
             f"backend '{config.backend}'; max_failed_trials {config.max_failed_trials}",
             f"each trial: strategy '{plan.base.strategy.kind}' on cluster '{plan.base.cluster.kind}', "
             f"{plan.cores_per_trial} core(s) ({config.parallel * plan.cores_per_trial} of "
             f"{machine_cores()} in use at once)",
             f"storage: {config.storage_url()} (study '{config.output.study}')",
             f"fixed (set): {json.dumps(config.set) if config.set else 'nothing'}",
             "space:"]
    lines += [f"  {k}: {v.model_dump(mode='json', exclude={'type'})} ({v.type})"
              for k, v in config.space.items()]
    lines.append(f"the first {first} trial(s), before any result:")
    for _ in range(first):
        trial = study.ask()
        params = suggest(trial, config)
        shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
        lines.append(f"  {trial_dir(plan, trial.number)}: {shown}")
    lines.append(f"outputs: {plan.out}/trials.csv, best.yaml, *.png; each trial: kerasdist fit "
                 "<trial dir>/recipe.yaml")
    return "\n".join(lines)


def status_text(plan) -> str:
    """What ``--status`` prints: the table of :func:`kerasdist.sweep.outputs.status_table`.

    Raises:
        RecipeError: no study of that name in the storage yet (exit code 2).
    """
    from kerasdist.sweep.outputs import status_table
    from kerasdist.sweep.storage import stored_study

    study = stored_study(plan)
    if study is None:
        raise RecipeError(f"output.study: no sweep has run yet (no study "
                          f"'{plan.config.output.study}' in the storage). Received: "
                          f"storage={plan.config.storage_url()!r}")
    return status_table(plan, study)
