"""Keras objects of a recipe built with Keras's own lookups: optimizer, learning-rate schedule,
loss, metrics and callbacks.

An import path ``pkg.mod:Name`` is imported and checked against its field's kind (:data:`KINDS`)
before its class is built (``from_config``, else ``Class(**config)``). Every failure is a
:class:`~kerasdist.errors.RecipeError` (exit 2) naming the field (:func:`check_training_config`).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from kerasdist.config.training_configs import PATH_KEYS, KerasConfig, is_import_path
from kerasdist.errors import RecipeError
from kerasdist.importpath import import_attribute, is_builtin, require_kind
from kerasdist.training.schedule_checks import check_schedule_rates

if TYPE_CHECKING:
    from kerasdist.config import Recipe

LOSS_FROM_LOGITS = "sparse_categorical_crossentropy_from_logits"
"""The seed CNN's loss identifier: softmax cross-entropy on logits."""
COMPILE_ALIASES = frozenset({"accuracy", "acc", "crossentropy", "ce"})
"""Metric names ``model.compile`` resolves itself from the loss and output shapes."""
CALLABLE_KEYS = ("schedule",)
"""Callback config keys whose import-path value is imported (``LearningRateScheduler.schedule``)."""
REFUSED_CALLBACKS = {
    "BackupAndRestore": "kerasdist checkpoints and resumes at the exact step itself "
                        "(trainer.checkpoint); a second backup would fight it",
    "ProgbarLogger": "kerasdist adds Keras's progress bar itself (trainer.verbose)",
}


KINDS = {
    "optimizer": ("a keras.optimizers.Optimizer subclass", "keras.optimizers.Optimizer", None),
    "schedule": ("a keras.optimizers.schedules.LearningRateSchedule subclass",
                 "keras.optimizers.schedules.LearningRateSchedule", None),
    "loss": ("a keras.losses.Loss subclass or a function (y_true, y_pred)", "keras.losses.Loss",
             (2,)),
    "metric": ("a keras.metrics.Metric subclass or a function (y_true, y_pred)",
               "keras.metrics.Metric", (2,)),
    "callback": ("a keras.callbacks.Callback subclass", "keras.callbacks.Callback", None),
    "epoch_function": ("a function (epoch, lr) -> lr", "", (2, 1)),
}
"""What an import path may name, per kind of field: ``(what the message says, the Keras base class
to subclass or be an instance of, the positional-argument counts a function may take or None)``."""


def _shown(value: Any) -> Any:
    return value.as_keras() if isinstance(value, KerasConfig) else value


def import_object(path: str, *, field: str, kind: str = "") -> Any:
    """Import ``package.module:Name`` (``Name`` may be dotted: ``Outer.Inner``) and check it is
    of the documented ``kind``; nothing is built or called here (importing the module runs its
    top-level code).

    Args:
        path: the import path as written in the recipe.
        field: the recipe field, first in every message (``callbacks.0``).
        kind: a key of :data:`KINDS` (``callback``, ``loss`` ...); empty: any object that is not
            a Python built-in (default).

    Raises:
        RecipeError: the module cannot be imported, its import raised, it has no ``Name``, or
            ``Name`` is not of ``kind`` (a class that does not subclass the Keras base, a
            function of the wrong arity, the standard library); names ``field`` and ``path``.
    """
    obj = import_attribute(path, field=field, error=RecipeError, received=repr(path))
    if is_builtin(obj):
        raise RecipeError(f"{field}: '{path}' is a Python built-in, not a Keras object of your "
                          f"own. Received: {path!r}")
    if kind:
        what, base, function_args = KINDS[kind]
        require_kind(obj, path, field=field, error=RecipeError, what=what,
                     classes=(_keras_class(base),) if base else (), function_args=function_args)
    return obj


def _keras_class(dotted: str) -> type:
    """``keras.callbacks.Callback`` from its dotted public name."""
    import keras

    obj: Any = keras
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def _instance(obj: Any, config: dict, *, field: str, shown: Any) -> Any:
    """An imported class built from ``config``; anything else is returned as it is (no config)."""
    if not inspect.isclass(obj):
        if config:
            raise RecipeError(f"{field}: '{shown}' is not a class, so it takes no config. "
                              f"Received: {shown!r}")
        return obj
    try:
        if callable(getattr(obj, "from_config", None)) and config:
            return obj.from_config(dict(config))
        return obj(**config)
    except (TypeError, ValueError) as err:
        raise RecipeError(f"{field}: {obj.__name__} cannot be built from its config: {err}. "
                          f"Received: {shown!r}") from None
    except Exception as err:  # noqa: BLE001 - the user's own __init__/from_config failed
        raise RecipeError(f"{field}: building {obj.__name__} raised {type(err).__name__}: {err}. "
                          f"Received: {shown!r}") from None


def _from_spec(spec: Any, *, field: str, kind: str) -> tuple[Any, bool]:
    """``(object, True)`` for an import path (a string or a KerasConfig's class_name), checked
    against ``kind`` (:data:`KINDS`) and then built from its config; ``(None, False)`` for
    something Keras looks up itself."""
    if isinstance(spec, str) and is_import_path(spec):
        obj = import_object(spec, field=field, kind=kind)
        return _instance(obj, {}, field=field, shown=spec), True
    if isinstance(spec, KerasConfig) and is_import_path(spec.class_name):
        obj = import_object(spec.class_name, field=f"{field}.class_name", kind=kind)
        return _instance(obj, spec.config, field=field, shown=spec.as_keras()), True
    return None, False


def _must_be(obj: Any, kind: type, *, field: str, what: str, shown: Any) -> Any:
    if not isinstance(obj, kind):
        raise RecipeError(f"{field}: must give {what}. Received: {shown!r}, which built a "
                          f"{type(obj).__name__}")
    return obj


# ------------------------------------------------------------------------------------- optimizer
def make_schedule(spec: KerasConfig):
    """A ``keras.optimizers.schedules.LearningRateSchedule`` from ``optimizer.learning_rate``.

    Raises:
        RecipeError: unknown class, a config the class refuses, not a schedule.
    """
    import keras

    field, shown = "optimizer.learning_rate", spec.as_keras()
    schedule, imported = _from_spec(spec, field=field, kind="schedule")
    if not imported:
        try:
            schedule = keras.optimizers.schedules.deserialize(spec.as_keras())
        except (TypeError, ValueError) as err:
            raise RecipeError(f"{field}: Keras cannot build this schedule: "
                              f"{str(err).splitlines()[-1]}. Received: {shown!r}") from None
    _must_be(schedule, keras.optimizers.schedules.LearningRateSchedule, field=field,
             what="a keras.optimizers.schedules.LearningRateSchedule", shown=shown)
    check_schedule_rates(schedule, field=field, shown=shown)
    return schedule


def make_optimizer(config, num_replicas: int = 1):
    """A Keras 3 optimizer from an :class:`~kerasdist.config.OptimizerConfig`.

    Args:
        config: ``recipe.optimizer``.
        num_replicas: replicas in sync (a constant learning rate is multiplied by it when
            ``scale_lr_by_replicas``).

    Returns:
        A new, unbuilt ``keras.optimizers.Optimizer`` (create it inside ``strategy.scope()``).

    Raises:
        RecipeError: an unknown optimizer, ``params`` it refuses, a bad schedule, an import path
            that fails or does not give an optimizer; names the field and what was received.
    """
    import keras

    if config.is_schedule:
        learning_rate = make_schedule(config.learning_rate)
    else:
        learning_rate = config.learning_rate * (num_replicas if config.scale_lr_by_replicas else 1)
    kwargs = {"learning_rate": learning_rate, **config.params}
    kind = config.name.lower()
    if kind in ("sgd", "rmsprop"):
        kwargs["momentum"] = config.momentum
    if kind == "sgd":
        kwargs["nesterov"] = config.nesterov
    shown = {"name": config.name, "params": dict(config.params)}
    if is_import_path(config.name):
        cls = import_object(config.name, field="optimizer.name", kind="optimizer")
        if not inspect.isclass(cls):
            raise RecipeError("optimizer.name: must name a keras.optimizers.Optimizer subclass. "
                              f"Received: {config.name!r} ({type(cls).__name__})")
        return _instance(cls, kwargs, field="optimizer", shown=shown)
    try:
        return keras.optimizers.get({"class_name": config.name, "config": kwargs})
    except (TypeError, ValueError) as err:
        raise RecipeError(f"optimizer: Keras cannot build this optimizer: "
                          f"{str(err).splitlines()[-1]}. Received: {shown!r}") from None


# ------------------------------------------------------------------------------- loss, metrics
def make_loss(spec: Any):
    """A Keras loss from ``model.loss`` (identifier, ``{class_name, config}`` or import path).

    Raises:
        RecipeError: naming ``model.loss`` and what was received.
    """
    import keras

    if spec == LOSS_FROM_LOGITS:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    loss, imported = _from_spec(spec, field="model.loss", kind="loss")
    if imported:
        if not callable(loss):
            raise RecipeError(f"model.loss: must give a keras.losses.Loss or a function "
                              f"(y_true, y_pred). Received: {_shown(spec)!r}")
        return loss
    try:
        return keras.losses.get(_shown(spec))
    except (TypeError, ValueError) as err:
        raise RecipeError(f"model.loss: {str(err).splitlines()[-1]}. Received: "
                          f"loss={_shown(spec)!r}") from None


def make_metrics(specs: Sequence[Any]) -> list:
    """Keras metrics from ``model.metrics``; every plain name stays a string (checked here with
    ``keras.metrics.get``), so the logs carry the name the recipe gave, as in ``compile``.

    Raises:
        RecipeError: naming ``model.metrics.<i>`` and what was received.
    """
    import keras

    metrics = []
    for index, spec in enumerate(specs):
        field = f"model.metrics.{index}"
        if isinstance(spec, str) and spec.lower() in COMPILE_ALIASES:
            metrics.append(spec)
            continue
        metric, imported = _from_spec(spec, field=field, kind="metric")
        if not imported:
            try:
                metric = keras.metrics.get(_shown(spec))
            except (TypeError, ValueError) as err:
                raise RecipeError(f"{field}: unknown metric ({str(err).splitlines()[-1]}). "
                                  f"Received: {_shown(spec)!r}") from None
        if not callable(metric):
            raise RecipeError(f"{field}: must give a keras.metrics.Metric or a function "
                              f"(y_true, y_pred). Received: {_shown(spec)!r}")
        metrics.append(spec if isinstance(spec, str) and not imported else metric)
    return metrics


def loss_label(spec: Any) -> str:
    """A lowercase name of ``model.loss`` for checks that depend on the kind of loss
    (``'sparsecategoricalcrossentropy'`` for ``{class_name: SparseCategoricalCrossentropy}``,
    the identifier itself for a string)."""
    name = spec.class_name if isinstance(spec, KerasConfig) else str(spec or "")
    return name.lower()


# ------------------------------------------------------------------------------------ callbacks
def _resolve_config(config: dict, run_dir: Path, *, field: str) -> dict:
    resolved = dict(config)
    for key in PATH_KEYS:
        value = resolved.get(key)
        if isinstance(value, str) and value and not Path(value).is_absolute() and \
                "://" not in value:
            resolved[key] = str(Path(run_dir) / value)
    for key in CALLABLE_KEYS:
        value = resolved.get(key)
        if isinstance(value, str) and is_import_path(value):
            resolved[key] = import_object(value, field=f"{field}.config.{key}",
                                          kind="epoch_function")
    return resolved


def _keras_callback_class(name: str, *, field: str):
    import keras

    cls = getattr(keras.callbacks, name, None)
    if not (inspect.isclass(cls) and issubclass(cls, keras.callbacks.Callback)):
        known = sorted(n for n in dir(keras.callbacks) if inspect.isclass(
            getattr(keras.callbacks, n)) and issubclass(getattr(keras.callbacks, n),
                                                        keras.callbacks.Callback))
        raise RecipeError(f"{field}: not a Keras callback (keras.callbacks has {', '.join(known)}"
                          f"; your own: 'pkg.mod:Class'). Received: {name!r}")
    if name in REFUSED_CALLBACKS:
        raise RecipeError(f"{field}: {name} is not accepted in a recipe: "
                          f"{REFUSED_CALLBACKS[name]}. Received: {name!r}")
    return cls


def make_callback(spec: Any, *, index: int, run_dir: Path):
    """One recipe callback, its relative paths taken inside ``run_dir``.

    A ``TensorBoard`` without ``log_dir`` writes ``<run_dir>/tensorboard`` (kerasdist then adds
    none of its own); a ``CSVLogger`` without ``append`` appends, so a resumed run keeps its rows.

    Raises:
        RecipeError: unknown class, a config the class refuses, an import path that fails or
            does not give a ``keras.callbacks.Callback``; names ``callbacks.<index>``.
    """
    import keras

    field = f"callbacks.{index}"
    name = spec.class_name if isinstance(spec, KerasConfig) else spec
    config = dict(spec.config) if isinstance(spec, KerasConfig) else {}
    if is_import_path(name):
        cls = import_object(name, field=field if isinstance(spec, str) else f"{field}.class_name",
                            kind="callback")
    else:
        cls = _keras_callback_class(name, field=field)
        if name == "TensorBoard":
            from kerasdist.keras.callbacks import EpochTensorBoard

            cls = EpochTensorBoard  # Keras's, without per-step work that writes nothing
            config.setdefault("log_dir", "tensorboard")
        elif name == "CSVLogger":  # a resumed run (and each fit phase) adds its epochs' rows
            config.setdefault("append", True)
    config = _resolve_config(config, run_dir, field=field)
    callback = _instance(cls, config, field=field, shown=_shown(spec)) if inspect.isclass(cls) \
        else cls
    return _must_be(callback, keras.callbacks.Callback, field=field,
                    what="a keras.callbacks.Callback", shown=_shown(spec))


def make_callbacks(specs: Sequence[Any], run_dir: Path) -> list:
    """Every recipe callback (:func:`make_callback`), in recipe order."""
    return [make_callback(spec, index=i, run_dir=run_dir) for i, spec in enumerate(specs)]


def has_tensorboard(specs: Sequence[Any]) -> bool:
    """Whether the recipe's callbacks include Keras's ``TensorBoard``."""
    return any((s.class_name if isinstance(s, KerasConfig) else s) == "TensorBoard" for s in specs)


# ---------------------------------------------------------------------------------- the check
def check_training_config(recipe: Recipe, run_dir: Path | None = None) -> None:
    """Build (and discard) the recipe's optimizer, schedule, loss, metrics and callbacks with
    Keras, outside any strategy: every error Keras would raise later is raised here, before
    anything is written. Imports every import path they name (runs its code).

    Raises:
        RecipeError: the first problem, naming its field and what was received.
    """
    from kerasdist.models import registry

    spec = registry.check(recipe.model)
    make_optimizer(recipe.optimizer)
    make_loss(spec.loss)
    make_metrics(spec.metrics)
    make_callbacks(recipe.callbacks, Path(run_dir or recipe.output.run_dir))


# ------------------------------------------------------------- Python callbacks sent by path
def as_recipe_callback(callback: Any) -> Any | None:
    """A callback given in Python, as a recipe ``callbacks`` entry that a child process can build
    (a local or Ray cluster's tasks get the recipe, not Python objects), or None when it cannot
    be sent that way.

    Sent: an import path or Keras class name, a ``{class_name, config}`` dict, and an instance of
    an importable class (not from ``__main__``) with its own ``get_config()``, sent as
    ``{class_name: "module:Class", config: get_config()}``.
    """
    if isinstance(callback, (str, dict, KerasConfig)):
        return callback.as_keras() if isinstance(callback, KerasConfig) else callback
    cls = type(callback)
    get_config = getattr(cls, "get_config", None)
    if cls.__module__ in ("__main__", "builtins") or not callable(get_config):
        return None
    path = f"{cls.__module__}:{cls.__qualname__}"
    try:
        if import_object(path, field="callbacks") is not cls:
            return None
        config = callback.get_config()
    except (RecipeError, TypeError, ValueError, NotImplementedError):
        return None
    return {"class_name": path, "config": dict(config)} if isinstance(config, dict) else None
