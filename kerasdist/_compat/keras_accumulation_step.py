"""The accumulating ``train_step`` of :mod:`kerasdist.keras.accumulation`
(``trainer.gradient_accumulation_steps``): a copy of Keras's own TensorFlow ``train_step`` run on
``k`` micro-batches, so it reads the internals Keras's step reads (``Trainer._compute_loss``,
``Trainer._loss_tracker``, ``Layer._call_has_training_arg``, ``unscale_loss_for_distribution``).

Not a process-wide patch: :func:`kerasdist.keras.accumulation.accumulate_gradients` binds
:func:`train_step` to one model instance (Keras 3's documented way to customise ``fit``). Why not
Keras's own optimizer ``gradient_accumulation_steps``: :mod:`kerasdist._compat.keras_20582_grad_accum`.

Probe: :func:`matches_keras` (source check): Keras's own TF ``train_step`` still computes, tracks
and scales the loss through those internals and applies the gradients with ``apply_gradients``;
when a release changes that, ``accumulate_gradients`` logs a warning and
``tests/unit/test_compat.py`` fails ("Keras's train_step changed").
"""

from __future__ import annotations

NAME = "kerasdist-accumulation-step"
ISSUE = "https://github.com/keras-team/keras/issues/20582"
STEPS = "_kerasdist_accumulation_steps"
"""The model attribute holding ``k`` (set by ``accumulate_gradients``)."""

# What Keras's TF train_step must still contain for this copy of it to match (matches_keras).
_KERAS_STEP_USES = ("self._call_has_training_arg", "self._compute_loss(",
                    "self._loss_tracker.update_state(", "unscale_loss_for_distribution(",
                    "self.optimizer.scale_loss(", "apply_gradients(", "self.compute_metrics(")


def _keras_step_source() -> str:
    import inspect

    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    return inspect.getsource(inspect.unwrap(TensorFlowTrainer.train_step))


def missing_from_keras() -> list[str]:
    """The internals of :data:`_KERAS_STEP_USES` that Keras's TF ``train_step`` no longer uses,
    and the ``Trainer`` methods :func:`train_step` calls that Keras no longer has."""
    from keras.src.trainers.trainer import Trainer

    source = _keras_step_source()
    missing = [use for use in _KERAS_STEP_USES if use not in source]
    missing += [f"Trainer.{name}" for name in ("_compute_loss", "compute_metrics",
                                               "get_metrics_result") if not hasattr(Trainer, name)]
    return missing


def matches_keras() -> bool:
    """Whether the installed Keras's own TF ``train_step`` still works as this copy of it does
    (source check; runs no TF op)."""
    return not missing_from_keras()


def _micro_batches(tensor, steps: int):
    """``tensor`` of batch ``n`` as a list of ``steps`` tensors of batch ``n // steps``."""
    import tensorflow as tf

    if tensor is None:
        return [None] * steps
    tensor = tf.convert_to_tensor(tensor)
    tf.debugging.assert_equal(tf.shape(tensor)[0] % steps, 0, message=f"trainer.gradient_"
                              f"accumulation_steps: the per-replica batch must split into {steps} "
                              f"equal micro-batches")
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


def train_step(self, data):
    """``train_step`` of an accumulating model (:mod:`kerasdist.keras.accumulation`); returns the
    metric results.

    The ``k`` micro-batches are unrolled in the traced step rather than run in a ``tf.while_loop``:
    a model whose forward pass has a synchronisation point (a mirrored variable assigned in
    replica context, ``merge_call``) cannot run inside control flow under ``tf.distribute``.
    """
    import keras
    import tensorflow as tf
    from keras.src.losses.loss import unscale_loss_for_distribution

    steps = getattr(self, STEPS)
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    micro = [_split(part, steps) for part in (x, y, sample_weight)]
    variables = list(self.trainable_variables)
    loss_tracker = getattr(self, "_loss_tracker", None)
    with_training = bool(getattr(self, "_call_has_training_arg", True))
    sums = [tf.zeros(v.shape, v.dtype) for v in variables]
    for i in range(steps):
        xi, yi, wi = (part[i] for part in micro)
        if i:
            xi, yi, wi = _after(sums, (xi, yi, wi))
        with tf.GradientTape() as tape:
            y_pred = self(xi, training=True) if with_training else self(xi)
            loss = self._compute_loss(x=xi, y=yi, y_pred=y_pred, sample_weight=wi, training=True)
            if loss_tracker is not None:
                loss_tracker.update_state(unscale_loss_for_distribution(loss),
                                          sample_weight=tf.shape(keras.tree.flatten(xi)[0])[0])
            if self.optimizer is not None:
                loss = self.optimizer.scale_loss(loss)
        grads = tape.gradient(loss, variables)
        self.compute_metrics(xi, yi, y_pred, sample_weight=wi)
        sums = [s if g is None else s + tf.cast(tf.convert_to_tensor(g), s.dtype) / steps
                for s, g in zip(sums, grads, strict=True)]
    if variables:
        self.optimizer.apply_gradients(zip(sums, variables, strict=True))
    return self.get_metrics_result()
