"""``multi_worker``: synchronous data parallelism over worker processes (``MultiWorkerMirroredStrategy``).

Every worker holds a full copy of the variables; each step's gradients are all-reduced, so all workers
stay identical. Create the strategy before any other TensorFlow op runs in the process (TF configures
its collective ops at startup).
Source: https://www.tensorflow.org/api_docs/python/tf/distribute/MultiWorkerMirroredStrategy
"""

from __future__ import annotations

import contextlib
import re

from kerasdist.config.schema import MultiWorkerStrategyConfig
from kerasdist.errors import ClusterError, RecipeError, TaskFailedError
from kerasdist.strategies.base import Strategy

IMPLEMENTATIONS = {"auto": "AUTO", "ring": "RING", "nccl": "NCCL"}


def communication_options(config):
    """``tf.distribute.experimental.CommunicationOptions`` from a ``MultiWorkerStrategyConfig``.

    ``implementation`` from ``config.communication`` (auto/ring/nccl -> ``AUTO``/``RING``/``NCCL``);
    ``bytes_per_pack`` (bytes, 0 = automatic): one collective per pack of about that size. No
    ``timeout_seconds`` (a TF thread per collective): ``config.timeout_s`` is enforced by the
    process's collective watchdog and the heartbeats (:func:`configure_heartbeat`).

    Raises:
        RecipeError: a value TF refuses (configs built with ``model_construct``), naming the field.

    Source: https://www.tensorflow.org/api_docs/python/tf/distribute/experimental/CommunicationOptions
    """
    import tensorflow as tf

    if config.communication not in IMPLEMENTATIONS:
        raise RecipeError(f"strategy.communication must be one of {sorted(IMPLEMENTATIONS)}. "
                          f"Received: communication={config.communication!r}")
    implementation = getattr(tf.distribute.experimental.CommunicationImplementation,
                             IMPLEMENTATIONS[config.communication])
    try:
        return tf.distribute.experimental.CommunicationOptions(
            implementation=implementation, bytes_per_pack=int(config.bytes_per_pack))
    except ValueError as err:
        raise RecipeError(f"strategy: TensorFlow refused the all-reduce options ({err}). Received: "
                          f"bytes_per_pack={config.bytes_per_pack}") from None


def build(config, *, cluster_resolver=None, **_):
    """Return a ``MultiWorkerMirroredStrategy`` for this task.

    Args:
        config: a ``MultiWorkerStrategyConfig``; see :func:`communication_options` and
            :func:`configure_heartbeat` (``timeout_s``, seconds).
        cluster_resolver: this task's cluster and role, e.g. ``TFConfig.cluster_resolver()``
            or a ``SlurmClusterResolver``; ``None`` reads ``TF_CONFIG`` (TF's default).

    Returns:
        The strategy; ``num_replicas_in_sync`` = workers x local devices.

    Raises:
        ClusterError: TensorFlow was initialised before the strategy was created, or the
            cluster cannot be set up (the message says which).
    """
    import tensorflow as tf

    resolver = cluster_resolver or tf.distribute.cluster_resolver.TFConfigClusterResolver()
    try:
        configure_heartbeat(resolver, config.timeout_s)
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=cluster_resolver, communication_options=communication_options(config))
    except RuntimeError as err:
        task = "this task"
        if cluster_resolver is not None:
            task = f"task {cluster_resolver.task_type}:{cluster_resolver.task_id}"
        raise ClusterError(f"strategy 'multi_worker': cannot start on {task}: {err}. Create the "
                           "strategy before any other TensorFlow op runs in the process.") from None


def configure_heartbeat(cluster_resolver, timeout_s: float) -> bool:
    """Make TF's coordination service wait ``timeout_s`` seconds (``strategy.timeout_s``) for a
    task's heartbeat before it declares the task lost, instead of TF's fixed 10 s.

    A task that misses its heartbeats for ``timeout_s`` makes the service abort the others'
    collectives (``UnavailableError`` naming it). Only clusters of two or more chief/worker tasks
    are configured; a coordination service already configured is left alone.

    Returns:
        Whether the service was configured here.
    """
    from kerasdist._compat import internals

    spec = cluster_resolver.cluster_spec()
    if sum(spec.num_tasks(job) for job in ("chief", "worker") if job in spec.jobs) < 2:
        return False
    return internals.configure_coordination_heartbeat(spec, heartbeat_timeout_s=timeout_s)


def num_workers(tf_strategy) -> int:
    """Worker processes (chief + workers) of a multi-worker strategy's cluster."""
    jobs = tf_strategy.cluster_resolver.cluster_spec().as_dict()
    return sum(len(jobs.get(job, ())) for job in ("chief", "worker"))


def lost_tasks(message: str, task_name: str) -> list[str]:
    """Task names (``worker:1``) other than ``task_name`` mentioned in a TF error message."""
    found = {f"{job}:{index}" for job, index in
             re.findall(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)", message)}
    found.discard(task_name)
    return sorted(found)


def _addresses(tf_config) -> dict[str, str]:
    return {f"{job}:{index}": address for job, addresses in tf_config.cluster.items()
            for index, address in enumerate(addresses)}


def peer_error(err, tf_config, start_step: int, timeout_s: float) -> TaskFailedError:
    """The :class:`TaskFailedError` for a failed collective, naming each lost task with its state
    and address (``worker:2 (unreachable, 10.77.5.3:4021)``): the tasks TF's message names (only
    those a liveness probe finds not alive, if any: TF's chained messages also name tasks that
    merely relayed the error), else every peer the probe finds not alive."""
    from kerasdist.cluster.probe import unresponsive_peers

    states = unresponsive_peers(tf_config)
    lost = lost_tasks(err.message, tf_config.task_name)
    if any(task in states for task in lost):
        lost = [task for task in lost if task in states]
    lost = lost or sorted(states)
    where = _addresses(tf_config)
    named = [f"{task} ({', '.join(p for p in (states.get(task), where.get(task)) if p)})"
             for task in lost]
    who = f"lost task {', '.join(named)}" if lost else "lost contact with a peer task"
    lines = [line.strip() for line in err.message.splitlines() if line.strip()]
    telling = [line for line in lines
               if re.search(r"task:\d|aborted|unhealthy|[Tt]ime(d )?out|[Dd]eadline", line)]
    first = (telling or lines or [""])[0]
    failure = TaskFailedError(
        f"task {tf_config.task_name}: {who} during training ({type(err).__name__}; "
        f"strategy.timeout_s {timeout_s:.0f} s, started at global step {start_step}); restart the cluster "
        f"to resume from the last backup. Received: {first[:300]}")
    failure.lost_tasks = lost
    return failure


def check_same_step(tf_strategy, step: int, *, task: str, run_dir, watchdog=None) -> None:
    """Collective: every worker restored the same global step, else ClusterError naming them;
    ``watchdog`` bounds the wait to :data:`BOUNDARY_TIMEOUT_FACTOR` x its ``timeout_s``."""
    import tensorflow as tf

    @tf.function
    def gather(value):
        return tf_strategy.gather(tf_strategy.run(lambda v: tf.reshape(v, [1]), args=(value,)),
                                  axis=0)

    guard = contextlib.nullcontext() if watchdog is None else watchdog.guard(
        "the restored-step check", BOUNDARY_TIMEOUT_FACTOR * watchdog.timeout_s)
    with guard:
        steps = [int(s) for s in gather(tf.constant(step, tf.int64)).numpy()]
    if len(set(steps)) > 1:
        per_replica = ", ".join(f"replica {i}: step {s}" for i, s in enumerate(steps))
        raise ClusterError(
            f"task {task}: the workers restored different checkpoints ({per_replica}); "
            f"output.run_dir must be on a filesystem every worker sees. Received: run_dir='{run_dir}'")


BOUNDARY_TIMEOUT_FACTOR = 3
"""An epoch boundary's barrier waits up to this many times ``strategy.timeout_s``."""


def boundary_barrier(tf_strategy, timeout_s: float, watchdog=None):
    """A Keras callback: every worker meets the others (one all-reduce of a scalar) before each
    epoch's first step and before each validation, so the stretches where workers work alone get
    their own, longer bound than one step's (docs/guarantees.md).

    Args:
        tf_strategy: the ``MultiWorkerMirroredStrategy``.
        timeout_s: seconds the barrier waits for every worker (kerasdist passes
            :data:`BOUNDARY_TIMEOUT_FACTOR` x ``strategy.timeout_s``).
        watchdog: the process's ``CollectiveWatchdog``, armed for ``timeout_s`` (None: unbounded).

    Returns:
        A ``keras.callbacks.Callback`` (one traced function, run at ``on_epoch_begin`` and
        ``on_test_begin``; place it after every other callback).
    """
    import keras
    import tensorflow as tf

    @tf.function
    def all_reduce():
        def replica():
            return tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, tf.constant(1.0))

        return tf_strategy.run(replica)

    def meet(where):
        if watchdog is None:
            return all_reduce()
        with watchdog.guard(f"the barrier {where}", timeout_s):
            return all_reduce()

    class BoundaryBarrier(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            meet(f"before epoch {epoch + 1}")

        def on_test_begin(self, logs=None):
            meet("before evaluation")

    return BoundaryBarrier()


def uneven_eval_fn(eval_fn):
    """``eval_fn`` whose per-worker datasets have no known length, so that evaluation under
    ``MultiWorkerMirroredStrategy`` counts every example once when the shards are uneven.

    With a known local cardinality uneven shards would make workers run different step counts
    (mismatched collectives); without it Keras steps until the iterator ends on every worker, an
    exhausted worker evaluating an empty batch (weight 0).
    """
    import tensorflow as tf

    def fn(ctx):
        return eval_fn(ctx).filter(lambda *_: tf.constant(True))  # cardinality: unknown

    return fn


class MultiWorkerStrategy(Strategy):
    """``strategy.kind: multi_worker``: every worker task runs the lifecycle; Keras ``model.fit``
    in lockstep; the chief writes the outputs.

    ``strategy.timeout_s`` bounds each wait for the other workers through one ``CollectiveWatchdog``
    per process (boundaries and first steps: :data:`BOUNDARY_TIMEOUT_FACTOR` x; docs/guarantees.md)."""

    kind = "multi_worker"
    config_class = MultiWorkerStrategyConfig
    watchdog = None

    def build(self, config, *, cluster_resolver=None):
        from kerasdist.keras.collective_watchdog import CollectiveWatchdog

        tf_strategy = build(config, cluster_resolver=cluster_resolver)
        if self.watchdog is not None:  # an earlier run of this process (the object is shared):
            self.watchdog.close()      # a deadline it left armed (a failed step) must not fire
        self.watchdog = CollectiveWatchdog(float(config.timeout_s))
        return tf_strategy

    def replicas_before_start(self, recipe) -> int | None:
        # One replica per CPU worker; with GPUs the replicas are a multiple of the workers, so the
        # batch must divide by the workers in any case.
        return recipe.cluster.workers if recipe.cluster.traits.supervised else None

    def num_input_pipelines(self, tf_strategy) -> int:
        return num_workers(tf_strategy)

    def make_input(self, recipe, tf_strategy):
        import dataclasses

        data = super().make_input(recipe, tf_strategy)
        if data.eval_fn is None or data.pipelines < 2:
            return data
        return dataclasses.replace(data, eval_fn=uneven_eval_fn(data.eval_fn))

    def make_loop(self):
        from kerasdist.strategies.loops import KerasFitLoop

        def barrier(run):
            from kerasdist.keras.collective_watchdog import CollectiveWatchdog, step_guard

            timeout_s = float(run.recipe.strategy.timeout_s)
            if self.watchdog is None:  # a strategy built elsewhere
                self.watchdog = CollectiveWatchdog(timeout_s)
            return [boundary_barrier(run.tf_strategy, BOUNDARY_TIMEOUT_FACTOR * timeout_s,
                                     self.watchdog),
                    step_guard(self.watchdog, first_step_factor=BOUNDARY_TIMEOUT_FACTOR)]

        return KerasFitLoop(boundary_callbacks=barrier)

    def prepare_model(self, model, config) -> None:
        from kerasdist.keras.compression import compress_gradients

        compress_gradients(model.optimizer, config.gradient_compression)

    def gather_figures(self, tf_strategy):
        """Every worker's figures of the epoch, gathered (one all-gather, bounded as the
        restored-step check): the workers step together, so their rates differ only by what
        each one's clock saw."""
        import tensorflow as tf

        @tf.function
        def gather(row):
            return tf_strategy.gather(tf_strategy.run(lambda r: tf.reshape(r, [1, 4]), args=(row,)),
                                      axis=0)

        def figures(own: dict) -> dict:
            (task, (steps, seconds)), = own.items()
            kind, index = task.rsplit("-", 1)
            row = [float(kind == "chief"), float(index), steps, seconds]
            watch = self.watchdog
            with contextlib.nullcontext() if watch is None else watch.guard(
                    "the per-task figures", BOUNDARY_TIMEOUT_FACTOR * watch.timeout_s):
                rows = gather(tf.constant(row, tf.float64)).numpy()
            return {f"{'chief' if c else 'worker'}-{int(i)}": (n, t) for c, i, n, t in rows}

        return figures

    def after_restore(self, tf_strategy, step: int, *, task, run_dir) -> None:
        check_same_step(tf_strategy, step, task=task, run_dir=run_dir, watchdog=self.watchdog)

    def explain_failure(self, err, *, config, tf_config, start_step: int):
        from kerasdist.errors import PEER_LOST, classify

        if tf_config is None or classify(err) != PEER_LOST or not hasattr(err, "message"):
            return err
        return peer_error(err, tf_config, start_step, config.timeout_s)

    def describe(self, tf_strategy) -> str:
        return (f"{num_workers(tf_strategy)} worker(s), "
                f"{tf_strategy.num_replicas_in_sync} replica(s) in sync")
