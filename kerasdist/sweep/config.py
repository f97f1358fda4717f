"""``sweep.yaml``: the typed, frozen description of a hyper-parameter sweep (pydantic v2).

A sweep names a base recipe, the fixed ``set`` overrides (the dotted paths of ``--set``), a
search ``space`` over more dotted paths, the ``objective`` (an epoch-log metric of the runs and a
direction), Optuna's ``sampler`` and ``pruner``, how many ``trials`` must finish and how many run
at once (``parallel``). Validated once where it enters (:func:`kerasdist.sweep.plan.load_sweep`);
below that only these frozen objects travel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Field, model_validator

from kerasdist.config._base import Frozen


class FloatParam(Frozen):
    """A float between ``low`` and ``high`` (both included), uniform or ``log`` uniform
    (``optuna.trial.Trial.suggest_float``); ``step`` discretises it (not with ``log``)."""

    type: Literal["float"]
    low: float = Field(allow_inf_nan=False)
    high: float = Field(allow_inf_nan=False)
    log: bool = False
    step: float | None = Field(None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _range(self) -> FloatParam:
        _check_range(self.low, self.high, self.log, self.step)
        if self.log and self.step is not None:
            raise ValueError("a log-scale range takes no step (Optuna samples it continuously). "
                             f"Received: log=true, step={self.step}")
        return self


class IntParam(Frozen):
    """An integer between ``low`` and ``high`` (both included), every ``step``-th one, uniform or
    ``log`` uniform (``optuna.trial.Trial.suggest_int``)."""

    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _range(self) -> IntParam:
        _check_range(self.low, self.high, self.log, self.step)
        if self.log and self.step != 1:
            raise ValueError(f"a log-scale int range takes step 1. Received: step={self.step}")
        return self


class CategoricalParam(Frozen):
    """One of ``choices`` (``optuna.trial.Trial.suggest_categorical``): numbers, strings,
    booleans or null, each written into the trial's recipe as it is."""

    type: Literal["categorical"]
    choices: list[int | float | str | bool | None] = Field(min_length=1)


def _check_range(low: float, high: float, log: bool, step: float | None) -> None:
    if low >= high:
        raise ValueError(f"low must be below high. Received: low={low}, high={high}")
    if step is not None and step > high - low:
        raise ValueError(f"step must not exceed high - low ({high - low:g}: the range would hold "
                         f"low alone). Received: low={low}, high={high}, step={step}")
    if log and low <= 0:
        raise ValueError(f"a log-scale range must have low > 0. Received: low={low}")


Param = Annotated[Union[FloatParam, IntParam, CategoricalParam], Field(discriminator="type")]


class Objective(Frozen):
    """``objective``: what a trial is worth. ``metric`` is a key of the runs' epoch logs
    (``metrics.json`` ``history``: ``loss``, ``accuracy``, ``val_loss``, ``val_accuracy`` ...);
    a trial's value is the metric at its last trained epoch, and its epoch-end values are the
    intermediate values a pruner sees."""

    metric: str = Field(min_length=1)
    direction: Literal["minimize", "maximize"]


class SamplerConfig(Frozen):
    """``sampler``: Optuna's sampler by name (``tpe`` TPESampler, ``random`` RandomSampler,
    ``grid`` GridSampler over the categorical and stepped-int choices of ``space``, ``cmaes``
    CmaEsSampler, ``gp`` GPSampler, ``qmc`` QMCSampler), ``seed`` for reproducible suggestions,
    ``options`` passed to its constructor as keyword arguments."""

    name: Literal["tpe", "random", "grid", "cmaes", "gp", "qmc"] = "tpe"
    seed: int | None = None
    options: dict[str, Any] = Field(default_factory=dict)


class PrunerConfig(Frozen):
    """``pruner``: Optuna's pruner by name (``none`` NopPruner, ``median`` MedianPruner,
    ``percentile``, ``hyperband``, ``successive_halving``, ``threshold``: the pruners of those
    names); ``warmup_epochs``: epochs a trial trains before it may be pruned
    (:func:`kerasdist.sweep.study.make_pruner`); ``options`` passed to its constructor."""

    name: Literal["none", "median", "percentile", "hyperband", "successive_halving",
                  "threshold"] = "none"
    warmup_epochs: int = Field(0, ge=0)
    options: dict[str, Any] = Field(default_factory=dict)


class SweepOutput(Frozen):
    """``output``: ``dir`` holds a folder per trial (``trial-NNNN``), ``best.yaml``,
    ``trials.csv`` and the plots; ``storage`` is Optuna's storage URL (default
    ``sqlite:///<dir>/study.db``), where the study lives and a re-run continues it;
    ``study``: the study's name in the storage."""

    dir: Path = Path("runs/sweep")
    storage: str | None = Field(None, min_length=1)
    study: str = Field("kerasdist-sweep", min_length=1)


class SweepConfig(Frozen):
    """A whole sweep (``sweep.yaml``). Every trial is a whole ``kerasdist fit`` of ``recipe``
    with ``set`` and the trial's parameters applied, in ``<output.dir>/trial-NNNN``; the table
    of ``docs/sweep.md`` says what each field means. Refused: ``ray_address`` without
    ``backend: ray``, a path both in ``set`` and ``space``."""

    recipe: Path
    set: dict[str, Any] = Field(default_factory=dict)
    space: dict[str, Param] = Field(min_length=1)
    objective: Objective
    sampler: SamplerConfig = SamplerConfig()
    pruner: PrunerConfig = PrunerConfig()
    trials: int = Field(10, ge=1)
    parallel: int = Field(1, ge=1)
    max_failed_trials: int = Field(3, ge=0)
    backend: Literal["local", "ray"] = "local"
    ray_address: str | None = Field(None, min_length=1)
    allow_oversubscription: bool = False
    trial_timeout_s: float = Field(3600.0, gt=0, allow_inf_nan=False)
    prune_wait_s: float = Field(600.0, gt=0, allow_inf_nan=False)
    output: SweepOutput = SweepOutput()

    @model_validator(mode="after")
    def _ray_address(self) -> SweepConfig:
        if self.ray_address is not None and self.backend != "ray":
            raise ValueError("ray_address is for backend 'ray' only. Received: "
                             f"backend={self.backend!r}, ray_address={self.ray_address!r}")
        return self

    @model_validator(mode="after")
    def _disjoint(self) -> SweepConfig:
        both = sorted(set(self.set) & set(self.space))
        if both:
            raise ValueError(f"a path is both fixed (set) and searched (space): {', '.join(both)}. "
                             f"Received: set and space both name {both[0]!r}")
        return self

    def storage_url(self) -> str:
        """``output.storage``, or ``sqlite:///<output.dir>/study.db`` (absolute)."""
        return self.output.storage or f"sqlite:///{self.output.dir.absolute() / 'study.db'}"
