"""``multi_worker``: synchronous data parallelism over worker processes (``MultiWorkerMirroredStrategy``).

Every worker holds a full copy of the variables (initial values broadcast from worker 0); after each
step the gradients are all-reduced with collective ops, so all workers apply the same update and stay
identical. This is the TF2 form of the seed's ``SyncReplicasOptimizer`` training, without parameter
servers. Source: https://www.tensorflow.org/api_docs/python/tf/distribute/MultiWorkerMirroredStrategy

The strategy must be created before any other TensorFlow op runs in the process (TF configures its
collective ops when its runtime starts; afterwards it raises "Collective ops must be configured at
program startup").
"""

from __future__ import annotations

from kerasdist.errors import ClusterError

IMPLEMENTATIONS = {"auto": "AUTO", "ring": "RING", "nccl": "NCCL"}


def communication_options(config):
    """``tf.distribute.experimental.CommunicationOptions`` from a ``MultiWorkerStrategyConfig``.

    ``timeout_seconds=config.timeout_s`` bounds every collective: when a peer dies or hangs, the
    survivors' next all-reduce fails after at most that many seconds instead of waiting forever
    (TF's coordination service usually notices a dead peer sooner, from missed heartbeats).
    Source: https://www.tensorflow.org/api_docs/python/tf/distribute/experimental/CommunicationOptions
    """
    import tensorflow as tf

    implementation = getattr(tf.distribute.experimental.CommunicationImplementation,
                             IMPLEMENTATIONS[config.communication])
    return tf.distribute.experimental.CommunicationOptions(
        implementation=implementation, timeout_seconds=float(config.timeout_s))


def build(config, *, cluster_resolver=None, **_):
    """Return a ``MultiWorkerMirroredStrategy`` for this task.

    Args:
        config: a ``MultiWorkerStrategyConfig`` (``communication``: auto/ring/nccl;
            ``timeout_s``: collective timeout, seconds).
        cluster_resolver: this task's cluster and role, e.g. ``TFConfig.cluster_resolver()``
            or a ``SlurmClusterResolver``; ``None`` reads ``TF_CONFIG`` (TF's default).

    Returns:
        The strategy; ``num_replicas_in_sync`` = workers x local devices.

    Raises:
        ClusterError: TensorFlow was initialised before the strategy was created, or the
            cluster cannot be set up (the message says which).
    """
    import tensorflow as tf

    try:
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=cluster_resolver, communication_options=communication_options(config))
    except RuntimeError as err:
        task = "this task"
        if cluster_resolver is not None:
            task = f"task {cluster_resolver.task_type}:{cluster_resolver.task_id}"
        raise ClusterError(f"strategy 'multi_worker': cannot start on {task}: {err}. Create the "
                           "strategy before any other TensorFlow op runs in the process.") from None
