"""Mend: a Keras 3 optimizer's own ``gradient_accumulation_steps=k`` under ``tf.distribute``.

Upstream: keras-team/keras#20582 ("merge_call called while defining a new graph or a
tf.function"): ``BaseOptimizer._backend_apply_gradients`` takes the accumulate-or-update decision
with ``ops.cond`` *inside the replica function*, and both branches of the TensorFlow backend call
``merge_call``, which ``MirroredStrategy``'s replica context refuses inside a ``cond``: ``model.fit``
and ``strategy.run`` loops crash under ``MirroredStrategy`` and ``MultiWorkerMirroredStrategy``.

Mend: ``TFOptimizer.apply`` is wrapped. For an accumulating optimizer called in the replica context
of a ``MirroredStrategy``/``MultiWorkerMirroredStrategy`` that uses ``merge_call``, the gradients
are all-reduced there through the optimizer's own ``_all_reduce_sum_gradients`` (so the 16-bit
hook still applies), divided by the replicas when :mod:`~kerasdist._compat.keras_replica_loss` left
per-replica mean losses, and Keras's unmodified ``apply`` runs in cross-replica context (one
``merge_call``), where the ``ops.cond`` is allowed; anything else runs Keras's code. Keras's
semantics are kept (each ``apply`` is one micro-step; every ``k``-th applies the mean of the ``k``
accumulated global-batch gradients), equal to a strategy-free run on the same global batches
(``tests/integration/test_keras_grad_accum.py``). Not covered: variables with
``overwrite_with_gradient`` (float8) get the all-reduced *sum* of their replicas' values.

Raises (from the wrapped ``apply``, when the step is traced): ``ValueError`` under
``ParameterServerStrategy``, whose accumulators on the ps are shared by asynchronous workers.

Probe: :func:`bug_present` (sources): the base ``_backend_apply_gradients`` still branches on
``gradient_accumulation_steps`` with ``ops.cond`` and the accumulator increment calls ``merge_call``.
"""

from __future__ import annotations

import functools
import inspect

from kerasdist._compat import _patch

NAME = "keras#20582"
ISSUE = "https://github.com/keras-team/keras/issues/20582"
_ARGUMENT = "gradient_accumulation_steps"


def _optimizer_class():
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    return TFOptimizer


def _base_apply():
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    return BaseOptimizer.apply


def bug_present() -> bool:
    """Whether Keras still takes the accumulation ``ops.cond`` in the replica function around a
    ``merge_call`` (source check of the installed Keras; runs no TF op)."""
    optimizer = _optimizer_class()
    decide = inspect.getsource(inspect.unwrap(optimizer._backend_apply_gradients))
    increment = inspect.getsource(optimizer._backend_increment_gradient_accumulators)
    return _ARGUMENT in decide and "ops.cond(" in decide and "merge_call" in increment


def _replica_context_to_mend(optimizer):
    """The replica context in which ``optimizer.apply`` must be moved to cross-replica context,
    or None (run Keras's code). Raises the parameter-server refusal."""
    import tensorflow as tf

    if not getattr(optimizer, _ARGUMENT, None) or not tf.distribute.has_strategy():
        return None
    context = tf.distribute.get_replica_context()
    if context is None:  # cross-replica context: Keras's conds already work there
        return None
    strategy = context.strategy
    if isinstance(strategy, tf.distribute.ParameterServerStrategy):
        _refuse(getattr(optimizer, _ARGUMENT))
    mirrored = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
    if isinstance(strategy, mirrored) and not tf.__internal__.distribute.strategy_supports_no_merge_call():
        return context
    return None


def _refuse(steps) -> None:
    # A plain ValueError: raised while tf.function traces a step, where autograph re-raises only
    # built-in types as they are (kerasdist's UnsupportedFeatureError would reach the user as a
    # StagingError). Keras ``fit`` under kerasdist refuses earlier (kerasdist.keras.ps_fit).
    raise ValueError(
        f"optimizer `{_ARGUMENT}` is not supported under ParameterServerStrategy: its "
        "accumulators and micro-step counter live on the parameter servers and are shared by "
        "asynchronous workers, so the k-th micro-step would apply gradients other workers computed "
        "from other weights, concurrent `acc + g` updates can lose gradients, and a step re-run "
        "after a lost worker would add its gradient twice. Use a larger global batch instead, or "
        f"a synchronous strategy (MultiWorkerMirroredStrategy). Received: {_ARGUMENT}={steps!r}")


def _reduced_gradients(optimizer, grads, variables):
    """The replicas' gradients summed (``None`` kept), as Keras's TF optimizer reduces them; the
    mean when kerasdist left a Keras step's losses unscaled (per-replica means)."""
    import tensorflow as tf

    from kerasdist._compat import keras_replica_loss

    pairs = list(zip(grads, [getattr(v, "value", v) for v in variables], strict=True))
    reduced = [g for g, _ in optimizer._all_reduce_sum_gradients(pairs)]
    if keras_replica_loss.unscaled_losses():
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        reduced = [None if g is None else g / tf.cast(replicas, g.dtype) for g in reduced]
    return reduced


def _mended(original):
    @functools.wraps(original)
    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        context = _replica_context_to_mend(self) if grads else None
        if trainable_variables is None:
            variables = list(self._trainable_variables) if self.built else []
        else:
            variables = list(trainable_variables)
        if context is None or len(variables) != len(grads):  # Keras's answer, errors included
            return original(self, grads, trainable_variables)
        reduced = _reduced_gradients(self, grads, variables)

        def in_cross_replica(distribution, reduced):
            from kerasdist._compat import internals

            local = [None if g is None else distribution.experimental_local_results(g)[0]
                     for g in reduced]
            with internals.direct_merge_calls():
                return original(self, local, variables)

        return context.merge_call(in_cross_replica, args=(reduced,))

    return apply


def _patches():
    # TFOptimizer inherits Keras's ``apply``; uninstall() deletes the override again.
    return [_patch.Patch(_optimizer_class(), "apply", lambda _: _mended(_base_apply()))]


installed, install, uninstall = _patch.functions(__name__)  # see _patch.functions
