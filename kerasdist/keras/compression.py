"""Optional gradient compression for the multi-worker all-reduce (``strategy.gradient_compression``).

On CPU workers the gradient all-reduce is paid in CPU time: TF's ring all-reduce over gRPC copies
and serialises every byte, which can cost more than the step's forward/backward pass
(``docs/benchmarks-log.md``). Casting the gradients to 16 bits before the all-reduce and back to the
variable dtype after it halves those bytes, as Horovod's ``Compression.fp16`` does
(https://horovod.readthedocs.io/en/stable/api.html). The cost is precision: each worker's gradient
and their sum are rounded to 8 (``bf16``) or 11 (``fp16``) significant bits before the optimizer
(which keeps float32 weights and moments) uses them; ``bf16`` keeps float32's range, ``fp16``
flushes gradients below ~6e-8 to zero. The hook on one optimizer instance:
:mod:`kerasdist._compat.keras_allreduce_hook`.
"""

from __future__ import annotations

from kerasdist._compat.keras_allreduce_hook import HOOK, replace_all_reduce
from kerasdist.errors import RecipeError

__all__ = ["HOOK", "compress_gradients"]


def compress_gradients(optimizer, compression: str):
    """Make ``optimizer`` all-reduce its gradients in 16 bits (``'bf16'``/``'fp16'``); ``'none'``
    leaves it unchanged. Returns the optimizer.

    Raises:
        RecipeError: the installed Keras optimizer has no gradient all-reduce hook.
    """
    if compression == "none":
        return optimizer
    import tensorflow as tf

    wire = {"bf16": tf.bfloat16, "fp16": tf.float16}[compression]
    if not callable(getattr(optimizer, HOOK, None)):
        raise RecipeError(f"strategy.gradient_compression '{compression}' needs the Keras "
                          f"optimizer hook {HOOK}, which this Keras version lacks. "
                          "Received: gradient_compression='" + compression + "'; use 'none'.")

    def all_reduce_compressed(self, grads_and_vars):
        pairs = [(g, v) for g, v in grads_and_vars]
        context = tf.distribute.get_replica_context()
        present = [i for i, (g, _) in enumerate(pairs) if g is not None]
        if context is None or not present:
            return pairs
        reduced = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                     [tf.cast(pairs[i][0], wire) for i in present])
        for i, value in zip(present, reduced, strict=True):
            pairs[i] = (tf.cast(value, pairs[i][0].dtype), pairs[i][1])
        return pairs

    replace_all_reduce(optimizer, all_reduce_compressed)
    return optimizer
