"""Loading a sweep: ``sweep.yaml`` in, a checked :class:`SweepPlan` out, or one error that names
the field and the value (exit code 2) before any trial starts.

Checked here: the sweep's own schema (ranges with ``low < high``...), that every dotted path of
``set`` and ``space`` exists in the base recipe's schema, that the recipe is valid with ``set``
and with each end of every range (and each choice) applied, that the objective metric is one the
runs report (where the model's metrics are plain Keras names), and that ``parallel`` trials fit
this machine's cores. The storage and ``output.dir`` are checked by
:func:`kerasdist.sweep.storage.check_start`.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
from pydantic import BaseModel

from kerasdist.config import Recipe
from kerasdist.config.loader import parse_yaml, read_recipe_text, validate_recipe
from kerasdist.errors import KerasdistError, RecipeError
from kerasdist.sweep.config import CategoricalParam, SweepConfig

METRIC_ALIASES = {"acc": "accuracy", "mae": "mean_absolute_error", "mse": "mean_squared_error"}
"""Keras metric identifiers whose epoch-log name may be the other spelling."""


@dataclass(frozen=True)
class SweepPlan:
    """A checked sweep: its config, the base recipe as a mapping with ``set`` applied (what each
    trial's recipe starts from), that recipe validated, and the CPU cores a trial takes."""

    config: SweepConfig
    source: Path
    base_raw: dict[str, Any]
    base: Recipe
    cores_per_trial: int

    @property
    def out(self) -> Path:
        """The sweep's folder (``output.dir``), absolute."""
        return self.config.output.dir.absolute()


def load_sweep(path: str | Path) -> SweepPlan:
    """Read and check ``sweep.yaml`` (see module docs).

    ``recipe`` and ``output.dir`` are taken relative to the working directory, as ``kerasdist
    fit`` takes a recipe's paths.

    Raises:
        RecipeError: any problem, naming the field (``space.optimizer.learning_rate.low``) and
            the value received.
    """
    path = Path(path)
    text = read_recipe_text(path)
    raw = parse_yaml(text, source=str(path))
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: a sweep must be a YAML mapping. Received: {type(raw).__name__}")
    try:
        config = SweepConfig.model_validate(raw)
    except pydantic.ValidationError as err:
        raise RecipeError(_sweep_error(err, source=str(path))) from None
    base_text = read_recipe_text(config.recipe)
    recipe_raw = parse_yaml(base_text, source=str(config.recipe)) or {}
    if not isinstance(recipe_raw, dict):
        raise RecipeError(f"recipe '{config.recipe}': a recipe must be a YAML mapping")
    plain = validate_recipe(recipe_raw, source=str(config.recipe), text=base_text)
    for field, paths in (("set", config.set), ("space", config.space)):
        for dotted in paths:
            problem = schema_problem(plain, dotted)
            if problem:
                raise RecipeError(f"{path}: {field}.{dotted}: {problem}. Received: {dotted!r}")
    base_raw = with_values(recipe_raw, config.set)
    base = _validated(base_raw, what=f"{path}: set {dict(config.set)!r}")
    _check_corners(config, base_raw, source=path)
    _check_objective(config, base, source=path)
    cores = trial_cores(base)
    if config.ray_address is None:  # a joined Ray cluster's CPUs are counted when it is joined
        _check_parallel(config, cores, source=path)
    if config.backend == "ray":
        from kerasdist.launch.clusters.ray import require_ray

        require_ray()
    if config.sampler.name == "grid":
        _check_grid(config, source=path)
    return SweepPlan(config=config, source=path, base_raw=base_raw, base=base,
                     cores_per_trial=cores)


def _sweep_error(err: pydantic.ValidationError, *, source: str) -> str:
    """One line per problem, each naming the sweep field (``space.<path>.low``) and the value."""
    lines = []
    for item in err.errors(include_url=False):
        loc = [str(p) for p in item["loc"]]
        if len(loc) > 2 and loc[0] == "space" and loc[2] in ("float", "int", "categorical"):
            del loc[2]  # the union's tag: space.<path>.float.low -> space.<path>.low
        kind, message = item["type"], item["msg"]
        if kind == "value_error":
            message = message.removeprefix("Value error, ")
        elif kind == "extra_forbidden":
            message = f"unknown key (not part of the sweep schema). Received: {item['input']!r}"
        elif kind == "bool_for_number":  # raised for the whole section: the field is in ctx
            loc.append(str(item["ctx"]["field"]))
        else:
            message = f"{message}. Received: {item.get('input')!r}"
        lines.append(f"{source}: {'.'.join(loc) or '(sweep)'}: {message}")
    return "invalid sweep\n  " + "\n  ".join(lines)


def schema_problem(recipe: Recipe, dotted: str) -> str | None:
    """Why ``dotted`` is not a field of ``recipe``'s schema (None when it is). Free-form
    mappings (``model.params``, ``optimizer.params``...) accept any key below them; ``strategy``
    is checked against the recipe's own strategy kind."""
    node: Any = recipe
    cls: type | None = type(recipe)
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        here = ".".join(parts[:depth + 1])
        if isinstance(node, dict) or (node is None and cls is dict):
            return None
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                return f"'{here}': the list has {len(node)} item(s)"
            node, cls = node[int(part)], None
            cls = type(node) if isinstance(node, BaseModel) else None
            continue
        if cls is None or not issubclass(cls, BaseModel):
            return f"'{'.'.join(parts[:depth])}' is a value, not a section"
        fields = cls.model_fields
        name = next((n for n, f in fields.items() if part in (n, f.alias)), None)
        if name is None:
            known = ", ".join(sorted(f.alias or n for n, f in fields.items()))
            return f"'{here}' is not in the recipe schema (that section has: {known})"
        node = getattr(node, name) if node is not None else None
        cls = type(node) if isinstance(node, BaseModel) else _model_in(fields[name].annotation)
        if node is None and cls is None and isinstance(_dict_in(fields[name].annotation), type):
            cls = dict
    return None


def _model_in(annotation: Any) -> type | None:
    """The one pydantic model class inside an annotation (``TrackingConfig | None``), or None."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    found = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
    return found[0] if len(found) == 1 else None


def _dict_in(annotation: Any) -> type | None:
    import typing

    args = typing.get_args(annotation) or (annotation,)
    return dict if any(typing.get_origin(a) is dict or a is dict for a in args) else None


def with_values(raw: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of a recipe mapping with each ``dotted.path: value`` set (sections created;
    a ``data.source`` given by its kind's name alone is first written ``{kind: <name>}``)."""
    result = copy.deepcopy(raw)
    for dotted, value in values.items():
        node = result
        parts = dotted.split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if isinstance(child, str) and parts[:depth + 1] == ["data", "source"]:
                child = node[part] = {"kind": child}
            elif not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = copy.deepcopy(value)
    return result


def _validated(raw: dict[str, Any], *, what: str) -> Recipe:
    try:
        recipe = validate_recipe(raw, source="<trial recipe>")
        from kerasdist.launch.run import check_shape

        check_shape(recipe)
    except KerasdistError as err:  # RecipeError, or check_shape's ClusterError (task count...)
        raise RecipeError(f"{what} makes the recipe invalid: {err}") from None
    return recipe


def corners(param) -> list[Any]:
    """The values of a search range checked before any trial: both ends, or every choice."""
    if isinstance(param, CategoricalParam):
        return list(param.choices)
    return [param.low, param.high]


def _check_corners(config: SweepConfig, base_raw: dict[str, Any], *, source: Path) -> None:
    """The recipe must stay valid at each end of every range and with each choice (one
    parameter at a time: the others keep the base recipe's value)."""
    for dotted, param in config.space.items():
        for value in corners(param):
            _validated(with_values(base_raw, {dotted: value}),
                       what=f"{source}: space.{dotted} = {value!r}")


def known_metrics(recipe: Recipe) -> set[str] | None:
    """The epoch-log keys a run of ``recipe`` reports, or None when they cannot be known without
    building the model (a metric given as a Keras config or an import path, an import-path
    builder without ``model.metrics``)."""
    from kerasdist.models import registry

    metrics = recipe.model.metrics
    if metrics is None:
        if registry.is_import_path(recipe.model.name):
            return None
        metrics = list(registry.resolve(recipe.model.name, loss="mse").metrics)
    if not all(isinstance(m, str) and ":" not in m for m in metrics):
        return None
    names = {"loss", *metrics}
    names |= {METRIC_ALIASES[n] for n in names if n in METRIC_ALIASES}
    names |= {k for k, v in METRIC_ALIASES.items() if v in names}
    if recipe.trainer.validation:
        names |= {f"val_{n}" for n in names}
    return names


def _check_objective(config: SweepConfig, base: Recipe, *, source: Path) -> None:
    names = known_metrics(base)
    metric = config.objective.metric
    if names is not None and metric not in names:
        raise RecipeError(f"{source}: objective.metric '{metric}' is not reported by runs of "
                          f"recipe '{config.recipe}' (their epoch logs have: "
                          f"{', '.join(sorted(names))}). Received: metric={metric!r}")


def trial_cores(recipe: Recipe) -> int:
    """The CPU cores one trial of ``recipe`` takes: its processes on a local cluster (workers,
    ps, a parameter-server coordinator), its workers' ``cpus_per_worker`` on Ray, else 1."""
    from kerasdist.strategies import registry

    return recipe.cluster.cores_here(coordinator=registry.for_recipe(recipe).traits.needs_ps)


def machine_cores() -> int:
    """CPU cores this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _check_parallel(config: SweepConfig, cores_per_trial: int, *, source: Path) -> None:
    """At most ``cores // cores_per_trial`` trials at once (at least 1: one trial alone is what
    ``kerasdist fit`` would run, bounded by its own task-count check)."""
    cores = machine_cores()
    most = max(1, cores // cores_per_trial)
    if config.parallel > most and not config.allow_oversubscription:
        raise RecipeError(
            f"{source}: parallel={config.parallel} trials of {cores_per_trial} core(s) each need "
            f"{config.parallel * cores_per_trial} CPU cores; this machine has {cores}. Lower "
            f"parallel to {most}, or set allow_oversubscription: true. Received: "
            f"parallel={config.parallel}")


def _check_grid(config: SweepConfig, *, source: Path) -> None:
    import math

    size = math.prod(len(values) for values in grid_space(config).values())
    if config.trials > size:
        raise RecipeError(f"{source}: trials={config.trials} is more than the {size} points of "
                          f"the grid (sampler 'grid' would repeat them). Received: "
                          f"trials={config.trials}")


def grid_space(config: SweepConfig) -> dict[str, list[Any]]:
    """The search space as Optuna's ``GridSampler`` takes it: every choice, every int in its
    range, every step of a stepped float range.

    Raises:
        RecipeError: a float range without ``step`` (no grid to walk), naming it.
    """
    grid: dict[str, list[Any]] = {}
    for dotted, param in config.space.items():
        if isinstance(param, CategoricalParam):
            grid[dotted] = list(param.choices)
        elif param.type == "int":
            grid[dotted] = list(range(param.low, param.high + 1, param.step))
        elif param.step is not None:
            count = int(round((param.high - param.low) / param.step))
            grid[dotted] = [param.low + i * param.step for i in range(count + 1)]
        else:
            raise RecipeError(f"sampler 'grid' needs a finite grid: space.{dotted} is a float "
                              "range without step (give it a step, or choices). Received: "
                              f"low={param.low}, high={param.high}")
    return grid
