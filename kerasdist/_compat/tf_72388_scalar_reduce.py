"""Mend for tensorflow/tensorflow#72388: ``strategy.reduce("MEAN", v, axis=0)`` on scalar logs.

Upstream: https://github.com/tensorflow/tensorflow/issues/72388. After every train/test step,
Keras's ``reduce_per_replica`` averages the step's logs across the workers of a multi-worker
``MultiWorkerMirroredStrategy`` with ``strategy.reduce("MEAN", value, axis=0)``; the logs are
scalars, and ``Strategy.reduce`` first sums along the axis: "Invalid reduction dimension 0 for
input with 0 dimensions".

Mend: for a multi-worker strategy and the ``"auto"``/``"mean"`` reduction, every scalar log is
averaged with ``axis=None`` (one all-reduce per step, the scalars packed into one vector); values
of rank >= 1 go to the unmodified function. For ``predict`` (``"concat"``) of a mixed_bfloat16
model, bfloat16 outputs are gathered as float32 and cast back (no bfloat16 all-gather kernel).
"""

from __future__ import annotations

import functools
import types

from kerasdist._compat import _patch
from kerasdist._compat._fakes import fake_multi_worker_strategy, is_multi_worker

NAME = "tensorflow#72388"
ISSUE = "https://github.com/tensorflow/tensorflow/issues/72388"


def _trainer_module():
    from keras.src.backend.tensorflow import trainer

    return trainer


def _mean_of_scalars(values, strategy, original, reduction):
    """Reduce the scalar leaves of ``values`` together with one MEAN all-reduce."""
    import tensorflow as tf

    leaves = tf.nest.flatten(values)
    scalar_ids = [i for i, v in enumerate(leaves)
                  if getattr(getattr(v, "shape", None), "rank", None) == 0]
    if scalar_ids:
        packed = tf.stack([tf.cast(leaves[i], tf.float32) for i in scalar_ids])
        means = strategy.reduce("MEAN", packed, axis=None)
        for position, i in enumerate(scalar_ids):
            leaves[i] = tf.cast(means[position], leaves[i].dtype)
    scalar_set = set(scalar_ids)
    rest = [i for i in range(len(leaves)) if i not in scalar_set]
    if rest:
        reduced = original([leaves[i] for i in rest], strategy, reduction)
        for i, value in zip(rest, reduced, strict=True):
            leaves[i] = value
    return tf.nest.pack_sequence_as(values, leaves)


def _concat_via_float32(values, strategy, original, reduction):
    """``predict``'s cross-worker concat of bfloat16 outputs (mixed_bfloat16 models): TF's
    all-gather has no bfloat16 kernel ("DataType bfloat16 not in list of allowed values"), so
    gather them as float32 (exact: every bfloat16 is a float32) and cast back."""
    import tensorflow as tf

    def is_bf16(v):
        return getattr(v, "dtype", None) == tf.bfloat16

    def widen(v):
        if isinstance(v, tf.distribute.DistributedValues):
            parts = strategy.experimental_local_results(v)
            if parts and is_bf16(parts[0]):
                return strategy.run(lambda t: tf.cast(t, tf.float32), args=(v,))
        elif is_bf16(v):  # one local replica: a plain tensor
            return tf.cast(v, tf.float32)
        return v

    flat = tf.nest.flatten(values, expand_composites=False)
    narrow = [any(is_bf16(p) for p in strategy.experimental_local_results(v))
              if isinstance(v, tf.distribute.DistributedValues) else is_bf16(v) for v in flat]
    if not any(narrow):
        return original(values, strategy, reduction)
    widened = tf.nest.pack_sequence_as(values, [widen(v) for v in flat])
    out = tf.nest.flatten(original(widened, strategy, reduction))
    return tf.nest.pack_sequence_as(
        values, [tf.cast(o, tf.bfloat16) if n else o for o, n in zip(out, narrow, strict=True)])


def _mended(original):
    @functools.wraps(original)
    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and is_multi_worker(strategy):
            return _mean_of_scalars(values, strategy, original, reduction)
        if reduction == "concat" and is_multi_worker(strategy):
            return _concat_via_float32(values, strategy, original, reduction)
        return original(values, strategy, reduction)

    return reduce_per_replica


def _patches():
    return [_patch.Patch(_trainer_module(), "reduce_per_replica", _mended)]


installed, install, uninstall = _patch.functions(__name__)  # see _patch.functions


def bug_present() -> bool:
    """Probe: does the unmodified ``reduce_per_replica`` ask a multi-worker strategy for
    ``reduce("MEAN", <scalar>, axis=0)``?

    Runs it on a fake multi-worker ``MultiWorkerMirroredStrategy`` that records reduce calls (no
    cluster, no TF op). The TF half (``Strategy.reduce`` rejecting ``axis=0`` on a scalar) is
    checked by ``tests/unit/test_compat.py``, where running TF ops is allowed.
    """
    strategy = fake_multi_worker_strategy()
    scalar = types.SimpleNamespace(shape=types.SimpleNamespace(rank=0))  # a rank-0 log, no TF op
    try:
        _patch.original(_trainer_module(), "reduce_per_replica")({"loss": scalar}, strategy, "auto")
    except (AttributeError, TypeError):
        return False
    return any(c.axis == 0 and getattr(getattr(c.value, "shape", None), "rank", None) == 0
               for c in strategy.calls)
