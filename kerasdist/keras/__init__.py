"""Keras-level pieces usable without recipes: the one-line opt-in (:func:`enable`), the
parameter-server ``fit`` (:mod:`~kerasdist.keras.ps_fit`), chief-aware step-exact backups
(:mod:`~kerasdist.keras.backup`), the preemption vote (:mod:`~kerasdist.keras.preemption`),
16-bit gradient all-reduce (:mod:`~kerasdist.keras.compression`) and the one throughput rule
(:mod:`~kerasdist.keras.callbacks`, :mod:`~kerasdist.keras.timing`). Importing this package is
light; each module imports Keras/TensorFlow when used.
"""

from __future__ import annotations


def enable() -> list[str]:
    """Opt in, one line: route ``model.fit``/``evaluate``/``predict`` of models built under
    ``ParameterServerStrategy`` to :mod:`kerasdist.keras.ps_fit`, install every
    :mod:`kerasdist._compat` mend the installed Keras/TF need and the ``ENABLE_MENDS`` (Keras's
    own callbacks and saves chief-aware, with atomic writes). Idempotent and thread-safe.

    Returns:
        The names of the mends in effect (e.g. ``['keras#20585', 'tensorflow#72388']``).
    """
    from kerasdist import _compat
    from kerasdist._compat import (
        keras_chief_callbacks,
        keras_chief_logs,
        keras_chief_saves,
        keras_ps_dispatch,
        tf_coordinator_copies,
    )
    from kerasdist.keras import ps_fit, ps_predict, sync_checks

    mends = _compat.apply()
    keras_ps_dispatch.enable(fit=ps_fit.fit, evaluate=ps_fit.evaluate, predict=ps_predict.predict,
                             check=sync_checks.check_model)
    keras_chief_callbacks.install()
    keras_chief_logs.install()
    keras_chief_saves.install()
    tf_coordinator_copies.install()
    return mends


def disable() -> None:
    """Put Keras's own ``fit``/``evaluate`` back (the multi-worker mends stay). Idempotent."""
    from kerasdist._compat import keras_ps_dispatch

    keras_ps_dispatch.disable()


def is_enabled() -> bool:
    """Whether :func:`enable` is in effect."""
    from kerasdist._compat import keras_ps_dispatch

    return keras_ps_dispatch.is_enabled()


__all__ = ["disable", "enable", "is_enabled"]
