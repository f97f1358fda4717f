"""Mend: metrics created outside ``strategy.scope()`` report each worker's own share.

Upstream: no Keras issue found; reproduction (Keras 3.15 / TF 2.21, ``kerasdist launch --workers
2``): ``metrics = [AUC(), Precision(), Recall()]`` built at the top of a script, then
``compile(metrics=metrics)`` inside ``MultiWorkerMirroredStrategy.scope()``: ``evaluate`` reports
different values on each worker, none equal to a strategy-free ``evaluate``. Cause: a metric built
outside the scope has plain per-process state variables, not ``ON_READ`` ones that a cross-worker
read aggregates (metrics built inside the scope, or given by name, are aggregated by TensorFlow).

Mend: when Keras reads the metric results (``Trainer.get_metrics_result``, at the end of an epoch
or of ``evaluate``) under a multi-worker strategy, the model's non-distributed metric states are
summed over the workers (``"mean"`` ones averaged) with one all-reduce per dtype, ``result()`` is
computed from those totals, and each worker's own states are put back; every worker reads at the
same points, so the collectives pair. Probe: :func:`bug_present` reads
``Trainer.get_metrics_result`` (still no cross-worker step).
"""

from __future__ import annotations

import functools
import inspect

from kerasdist._compat import _patch
from kerasdist._compat._fakes import is_multi_worker

NAME = "keras-metric-states"
ISSUE = "no upstream issue found; reproduction in this module's docstring"
_REDUCE = {"sum": "SUM", "mean": "MEAN"}


def _trainer_class():
    from keras.src.trainers.trainer import Trainer

    return Trainer


def bug_present() -> bool:
    """Whether Keras's ``get_metrics_result`` reads the metrics with no cross-worker step."""
    source = inspect.getsource(_patch.original(_trainer_class(), "get_metrics_result"))
    return "all_reduce" not in source and "strategy" not in source


def _local_variables(model) -> list:
    """The model's metric variables that TensorFlow does not aggregate across workers."""
    import tensorflow as tf

    found = []
    for variable in model.metrics_variables:
        backing = getattr(variable, "_value", variable)  # Keras's wrapper of the TF variable
        if isinstance(backing, tf.distribute.DistributedValues):
            continue
        if getattr(variable, "aggregation", "sum") in _REDUCE:
            found.append(variable)
    return found


def _all_reduce(strategy, variables) -> list:
    """Each variable's value summed (or averaged) over the workers, one all-reduce per group."""
    import tensorflow as tf

    groups: dict[tuple, list[int]] = {}
    for index, variable in enumerate(variables):
        key = (_REDUCE[variable.aggregation], tf.as_dtype(variable.dtype).name)
        groups.setdefault(key, []).append(index)
    local_replicas = len(strategy.extended.worker_devices)
    values = [tf.convert_to_tensor(v.numpy()) for v in variables]
    reduced: list = [None] * len(variables)
    for (op, _), indices in groups.items():
        flat = tf.concat([tf.reshape(values[i], [-1]) for i in indices], axis=0)

        def share(flat=flat, op=op):
            context = tf.distribute.get_replica_context()
            first = tf.equal(context.replica_id_in_sync_group % local_replicas, 0)
            # Every worker's local state once: only its first local replica contributes.
            mine = tf.where(first, flat, tf.zeros_like(flat))
            total = context.all_reduce("SUM", mine)
            if op == "MEAN":
                total = total / tf.cast(strategy.num_replicas_in_sync // local_replicas, total.dtype)
            return total

        total = strategy.experimental_local_results(strategy.run(tf.function(share)))[0]
        offset = 0
        for i in indices:
            size = int(tf.size(values[i]))
            reduced[i] = tf.reshape(total[offset:offset + size], tf.shape(values[i]))
            offset += size
    return reduced


def _mended(original):
    @functools.wraps(original)
    def get_metrics_result(self):
        import tensorflow as tf

        strategy = getattr(self, "distribute_strategy", None)
        in_replica = tf.distribute.has_strategy() and tf.distribute.get_replica_context() is not None
        if not is_multi_worker(strategy) or not tf.executing_eagerly() or in_replica:
            return original(self)  # inside a step: each replica's running value, as Keras does
        variables = _local_variables(self)
        if not variables:
            return original(self)
        own = [v.numpy() for v in variables]
        for variable, total in zip(variables, _all_reduce(strategy, variables), strict=True):
            variable.assign(total)
        try:
            return original(self)
        finally:
            for variable, value in zip(variables, own, strict=True):
                variable.assign(value)

    return get_metrics_result


def _patches():
    return [_patch.Patch(_trainer_class(), "get_metrics_result", _mended)]


installed, install, uninstall = _patch.functions(__name__)  # see _patch.functions
