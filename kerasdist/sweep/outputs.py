"""What a sweep leaves in ``output.dir``: ``trials.csv`` (one row per trial), ``best.yaml`` (the
base recipe with the best COMPLETE trial's parameters, validated before it is written), Optuna's
own matplotlib plots (:data:`PLOTS`; one Optuna cannot draw yet is left out with a line saying
why), and the table ``kerasdist sweep --status`` prints; ``docs/sweep.md`` shows them.
"""

from __future__ import annotations

import collections
import csv
import io
import logging
import warnings
from pathlib import Path
from typing import Callable

import yaml

from kerasdist._files import write_text_atomic
from kerasdist.config.loader import validate_recipe
from kerasdist.sweep.plan import SweepPlan
from kerasdist.sweep.study import best_recipe

PLOTS = {"optimization_history": "plot_optimization_history",
         "param_importances": "plot_param_importances",
         "parallel_coordinate": "plot_parallel_coordinate",
         "intermediate_values": "plot_intermediate_values"}
"""Output file stem -> the ``optuna.visualization.matplotlib`` function that draws it."""


def rows(plan: SweepPlan, study) -> list[dict]:
    """One dict per trial, in trial order (the columns of ``trials.csv``)."""
    out = []
    for trial in study.get_trials(deepcopy=False):
        row = {"number": trial.number, "state": trial.state.name,
               "value": "" if trial.value is None else trial.value}
        for name in plan.config.space:
            row[name] = trial.params.get(name, "")
        steps = sorted(trial.intermediate_values)
        row["epochs_reported"] = len(steps)
        row["pruned_at_epoch"] = steps[-1] if trial.state.name == "PRUNED" and steps else ""
        seconds = trial.duration.total_seconds() if trial.duration is not None else ""
        row["seconds"] = round(seconds, 1) if seconds != "" else ""
        row["dir"] = trial.user_attrs.get("dir", "")
        row["failure"] = trial.user_attrs.get("failure", "")
        out.append(row)
    return out


def write_csv(plan: SweepPlan, study) -> Path:
    """Write ``trials.csv`` (atomically); returns its path."""
    table = rows(plan, study)
    columns = ["number", "state", "value", *plan.config.space, "epochs_reported",
               "pruned_at_epoch", "seconds", "dir", "failure"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(table)
    return write_text_atomic(plan.out / "trials.csv", buffer.getvalue())


def best_trial(study):
    """The best COMPLETE trial, or None."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    return study.best_trial if complete else None


def write_best(plan: SweepPlan, study) -> Path | None:
    """Write ``best.yaml`` (validated first); None when no trial is COMPLETE."""
    best = best_trial(study)
    if best is None:
        return None
    raw = best_recipe(plan, dict(best.params))
    validate_recipe(raw, source="best.yaml")
    metric = plan.config.objective.metric
    header = (f"# kerasdist sweep {plan.config.output.study}: best of {len(study.trials)} trials: "
              f"trial {best.number}, {metric}={best.value:.6g}\n"
              f"# parameters: {', '.join(f'{k}={v!r}' for k, v in best.params.items())}\n"
              f"# train it: kerasdist fit {plan.out / 'best.yaml'}\n")
    return write_text_atomic(plan.out / "best.yaml", header + yaml.safe_dump(raw, sort_keys=False))


def write_plots(plan: SweepPlan, study, *, echo: Callable[[str], None] = print) -> list[Path]:
    """Draw :data:`PLOTS` as PNG files in ``output.dir``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import optuna
    import optuna.visualization.matplotlib as ovm

    written = []
    optuna.logging.set_verbosity(logging.ERROR)  # "no complete trials" is said below, once
    for stem, function in PLOTS.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna's ExperimentalWarning for these plots
                axes = getattr(ovm, function)(study)
            figure = (axes.flat[0] if hasattr(axes, "flat") else axes).get_figure()
            figure.set_size_inches(9, 5.5)
            figure.tight_layout()
            path = plan.out / f"{stem}.png"
            figure.savefig(path, dpi=100)
            plt.close(figure)
            written.append(path)
        except Exception as err:  # noqa: BLE001 - a plot Optuna cannot draw yet is skipped
            echo(f"kerasdist sweep: {stem}.png not drawn: {str(err).splitlines()[0][:200]}")
    plt.close("all")
    return written


def write_outputs(plan: SweepPlan, study, *, echo: Callable[[str], None] = print) -> None:
    """``trials.csv``, ``best.yaml`` and the plots; one line saying where they are."""
    write_csv(plan, study)
    best = write_best(plan, study)
    plots = write_plots(plan, study, echo=echo)
    echo(status_table(plan, study))
    echo(f"kerasdist sweep: trials.csv, {'best.yaml, ' if best else ''}{len(plots)} plot(s) in "
         f"{plan.out}")


def status_table(plan: SweepPlan, study) -> str:
    """The trials as a fixed-width table, with counts by state and the best trial."""
    table = rows(plan, study)
    names = list(plan.config.space)
    header = ["#", "state", plan.config.objective.metric, *names, "epochs", "seconds"]
    lines = [[str(r["number"]), r["state"], _fmt(r["value"]), *(_fmt(r[n]) for n in names),
              str(r["epochs_reported"]), _fmt(r["seconds"])] for r in table]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
              for i, h in enumerate(header)]
    text = [" ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    text += [" ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    by_state = collections.Counter(r["state"] for r in table)
    done = by_state.get("COMPLETE", 0) + by_state.get("PRUNED", 0)
    text.append(f"{done} of {plan.config.trials} trials finished (" + ", ".join(
        f"{k} {v}" for k, v in sorted(by_state.items())) + ")")
    best = best_trial(study)
    if best is not None:
        text.append(f"best: trial {best.number}, {plan.config.objective.metric}="
                    f"{best.value:.6g} ({', '.join(f'{k}={v!r}' for k, v in best.params.items())})")
    return "\n".join(text)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
