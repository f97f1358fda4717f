"""Gradient accumulation (``trainer.gradient_accumulation_steps``): one optimizer update, and so one
gradient all-reduce, per ``k`` micro-batches.

One Keras ``fit`` step is still one optimizer update on one global batch of ``data.batch_size``
examples (``optimizer.iterations`` is the global step; checkpoints, resumption, preemption and
throughput are unchanged). Each replica runs forward and backward on its share of that batch in
``k`` sequential micro-batches of ``batch_size / (replicas * k)`` examples, averages their
gradients locally and hands them to the optimizer once: activation memory is one micro-batch's,
so ``data.batch_size: k*b`` with ``k`` steps trains at batch ``b``'s memory with ``1/k`` of the
all-reduces per example. With the losses' ``sum_over_batch_size`` reduction the update equals the
unaccumulated one up to float rounding; layers whose training output depends on the whole batch
(BatchNormalization statistics) see micro-batches instead.

Mechanism: :func:`accumulate_gradients` binds
:func:`kerasdist._compat.keras_accumulation_step.train_step` (a copy of Keras's own, with its probe;
why not Keras's optimizer ``gradient_accumulation_steps`` is said there) to one model instance; the
class, saving and loading are unchanged. The ``k`` micro-batches are unrolled in the traced step
(tracing takes ``k`` times longer), each waiting for the previous one's gradients.
"""

from __future__ import annotations

import types

from kerasdist._compat import keras_accumulation_step
from kerasdist._log import get_logger
from kerasdist.errors import RecipeError

log = get_logger(__name__)

FIELD = "trainer.gradient_accumulation_steps"


def check_divisible(global_batch: int, num_replicas: int, steps: int) -> None:
    """Refuse a global batch that does not split into ``steps`` equal micro-batches per replica.

    Raises:
        RecipeError: ``global_batch % (num_replicas * steps) != 0``.
    """
    if steps > 1 and global_batch % (num_replicas * steps):
        unit = num_replicas * steps
        raise RecipeError(
            f"data.batch_size (the global batch, one optimizer update) must be divisible by "
            f"replicas x {FIELD} ({num_replicas} x {steps} = {unit}): each replica splits its "
            f"share into {steps} equal micro-batches. Received: batch_size={global_batch}; use "
            f"e.g. {max(unit, global_batch - global_batch % unit)}.")


def refuse(recipe, kind: str) -> None:
    """For strategies that do not train with Keras ``fit``: refuse ``k > 1``.

    Raises:
        RecipeError: ``trainer.gradient_accumulation_steps > 1``.
    """
    steps = recipe.trainer.gradient_accumulation_steps
    if steps > 1:
        raise RecipeError(f"{FIELD} is not supported by strategy '{kind}' (its workers apply "
                          f"their updates asynchronously, with no all-reduce to save). "
                          f"Received: gradient_accumulation_steps={steps}; use 1.")


def accumulate_gradients(model, steps: int):
    """Make ``model`` (compiled, one instance) apply its optimizer once per ``steps`` micro-batches
    of each training batch (see module docs); ``steps == 1`` leaves it unchanged. Returns the model.

    Raises:
        RecipeError: ``steps < 1``.
    """
    if steps < 1:
        raise RecipeError(f"{FIELD} must be >= 1. Received: {steps}")
    if steps == 1:
        return model
    if not keras_accumulation_step.matches_keras():
        log.warning(f"{FIELD}: Keras's own train_step changed in this release (it no longer uses "
                    f"{', '.join(keras_accumulation_step.missing_from_keras())}); the "
                    "accumulating step copies the old one and may not match fit's")
    setattr(model, keras_accumulation_step.STEPS, int(steps))
    model.train_step = types.MethodType(keras_accumulation_step.train_step, model)
    model.train_function = None  # a fit traced before must trace the new step
    return model


def accumulation_steps(model) -> int:
    """The micro-batches per update :func:`accumulate_gradients` gave ``model`` (1 if none)."""
    return int(getattr(model, keras_accumulation_step.STEPS, 1))
