"""``parameter_server``: asynchronous training with parameter servers (``ParameterServerStrategy``).

Variables live on the ``ps`` tasks. The *coordinator* (task type ``chief``) creates them, schedules
steps onto the ``worker`` tasks (``ClusterCoordinator``) and owns checkpoints and logs; each worker
applies its gradients without waiting for the others. Keras 3 ``model.fit`` cannot drive this
strategy by itself: kerasdist's coordinator loop (:mod:`kerasdist.keras.ps_fit`) does.
Source: https://www.tensorflow.org/api_docs/python/tf/distribute/ParameterServerStrategy
"""

from __future__ import annotations

import weakref

from kerasdist.config.schema import ParameterServerStrategyConfig
from kerasdist.errors import ClusterError, RecipeError
from kerasdist.strategies.base import Strategy


def make_partitioner(config, num_ps: int):
    """The variable partitioner named by ``config.variable_partitioning``, or None.

    * ``none``: every variable lives whole on one ps task (round-robin over the ps tasks).
    * ``min_size``: ``MinSizePartitioner``: shards along axis 0 of at least ``min_shard_bytes``
      bytes, at most ``max_shards`` (default ``num_ps``) of them.
    * ``fixed`` (or ``max_shards``): ``FixedShardsPartitioner(max_shards or num_ps)``: every
      variable of rank >= 1 in ``min(max_shards, shape[0])`` shards along axis 0.

    Keras 3 trains the shards through :mod:`kerasdist._compat.keras_sharded_variables`.

    Args:
        config: a ``ParameterServerStrategyConfig``.
        num_ps: number of ps tasks in the cluster (>= 1).

    Returns:
        A ``tf.distribute.experimental.partitioners.Partitioner`` or None.

    Source: https://www.tensorflow.org/api_docs/python/tf/distribute/experimental/partitioners
    """
    import tensorflow as tf

    partitioners = tf.distribute.experimental.partitioners
    shards = config.max_shards or num_ps
    if config.variable_partitioning == "min_size":
        return partitioners.MinSizePartitioner(min_shard_bytes=config.min_shard_bytes,
                                               max_shards=shards)
    if config.variable_partitioning in ("fixed", "max_shards"):
        return partitioners.FixedShardsPartitioner(num_shards=shards)
    return None


def build(config, *, cluster_resolver=None, **_):
    """Return a ``tf.distribute.ParameterServerStrategy`` for the cluster the resolver describes.

    Args:
        config: a ``ParameterServerStrategyConfig``.
        cluster_resolver: a ``tf.distribute.cluster_resolver.ClusterResolver`` whose cluster has
            ``worker`` and ``ps`` jobs and whose task is the coordinator (``chief``); default
            ``TFConfigClusterResolver()`` (reads the ``TF_CONFIG`` environment variable).

    Returns:
        The strategy, connected to the running cluster (this process's server started).

    Raises:
        ClusterError: the cluster has no ``ps`` or no ``worker`` task.
    """
    import tensorflow as tf

    resolver = cluster_resolver or tf.distribute.cluster_resolver.TFConfigClusterResolver()
    jobs = resolver.cluster_spec().as_dict()
    num_ps, num_workers = len(jobs.get("ps", [])), len(jobs.get("worker", []))
    if num_ps < 1 or num_workers < 1:
        raise ClusterError(
            "strategy 'parameter_server' needs at least one 'ps' and one 'worker' task in the "
            f"cluster spec. Received: ps={num_ps}, worker={num_workers} "
            f"(jobs: {', '.join(sorted(jobs)) or 'none'})")
    return tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=make_partitioner(config, num_ps))


_SYNC: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # built with strategy.sync: K


class ParameterServerStrategy(Strategy):
    """``strategy.kind: parameter_server``: ps and worker tasks serve; the chief runs kerasdist's
    coordinator loop (:class:`kerasdist.strategies.loops.CoordinatorLoop`)."""

    kind = "parameter_server"
    config_class = ParameterServerStrategyConfig

    def build(self, config, *, cluster_resolver=None):
        strategy = build(config, cluster_resolver=cluster_resolver)
        if config.sync is not None:
            _SYNC[strategy] = config.sync.replicas_to_aggregate
        return strategy

    def replicas_before_start(self, recipe) -> int | None:
        """Synchronous mode on a local cluster: the workers (the global batch splits over them)."""
        sync = recipe.strategy.sync is not None and recipe.cluster.traits.supervised
        return recipe.cluster.workers if sync else None

    def preflight(self, recipe) -> None:
        """Also refuse ``trainer.gradient_accumulation_steps > 1``, and a
        ``strategy.sync.replicas_to_aggregate`` above the workers of a local cluster or above its
        ``cluster.min_workers`` (an attempt on the fewest workers must still aggregate K).

        Raises:
            RecipeError: naming the field and the received value.
        """
        from kerasdist.keras.accumulation import refuse
        from kerasdist.keras.ps_sync import check_replicas

        super().preflight(recipe)
        refuse(recipe, self.kind)
        workers = self.replicas_before_start(recipe)
        if workers:
            k = check_replicas(recipe.strategy.sync.replicas_to_aggregate, workers)
            fewest = getattr(recipe.cluster, "min_workers", None)
            if fewest is not None and recipe.strategy.sync.replicas_to_aggregate and k > fewest:
                raise RecipeError("strategy.sync.replicas_to_aggregate must be <= "
                                  f"cluster.min_workers ({fewest}): an attempt on the fewest "
                                  "workers must still aggregate K gradients per step. "
                                  f"Received: replicas_to_aggregate={k}")

    def num_input_pipelines(self, tf_strategy) -> int:
        """One input pipeline per worker task."""
        return self.num_replicas(tf_strategy)

    def make_input(self, recipe, tf_strategy):
        """The resumable streams every strategy uses (:func:`kerasdist.data.inputs.build_data`),
        one per worker: each step one worker's whole batch (``asynchronous=True``), or with
        ``strategy.sync`` one per-replica batch of every pipeline (read by the coordinator).

        Raises:
            RecipeError: ``gradient_accumulation_steps > 1``; ``replicas_to_aggregate`` above the
                workers (before the run directory is claimed).
        """
        from kerasdist.data.inputs import build_data
        from kerasdist.keras.accumulation import refuse
        from kerasdist.keras.ps_sync import check_replicas

        refuse(recipe, self.kind)  # trainer.gradient_accumulation_steps > 1
        workers = self.num_input_pipelines(tf_strategy)
        if recipe.strategy.sync is None:
            return build_data(recipe, replicas=1, pipelines=workers, asynchronous=True)
        check_replicas(recipe.strategy.sync.replicas_to_aggregate, workers)
        return build_data(recipe, replicas=workers, pipelines=workers)

    def compile_kwargs(self, config) -> dict:
        return {"steps_per_execution": config.steps_per_execution}

    def prepare_model(self, model, config) -> None:
        """Synchronous mode: :func:`kerasdist.keras.ps_sync.sync_replicas`."""
        if config.sync is not None:
            from kerasdist.keras.ps_sync import sync_replicas

            sync_replicas(model, config.sync.replicas_to_aggregate)

    def make_loop(self):
        from kerasdist.strategies.loops import CoordinatorLoop

        return CoordinatorLoop()

    def num_replicas(self, tf_strategy) -> int:
        """Workers (each applies its own updates; none are in sync)."""
        from kerasdist.keras.ps_fit import cluster_spec

        return cluster_spec(tf_strategy).num_tasks("worker")

    def describe(self, tf_strategy) -> str:
        from kerasdist.keras.ps_fit import cluster_spec

        spec = cluster_spec(tf_strategy)
        workers = spec.num_tasks("worker")
        mode = (f"synchronous, {_SYNC[tf_strategy] or workers} of {workers} gradients per step"
                if tf_strategy in _SYNC else "asynchronous")
        return f"{workers} worker(s) and {spec.num_tasks('ps')} ps ({mode})"
