"""``cluster.kind: ray``: run a multi-worker recipe, or a user's script, on Ray: each Ray Train
worker is one worker task, given a worker-only ``TF_CONFIG`` by Ray (worker 0 is the chief) and
running :mod:`kerasdist.launch.ray_worker` (docs/ray.md: fields, restarts, elastic scaling, addresses).
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerasdist import _log
from kerasdist.errors import ClusterError, KerasdistError, TaskFailedError
from kerasdist.launch import isolation
from kerasdist.launch.clusters.local import LocalKind

if TYPE_CHECKING:
    from kerasdist.config import Recipe
    from kerasdist.training import RunResult

log = _log.get_logger("launch")

INSTALL_HINT = "pip install 'kerasdist[ray]'"
OBJECT_STORE_BYTES = 256 << 20
"""Object store of a local Ray started by kerasdist (training data does not go through it)."""
CONNECT_TIMEOUT_S = 5.0
"""Seconds to wait for a ``HOST:PORT`` Ray address to accept a TCP connection."""


@dataclass(frozen=True)
class RayPlacement:
    """Where and how big the Ray worker group is.

    Attributes:
        workers: Ray Train workers (>= 1), one TF worker task each.
        cpus: logical CPUs each worker reserves (> 0).
        gpus: GPUs each worker reserves (>= 0).
        address: None (start a local Ray), ``auto`` or ``HOST:PORT``.
        max_failures: restarts of the whole group after a lost worker (Ray's FailureConfig).
        min_workers: None (a fixed group of ``workers``) or the fewest workers Ray Train's
            elastic scaling may run the group with (``1 <= min_workers <= workers``).
        resize_check_s: seconds between Ray's checks whether an elastic group can grow
            (``ScalingConfig.elastic_resize_monitor_interval_s``).
    """

    workers: int
    cpus: float = 1.0
    gpus: float = 0.0
    address: str | None = None
    max_failures: int = 0
    min_workers: int | None = None
    resize_check_s: float = 60.0

    @classmethod
    def of(cls, recipe: Recipe) -> RayPlacement:
        c = recipe.cluster
        return cls(workers=c.workers, cpus=c.cpus_per_worker, gpus=c.gpus_per_worker,
                   address=c.address, max_failures=c.max_restarts, min_workers=c.min_workers,
                   resize_check_s=c.resize_check_s)

    @property
    def fewest(self) -> int:
        """Fewest workers the group runs with (``workers`` when not elastic)."""
        return self.workers if self.min_workers is None else self.min_workers

    @property
    def num_workers(self) -> int | tuple[int, int]:
        """Ray Train's ``ScalingConfig(num_workers=...)``: an int, or ``(min, max)`` (elastic)."""
        return self.workers if self.fewest == self.workers else (self.fewest, self.workers)


def require_ray():
    """The ``ray`` module, with Ray Train's TensorFlow trainer importable.

    Raises:
        ClusterError: Ray Train is not installed (exit code 2; says how to install it).
    """
    try:
        import ray
        import ray.train.tensorflow  # noqa: F401
    except ImportError as err:
        raise ClusterError(f"cluster.kind 'ray' needs Ray Train, which is not installed here "
                           f"({err}); install it with {INSTALL_HINT}. Received: "
                           "cluster.kind='ray'") from None
    return ray


def check_elastic(recipe: Recipe) -> None:
    """Refuse an elastic Ray group (``cluster.min_workers``) Ray Train cannot run, or with a worker
    count in ``min_workers..workers`` the global batch (x accumulation steps) does not divide.

    Raises:
        RecipeError: a count in ``min_workers..workers`` does not divide the global batch (exit 2).
        ClusterError: Ray Train V2 is disabled (exit 2).
    """
    from kerasdist.data.pipeline import check_batch_divisible
    from kerasdist.errors import RecipeError
    from kerasdist.keras.accumulation import check_divisible

    c = recipe.cluster
    if c.min_workers is None or c.min_workers == c.workers:
        return
    check_elastic_v2(RayPlacement.of(recipe), flag=f"min_workers={c.min_workers}",
                     what="cluster.min_workers")
    for workers in range(c.min_workers, c.workers + 1):
        try:
            check_batch_divisible(recipe.data.batch_size, workers)
            check_divisible(recipe.data.batch_size, workers,
                            recipe.trainer.gradient_accumulation_steps)
        except RecipeError as err:
            raise RecipeError(f"cluster.min_workers={c.min_workers}, workers={c.workers}: Ray may "
                              f"run the group with {workers} workers, keeping the global batch: "
                              f"{err}") from None


def check_elastic_v2(placement: RayPlacement, *, flag: str,
                     what: str = "--workers MIN:MAX") -> None:
    """Refuse an elastic group (``placement.min_workers`` below ``workers``) where Ray Train V2,
    the only version with elastic scaling, is switched off (``RAY_TRAIN_V2_ENABLED=0``).

    Args:
        flag: the setting as the user gave it, for the message (``--workers 1:2``).
        what: the setting's name (``cluster.min_workers``, ``--workers MIN:MAX``).

    Raises:
        ClusterError: Ray Train V2 is disabled (exit 2).
    """
    if isinstance(placement.num_workers, int):
        return
    setting = os.environ.get("RAY_TRAIN_V2_ENABLED")  # as Ray reads it: on unless not '1'/'true'
    if setting is not None and setting.lower() not in ("1", "true"):
        raise ClusterError(f"{what} on Ray needs Ray Train V2's elastic scaling; "
                           "RAY_TRAIN_V2_ENABLED=0 selects V1, which has none. Received: "
                           f"RAY_TRAIN_V2_ENABLED={setting!r}, {flag}")


def check_address(address: str | None) -> None:
    """Refuse an unreachable ``HOST:PORT`` before anything starts (``auto`` and ``ray://``
    addresses are checked when Ray connects).

    Raises:
        ClusterError: malformed, or nothing accepts a TCP connection there within
            :data:`CONNECT_TIMEOUT_S` (exit code 2).
    """
    if address is None or address == "auto" or address.startswith("ray://"):
        return
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ClusterError(f"cluster.address must be 'auto' or HOST:PORT (the Ray cluster's GCS "
                           f"address). Received: address={address!r}")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as err:
        raise ClusterError(f"cluster.address {address!r}: no Ray cluster reachable there "
                           f"({err.strerror or err}). Received: address={address!r}") from None


@contextlib.contextmanager
def ray_session(placement: RayPlacement):
    """Connect to (or start) Ray and check the worker group fits; shut a local Ray down on exit.

    Raises:
        ClusterError: Ray cannot be reached, or cannot place the workers (exit code 2).
    """
    ray = require_ray()
    started = placement.address is None
    if started:
        cpus = max(os.cpu_count() or 1, math.ceil(placement.workers * placement.cpus))
        # address="local": always a new local Ray. With no address, ray.init joins whatever
        # RAY_ADDRESS or /tmp/ray/ray_current_cluster (left by any `ray start`, even a stopped
        # one) names, and then refuses num_cpus ("When connecting to an existing cluster...").
        ray.init(address="local", num_cpus=cpus, include_dashboard=False,
                 object_store_memory=OBJECT_STORE_BYTES,
                 log_to_driver=True, configure_logging=False, logging_config=_quiet(ray))
        log.info(f"started a local Ray ({cpus} logical CPUs) for this run")
    else:
        try:
            ray.init(address=placement.address, log_to_driver=True, configure_logging=False,
                     logging_config=_quiet(ray))
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise ClusterError(
                f"cluster.address {placement.address!r}: cannot join a Ray cluster there: {err} "
                "(a cluster with token authentication also needs RAY_AUTH_MODE=token and its "
                "token, in ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN). Received: "
                f"address={placement.address!r}") from None
    try:
        _check_fits(ray, placement)
        yield ray
    finally:
        ray.shutdown()  # stops a local Ray; only disconnects from an existing cluster


def _quiet(ray):
    """Ray's own loggers at ERROR: without Ray's dashboard (not in ``ray[train]``) Ray Train's
    placement-group cleaner would log every second that it cannot use the state API."""
    return ray.LoggingConfig(log_level="ERROR")


def _check_fits(ray, placement: RayPlacement) -> None:
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    total = {k: sum(n.get(k, 0.0) for n in nodes) for k in ("CPU", "GPU")}
    fits = sum(min(math.floor(n.get("CPU", 0.0) / placement.cpus),
                   math.floor(n.get("GPU", 0.0) / placement.gpus) if placement.gpus else 1 << 30)
               for n in nodes)
    if fits < placement.fewest:
        raise ClusterError(
            f"cluster.workers: the Ray cluster can place {fits} worker(s) of {placement.cpus:g} "
            f"CPU and {placement.gpus:g} GPU each ({len(nodes)} node(s), {total['CPU']:g} CPU and "
            f"{total['GPU']:g} GPU in all), fewer than asked. Received: workers="
            f"{placement.workers}, " + (f"min_workers={placement.min_workers}, " if
            placement.min_workers is not None else "") + f"cpus_per_worker={placement.cpus:g}, "
            f"gpus_per_worker={placement.gpus:g}")


def fit_on_ray(ray, loop, config: dict[str, Any], placement: RayPlacement, *, storage: Path,
               name: str, keep: int) -> None:
    """Run ``loop(config)`` on every worker of a ``TensorflowTrainer``; return when all finish.

    Raises:
        KerasdistError: the first worker's own kerasdist error (same class), e.g. bad input.
        TaskFailedError: the group failed after ``placement.max_failures`` restarts.
    """
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    resources = {"CPU": placement.cpus, **({"GPU": placement.gpus} if placement.gpus else {})}
    elastic = ({} if isinstance(placement.num_workers, int) else
               {"elastic_resize_monitor_interval_s": placement.resize_check_s})
    trainer = TensorflowTrainer(
        loop, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=placement.num_workers,
                                     use_gpu=placement.gpus > 0, resources_per_worker=resources,
                                     **elastic),
        run_config=RunConfig(name=name, storage_path=str(storage.resolve()),
                             failure_config=FailureConfig(max_failures=placement.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=keep)))
    try:
        trainer.fit()
    except Exception as err:  # Ray's TrainingFailedError and friends: find the workers' cause
        own = _own_error(err)
        if own is not None:
            raise own from None
        raise TaskFailedError(f"Ray training failed after {placement.max_failures} restart(s) "
                              f"(cluster.max_restarts): {str(err).strip()[-2000:]}") from None


def _own_error(err: BaseException) -> KerasdistError | None:
    """The kerasdist error a worker raised, found in Ray's wrapping (worker failures, causes)."""
    seen, todo = set(), [err]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, KerasdistError):
            return e
        failures = getattr(e, "worker_failures", None)
        if isinstance(failures, dict):
            todo += [failures[k] for k in sorted(failures)]
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return None


def train_on_ray(recipe: Recipe, *, overwrite: bool, verbose) -> RunResult:
    """Run ``recipe`` (strategy ``multi_worker``) on Ray; called under the run directory's lock
    (whose token the workers receive), after the launcher's preflight.

    Args:
        overwrite: done by the launcher under the lock; the workers never overwrite.

    Returns:
        the chief's :class:`RunResult` (from ``<run_dir>/metrics.json``).

    Raises:
        ClusterError: Ray missing or unreachable, or the workers do not fit (exit 2).
        KerasdistError: a worker's own error (same class); TaskFailedError: workers lost.
    """
    from kerasdist.launch.plan import worker_recipe
    from kerasdist.launch.ray_worker import recipe_loop
    from kerasdist.training import RunResult, rundir, rundir_lock

    run_dir = rundir.RunDir(Path(recipe.output.run_dir).resolve())
    placement = RayPlacement.of(recipe)
    config = {"recipe": worker_recipe(recipe), "verbose": verbose,
              "lock_token": rundir_lock.lock_token(run_dir.path),
              "threads": recipe.intra_op_threads()}
    with ray_session(placement) as ray:
        log.info(f"Ray: {placement.workers} workers ({placement.cpus:g} CPU, {placement.gpus:g} GPU "
                 f"each); run dir {run_dir.path}; Ray storage {run_dir.ray}")
        fit_on_ray(ray, recipe_loop, config, placement, storage=run_dir.ray,
                   name="train", keep=recipe.trainer.checkpoint.max_to_keep)
    return RunResult.from_metrics(run_dir.metrics)


def script_dry_run(script: str, args: list[str], placement: RayPlacement, *, log_dir: Path,
                   threads: int = 0) -> str:
    """What ``kerasdist launch --ray --dry-run`` prints: the Ray worker group (Ray Train's
    ``ScalingConfig`` and ``FailureConfig``), where Ray runs, and each worker's command. Nothing
    is imported from Ray, connected to or started; the ``TF_CONFIG`` of each worker is Ray's."""
    resources = {"CPU": placement.cpus, **({"GPU": placement.gpus} if placement.gpus else {})}
    n = placement.num_workers
    if isinstance(n, int):
        size = f"num_workers={n}"
        group = f"{n} worker(s), fixed"
    else:
        size = (f"num_workers=({n[0]}, {n[1]}), elastic_resize_monitor_interval_s="
                f"{placement.resize_check_s:g}")
        group = (f"elastic: {n[0]} to {n[1]} workers (Ray Train V2; after a lost worker the group "
                 f"restarts on as many as Ray can place, at least {n[0]}; every "
                 f"{placement.resize_check_s:g} s a smaller group checks whether it can grow)")
    where = ("a local Ray started for this run (private network namespace), stopped at the end"
             if placement.address is None else f"the Ray cluster at {placement.address}")
    command = " ".join([str(Path(script).resolve()), *args])
    return "\n".join([
        f"[ray] {group}",
        f"  ScalingConfig({size}, resources_per_worker={resources}, "
        f"use_gpu={placement.gpus > 0})",
        f"  FailureConfig(max_failures={placement.max_failures})  (--max-restarts)",
        f"  Ray: {where}; Ray storage {Path(log_dir).resolve() / 'ray'}",
        "[worker:<rank>] TF_CONFIG written by Ray (worker-only, index = rank; worker:0 is the "
        "chief)" + (f"; TF_NUM_INTRAOP_THREADS={threads}" if threads else ""),
        f"  kerasdist.enable(); runpy {command}"])


def launch_script(script: str, args: list[str], placement: RayPlacement, *, log_dir: Path,
                  threads: int = 0) -> None:
    """``kerasdist launch --ray``: run a user's script on every Ray worker with kerasdist enabled
    and Ray's TF_CONFIG (worker 0 is the chief, as MultiWorkerMirroredStrategy expects).

    Raises:
        ClusterError: Ray missing or unreachable, or the workers do not fit (exit 2).
        TaskFailedError: a worker's script failed or was lost, after the restarts allowed.
    """
    from kerasdist.launch.ray_worker import script_loop

    check_address(placement.address)
    log_dir = Path(log_dir).resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    config = {"script": str(Path(script).resolve()), "args": list(args), "threads": threads}
    with ray_session(placement) as ray:
        size = (placement.workers if isinstance(placement.num_workers, int) else
                f"{placement.fewest} to {placement.workers} (elastic)")
        log.info(f"Ray: running {script} on {size} workers; Ray storage {log_dir / 'ray'}")
        fit_on_ray(ray, script_loop, config, placement, storage=log_dir / "ray", name="launch", keep=1)


class RayKind(LocalKind):
    """``cluster.kind: ray``: started as a local cluster is (preflight, isolation of a local Ray,
    tracking, the run directory's lock); Ray Train runs the worker group (:func:`train_on_ray`)."""

    def check(self, recipe: Recipe) -> None:
        """Nothing before anything starts: Ray places the workers (:func:`ray_session`)."""

    def isolate(self, recipe: Recipe, callbacks) -> bool:
        """Ray Train installed, an elastic group it can run, no extra callbacks, a reachable
        address; whether the run goes into a private network namespace (a local Ray).

        Raises:
            ClusterError, RecipeError: what cannot run (exit code 2), before anything is written.
        """
        require_ray()
        check_elastic(recipe)
        if callbacks:
            raise ClusterError("extra Python callbacks cannot be sent to Ray workers. "
                               f"Received: callbacks={list(callbacks)!r}")
        if recipe.cluster.address is None:
            return isolation.plan(recipe)
        check_address(recipe.cluster.address)
        return False

    def chief_log(self, recipe: Recipe) -> None:
        """None: Ray forwards its workers' output itself."""
        return None

    def launch_here(self, recipe: Recipe, *, overwrite: bool, verbose, callbacks=()) -> RunResult:
        return train_on_ray(recipe, overwrite=overwrite, verbose=verbose)
