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

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from kerasdist.config._base import Frozen as _Frozen
from kerasdist.config.strategy_configs import (  # noqa: F401  (re-exported: the schema's names)
    CHECKPOINT_SCHEMA,
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
    KerasConfig,
    KerasObject,
    OptimizerConfig,
    TrackingConfig,
    check_callback,
    check_identifier,
)
from kerasdist.errors import RecipeError


# --------------------------------------------------------------------------------------- model
class ModelConfig(_Frozen):
    """``model``: which Keras builder to call and with what keyword arguments, or which saved
    model to start from; its loss and metrics.

    ``name`` is a registered builder (``mnist_cnn``, ``linear``) or an import path
    ``package.module:function`` returning an uncompiled ``keras.Model``. ``loss`` and ``metrics``
    default to the registered builder's own; a custom builder (or a saved model of one) must name
    its ``loss``. Each is a Keras identifier (``mse``), a Keras config ``{class_name, config}`` as
    ``keras.losses.get`` / ``keras.metrics.get`` take it, or an import path ``pkg.mod:Name`` (a
    class is built with no arguments, a function is used as it is).

    ``from`` starts from a saved ``.keras`` model (``keras.saving.load_model(compile=False)``,
    fine-tuning) instead of calling the builder; ``name`` then only gives the default loss and
    metrics, and ``params`` must be empty. ``trainable_layers`` freezes every top-level layer
    whose name matches none of its glob patterns (``fnmatch``: ``dense*``, ``head_?``).
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


# ---------------------------------------------------------------------------------------- data
from kerasdist.config.data_configs import (  # noqa: E402,F401  (re-exported: the schema's names)
    AutoShard,
    DataConfig,
    DataSource,
    FeatureSpec,
)

# ------------------------------------------------------------------------------------- cluster
MAX_THREADS_PER_TASK = 1024
"""Most intra-op threads a task may be given (``cluster.threads_per_task``, ``kerasdist launch
--threads-per-task``): above the hardware threads of the largest machines sold today (2 x 192 cores,
768 threads); TensorFlow aborts a task given a thread count it cannot use."""


PreemptionSignal = Literal["USR1", "TERM", "INT", "HUP", "ALRM", "XCPU", "QUIT"]
PREEMPTION_SIGNALS: tuple[str, ...] = PreemptionSignal.__args__
"""Names ``cluster.preemption_signal`` takes (without ``SIG``): signals a process can catch that
Slurm's ``--signal`` can send, except ``USR2`` (kerasdist's release signal under Slurm)."""


class ClusterConfig(_Frozen):
    """``cluster``: where the tasks of the strategy run.

    * ``this_process``: the current process is the whole job (strategies default, mirrored).
    * ``local``: kerasdist starts ``workers`` worker tasks and ``ps`` parameter-server tasks as
      subprocesses on free localhost ports, each with its own ``TF_CONFIG``.
    * ``tf_config``: the process takes the role named by the ``TF_CONFIG`` environment variable
      (or the ``--job-name/--task-index/--ps-hosts/--worker-hosts`` flags): real machines.
    * ``slurm``: the role comes from the Slurm job (``SlurmClusterResolver``), one task per node
      or per ``srun`` task.
    * ``jobset``: the role comes from a Kubernetes JobSet pod (``kerasdist export jobset``): its
      replicated job and completion index, the peers' DNS names (:mod:`kerasdist.cluster.jobset`);
      in a Kubeflow Trainer v2 TrainJob (``kerasdist export trainjob``), its rank in the
      replicated job ``node``.
    * ``ray``: ``workers`` Ray Train workers (``TensorflowTrainer``), each running kerasdist's
      lifecycle as one multi-worker task (:mod:`kerasdist.launch.ray_run`); needs
      ``pip install 'kerasdist[ray]'``.
    """

    kind: Literal["this_process", "local", "tf_config", "slurm", "jobset", "ray"] = "this_process"
    workers: int = Field(1, ge=1, description="local, ray, jobset: number of worker tasks; "
                         "slurm: when set, the step's task count must match (exit 2 otherwise).")
    ps: int = Field(0, ge=0, description="local, slurm, jobset: number of parameter-server "
                    "tasks.")
    max_restarts: int = Field(0, ge=0, description="local, ray (multi_worker): cluster restarts "
                              "after a task dies (resuming from the last backup at its exact "
                              "step; on Ray: FailureConfig.max_failures). slurm: requeues a "
                              "preempted job may ask for (SLURM_RESTART_COUNT below it; a job "
                              "requeued more often is refused at start, exit 2); jobset: the "
                              "JobSet's failurePolicy.maxRestarts.")
    preemption_signal: PreemptionSignal = Field(
        "USR1", description="slurm: the signal that stops training at one agreed step with a "
        "checkpoint, after which task 0 requeues the job (besides SIGTERM and SIGINT, always "
        "watched); kerasdist export slurm writes it as --signal=<SIG>@<seconds>. A name with or "
        "without 'SIG', any case: " + ", ".join(PREEMPTION_SIGNALS) + " (USR2 is kerasdist's "
        "release signal; KILL and STOP cannot be caught).")
    min_workers: int | None = Field(
        None, ge=1, description="local, ray: elastic worker count. On ray it is Ray Train's own "
        "elastic scaling (ScalingConfig(num_workers=(min_workers, workers))): after a lost worker "
        "(each loss uses one of cluster.max_restarts) Ray restarts the group on as many workers "
        "as the cluster can place, at least this many, and grows it back every "
        "cluster.resize_check_s when more can be placed; every count must divide data.batch_size "
        "(refused before anything starts). local: when a worker is lost and no "
        "restart is left, the run continues on the workers that are left, down to this many, from "
        "the last backup at its exact step with the same global batch (per-replica batch "
        "re-derived; a count data.batch_size does not divide is refused); a later restart tries "
        "cluster.workers again. Under parameter_server a value below cluster.workers runs the "
        "coordinator as a task of its own (chief:0, its progress in logs/chief-0.log): TF's "
        "ClusterCoordinator cannot go on without one of its workers, so the attempt is stopped "
        "and the next one, on the workers left, resumes from the last checkpoint (the "
        "parameter-server global batch is one worker's batch: nothing to re-derive). None = not "
        "elastic: the run fails when the restarts are spent (under parameter_server: exit 1; "
        "re-run with fewer cluster.workers to resume without the lost worker).")
    start_timeout_s: float = Field(120.0, gt=0, description="Seconds to wait for tasks to start.")
    threads_per_task: Annotated[int, Field(ge=0, le=MAX_THREADS_PER_TASK, strict=True)] | \
            Literal["auto"] = Field(
        "auto", description=f"intra-op threads per task, 0 to {MAX_THREADS_PER_TASK} (an integer, "
        "not a boolean); 0 = TF default (every core). 'auto': on "
        "local and local-Ray clusters, this machine's cores divided by the tasks sharing them "
        "(workers + ps + coordinator), at least 1; elsewhere TF's default. Measured on 2 cores: "
        "1 thread per task was faster in every alternating pair for multi_worker (+7 to +13 %) "
        "and parameter_server (+6 to +7 %) (docs/benchmarks.md).")

    port_base: int = Field(8888, ge=1024, le=65535, description="slurm: first port of the tasks "
                           "on each node (SlurmClusterResolver's port_base); jobset: every pod's "
                           "port.")
    allow_oversubscription: bool = Field(
        False, description="local: start more than 4 tasks per CPU core (at least 8 in all); "
        "refused otherwise before anything starts.")
    allow_network_exposure: bool = Field(
        False, description="local: start the tasks even where kerasdist cannot isolate them in a "
        "private network namespace. TensorFlow binds every task server to all interfaces with no "
        "authentication, so without isolation any host that can reach this machine can run ops "
        "in them (read files, for example).")
    address: str | None = Field(
        None, min_length=1, description="ray: None = start a local Ray for this run (in a private "
        "network namespace, shut down at the end); 'auto' = the Ray cluster already running on "
        "this machine; 'HOST:PORT' = that cluster's GCS address (left running).")
    resize_check_s: float = Field(
        60.0, gt=0, allow_inf_nan=False, description="ray, with min_workers: seconds between Ray "
        "Train's checks whether a smaller group can grow (ScalingConfig."
        "elastic_resize_monitor_interval_s); growing restarts the group from the last backup.")
    cpus_per_worker: float = Field(1.0, gt=0, allow_inf_nan=False,
                                   description="ray: logical CPUs each worker reserves.")
    gpus_per_worker: float = Field(0.0, ge=0, allow_inf_nan=False,
                                   description="ray: GPUs each worker reserves (0 = none).")

    @field_validator("preemption_signal", mode="before")
    @classmethod
    def _signal_name(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        name = value.strip().upper().removeprefix("SIG")
        if name not in PREEMPTION_SIGNALS:
            raise ValueError(f"cluster.preemption_signal must name one of "
                             f"{', '.join(PREEMPTION_SIGNALS)} (with or without 'SIG'). "
                             f"Received: {value!r}")
        return name

    @model_validator(mode="after")
    def _min_workers_within_workers(self) -> ClusterConfig:
        if self.min_workers is not None and self.kind not in ("local", "ray"):
            raise ValueError("cluster.min_workers is for cluster.kind 'local' and 'ray' only. "
                             "Received: "
                             f"kind='{self.kind}', min_workers={self.min_workers}")
        if self.min_workers is not None and self.min_workers > self.workers:
            raise ValueError(f"cluster.min_workers must be <= cluster.workers. Received: "
                             f"min_workers={self.min_workers}, workers={self.workers}")
        return self

    @model_validator(mode="after")
    def _ray_fields_only_on_ray(self) -> ClusterConfig:
        if self.kind != "ray" and self.address is not None:
            raise ValueError("cluster.address is for cluster.kind 'ray' only. Received: "
                             f"kind='{self.kind}', address={self.address!r}")
        return self


# ------------------------------------------------------------------------------------- trainer
class CheckpointConfig(_Frozen):
    """Checkpoints of model + optimizer + progress, written with ``tf.train.CheckpointManager``."""

    enabled: bool = True
    max_to_keep: int = Field(3, ge=1)
    every_steps: int | None = Field(None, gt=0, description="Also save every N optimizer steps "
                                    "(multi_worker: the backup a restarted cluster resumes from; "
                                    "parameter_server: the coordinator joins the workers, then "
                                    "saves, at the first scheduled call's end at or after each "
                                    "multiple); None = at epoch ends only.")


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
    tracking: TrackingConfig | None = Field(None, description="Experiment tracking ({kind: "
                                            "mlflow, uri: ...}); None = none.")

    @field_validator("run_dir", mode="before")
    @classmethod
    def _named_dir(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise ValueError("output.run_dir must name a directory (an empty string would be the "
                             f"current directory). Received: run_dir={value!r}")
        return value


# -------------------------------------------------------------------------------------- recipe
class Recipe(_Frozen):
    """A whole training recipe. Every field: docs/recipes.md (generated from this schema)."""

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    strategy: StrategyConfig = DefaultStrategyConfig()
    cluster: ClusterConfig = ClusterConfig()
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
        kind, traits, cluster = self.strategy.kind, self.strategy.traits, self.cluster
        why = dict(traits.refusals).get(cluster.kind)
        if why:
            raise ValueError(f"strategy '{kind}' cannot run on cluster.kind '{cluster.kind}': "
                             f"{why}. Received: kind='{cluster.kind}'")
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

    def intra_op_threads(self, cores: int | None = None) -> int:
        """The intra-op threads of each task: ``cluster.threads_per_task`` resolved.

        ``'auto'`` on a ``local`` cluster (or a ``ray`` cluster started here, no
        ``cluster.address``) of 2 or more tasks is ``max(1, cores // tasks)``, with tasks =
        workers + ps + the coordinator (parameter server): the tasks share this machine's cores,
        and TensorFlow's default (every core for every task) oversubscribes them. Otherwise
        ``'auto'`` is 0 (TensorFlow's default). Tasks receive the resolved number in their
        recipe, so a task never resolves ``'auto'`` itself.

        Args:
            cores: CPU cores of this machine; default ``os.cpu_count()``.

        Returns:
            Threads per task, >= 0 (0 = TensorFlow's default).
        """
        import os

        value, cluster = self.cluster.threads_per_task, self.cluster
        if value != "auto":
            return value
        if cluster.kind == "local" or (cluster.kind == "ray" and cluster.address is None):
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
