"""The one-line opt-in: ``kerasdist.enable()`` makes plain ``model.fit`` work on every strategy.

After it, a Keras model built and compiled inside ``tf.distribute.ParameterServerStrategy.scope()``
trains with ``model.fit(...)`` and evaluates with ``model.evaluate(...)``: both are routed to
kerasdist's coordinator loop (:mod:`kerasdist.training.ps`). Models under any other strategy
(or none) call Keras's own methods, unchanged. ``enable()`` also installs kerasdist's mends of
upstream bugs (:func:`kerasdist._compat.apply`, e.g. for MultiWorkerMirroredStrategy).

It works by wrapping ``TensorFlowTrainer.fit``/``evaluate`` (the TensorFlow backend's trainer,
the base of every ``keras.Model`` on this backend); the originals are kept and :func:`disable`
puts them back. Subclasses that override ``fit``/``evaluate`` themselves are not affected.

Example::

    import kerasdist, keras, tensorflow as tf
    kerasdist.enable()
    strategy = tf.distribute.ParameterServerStrategy(cluster_resolver)
    with strategy.scope():
        model = kerasdist.models.mnist_cnn()
        model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(dataset_fn, epochs=3, steps_per_epoch=62)   # dataset_fn(input_context)
"""

from __future__ import annotations

import functools
import inspect
import threading

_LOCK = threading.Lock()
_ORIGINALS: dict[str, object] = {}
_MARK = "_kerasdist_original"


def _trainer_class():
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    return TensorFlowTrainer


def _wrap(name: str, original, target):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def method(self, *args, **kwargs):
        from kerasdist.training.ps import is_parameter_server

        if not is_parameter_server(self.distribute_strategy):
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        arguments = dict(bound.arguments)
        arguments.pop("self")
        arguments.update(arguments.pop("kwargs", {}))
        return target(self, **arguments)

    setattr(method, _MARK, original)
    method.__name__ = name
    return method


def enable() -> None:
    """Route ``model.fit``/``model.evaluate`` of ParameterServerStrategy models to kerasdist.

    Idempotent and thread-safe. Also applies :func:`kerasdist._compat.apply`.
    """
    from kerasdist import _compat
    from kerasdist.training import ps

    _compat.apply()
    trainer = _trainer_class()
    with _LOCK:
        for name, target in (("fit", ps.fit), ("evaluate", ps.evaluate)):
            current = trainer.__dict__[name]
            if hasattr(current, _MARK):
                continue
            _ORIGINALS[name] = current
            setattr(trainer, name, _wrap(name, current, target))


def disable() -> None:
    """Put Keras's own ``fit``/``evaluate`` back (the ``_compat`` mends stay). Idempotent."""
    trainer = _trainer_class()
    with _LOCK:
        for name, original in list(_ORIGINALS.items()):
            setattr(trainer, name, original)
            del _ORIGINALS[name]


def is_enabled() -> bool:
    """Whether :func:`enable` is in effect."""
    return hasattr(_trainer_class().__dict__["fit"], _MARK)
