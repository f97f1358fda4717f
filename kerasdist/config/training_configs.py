"""Recipe models of the Keras-native training config: Keras objects as identifiers, Keras configs
(``{class_name, config}``) or import paths; the optimizer with its schedule; callbacks; tracking.

Checked here for their *shape* only (no Keras import); whether Keras can build each object is
checked by :func:`kerasdist.training.keras_objects.check_training_config` before anything is
written. An import path runs code when imported: a recipe is as trusted as the code it names.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from kerasdist.config._base import Frozen as _Frozen


def is_import_path(text: str) -> bool:
    """True when ``text`` looks like ``package.module:Name`` (a ``:`` separating two parts)."""
    return ":" in text


def check_import_path(text: str, *, field: str) -> str:
    """Refuse a malformed import path (syntax only; nothing is imported).

    Raises:
        ValueError: naming ``field`` and the text received.
    """
    module, _, attr = text.partition(":")
    parts = module.split(".")
    if not (all(p.isidentifier() for p in parts) and all(a.isidentifier() for a in attr.split("."))):
        raise ValueError(f"{field}: not an import path 'package.module:Name'. Received: {text!r}")
    return text


class KerasConfig(_Frozen):
    """A Keras object in Keras's own serialized form, ``{class_name, config}``.

    ``class_name`` is what Keras's ``get``/``deserialize`` look up (``CosineDecay``,
    ``EarlyStopping``), or an import path ``package.module:Class`` of your own class, built as
    ``Class.from_config(config)`` when it has that method, else ``Class(**config)``. The
    ``module`` and ``registered_name`` keys Keras's serializer writes are accepted and dropped.
    """

    class_name: str = Field(min_length=1, description="Keras class name or 'pkg.mod:Class'.")
    config: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments.")

    @model_validator(mode="before")
    @classmethod
    def _drop_keras_extras(cls, data: Any) -> Any:
        if isinstance(data, dict) and ({"module", "registered_name"} & set(data)):
            data = {k: v for k, v in data.items() if k not in ("module", "registered_name")}
        return data

    @field_validator("class_name")
    @classmethod
    def _class_name(cls, value: str) -> str:
        if is_import_path(value):
            return check_import_path(value, field="class_name")
        if not value.replace("_", "").replace(">", "").isalnum():
            raise ValueError(f"class_name must be a Keras class name or an import path "
                             f"'package.module:Class'. Received: class_name={value!r}")
        return value

    def as_keras(self) -> dict[str, Any]:
        """The dict Keras's ``get``/``deserialize`` take."""
        return {"class_name": self.class_name, "config": dict(self.config)}


KerasObject = str | KerasConfig
"""A Keras identifier (``"adam"``, ``"mse"``, ``"accuracy"``), an import path ``pkg.mod:Name``,
or a :class:`KerasConfig`."""


def check_identifier(value: Any, *, field: str) -> Any:
    """A bare identifier must not be empty; an import path must be well formed."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"{field}: an empty identifier. Received: {value!r}")
        if is_import_path(value):
            check_import_path(value, field=field)
    return value


# ------------------------------------------------------------------------------------ optimizer
_LEGACY_FIELDS = ("momentum", "nesterov", "scale_lr_by_replicas", "learning_rate", "params", "name")


class OptimizerConfig(_Frozen):
    """``optimizer``: any Keras 3 optimizer, with a constant learning rate or a Keras schedule.

    The Keras form ``{class_name: AdamW, config: {...}}`` is read as ``name`` + ``params`` (+
    ``learning_rate``). A schedule is evaluated at ``optimizer.iterations``, the global step
    restored from the checkpoint, so a resumed run continues it at its exact step.
    ``scale_lr_by_replicas`` multiplies a constant learning rate by the replicas in sync (the
    linear scaling rule, Goyal et al. 2017); with a schedule, scale its own rates.
    """

    name: str = Field("adam", min_length=1, description="keras.optimizers.get identifier (adam, "
                      "adamw, sgd, rmsprop, lion, ...) or 'pkg.mod:Class'.")
    params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the "
                                   "optimizer (weight_decay, beta_1, global_clipnorm, ...).")
    learning_rate: float | KerasConfig = Field(
        1e-3, description="A positive float, or a Keras schedule {class_name, config} "
        "(CosineDecay, ExponentialDecay, PiecewiseConstantDecay, ... or 'pkg.mod:Class').")
    momentum: float = Field(0.0, ge=0, lt=1, allow_inf_nan=False,
                            description="SGD, RMSprop only.")
    nesterov: bool = Field(False, description="SGD only.")
    scale_lr_by_replicas: bool = False

    @model_validator(mode="before")
    @classmethod
    def _keras_form(cls, data: Any) -> Any:
        """``{class_name, config[, module, registered_name]}`` -> ``name``, ``params``,
        ``learning_rate``."""
        if not isinstance(data, dict) or "class_name" not in data:
            return data
        mixed = sorted(set(data) & set(_LEGACY_FIELDS))
        if mixed:
            raise ValueError(f"optimizer: give either the Keras form {{class_name, config}} or "
                             f"name/params/learning_rate, not both. Received: keys {sorted(data)}")
        extra = sorted(set(data) - {"class_name", "config", "module", "registered_name"})
        if extra:
            raise ValueError(f"optimizer: unknown key(s) {extra} in the Keras form "
                             "{class_name, config}. Received: " + repr(data))
        config = dict(data.get("config") or {})
        out: dict[str, Any] = {"name": data["class_name"]}
        if "learning_rate" in config:
            out["learning_rate"] = config.pop("learning_rate")
        config.pop("name", None)  # Keras writes the optimizer's own name in its config
        out["params"] = config
        return out

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_identifier(value, field="optimizer.name")

    @field_validator("learning_rate")
    @classmethod
    def _positive(cls, value: float | KerasConfig) -> float | KerasConfig:
        import math

        if isinstance(value, float) and not (math.isfinite(value) and value > 0):
            raise ValueError("optimizer.learning_rate must be a finite number > 0 or a schedule "
                             f"{{class_name, config}}. Received: {value!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> OptimizerConfig:
        for key in ("learning_rate", "momentum", "nesterov"):
            if key in self.params:
                raise ValueError(f"optimizer.params.{key}: give it as optimizer.{key}, not in "
                                 f"params. Received: params={dict(self.params)!r}")
        if self.scale_lr_by_replicas and isinstance(self.learning_rate, KerasConfig):
            raise ValueError("optimizer.scale_lr_by_replicas applies to a constant learning rate "
                             "only; with a schedule, scale its rates in its config. Received: "
                             f"learning_rate={self.learning_rate.as_keras()!r}")
        return self

    @property
    def is_schedule(self) -> bool:
        """Whether ``learning_rate`` is a schedule (not a constant)."""
        return isinstance(self.learning_rate, KerasConfig)


# ------------------------------------------------------------------------------------ callbacks
CallbackSpec = KerasConfig | str
"""A recipe callback: a Keras callback class name (``TerminateOnNaN``), ``{class_name, config}``
or an import path ``pkg.mod:Class`` (built with no arguments) / ``{class_name: pkg.mod:Class,
config: {...}}``."""

PATH_KEYS = ("filepath", "filename", "log_dir", "backup_dir")
"""Callback config keys holding a file or folder path; a relative path there is taken inside the
run directory (``CSVLogger(filename='train.csv')`` writes ``<run_dir>/train.csv``)."""


SINGLE_PROCESS_SAVERS = ("OrbaxCheckpoint",)
"""Keras callbacks that coordinate their saves across processes on JAX only
(``keras.callbacks.OrbaxCheckpoint``'s docstring), refused under a multi-process strategy, in a
recipe (:func:`check_savers_fit_strategy`) and in ``model.fit`` after ``kerasdist.enable()``
(:func:`single_process_saver_error`)."""


def single_process_saver_error(name: str, *, strategy: str, field: str) -> str | None:
    """The refusal of callback ``name`` (a class name or ``pkg.mod:Class``) under the
    multi-process ``strategy`` kind, or None when it is no :data:`SINGLE_PROCESS_SAVERS` one.

    Args:
        name: the callback's class name or import path.
        strategy: ``multi_worker`` or ``parameter_server``.
        field: where it was given (``callbacks.1``, ``model.fit(callbacks=...)``).
    """
    if name.rpartition(":")[2] not in SINGLE_PROCESS_SAVERS:
        return None
    return (f"{field}: {name} is not accepted under strategy '{strategy}': Keras coordinates "
            "its saves across processes on JAX only, and kerasdist does not make it chief-only. "
            "Use trainer.checkpoint (kerasdist's own checkpoints, resumed at the exact step) or "
            f"ModelCheckpoint (written by the chief only). Received: {name!r}")


def check_savers_fit_strategy(callbacks: list, strategy) -> None:
    """Refuse a :data:`SINGLE_PROCESS_SAVERS` callback (by class name, or an import path to a
    class of that name) under a strategy of several processes (``multi_worker``,
    ``parameter_server``).

    Raises:
        ValueError: names ``callbacks.<index>``, the callback, the strategy and what to use.
    """
    if strategy.traits.topology == "single":
        return
    for index, spec in enumerate(callbacks):
        name = spec.class_name if isinstance(spec, KerasConfig) else spec
        error = single_process_saver_error(name, strategy=strategy.kind, field=f"callbacks.{index}")
        if error:
            raise ValueError(error)


def check_callback(value: Any, index: int) -> Any:
    """A string callback must be a class name or an import path."""
    if isinstance(value, str):
        check_identifier(value, field=f"callbacks.{index}")
        if not is_import_path(value) and not value.isidentifier():
            raise ValueError(f"callbacks.{index}: a Keras callback class name (EarlyStopping) or "
                             f"'pkg.mod:Class'. Received: {value!r}")
    return value


# ------------------------------------------------------------------------------------- tracking
TRACKING_SCHEMES = ("http", "https", "databricks", "databricks-uc", "uc", "file", "sqlite",
                    "postgresql", "mysql", "mssql")
"""URI schemes of MLflow's own tracking stores (``mlflow.tracking._tracking_service.utils``);
``databricks`` and ``uc`` may stand without ``://``."""


class TrackingConfig(_Frozen):
    """``output.tracking``: log the run to an experiment tracker (``kind: mlflow``).

    One tracker run per kerasdist run, written by the chief or coordinator; a resumed or elastic
    run continues it (``tracking.json``). Needs ``pip install 'kerasdist[mlflow]'``.
    """

    kind: Literal["mlflow"] = "mlflow"
    uri: str | None = Field(None, min_length=1, description="MLflow tracking URI (http://HOST:PORT, "
                            "sqlite:///file.db, ...); None = sqlite:///<run_dir>/mlflow.db.")
    experiment: str = Field("kerasdist", min_length=1, description="MLflow experiment name.")
    run_name: str | None = Field(None, description="MLflow run name; None = the run dir's name.")
    log_model: bool = Field(True, description="Log model.keras and metrics.json as artifacts.")
    required: bool = Field(True, description="true: a tracking store that does not answer before "
                           "anything is written is bad input (exit 2); false: a warning.")

    @field_validator("uri")
    @classmethod
    def _known_scheme(cls, value: str | None) -> str | None:
        if value is None:
            return value
        head, sep, _ = value.partition("://")
        if not sep:  # a folder path, or a bare scheme such as "databricks"
            head = value.partition(":")[0] if ":" in value else ""
        scheme = head.partition("+")[0].lower()  # postgresql+psycopg2:// is postgresql
        if len(scheme) > 1 and scheme not in TRACKING_SCHEMES:  # one letter: a drive, C:/
            raise ValueError(
                f"output.tracking.uri: MLflow has no tracking store for the scheme '{scheme}' "
                f"(known: {', '.join(TRACKING_SCHEMES)}; or a folder path). Received: uri={value!r}")
        return value


def keras_checked_fields(recipe) -> list[str]:
    """The recipe fields beyond plain names whose objects only Keras can check (a
    ``{class_name, config}``, an import path, optimizer params, callbacks): what ``kerasdist
    validate`` checks for shape only unless given ``--import``."""
    model, optimizer = recipe.model, recipe.optimizer
    fields = []
    if optimizer.params or optimizer.is_schedule or is_import_path(optimizer.name):
        fields.append("optimizer")
    if isinstance(model.loss, KerasConfig) or (isinstance(model.loss, str)
                                                and is_import_path(model.loss)):
        fields.append("model.loss")
    if any(isinstance(m, KerasConfig) or is_import_path(m) for m in model.metrics or ()):
        fields.append("model.metrics")
    if recipe.callbacks:
        fields.append("callbacks")
    return fields
