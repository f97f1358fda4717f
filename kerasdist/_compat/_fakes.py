""":func:`is_multi_worker`, and the stand-ins with which the mends' behavioural probes call the
*unmodified* upstream functions: a fake multi-worker strategy that records what it is asked to
reduce, instead of a cluster. Nothing here runs a TensorFlow op: the probes must be safe before
``MultiWorkerMirroredStrategy`` is created (TF refuses to configure collective ops once its
runtime is initialised).
"""

from __future__ import annotations

import contextlib
from typing import Any


def is_multi_worker(strategy: Any) -> bool:
    """True for a ``MultiWorkerMirroredStrategy`` whose cluster has more than one worker task.

    Counts the ``chief`` and ``worker`` tasks of the strategy's public ``cluster_resolver``; a
    strategy without a resolver, or with a one-task cluster, is in single-worker (local) mode.
    """
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return False
    jobs = resolver.cluster_spec().as_dict()
    return sum(len(jobs.get(job, ())) for job in ("chief", "worker")) > 1


class ReduceCall:
    """One recorded ``strategy.reduce(op, value, axis)`` call."""

    def __init__(self, op, value, axis):
        self.op, self.value, self.axis = op, value, axis


def fake_multi_worker_strategy(task_id: int = 0):
    """A ``MultiWorkerMirroredStrategy`` instance (never initialised) of a 2-worker cluster, in
    'multi-worker mode' and seen from ``worker:<task_id>``, whose ``reduce`` records its calls in
    ``.calls`` and returns the value unchanged."""
    import tensorflow as tf

    class _Extended:
        def _in_multi_worker_mode(self):  # what Keras 3.15 asks
            return True

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": ["fake:1", "fake:2"]}), task_type="worker", task_id=task_id)

    class _FakeMWMS(tf.distribute.MultiWorkerMirroredStrategy):
        def __init__(self):  # skip the real constructor: no cluster, no TF runtime
            self._extended = _Extended()
            self.calls: list[ReduceCall] = []

        @property
        def cluster_resolver(self):
            return resolver

        def reduce(self, reduce_op, value, axis):
            self.calls.append(ReduceCall(reduce_op, value, axis))
            return value

        def scope(self):
            return contextlib.nullcontext()

        def experimental_local_results(self, value):
            return tuple(getattr(value, "values", (value,)))

    return _FakeMWMS()


def fake_per_replica(value):
    """A ``tf.distribute.DistributedValues`` holding one local value (no TF op)."""
    import tensorflow as tf

    class _PerReplica(tf.distribute.DistributedValues):
        def __init__(self, v):
            self.values = (v,)

    return _PerReplica(value)
