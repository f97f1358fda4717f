"""Typed, frozen recipe models (pydantic v2).

A recipe is a YAML mapping with the sections below. Every model forbids unknown keys and is frozen,
so a validated :class:`Recipe` can be passed around (and pickled to child tasks) without anyone
changing it. Closed sets are ``Literal`` so that recipes round-trip through YAML and JSON Schema.

Batch sizes: ``data.batch_size`` is the **global** batch size, the number of examples consumed by
one optimizer step summed over every replica in the cluster. Each replica receives
``batch_size // num_replicas_in_sync`` examples per step (TF's
``InputContext.get_per_replica_batch_size``); the global batch size must be divisible by the number
of replicas, otherwise ``kerasdist.data.pipeline.check_batch_divisible`` raises
:class:`kerasdist.errors.RecipeError`
before anything starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializeAsAny,
    field_validator,
    model_validator,
)

from kerasdist.errors import RecipeError


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


# --------------------------------------------------------------------------------------- model
class ModelConfig(_Frozen):
    """``model``: which Keras builder to call and with what keyword arguments.

    ``name`` is a registered builder (``mnist_cnn``, ``linear``) or an import path
    ``package.module:function`` returning an uncompiled ``keras.Model``. ``loss`` and ``metrics``
    default to the registered builder's own; a custom builder must name its ``loss``.
    """

    name: str = Field("mnist_cnn", min_length=1, description="Registered builder or 'pkg.mod:fn'.")
    params: dict[str, Any] = Field(default_factory=dict, description="Keyword args of the builder.")
    loss: str | None = Field(None, description="Keras loss identifier; default: the builder's.")
    metrics: list[str] | None = Field(None, description="Keras metric names; default: builder's.")


# ---------------------------------------------------------------------------------------- data
DataSource = Literal["embedded", "tfds", "idx", "npz", "tfrecord", "synthetic_linear"]
AutoShard = Literal["auto", "off", "data", "file"]


class DataConfig(_Frozen):
    """``data``: where examples come from, how they are split, batched and shuffled.

    Splits use TFDS slicing syntax (``test[:80%]``, ``train[10:200]``, ``test[:10%]+test[90%:]``).
    ``batch_size`` is the global batch size (see module docs). Training batches drop the remainder
    so that every step consumes exactly ``batch_size`` examples.
    """

    source: DataSource = "embedded"
    path: Path | None = Field(None, description="Folder (idx, tfrecord) or file (npz).")
    name: str = Field("mnist", description="TFDS dataset name (source 'tfds').")
    data_dir: Path | None = Field(None, description="TFDS data_dir (source 'tfds').")
    train_split: str = "test[:80%]"
    eval_split: str | None = "test[80%:]"
    batch_size: int = Field(128, gt=0, description="Global batch size, examples per step.")
    shuffle_buffer: int = Field(10_000, ge=0, description="0 disables shuffling.")
    shuffle_seed: int = 42
    normalize: bool = Field(True, description="Scale uint8 images to float32 in [0, 1].")
    prefetch: int = Field(-1, ge=-1, description="Batches to prefetch; -1 = tf.data.AUTOTUNE.")
    num_examples: int = Field(1000, gt=0, description="synthetic_linear: examples generated.")
    noise_std: float = Field(0.33, ge=0, description="synthetic_linear: std of N(0, s^2).")
    auto_shard: AutoShard = Field(
        "auto",
        description="Multi-worker sharding: auto = by data for in-memory sources, by file for "
        "tfrecord; off = every worker reads everything (seeded differently).",
    )

    @model_validator(mode="after")
    def _check_path(self) -> DataConfig:
        needs_path = self.source in ("idx", "npz", "tfrecord")
        if needs_path and self.path is None:
            raise ValueError(f"data.path is required for source '{self.source}'. Received: path=None")
        if needs_path and not self.path.exists():
            raise ValueError(f"data.path does not exist. Received: path='{self.path}'")
        return self


# ----------------------------------------------------------------------------------- optimizer
class OptimizerConfig(_Frozen):
    """``optimizer``: a Keras 3 optimizer by name. ``momentum``/``nesterov`` apply to SGD and RMSprop.

    ``scale_lr_by_replicas`` applies the linear scaling rule (Goyal et al. 2017, "Accurate, Large
    Minibatch SGD"): the learning rate is multiplied by the number of replicas in sync.
    """

    name: Literal["adam", "sgd", "rmsprop", "adamw"] = "adam"
    learning_rate: float = Field(1e-3, gt=0, allow_inf_nan=False)
    momentum: float = Field(0.0, ge=0, lt=1, allow_inf_nan=False)
    nesterov: bool = False
    scale_lr_by_replicas: bool = False


# ------------------------------------------------------------------------------------ strategy
CHECKPOINT_SCHEMA = "kerasdist-step-v2"
"""The one checkpoint layout every built-in strategy writes and reads: model + optimizer (whose
``iterations`` is the global step) + ``steps_per_epoch``; epoch progress is derived from the step."""


@dataclass(frozen=True)
class StrategyTraits:
    """What a strategy kind needs and supports, declared once on its config class.

    Attributes:
        topology: ``single`` (this process is the whole job), ``peers`` (every worker task runs
            the same training program; the chief writes the outputs) or ``coordinator`` (ps and
            worker tasks serve; the chief task runs training and writes the outputs).
        cluster_kinds: the ``cluster.kind`` values it can run on.
        needs_ps: needs parameter-server tasks (``cluster.ps >= 1`` on local clusters).
        auto_shard: the ``data.auto_shard`` values it honours; others are refused.
        checkpoint_schema: the checkpoint layout it reads and writes; a run directory written
            under another schema is refused.
    """

    topology: Literal["single", "peers", "coordinator"]
    cluster_kinds: tuple[str, ...]
    needs_ps: bool = False
    auto_shard: tuple[str, ...] = ("auto",)
    checkpoint_schema: str = CHECKPOINT_SCHEMA


class StrategyConfigBase(_Frozen):
    """Base of every ``strategy`` section; subclasses set ``kind`` (a ``Literal``) and ``traits``."""

    kind: str
    traits: ClassVar[StrategyTraits]


_ONE_PROCESS = StrategyTraits(topology="single", cluster_kinds=("this_process",))
_CLUSTERS = ("local", "tf_config", "slurm")


class DefaultStrategyConfig(StrategyConfigBase):
    """One device (``tf.distribute.get_strategy()``'s default, or the device named)."""

    traits: ClassVar[StrategyTraits] = _ONE_PROCESS
    kind: Literal["default"] = "default"
    device: str | None = Field(None, description="e.g. '/cpu:0' or '/gpu:0'; None = TF's choice.")


class MirroredStrategyConfig(StrategyConfigBase):
    """Synchronous in-graph replication over the devices of one host (``MirroredStrategy``).

    With ``logical_cpus: N`` the host CPU is split into N logical devices and one replica runs on
    each, which is how the seed's multi-GPU tower training is exercised on a CPU-only machine.
    """

    traits: ClassVar[StrategyTraits] = _ONE_PROCESS
    kind: Literal["mirrored"] = "mirrored"
    devices: list[str] | None = Field(None, description="Devices; None = all GPUs, else the CPU.")
    logical_cpus: int | None = Field(None, ge=1, description="Split the CPU into N devices.")
    cross_device_ops: Literal["auto", "reduce_to_one", "nccl", "hierarchical_copy"] = "auto"

    @model_validator(mode="after")
    def _one_of(self) -> MirroredStrategyConfig:
        if self.devices and self.logical_cpus:
            raise ValueError(
                "strategy: give either 'devices' or 'logical_cpus', not both. "
                f"Received: devices={self.devices}, logical_cpus={self.logical_cpus}"
            )
        return self


class MultiWorkerStrategyConfig(StrategyConfigBase):
    """Synchronous between-graph replication over worker tasks (``MultiWorkerMirroredStrategy``).

    Every worker runs the same program on its own data shard; gradients are all-reduced with
    collective ops every step. Worker 0 is the chief (writes the outputs).
    Source: https://www.tensorflow.org/api_docs/python/tf/distribute/MultiWorkerMirroredStrategy
    """

    traits: ClassVar[StrategyTraits] = StrategyTraits(
        topology="peers", cluster_kinds=_CLUSTERS, auto_shard=("auto", "off", "data", "file"))
    kind: Literal["multi_worker"] = "multi_worker"
    communication: Literal["auto", "ring", "nccl"] = "auto"
    timeout_s: float = Field(60.0, gt=0, description="Collective-op timeout: a lost peer fails "
                             "the survivors after this many seconds.")
    gradient_compression: Literal["none", "bf16", "fp16"] = Field(
        "none", description="All-reduce gradients in 16 bits (half the bytes, less precision); "
        "see kerasdist.keras.compression.")


class ParameterServerStrategyConfig(StrategyConfigBase):
    """Asynchronous data parallelism with parameter servers (``ParameterServerStrategy``).

    Variables live on the ``ps`` tasks; a coordinator (the chief, in the launching process)
    schedules training steps onto workers with ``ClusterCoordinator``; each worker applies its
    gradients to the ps variables without waiting for the others.
    Source: https://www.tensorflow.org/tutorials/distribute/parameter_server_training
    """

    traits: ClassVar[StrategyTraits] = StrategyTraits(
        topology="coordinator", cluster_kinds=_CLUSTERS, needs_ps=True,
        auto_shard=("auto", "off", "data"))
    kind: Literal["parameter_server"] = "parameter_server"
    variable_partitioning: Literal["none", "min_size", "max_shards"] = Field(
        "none", description="Shard large variables over the ps tasks "
        "(tf.distribute.experimental.partitioners)."
    )
    min_shard_bytes: int = Field(256 << 10, gt=0, description="min_size: smallest shard, bytes.")
    max_shards: int | None = Field(None, ge=1, description="max_shards: default = number of ps.")
    steps_per_execution: int = Field(1, ge=1, description="Steps run by one scheduled function.")


_STRATEGY_CONFIGS: dict[str, type[StrategyConfigBase]] = {
    cls.model_fields["kind"].default: cls
    for cls in (DefaultStrategyConfig, MirroredStrategyConfig, MultiWorkerStrategyConfig,
                ParameterServerStrategyConfig)
}


def register_strategy_config(config_class: type[StrategyConfigBase]) -> None:
    """Make ``strategy.kind: <config_class's kind default>`` valid in recipes (used by
    :func:`kerasdist.strategies.register`; a later registration of the same kind replaces it).

    Raises:
        RecipeError: the class does not derive from :class:`StrategyConfigBase`, has no ``traits``
            or no default ``kind``.
    """
    kind = getattr(config_class.model_fields.get("kind"), "default", None)
    if not (isinstance(config_class, type) and issubclass(config_class, StrategyConfigBase)
            and isinstance(kind, str) and isinstance(getattr(config_class, "traits", None),
                                                      StrategyTraits)):
        raise RecipeError("a strategy config class must subclass StrategyConfigBase, give `kind` a "
                          f"string default and declare `traits`. Received: {config_class!r}")
    _STRATEGY_CONFIGS[kind] = config_class


def strategy_config_classes() -> dict[str, type[StrategyConfigBase]]:
    """``{kind: config class}`` of every strategy kind recipes accept."""
    return dict(_STRATEGY_CONFIGS)


def _strategy_by_kind(value: Any) -> Any:
    if isinstance(value, StrategyConfigBase):
        return value
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ValueError(f"strategy must be a mapping with a 'kind'. Received: {value!r}")
    kind = value.get("kind", "default")
    if kind not in _STRATEGY_CONFIGS:
        raise ValueError(f"strategy.kind: unknown strategy '{kind}'. Available: "
                         f"{', '.join(repr(k) for k in sorted(_STRATEGY_CONFIGS))}. "
                         f"Received: kind='{kind}'")
    return _STRATEGY_CONFIGS[kind].model_validate(value)


StrategyConfig = Annotated[SerializeAsAny[StrategyConfigBase], BeforeValidator(_strategy_by_kind)]


# ------------------------------------------------------------------------------------- cluster
class ClusterConfig(_Frozen):
    """``cluster``: where the tasks of the strategy run.

    * ``this_process``: the current process is the whole job (strategies default, mirrored).
    * ``local``: kerasdist starts ``workers`` worker tasks and ``ps`` parameter-server tasks as
      subprocesses on free localhost ports, each with its own ``TF_CONFIG``.
    * ``tf_config``: the process takes the role named by the ``TF_CONFIG`` environment variable
      (or the ``--job-name/--task-index/--ps-hosts/--worker-hosts`` flags): real machines.
    * ``slurm``: the role comes from the Slurm job (``SlurmClusterResolver``), one task per node
      or per ``srun`` task.
    """

    kind: Literal["this_process", "local", "tf_config", "slurm"] = "this_process"
    workers: int = Field(1, ge=1, description="local: number of worker tasks.")
    ps: int = Field(0, ge=0, description="local: number of parameter-server tasks.")
    max_restarts: int = Field(0, ge=0, description="local, multi_worker: cluster restarts after "
                              "a task dies (resuming from the last backup).")
    start_timeout_s: float = Field(120.0, gt=0, description="Seconds to wait for tasks to start.")
    threads_per_task: int = Field(0, ge=0, description="intra-op threads per task; 0 = TF default.")
    port_base: int = Field(8888, ge=1024, le=65535, description="slurm: first port of the tasks "
                           "on each node (SlurmClusterResolver's port_base).")
    allow_network_exposure: bool = Field(
        False, description="local: start the tasks even where kerasdist cannot isolate them in a "
        "private network namespace. TensorFlow binds every task server to all interfaces with no "
        "authentication, so without isolation any host that can reach this machine can run ops "
        "in them (read files, for example).")


# ------------------------------------------------------------------------------------- trainer
class CheckpointConfig(_Frozen):
    """Checkpoints of model + optimizer + progress, written with ``tf.train.CheckpointManager``."""

    enabled: bool = True
    max_to_keep: int = Field(3, ge=1)
    every_steps: int | None = Field(None, gt=0, description="Also save every N optimizer steps "
                                    "(multi_worker: the backup a restarted cluster resumes from); "
                                    "None = at epoch ends only.")


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
        1, ge=1, description="Split each replica's share of the global batch into this many "
        "sequential micro-batches and apply (all-reduce) their averaged gradients once. A step "
        "stays one optimizer update on data.batch_size examples (optimizer.iterations, "
        "steps_per_epoch and checkpoints count updates); memory is that of one micro-batch of "
        "batch_size / (replicas x k). data.batch_size must divide by replicas x k. Keras-fit "
        "strategies only (parameter_server refuses k > 1); see kerasdist.keras.accumulation.")
    precision: Literal["float32", "mixed_bfloat16", "mixed_float16"] = Field(
        "float32", description="Keras dtype policy of the model's layers: mixed_* compute in 16 "
        "bits with float32 variables and a float32 output layer; mixed_float16 adds dynamic loss "
        "scaling (LossScaleOptimizer). See kerasdist.keras.precision.")


class OutputConfig(_Frozen):
    """``output``: the run directory and what goes into it."""

    run_dir: Path = Path("runs/default")
    tensorboard: bool = True
    save_model: bool = True

    @field_validator("run_dir", mode="before")
    @classmethod
    def _named_dir(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise ValueError("output.run_dir must name a directory (an empty string would be the "
                             f"current directory). Received: run_dir={value!r}")
        return value


# -------------------------------------------------------------------------------------- recipe
class Recipe(_Frozen):
    """A whole training recipe. See the README's recipe reference for every field."""

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    strategy: StrategyConfig = DefaultStrategyConfig()
    cluster: ClusterConfig = ClusterConfig()
    trainer: TrainerConfig = TrainerConfig()
    output: OutputConfig = OutputConfig()

    @model_validator(mode="after")
    def _cluster_fits_strategy(self) -> Recipe:
        kind, traits, cluster = self.strategy.kind, self.strategy.traits, self.cluster
        if cluster.kind not in traits.cluster_kinds:
            raise ValueError(f"strategy '{kind}' needs cluster.kind "
                             f"{' or '.join(repr(k) for k in traits.cluster_kinds)}. "
                             f"Received: kind='{cluster.kind}'")
        if traits.needs_ps and cluster.kind == "local" and cluster.ps < 1:
            raise ValueError(f"cluster.ps must be >= 1 for strategy '{kind}'. "
                             f"Received: ps={cluster.ps}")
        if not traits.needs_ps and cluster.ps:
            raise ValueError(f"strategy '{kind}' has no parameter servers; cluster.ps must be "
                             f"0. Received: ps={cluster.ps}")
        if self.data.auto_shard not in traits.auto_shard:
            raise ValueError(f"data.auto_shard '{self.data.auto_shard}' means nothing for strategy "
                             f"'{kind}' (it accepts {', '.join(traits.auto_shard)}). "
                             f"Received: auto_shard='{self.data.auto_shard}'")
        return self

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: ModelConfig) -> ModelConfig:
        from kerasdist.models import registry

        try:
            registry.check(value)
        except RecipeError as err:
            raise ValueError(str(err)) from None
        return value
