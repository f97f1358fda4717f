"""Gradient accumulation (``trainer.gradient_accumulation_steps``): one optimizer update, and so one
gradient all-reduce, per ``k`` micro-batches.

What a step is: one Keras ``fit`` step is still one optimizer update on one global batch of
``data.batch_size`` examples (so ``optimizer.iterations`` is the global step, ``steps_per_epoch``
counts updates, and checkpoints, resumption, preemption and throughput are unchanged). With
accumulation each replica runs forward and backward on its share of that batch in ``k``
sequential micro-batches of ``batch_size / (replicas * k)`` examples, sums the micro-batch
gradients locally (averaged: ``1/k`` each) and hands them to the optimizer once, which all-reduces
them once. Activation memory is that of one micro-batch; a run that trained with batch ``b`` can
train with ``data.batch_size: k*b`` and ``gradient_accumulation_steps: k`` at the same memory and
``1/k`` of the all-reduces per example. Since a checkpoint can only be taken between Keras steps, no
half-accumulated gradient ever needs saving.

Exactness: the losses' ``sum_over_batch_size`` reduction makes the mean of ``k`` equal-sized
micro-batch losses the full-batch loss, so the update equals the unaccumulated one on the same
global batch up to float rounding. Layers whose training output depends on the whole batch
(BatchNormalization statistics) see micro-batches instead, as with any accumulation.

Why not Keras 3's ``optimizer.gradient_accumulation_steps``: it applies a conditional update inside
the replica function and is reported broken under ``tf.distribute`` (keras-team/keras#20582).
Here the update is unconditional, so nothing changes for the distribution strategy.

Mechanism: :func:`accumulate_gradients` replaces ``train_step`` on one model instance (Keras 3's
documented way to customise ``fit``); the class, saving and loading are unchanged. The ``k``
micro-batches are unrolled in the traced step (tracing takes ``k`` times longer), each waiting for
the previous one's gradients, so only one micro-batch's activations are alive at a time.
"""

from __future__ import annotations

import types

from kerasdist.errors import RecipeError

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


def _micro_batches(tensor, steps: int):
    """``tensor`` of batch ``n`` as a list of ``steps`` tensors of batch ``n // steps``."""
    import tensorflow as tf

    if tensor is None:
        return [None] * steps
    tensor = tf.convert_to_tensor(tensor)
    tf.debugging.assert_equal(tf.shape(tensor)[0] % steps, 0, message=f"{FIELD}: the per-replica "
                              f"batch must split into {steps} equal micro-batches")
    return tf.split(tensor, steps, axis=0)


def _split(structure, steps: int) -> list:
    """``steps`` copies of ``structure`` (tensors, nested or None), each with one micro-batch."""
    import keras

    if structure is None:
        return [None] * steps
    flat = [_micro_batches(t, steps) for t in keras.tree.flatten(structure)]
    return [keras.tree.pack_sequence_as(structure, [chunks[i] for chunks in flat])
            for i in range(steps)]


def _after(tensors, structure):
    """``structure`` with each tensor made to wait for ``tensors`` (the previous micro-batch's
    gradients), so micro-batches run one after the other and their activations are not alive
    together."""
    import keras
    import tensorflow as tf

    with tf.control_dependencies(tensors):
        return keras.tree.map_structure(lambda t: None if t is None else tf.identity(t), structure)


def _train_step(self, data):
    """``train_step`` of an accumulating model (see module docs); returns the metric results.

    The ``k`` micro-batches are unrolled in the traced step rather than run in a ``tf.while_loop``:
    a model whose forward pass has a synchronisation point (a mirrored variable assigned in
    replica context, ``merge_call``) cannot run inside control flow under ``tf.distribute``.
    """
    import keras
    import tensorflow as tf

    steps = self._kerasdist_accumulation_steps
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    micro = [_split(part, steps) for part in (x, y, sample_weight)]
    variables = list(self.trainable_variables)
    loss_tracker = getattr(self, "_loss_tracker", None)
    with_training = getattr(self, "_call_has_training_arg", True)
    sums = [tf.zeros(v.shape, v.dtype) for v in variables]
    for i in range(steps):
        xi, yi, wi = (part[i] for part in micro)
        if i:
            xi, yi, wi = _after(sums, (xi, yi, wi))
        with tf.GradientTape() as tape:
            y_pred = self(xi, training=True) if with_training else self(xi)
            loss = self._compute_loss(x=xi, y=yi, y_pred=y_pred, sample_weight=wi, training=True)
            if loss_tracker is not None:
                loss_tracker.update_state(
                    _unscaled(loss), sample_weight=tf.shape(keras.tree.flatten(xi)[0])[0])
            if self.optimizer is not None:
                loss = self.optimizer.scale_loss(loss)
        grads = tape.gradient(loss, variables)
        self.compute_metrics(xi, yi, y_pred, sample_weight=wi)
        sums = [s if g is None else s + tf.cast(tf.convert_to_tensor(g), s.dtype) / steps
                for s, g in zip(sums, grads, strict=True)]
    if variables:
        self.optimizer.apply_gradients(zip(sums, variables, strict=True))
    return self.get_metrics_result()


def _unscaled(loss):
    """The loss as the user sees it: Keras divides it by the replicas in sync for the gradient."""
    from keras.src.losses import loss as loss_module

    return loss_module.unscale_loss_for_distribution(loss)


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
    model._kerasdist_accumulation_steps = int(steps)
    model.train_step = types.MethodType(_train_step, model)
    model.train_function = None  # a fit traced before must trace the new step
    return model


def accumulation_steps(model) -> int:
    """The micro-batches per update :func:`accumulate_gradients` gave ``model`` (1 if none)."""
    return int(getattr(model, "_kerasdist_accumulation_steps", 1))
