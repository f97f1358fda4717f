"""The ``cluster`` section of a recipe: one frozen model per cluster kind, and their registry.

Each config class holds only its kind's fields and declares its :class:`ClusterTraits`; a value a
kind does not take from the recipe is a class constant, so every kind answers ``workers``, ``ps``,
``max_restarts`` and ``min_workers`` (docs/architecture.md, "Adding a cluster kind").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from kerasdist.config._base import Frozen, KindedSection

MAX_THREADS_PER_TASK = 1024
"""Most intra-op threads a task may be given (``cluster.threads_per_task``, ``--threads-per-task``;
above 768, the hardware threads of a 2 x 192-core machine); TensorFlow aborts a task above it."""

PreemptionSignal = Literal["USR1", "TERM", "INT", "HUP", "ALRM", "XCPU", "QUIT"]
PREEMPTION_SIGNALS: tuple[str, ...] = PreemptionSignal.__args__
"""Names ``cluster.preemption_signal`` takes (without ``SIG``): signals a process can catch that
Slurm's ``--signal`` can send, except ``USR2`` (kerasdist's release signal under Slurm)."""
DEFAULT_PREEMPTION_SIGNAL = "USR1"


@dataclass(frozen=True)
class ClusterTraits:
    """What a cluster kind is, declared once on its config class.

    Attributes:
        starts_tasks: kerasdist starts the task processes itself (local, ray).
        roles_from_environment: each task is started by someone else and reads its role from its
            environment (``TF_CONFIG``, Slurm, JobSet).
        elastic: ``min_workers`` (a worker count that may shrink) is supported.
        requeues: a preempted job is requeued by its scheduler; ``preemption_signal`` applies.
        supervised: kerasdist's own supervisor starts and watches the tasks as processes of this
            machine (task logs in ``<run_dir>/logs``, forked tasks, restarts).
        topologies: the strategy topologies (:class:`~kerasdist.config.strategy_configs.
            StrategyTraits`) it runs: ``single`` (one process) or ``peers`` and ``coordinator``.
        refusals: ``(topology, why)`` pairs: why this kind cannot run that topology.
    """

    starts_tasks: bool = False
    roles_from_environment: bool = False
    elastic: bool = False
    requeues: bool = False
    supervised: bool = False
    topologies: tuple[str, ...] = ("peers", "coordinator")
    refusals: tuple[tuple[str, str], ...] = ()

    @property
    def entry(self) -> Literal["command", "task"]:
        """Where a run enters and is checked once (run directory, tracking server): ``task``
        (the chief task) where roles come from the environment, else ``command`` (the command
        that runs the recipe)."""
        return "task" if self.roles_from_environment else "command"


class ClusterConfigBase(Frozen):
    """Base of every ``cluster`` section; subclasses set ``kind`` (a ``Literal``) and ``traits``."""

    kind: str
    traits: ClassVar[ClusterTraits] = ClusterTraits()
    threads_per_task: Annotated[int, Field(ge=0, le=MAX_THREADS_PER_TASK, strict=True)] | \
            Literal["auto"] = Field(
        "auto", description=f"intra-op threads per task, 0 to {MAX_THREADS_PER_TASK}; 0 = TF "
        "default (every core). 'auto': where the tasks share this machine (local, a Ray started "
        "here), its cores divided by the tasks, at least 1; elsewhere 0.")

    def shares_this_machine(self) -> bool:
        """Whether every task of the cluster runs on this machine (``'auto'`` threads split its
        cores between them)."""
        return False

    def cores_here(self, *, coordinator: bool) -> int:
        """CPU cores one run (a sweep's trial) takes on this machine, ``coordinator``: the
        strategy runs a coordinator task besides the workers and ps."""
        return 1


_MAX_RESTARTS = Field(0, ge=0, description="Times the cluster is started again after a lost task, "
                      "resuming from the last backup at its exact step.")
_MIN_WORKERS = Field(
    None, ge=1, description="Elastic worker count: after a lost worker with no restart left, go on "
    "with the workers left, down to this many, from the last backup with the same global batch; "
    "every count must divide data.batch_size. None = not elastic (docs/guarantees.md).")


def _min_within_workers(config):
    if config.min_workers is not None and config.min_workers > config.workers:
        raise ValueError(f"cluster.min_workers must be <= cluster.workers. Received: "
                         f"min_workers={config.min_workers}, workers={config.workers}")
    return config


_EXPOSURE = Field(False, description="Start the tasks even where kerasdist cannot isolate them in "
                  "a private network namespace. TensorFlow binds every task server to all "
                  "interfaces with no authentication: without isolation any host that can reach "
                  "this machine can run ops in them (read files, for example).")
_PORT_BASE = Field(8888, ge=1024, le=65535, description="Port of the task servers (Slurm: the "
                   "first port on each node).")


class ThisProcessClusterConfig(ClusterConfigBase):
    """This process is the whole job (strategies ``default``, ``mirrored``)."""

    traits: ClassVar[ClusterTraits] = ClusterTraits(topologies=("single",))
    kind: Literal["this_process"] = "this_process"
    workers: ClassVar[int] = 1
    ps: ClassVar[int] = 0
    max_restarts: ClassVar[int] = 0
    min_workers: ClassVar[None] = None


class LocalClusterConfig(ClusterConfigBase):
    """kerasdist starts ``workers`` worker tasks and ``ps`` parameter-server tasks on this
    machine, on free localhost ports, each with its own ``TF_CONFIG``, in a private network
    namespace where it can make one."""

    traits: ClassVar[ClusterTraits] = ClusterTraits(starts_tasks=True, elastic=True,
                                                    supervised=True)
    kind: Literal["local"] = "local"
    workers: int = Field(1, ge=1, description="Worker tasks.")
    ps: int = Field(0, ge=0, description="Parameter-server tasks.")
    max_restarts: int = _MAX_RESTARTS
    min_workers: int | None = _MIN_WORKERS
    start_timeout_s: float = Field(120.0, gt=0, description="Seconds to wait for tasks to start.")
    allow_oversubscription: bool = Field(
        False, description="Start more than 4 tasks per CPU core (at least 8 in all); refused "
        "otherwise before anything starts.")
    allow_network_exposure: bool = _EXPOSURE
    _elastic = model_validator(mode="after")(_min_within_workers)

    def shares_this_machine(self) -> bool:
        return True

    def cores_here(self, *, coordinator: bool) -> int:
        return self.workers + self.ps + (1 if coordinator else 0)


class TFConfigClusterConfig(ClusterConfigBase):
    """Each task takes the role named by its ``TF_CONFIG`` environment variable (or the
    ``--job-name/--task-index/--ps-hosts/--worker-hosts`` flags): real machines."""

    traits: ClassVar[ClusterTraits] = ClusterTraits(roles_from_environment=True)
    kind: Literal["tf_config"] = "tf_config"
    workers: int = Field(1, ge=1, description="Worker tasks that ``kerasdist export tfjob`` writes; "
                         "a running task takes the cluster from TF_CONFIG.")
    ps: int = Field(0, ge=0, description="Parameter-server tasks that ``kerasdist export tfjob`` "
                    "writes; a running task takes the cluster from TF_CONFIG.")
    max_restarts: int = Field(0, ge=0, description="Restarts of a failed pod that ``kerasdist "
                              "export tfjob`` writes (runPolicy.backoffLimit).")
    min_workers: ClassVar[None] = None


class SlurmClusterConfig(ClusterConfigBase):
    """Each task takes its role from its Slurm job step (``SlurmClusterResolver``), one task per
    node or per ``srun`` task (``kerasdist export slurm``)."""

    traits: ClassVar[ClusterTraits] = ClusterTraits(roles_from_environment=True, requeues=True)
    kind: Literal["slurm"] = "slurm"
    workers: int = Field(1, ge=1, description="When set, the job step's task count must match "
                         "(exit 2 otherwise).")
    ps: int = Field(0, ge=0, description="Parameter-server tasks (the first tasks of the step).")
    max_restarts: int = Field(0, ge=0, description="Requeues a preempted job may ask for "
                              "(SLURM_RESTART_COUNT below it; a job requeued more often is "
                              "refused at start, exit 2).")
    min_workers: ClassVar[None] = None
    preemption_signal: PreemptionSignal = Field(
        DEFAULT_PREEMPTION_SIGNAL, description="The signal (besides SIGTERM and SIGINT) that stops "
        "training at one agreed step with a checkpoint, then task 0 requeues the job; with or "
        "without 'SIG', any case: " + ", ".join(PREEMPTION_SIGNALS) + ".")
    port_base: int = _PORT_BASE

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


class JobSetClusterConfig(ClusterConfigBase):
    """Each task takes its role from its Kubernetes JobSet pod (``kerasdist export jobset``): its
    replicated job and completion index, the peers' DNS names; in a Kubeflow Trainer v2 TrainJob
    (``kerasdist export trainjob``), its rank in the replicated job ``node``."""

    traits: ClassVar[ClusterTraits] = ClusterTraits(roles_from_environment=True)
    kind: Literal["jobset"] = "jobset"
    workers: int = Field(1, ge=1, description="Worker tasks.")
    ps: int = Field(0, ge=0, description="Parameter-server tasks.")
    max_restarts: int = Field(0, ge=0, description="The JobSet's failurePolicy.maxRestarts.")
    min_workers: ClassVar[None] = None
    port_base: int = _PORT_BASE


_PS_ON_RAY = (
    "coordinator", "Ray Train's TensorFlow backend starts one group of identical workers and gives "
    "them a worker-only TF_CONFIG; a parameter-server cluster needs ps tasks that only serve "
    "variables and a coordinator that schedules steps onto the workers, roles Ray Train does not "
    "place. Use strategy.kind multi_worker on Ray, or parameter_server with cluster.kind local, "
    "tf_config or slurm")


class RayClusterConfig(ClusterConfigBase):
    """``workers`` Ray Train workers (``TensorflowTrainer``), each one multi-worker task; needs
    ``pip install 'kerasdist[ray]'`` (docs/ray.md)."""

    traits: ClassVar[ClusterTraits] = ClusterTraits(starts_tasks=True, elastic=True,
                                                    topologies=("peers",), refusals=(_PS_ON_RAY,))
    kind: Literal["ray"] = "ray"
    workers: int = Field(1, ge=1, description="Ray Train workers (worker tasks).")
    ps: ClassVar[int] = 0
    max_restarts: int = _MAX_RESTARTS
    min_workers: int | None = _MIN_WORKERS
    address: str | None = Field(
        None, min_length=1, description="None = start a local Ray for this run (in a private "
        "network namespace, shut down at the end); 'auto' = the Ray cluster already running on "
        "this machine; 'HOST:PORT' = that cluster's GCS address (left running).")
    resize_check_s: float = Field(
        60.0, gt=0, allow_inf_nan=False, description="With min_workers: seconds between Ray "
        "Train's checks whether a smaller group can grow (ScalingConfig."
        "elastic_resize_monitor_interval_s); growing restarts the group from the last backup.")
    cpus_per_worker: float = Field(1.0, gt=0, allow_inf_nan=False,
                                   description="Logical CPUs each worker reserves.")
    gpus_per_worker: float = Field(0.0, ge=0, allow_inf_nan=False,
                                   description="GPUs each worker reserves (0 = none).")
    allow_network_exposure: bool = _EXPOSURE
    _elastic = model_validator(mode="after")(_min_within_workers)

    def shares_this_machine(self) -> bool:
        return self.address is None

    def cores_here(self, *, coordinator: bool) -> int:
        return max(1, round(self.workers * self.cpus_per_worker))


def fields_of_other_kinds(kind: str, keys) -> dict[str, list[str]]:
    """``{key: [kinds that have it]}`` for each of ``keys`` that ``kind``'s class lacks but
    another kind's has (keys no kind has are left to the schema's unknown-key error)."""
    classes = CLUSTERS.classes()
    own = classes[kind].model_fields
    return {key: owners for key in keys if key not in own
            for owners in [[k for k, c in classes.items() if key in c.model_fields]]
            if owners}


def as_kind(cluster: ClusterConfigBase, kind: str, **updates: Any) -> ClusterConfigBase:
    """``cluster`` as a config of ``kind``: the fields both kinds have carried over, then
    ``updates``, the others at ``kind``'s defaults.

    Raises:
        KeyError: ``kind`` is not registered; pydantic.ValidationError: a bad update.
    """
    target = CLUSTERS.classes()[kind]
    if isinstance(cluster, target) and not updates:
        return cluster
    shared = {key: value for key, value in cluster.model_dump().items()
              if key in target.model_fields and key != "kind"}
    return target.model_validate({**shared, **updates, "kind": kind})


def _no_field_of_other_kinds(kind: str, value: dict) -> None:
    for key, owners in fields_of_other_kinds(kind, value).items():
        raise ValueError(f"cluster.{key} is not a field of cluster.kind '{kind}'; it belongs to "
                         f"{', '.join(repr(k) for k in owners)}. Received: kind='{kind}', "
                         f"{key}={value[key]!r}")


def check_fits_strategy(cluster: ClusterConfigBase, strategy) -> None:
    """Refuse a cluster kind the strategy cannot run on, or ps tasks it has no use for.

    Raises:
        ValueError: names the strategy, the cluster kind or ``cluster.ps`` and the value.
    """
    kind, traits = strategy.kind, strategy.traits
    why = dict(cluster.traits.refusals).get(traits.topology)
    if why:
        raise ValueError(f"strategy '{kind}' cannot run on cluster.kind '{cluster.kind}': "
                         f"{why}. Received: kind='{cluster.kind}'")
    if traits.topology not in cluster.traits.topologies:
        fits = [k for k, c in CLUSTERS.classes().items() if traits.topology in c.traits.topologies]
        raise ValueError(f"strategy '{kind}' needs cluster.kind "
                         f"{' or '.join(repr(k) for k in fits)}. Received: kind='{cluster.kind}'")
    if traits.needs_ps and cluster.traits.starts_tasks and cluster.ps < 1:
        raise ValueError(f"cluster.ps must be >= 1 for strategy '{kind}'. "
                         f"Received: ps={cluster.ps}")
    if not traits.needs_ps and cluster.ps:
        raise ValueError(f"strategy '{kind}' has no parameter servers; cluster.ps must be "
                         f"0. Received: ps={cluster.ps}")


CLUSTERS = KindedSection("cluster", ClusterConfigBase, ClusterTraits, (
    ThisProcessClusterConfig, LocalClusterConfig, TFConfigClusterConfig, SlurmClusterConfig,
    JobSetClusterConfig, RayClusterConfig), default="this_process", what="cluster kind",
    check=_no_field_of_other_kinds)
"""The cluster kinds recipes accept."""
register_cluster_config, cluster_config_classes = CLUSTERS.register, CLUSTERS.classes
ClusterConfig = CLUSTERS.annotated()
