"""The ``strategy`` section of a recipe: one frozen model per strategy kind, and their registry.

Each config class declares its :class:`StrategyTraits` (topology, ps tasks, ``data.auto_shard``
values, checkpoint schema; the cluster kinds that run a topology say so in their traits);
:mod:`kerasdist.strategies` registers the strategy object that runs it. Fields are documented
per class; docs/recipes.md is generated from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from kerasdist.config._base import Frozen, KindedSection

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
        needs_ps: needs parameter-server tasks (``cluster.ps >= 1`` on local clusters).
        auto_shard: the ``data.auto_shard`` values it honours; others are refused.
        checkpoint_schema: the checkpoint layout it reads and writes; a run directory written
            under another schema is refused.
        async_checkpoint_refused: why ``trainer.checkpoint.async`` cannot be honoured, or None.
    """

    topology: Literal["single", "peers", "coordinator"]
    needs_ps: bool = False
    auto_shard: tuple[str, ...] = ("auto",)
    checkpoint_schema: str = CHECKPOINT_SCHEMA
    async_checkpoint_refused: str | None = None


class StrategyConfigBase(Frozen):
    """Base of every ``strategy`` section; subclasses set ``kind`` (a ``Literal``) and ``traits``."""

    kind: str
    traits: ClassVar[StrategyTraits]


_ONE_PROCESS = StrategyTraits(topology="single")


class DefaultStrategyConfig(StrategyConfigBase):
    """One device (``tf.distribute.get_strategy()``'s default, or the device named)."""

    traits: ClassVar[StrategyTraits] = _ONE_PROCESS
    kind: Literal["default"] = "default"
    device: str | None = Field(None, description="e.g. '/cpu:0' or '/gpu:0'; None = TF's choice.")


class MirroredStrategyConfig(StrategyConfigBase):
    """Synchronous in-graph replication over the devices of one host (``MirroredStrategy``).

    With ``logical_cpus: N`` the host CPU is split into N logical devices, one replica on each.
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

    Every worker runs the same program on its own data shard; gradients are all-reduced every
    step; worker 0 is the chief. ``communication`` and ``bytes_per_pack`` become its
    ``CommunicationOptions``. Sources: https://www.tensorflow.org/api_docs/python/tf/distribute/MultiWorkerMirroredStrategy,
    https://www.tensorflow.org/api_docs/python/tf/distribute/experimental/CommunicationOptions
    """

    traits: ClassVar[StrategyTraits] = StrategyTraits(
        topology="peers",
        auto_shard=("auto", "off", "data", "file"))
    kind: Literal["multi_worker"] = "multi_worker"
    communication: Literal["auto", "ring", "nccl"] = Field(
        "auto", description="Collective implementation: 'ring' (gRPC ring, CPU or GPU), 'nccl' "
        "(GPU workers only), 'auto' (TF picks at run time).")
    bytes_per_pack: int = Field(
        0, ge=0, le=1 << 34, description="Pack the gradients into all-reduces of about this many "
        "bytes each (fewer, larger collectives); 0 = TF's automatic choice. Bytes, <= 16 GiB.")
    timeout_s: float = Field(60.0, gt=0, le=86_400, description="Seconds a worker waits for "
                             "its peers in one step before the run fails naming the lost task "
                             "(3 x timeout_s at epoch boundaries); also TF's heartbeat timeout.")
    gradient_compression: Literal["none", "bf16", "fp16"] = Field(
        "none", description="All-reduce gradients in 16 bits (half the bytes, less precision); "
        "see kerasdist.keras.compression.")


class SyncConfig(Frozen):
    """Synchronous steps with backup workers (``tf.compat.v1.train.SyncReplicasOptimizer``'s
    scheme; Chen et al., "Revisiting Distributed Synchronous SGD", 2016, arXiv:1604.00981)."""

    replicas_to_aggregate: int | None = Field(
        None, ge=1, description="K, gradients averaged per step, 1 <= K <= workers; null = every "
        "worker (K = N: the strategy-free weights). With K < N, N - K workers are backups: the "
        "slowest N - K gradients of each step are dropped.")


class ParameterServerStrategyConfig(StrategyConfigBase):
    """Asynchronous data parallelism with parameter servers (``ParameterServerStrategy``).

    Variables live on the ``ps`` tasks; a coordinator (the chief, in the launching process)
    schedules training steps onto workers with ``ClusterCoordinator``; each worker applies its
    gradients to the ps variables without waiting for the others.
    Source: https://www.tensorflow.org/tutorials/distribute/parameter_server_training
    """

    traits: ClassVar[StrategyTraits] = StrategyTraits(
        topology="coordinator", needs_ps=True, auto_shard=("auto", "off", "data"),
        async_checkpoint_refused=(
            "the variables live on the ps tasks, so the background write would run the save "
            "ops on every task from another thread, outside the save that never waits on a "
            "frozen worker (a stop could then hang on one); use async: false"))
    kind: Literal["parameter_server"] = "parameter_server"
    variable_partitioning: Literal["none", "min_size", "fixed", "max_shards"] = Field(
        "none", description="Shard variables along axis 0 over the ps tasks "
        "(tf.distribute.experimental.partitioners): min_size = MinSizePartitioner (shards of at "
        "least min_shard_bytes, at most max_shards); fixed = FixedShardsPartitioner(max_shards) "
        "for every variable; max_shards = the earlier name of fixed."
    )
    min_shard_bytes: int = Field(256 << 10, gt=0, description="min_size: smallest shard, bytes.")
    max_shards: int | None = Field(None, ge=1, description="min_size: most shards; fixed: the "
                                   "shard count. Default: the number of ps tasks.")
    steps_per_execution: int = Field(
        4, ge=1, description="Training steps run by one scheduled function (one coordinator "
        "round trip; default 4, faster than 1: docs/benchmarks-log.md). A lost worker re-runs "
        "at most this many steps (at-least-once).")
    task_timeout_s: float | None = Field(
        60.0, gt=0, le=86_400, description="Seconds a ps or worker task may stay unreachable or "
        "hung before it is lost (detected within this plus 7 s): a local cluster kills and "
        "restarts it; elsewhere the task watching it exits 1 naming it. null = never.")
    sync: SyncConfig | None = Field(
        None, description="Train synchronously: every worker computes the gradient of its slice "
        "of the global batch from the same weights; the mean of the first replicas_to_aggregate "
        "to arrive is applied once on the ps, later ones are dropped and counted "
        "(kerasdist.keras.ps_sync). null = asynchronous. steps_per_execution must stay 1.")

    @model_validator(mode="before")
    @classmethod
    def _sync_default_steps(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("sync") is not None:
            return {"steps_per_execution": 1, **data}  # sync: 1 unless given (then refused)
        return data

    @model_validator(mode="after")
    def _one_step_per_round(self) -> ParameterServerStrategyConfig:
        if self.sync is not None and self.steps_per_execution > 1:
            raise ValueError(
                "strategy.steps_per_execution must be 1 with strategy.sync (each synchronous step "
                "is one round of calls and one update on the ps). Received: "
                f"steps_per_execution={self.steps_per_execution}")
        return self


STRATEGIES = KindedSection("strategy", StrategyConfigBase, StrategyTraits, (
    DefaultStrategyConfig, MirroredStrategyConfig, MultiWorkerStrategyConfig,
    ParameterServerStrategyConfig), default="default", what="strategy")
"""The strategy kinds recipes accept (:func:`kerasdist.strategies.register` adds one)."""
register_strategy_config, strategy_config_classes = STRATEGIES.register, STRATEGIES.classes
StrategyConfig = STRATEGIES.annotated()
