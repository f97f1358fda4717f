"""Mixed precision (``trainer.precision``) through Keras 3 dtype policies.

* ``float32``: nothing changes.
* ``mixed_bfloat16`` / ``mixed_float16``: the model is *built* under that Keras dtype policy, so
  every layer computes in 16 bits while its variables stay float32; the global policy is set only
  while the builder runs (:func:`policy_scope`). The output layer of a ``keras.Sequential`` is
  switched back to float32 (:func:`float32_output`); other models' losses still compute in
  float32 (a Keras 3 loss casts its inputs to ``floatx()``).
* ``mixed_float16`` wraps the optimizer in ``keras.optimizers.LossScaleOptimizer`` (dynamic loss
  scaling: float16 gradients would underflow); ``bfloat16`` has float32's range.

Source: https://keras.io/api/mixed_precision/policy/ and
https://keras.io/api/mixed_precision/loss_scale_optimizer/
"""

from __future__ import annotations

import contextlib

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")


@contextlib.contextmanager
def policy_scope(precision: str):
    """Make ``precision`` Keras's global dtype policy inside the block (restored on exit)."""
    import keras

    if precision not in PRECISIONS:
        from kerasdist.errors import RecipeError

        raise RecipeError(f"trainer.precision must be one of {', '.join(PRECISIONS)}. "
                          f"Received: precision='{precision}'")
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def float32_output(model, precision: str):
    """Compute the output layer of a mixed-precision ``keras.Sequential`` in float32; other
    models are left as built. Returns the model."""
    import keras

    if precision != "float32" and isinstance(model, keras.Sequential) and model.layers:
        model.layers[-1].dtype_policy = "float32"
    return model


def wrap_optimizer(optimizer, precision: str):
    """``LossScaleOptimizer(optimizer)`` for ``mixed_float16``, else ``optimizer`` unchanged."""
    if precision != "mixed_float16":
        return optimizer
    import keras

    return keras.optimizers.LossScaleOptimizer(optimizer)
