"""Typed, frozen recipe models (pydantic v2): every model forbids unknown keys and is frozen, so a
validated :class:`Recipe` can be passed around and pickled to child tasks unchanged. Closed sets are
``Literal`` so that recipes round-trip through YAML and JSON Schema. ``data.batch_size`` is the
global batch (:mod:`kerasdist.data.inputs`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from kerasdist.config._base import Frozen as _Frozen
from kerasdist.config.strategy_configs import (  # noqa: F401  (re-exported: the schema's names)
    DefaultStrategyConfig,
    MirroredStrategyConfig,
    MultiWorkerStrategyConfig,
    ParameterServerStrategyConfig,
    StrategyConfig,
    StrategyConfigBase,
    StrategyTraits,
    register_strategy_config,
    strategy_config_classes,
)
from kerasdist.config.training_configs import (  # noqa: F401  (re-exported: the schema's names)
    CallbackSpec,
    KerasObject,
    OptimizerConfig,
    TrackingConfig,
    check_callback,
    check_identifier,
    check_savers_fit_strategy,
)
from kerasdist.errors import RecipeError


# --------------------------------------------------------------------------------------- model
class ModelConfig(_Frozen):
    """``model``: which Keras builder to call and with what keyword arguments, or which saved
    model to start from; its loss and metrics.

    ``loss`` and ``metrics`` default to the registered builder's own (a custom builder must name
    its ``loss``); an import path names a class (built with no arguments) or a function. With
    ``from`` (``keras.saving.load_model(compile=False)``), ``name`` only gives the default loss and
    metrics and ``params`` must be empty. ``trainable_layers`` patterns are ``fnmatch`` globs.
    """

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    name: str = Field("mnist_cnn", min_length=1, description="Registered builder or 'pkg.mod:fn'.")
    params: dict[str, Any] = Field(default_factory=dict, description="Keyword args of the builder.")
    loss: KerasObject | None = Field(None, description="Keras loss identifier, {class_name, "
                                     "config} or 'pkg.mod:Name'; default: the builder's.")
    metrics: list[KerasObject] | None = Field(None, description="Keras metric identifiers, "
                                              "{class_name, config} or 'pkg.mod:Name'; default: "
                                              "the builder's.")
    from_: Path | None = Field(None, alias="from", description="Start from this saved .keras "
                               "model (fine-tuning) instead of calling the builder.")
    trainable_layers: list[str] | None = Field(
        None, min_length=1, description="Glob patterns of the top-level layer names that train; "
        "every other layer is frozen. None = every layer trains.")

    @field_validator("loss")
    @classmethod
    def _loss(cls, value: Any) -> Any:
        return check_identifier(value, field="model.loss")

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, value: Any) -> Any:
        for index, item in enumerate(value or ()):
            check_identifier(item, field=f"model.metrics.{index}")
        return value

    @model_validator(mode="after")
    def _saved_model(self) -> ModelConfig:
        if self.from_ is None:
            return self
        if self.from_.suffix != ".keras":
            raise ValueError("model.from must be a saved Keras model file ending in .keras. "
                             f"Received: from='{self.from_}'")
        if not self.from_.is_file():
            raise ValueError(f"model.from does not exist or is not a file. Received: "
                             f"from='{self.from_}'")
        if self.params:
            raise ValueError("model.params has no effect with model.from (the saved model is "
                             f"loaded, no builder is called). Received: params={dict(self.params)!r}")
        return self


# ------------------------------------------------------------------------------- data, cluster
from kerasdist.config.cluster_configs import (  # noqa: E402,F401  (re-exported: the schema's names)
    MAX_THREADS_PER_TASK,
    PREEMPTION_SIGNALS,
    ClusterConfig,
    ThisProcessClusterConfig,
    check_fits_strategy,
)
from kerasdist.config.data_configs import DataConfig  # noqa: E402


# ------------------------------------------------------------------------------------- trainer
class CheckpointConfig(_Frozen):
    """Checkpoints of model + optimizer + progress, written with ``tf.train.CheckpointManager``."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    enabled: bool = True
    max_to_keep: int = Field(3, ge=1)
    every_steps: int | None = Field(None, gt=0, description="Also save every N optimizer steps "
                                    "(the backup a restarted cluster resumes from); None = at "
                                    "epoch ends only.")
    async_: bool = Field(False, alias="async", description="The chief writes in the background "
                         "(tf.train.CheckpointOptions(enable_async=True)). Not parameter_server.")


class ProfileConfig(_Frozen):
    """``trainer.profile``: a TensorBoard profile of every task over global steps ``[A, B]``."""

    steps: tuple[int, int] = Field(description="First and last global step profiled (1-based, "
                                   "inclusive, A < B), as Keras's TensorBoard profile_batch.")

    @model_validator(mode="after")
    def _ordered(self) -> ProfileConfig:
        first, last = self.steps
        if not 1 <= first < last:
            raise ValueError(f"trainer.profile.steps must be [A, B] with 1 <= A < B. Received: "
                             f"steps={list(self.steps)}")
        return self


class TrainerConfig(_Frozen):
    """``trainer``: epochs, steps and seeds. A step is one optimizer update on one global batch."""

    epochs: int = Field(5, ge=1)
    steps_per_epoch: int | None = Field(None, gt=0, description="None = one pass over the split.")
    validation: bool = True
    validation_steps: int | None = Field(None, gt=0)
    seed: int = Field(42, description="keras.utils.set_random_seed (weights, dropout).")
    deterministic: bool = Field(False, description="tf.config.experimental.enable_op_determinism")
    verbose: Literal["auto", 0, 1, 2] = "auto"
    checkpoint: CheckpointConfig = CheckpointConfig()
    gradient_accumulation_steps: int = Field(
        1, ge=1, description="Micro-batches each replica's share of the global batch is split "
        "into; their averaged gradients make one update, so a step stays one update on "
        "data.batch_size examples (which must divide by replicas x k). Not parameter_server.")
    precision: Literal["float32", "mixed_bfloat16", "mixed_float16"] = Field(
        "float32", description="Keras dtype policy of the model's layers (mixed_*: 16-bit "
        "compute, float32 variables and output layer; mixed_float16 adds loss scaling).")
    profile: ProfileConfig | None = Field(None, description="TensorBoard profile of every task "
                                          "into <run_dir>/tensorboard/profile-<task>; None = none.")

    @model_validator(mode="after")
    def _profile_within_run(self) -> TrainerConfig:
        total = self.epochs * (self.steps_per_epoch or 0)
        if self.profile is not None and total and self.profile.steps[1] > total:
            raise ValueError(f"trainer.profile.steps ends after the run's {total} steps "
                             f"(trainer.epochs x trainer.steps_per_epoch). Received: "
                             f"steps={list(self.profile.steps)}")
        return self


class OutputConfig(_Frozen):
    """``output``: the run directory and what goes into it."""

    run_dir: Path = Path("runs/default")
    tensorboard: bool = True
    save_model: bool = True
    tracking: TrackingConfig | None = Field(None, description="Experiment tracking ({kind: "
                                            "mlflow, uri: ...}); None = none.")

    @field_validator("run_dir", mode="before")
    @classmethod
    def _named_dir(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise ValueError("output.run_dir must name a directory (an empty string would be the "
                             f"current directory). Received: run_dir={value!r}")
        if value is None:
            raise ValueError("output.run_dir must name a directory; it is null (in YAML and "
                             "--set, '~' and 'null' mean no value, not the home directory: "
                             "kerasdist does not expand '~'). Received: run_dir=None")
        if str(value).startswith("~"):
            raise ValueError("output.run_dir starts with '~', which kerasdist does not expand "
                             "(it would make a folder named '~'): write the path in full, e.g. "
                             f"{Path.home() / str(value)[1:].lstrip('/')}. Received: "
                             f"run_dir={str(value)!r}")
        return value


# -------------------------------------------------------------------------------------- recipe
class Recipe(_Frozen):
    """A whole training recipe. Every field: docs/recipes.md (generated from this schema)."""

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    strategy: StrategyConfig = DefaultStrategyConfig()
    cluster: ClusterConfig = ThisProcessClusterConfig()
    trainer: TrainerConfig = TrainerConfig()
    output: OutputConfig = OutputConfig()
    callbacks: list[CallbackSpec] = Field(
        default_factory=list, description="Keras callbacks, after kerasdist's own: a class name "
        "(TerminateOnNaN), {class_name, config} (EarlyStopping, ReduceLROnPlateau, "
        "ModelCheckpoint, CSVLogger, TensorBoard, LearningRateScheduler, ...) or 'pkg.mod:Class'. "
        "Relative paths in filepath/filename/log_dir/backup_dir are taken inside output.run_dir.")

    @field_validator("callbacks")
    @classmethod
    def _callbacks(cls, value: list) -> list:
        for index, item in enumerate(value):
            check_callback(item, index)
        return value

    @model_validator(mode="after")
    def _cluster_fits_strategy(self) -> Recipe:
        kind, traits = self.strategy.kind, self.strategy.traits
        check_fits_strategy(self.cluster, self.strategy)
        check_savers_fit_strategy(self.callbacks, self.strategy)
        if self.trainer.checkpoint.async_ and traits.async_checkpoint_refused:
            raise ValueError(f"trainer.checkpoint.async is not supported under strategy '{kind}': "
                             f"{traits.async_checkpoint_refused}. Received: async=true")
        if self.data.auto_shard not in traits.auto_shard:
            raise ValueError(f"data.auto_shard '{self.data.auto_shard}' means nothing for strategy "
                             f"'{kind}' (it accepts {', '.join(traits.auto_shard)}). "
                             f"Received: auto_shard='{self.data.auto_shard}'")
        return self

    def intra_op_threads(self, cores: int | None = None) -> int:
        """The intra-op threads of each task: ``cluster.threads_per_task`` resolved. ``'auto'``
        is ``max(1, cores // tasks)`` (tasks = workers + ps + a coordinator) on a cluster of 2 or
        more tasks sharing this machine, else 0 (TensorFlow's default). Tasks receive the
        resolved number, never ``'auto'``.

        Args:
            cores: CPU cores of this machine; default ``os.cpu_count()``.

        Returns:
            Threads per task, >= 0 (0 = TensorFlow's default).
        """
        import os

        value, cluster = self.cluster.threads_per_task, self.cluster
        if value != "auto":
            return value
        if cluster.shares_this_machine():
            tasks = cluster.workers + cluster.ps + (1 if self.strategy.traits.needs_ps else 0)
            if tasks > 1:
                return max(1, (cores or os.cpu_count() or 1) // tasks)
        return 0

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: ModelConfig) -> ModelConfig:
        from kerasdist.models import registry

        try:
            registry.check(value)
        except RecipeError as err:
            raise ValueError(str(err)) from None
        return value
