"""The Optuna side of a sweep: the sampler and pruner from the sweep's config, the trials'
parameters and recipes (the study in its storage: :mod:`.storage`). A trial's tasks never import
it: the parameters of a trial are chosen here, by the driver.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from kerasdist.errors import RecipeError
from kerasdist.sweep.config import CategoricalParam, SweepConfig
from kerasdist.sweep.plan import SweepPlan, grid_space, machine_cores, with_values

GATE_CALLBACK = "kerasdist.sweep.gate:SweepPruneGate"


def require_optuna():
    """Import Optuna, quieted to warnings.

    Raises:
        RecipeError: Optuna is not installed (``pip install 'kerasdist[sweep]'``).
    """
    try:
        import optuna
    except ImportError:
        raise RecipeError("kerasdist sweep needs Optuna: pip install 'kerasdist[sweep]'. "
                          "Received: no module named 'optuna'") from None
    optuna.logging.set_verbosity(logging.WARNING)
    return optuna


RESEEDED = ("tpe", "random", "cmaes", "gp")
"""Samplers whose seed a re-run moves on (grid and qmc find their next point in the study)."""


def make_sampler(config: SweepConfig, *, trials_before: int = 0):
    """Optuna's sampler named by ``sampler.name``, seeded with ``sampler.seed``; a re-run of a
    study that holds ``trials_before`` trials seeds tpe, random, cmaes and gp with ``sampler.seed
    + trials_before``, so it does not propose again what the first run's sampler proposed (the
    same seed would draw the same first values).

    Raises:
        RecipeError: ``sampler.options`` the sampler's constructor refuses.
    """
    optuna = require_optuna()
    samplers = optuna.samplers
    spec = config.sampler
    classes = {"tpe": samplers.TPESampler, "random": samplers.RandomSampler,
               "cmaes": samplers.CmaEsSampler, "gp": samplers.GPSampler,
               "qmc": samplers.QMCSampler}
    try:
        if spec.name == "grid":
            return _ask_and_tell_grid(samplers)(grid_space(config), seed=spec.seed,
                                                **spec.options)
        seed = spec.seed + trials_before if spec.seed is not None and \
            spec.name in RESEEDED else spec.seed
        return classes[spec.name](seed=seed, **spec.options)
    except (TypeError, ValueError) as err:
        raise RecipeError(f"sampler.options: the {spec.name} sampler refuses them: {err}. "
                          f"Received: options={dict(spec.options)!r}") from None


def _ask_and_tell_grid(samplers):
    class AskAndTellGrid(samplers.GridSampler):
        """Optuna's ``GridSampler`` without its ``study.stop()`` once every point was asked
        (valid only inside ``Study.optimize``: under ask and tell, ``Study.tell`` of the last
        point raised); the driver counts the trials itself, ``trials`` at most the grid's size."""

        def after_trial(self, study, trial, state, values) -> None:
            return None

    return AskAndTellGrid


def make_pruner(config: SweepConfig):
    """Optuna's pruner named by ``pruner.name``. Intermediate values are reported at step = the
    epoch number (1-based), and Optuna prunes at no step below ``n_warmup_steps``: so
    ``warmup_epochs`` W becomes ``n_warmup_steps`` W + 1 of the median, percentile and threshold
    pruners (epoch W + 1 is the first that may be pruned); hyperband and successive halving take
    ``options.min_resource`` instead.

    Raises:
        RecipeError: ``pruner.options`` the pruner's constructor refuses.
    """
    optuna = require_optuna()
    pruners = optuna.pruners
    spec = config.pruner
    options = dict(spec.options)
    warmup = spec.warmup_epochs + 1
    try:
        if spec.name == "none":
            return pruners.NopPruner()
        if spec.name == "median":
            return pruners.MedianPruner(n_warmup_steps=warmup, **options)
        if spec.name == "percentile":
            return pruners.PercentilePruner(options.pop("percentile", 25.0),
                                            n_warmup_steps=warmup, **options)
        if spec.name == "threshold":
            return pruners.ThresholdPruner(n_warmup_steps=warmup, **options)
        if spec.name == "hyperband":
            return pruners.HyperbandPruner(**options)
        return pruners.SuccessiveHalvingPruner(**options)
    except (TypeError, ValueError) as err:
        raise RecipeError(f"pruner.options: the {spec.name} pruner refuses them: {err}. "
                          f"Received: options={dict(spec.options)!r}") from None


def suggest(trial, config: SweepConfig) -> dict[str, Any]:
    """The trial's parameters, asked of the sampler: ``{dotted.path: value}``."""
    params: dict[str, Any] = {}
    for dotted, spec in config.space.items():
        if isinstance(spec, CategoricalParam):
            params[dotted] = trial.suggest_categorical(dotted, spec.choices)
        elif spec.type == "int":
            params[dotted] = trial.suggest_int(dotted, spec.low, spec.high, step=spec.step,
                                               log=spec.log)
        else:
            params[dotted] = trial.suggest_float(dotted, spec.low, spec.high, log=spec.log,
                                                 step=spec.step)
    return params


def trial_dir(plan: SweepPlan, number: int) -> Path:
    """``<output.dir>/trial-NNNN`` (absolute): the trial's folder, holding its ``recipe.yaml``,
    ``trial.log``, ``gate/`` and its run directory ``run/``."""
    return plan.out / f"trial-{number:04d}"


def run_dir(folder: Path) -> Path:
    """The run directory (``output.run_dir``) of the trial in ``folder``."""
    return folder / "run"


def trial_recipe(plan: SweepPlan, number: int, params: dict[str, Any]) -> dict[str, Any]:
    """The recipe of trial ``number`` as a mapping: the base recipe (``set`` applied) with
    ``params``, ``output.run_dir`` the ``run`` folder of its trial folder, the gate callback
    (:mod:`.gate`) appended, ``trainer.verbose: 'auto'`` made 2 (one log line an epoch),
    ``cluster.threads_per_task: 'auto'`` resolved for ``parallel`` trials sharing the cores, and
    an MLflow store shared by every trial (``<output.dir>/mlflow.db`` unless the recipe names
    one) with the run named after the trial."""
    config, folder = plan.config, trial_dir(plan, number)
    raw = with_values(plan.base_raw, params)
    gate = {"class_name": GATE_CALLBACK, "config": {
        "gate_dir": str(folder / "gate"), "metric": config.objective.metric,
        "wait": config.pruner.name != "none", "wait_s": config.prune_wait_s}}
    values: dict[str, Any] = {"output.run_dir": str(run_dir(folder)),
                              "callbacks": [*raw.get("callbacks", []), gate]}
    if plan.base.trainer.verbose == "auto":  # trial.log: one line an epoch, not a progress bar
        values["trainer.verbose"] = 2
    if plan.base.cluster.threads_per_task == "auto":
        share = machine_cores() // (config.parallel * plan.cores_per_trial)
        values["cluster.threads_per_task"] = max(1, share)  # per task of every trial at once
    if plan.base.output.tracking is not None:
        if plan.base.output.tracking.uri is None:
            values["output.tracking.uri"] = f"sqlite:///{plan.out / 'mlflow.db'}"
        values["output.tracking.run_name"] = f"{config.output.study}/{folder.name}"
    return with_values(raw, values)


def best_recipe(plan: SweepPlan, params: dict[str, Any]) -> dict[str, Any]:
    """The base recipe with the best parameters and ``output.run_dir: <output.dir>/best``."""
    return with_values(plan.base_raw, {**params, "output.run_dir": str(plan.out / "best")})
