"""Mend: Keras 3 optimizers clip and keep EMA per replica, before the all-reduce.

Upstream: no issue found; reproduction (Keras 3.15 / TF 2.21, CPU): on the TensorFlow backend,
``BaseOptimizer._backend_apply_gradients`` runs in *replica* context and clips (``clipnorm``,
``clipvalue``, ``global_clipnorm``) each replica's partial gradient; only later, in
``_backend_update_step``, are the clipped gradients all-reduced. A clipped model under
``MirroredStrategy`` or ``MultiWorkerMirroredStrategy`` with 2 replicas thus ends away from the
single-process run on the same global batches, and ``use_ema`` with ``ema_overwrite_frequency``
calls ``merge_call`` in an ``ops.cond`` inside the replica function, which TensorFlow refuses.

Mend: with 2 or more replicas in sync (mirrored, multi-worker), the gradients are all-reduced in
replica context (the optimizer's own ``_all_reduce_sum_gradients``: the 16-bit hook still
applies), then Keras's unmodified ``_backend_apply_gradients`` runs in cross-replica context (one
``merge_call``): clipping and weight decay see the global-batch gradient, as in one process, and
``_backend_update_step`` does not reduce again. When
:mod:`~kerasdist._compat.keras_replica_loss` left a step's losses as per-replica means, the sum is
divided by the replicas; for a step whose one loss is a ``mean_with_sample_weight`` one, each
replica's gradient is weighed by its sample-weight sum and the sum divided by the global one.
Other strategies run Keras's code, and so does a cross-replica ``apply``
(:mod:`~kerasdist._compat.keras_20582_grad_accum`).

Probe: :func:`bug_present` (sources): clipping still happens in ``_backend_apply_gradients``,
before ``_backend_update_step`` reduces.
"""

from __future__ import annotations

import functools
import inspect

from kerasdist._compat import _patch

NAME = "keras-optimizer-replica-apply"
ISSUE = "no upstream issue found; reproduction in this module's docstring"


def _optimizer_class():
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    return TFOptimizer


def _base_method():
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    return BaseOptimizer._backend_apply_gradients


def bug_present() -> bool:
    """Whether Keras still clips in ``_backend_apply_gradients`` and all-reduces later, in
    ``TFOptimizer._backend_update_step`` (source check, no TF op)."""
    apply_source = inspect.getsource(_base_method())
    update_source = inspect.getsource(_optimizer_class()._backend_update_step)
    return "_clip_gradients" in apply_source and "_all_reduce_sum_gradients" in update_source


def _needs_mend(optimizer) -> bool:
    import tensorflow as tf

    strategy = getattr(optimizer, "_distribution_strategy", None)
    if strategy is None or tf.distribute.get_replica_context() is None:
        return False
    if isinstance(strategy, tf.distribute.ParameterServerStrategy):
        return False
    return strategy.num_replicas_in_sync > 1


def _local(distribution, value):
    """This worker's first replica's value of an all-reduced (identical) gradient."""
    if value is None:
        return None
    return distribution.experimental_local_results(value)[0]


def _scaled(grad, factor, *, divide: bool):
    """``grad`` times (or divided by, ``divide_no_nan``) the scalar ``factor``, of the same kind:
    a sparse gradient (``tf.IndexedSlices``, an ``Embedding``'s) stays sparse. Densifying it
    would make Keras's Adam (and every optimizer with slots) update the rows the batch did not
    touch, where the strategy-free step updates only the touched rows."""
    import tensorflow as tf

    if grad is None:
        return None
    values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
    factor = tf.cast(factor, values.dtype)
    values = tf.math.divide_no_nan(values, factor) if divide else values * factor
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    return values


def _mended(original):
    @functools.wraps(original)
    def _backend_apply_gradients(self, grads, trainable_variables):
        import tensorflow as tf

        if not _needs_mend(self):
            return original(self, grads, trainable_variables)
        from kerasdist._compat import internals, keras_replica_loss

        trainable_variables = list(trainable_variables)
        unscaled = keras_replica_loss.unscaled_losses()
        sums = keras_replica_loss.take_weight_sums() if unscaled else None
        if sums is not None:  # one mean_with_sample_weight loss: weigh by this replica's share
            grads = [_scaled(g, sums[0], divide=False) for g in grads]
        reduced = self._all_reduce_sum_gradients(
            list(zip(grads, [getattr(v, "value", v) for v in trainable_variables],
                     strict=True)))
        reduced = [g for g, _ in reduced]
        if unscaled:  # per-replica mean losses: sum -> mean (of the global batch)
            divisor = sums[1] if sums is not None else self._distribution_strategy.num_replicas_in_sync
            reduced = [_scaled(g, divisor, divide=True) for g in reduced]

        def in_cross_replica(distribution, reduced):
            local = [_local(distribution, g) for g in reduced]
            with internals.direct_merge_calls():
                return original(self, local, trainable_variables)

        return tf.distribute.get_replica_context().merge_call(in_cross_replica, args=(reduced,))

    return _backend_apply_gradients


def _patches():
    # The class inherits Keras's method; uninstall() deletes the override again.
    return [_patch.Patch(_optimizer_class(), "_backend_apply_gradients",
                         lambda _: _mended(_base_method()))]


installed, install, uninstall = _patch.functions(__name__)  # see _patch.functions
