"""Mend: Keras 3 ``model.fit``/``evaluate``/``predict`` cannot drive ``ParameterServerStrategy`` at all.

Upstream: Keras 3 has no parameter-server code (its TensorFlow trainer never creates a
``ClusterCoordinator``); ``model.fit`` fails with "you need to pass this dataset to
ClusterCoordinator.create_per_worker_dataset" (Keras 3.15 / TF 2.21; the TF tutorial
https://www.tensorflow.org/tutorials/distribute/parameter_server_training uses Keras 2's ``fit``).
Probe: :func:`bug_present` (the trainer's source still has no ``ClusterCoordinator``).

Installed by ``kerasdist.enable()``: ``TensorFlowTrainer.fit``/``evaluate``/``predict`` (the base
of every ``keras.Model`` on this backend) route a model built and compiled inside
``ParameterServerStrategy.scope()`` to kerasdist's coordinator loop
(:mod:`kerasdist.keras.ps_fit`, :mod:`kerasdist.keras.ps_predict`); every other model goes to
Keras's own method, and :func:`disable` puts the originals back. Subclasses that override
``fit``/``evaluate``/``predict`` are not affected. Example: ``docs/python-api.md`` ("Parameter
server").
"""

from __future__ import annotations

import functools
import inspect

from kerasdist._compat import _patch

NAME = "keras-ps-fit"
ISSUE = "Keras 3 has no ParameterServerStrategy support (reproduction in this module's docstring)"


def _trainer_class():
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    return TensorFlowTrainer


def bug_present() -> bool:
    """Whether the installed Keras TensorFlow trainer still knows nothing of ``ClusterCoordinator``."""
    import keras.src.backend.tensorflow.trainer as trainer

    return "ClusterCoordinator" not in inspect.getsource(trainer)


def _is_parameter_server(strategy) -> bool:
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.ParameterServerStrategy)


def _wrap(name: str, original, target, check=None):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def method(self, *args, **kwargs):
        arguments = dict(signature.bind(self, *args, **kwargs).arguments)
        arguments.pop("self")
        arguments.update(arguments.pop("kwargs", {}))
        if not _is_parameter_server(self.distribute_strategy):
            if check is not None:
                check(self, arguments.get("callbacks"))
            return original(self, *args, **kwargs)
        return target(self, **arguments)

    method.__name__ = name
    return method


def enable(*, fit, evaluate, predict=None, check=None) -> None:
    """Route ``model.fit``/``model.evaluate`` (and ``model.predict`` when given) of
    ParameterServerStrategy models to ``fit``, ``evaluate`` and ``predict``: kerasdist's
    :func:`kerasdist.keras.ps_fit.fit` / ``evaluate`` and
    :func:`kerasdist.keras.ps_predict.predict`, passed in by :func:`kerasdist.keras.enable` so
    that this layer imports nothing above it. ``check(model, callbacks)``, when given, runs before Keras's
    own method for every other model (refusals of what the strategy cannot run:
    :func:`kerasdist.keras.sync_checks.check_model`).

    Idempotent and thread-safe.
    """
    trainer = _trainer_class()
    targets = (("fit", fit), ("evaluate", evaluate)) + (
        (("predict", predict),) if predict is not None else ())
    _patch.install(NAME, [_patch.Patch(trainer, name, functools.partial(_wrap, name,
                                                                        target=target, check=check))
                          for name, target in targets])


def disable() -> None:
    """Put Keras's own ``fit``/``evaluate``/``predict`` back (the ``_compat`` mends stay).
    Idempotent."""
    _patch.uninstall(NAME)


def is_enabled() -> bool:
    """Whether :func:`enable` is in effect."""
    return _patch.is_patched(_trainer_class(), "fit", NAME)
