"""Refusals of what a synchronous strategy (mirrored, multi_worker) cannot run, before the first
step: ``model.fit``/``evaluate``/``predict`` of a model under one (after ``kerasdist.enable()``)
check it here first (:mod:`kerasdist._compat.keras_ps_dispatch` calls :func:`check_model`).

* ``jit_compile=True`` with 2+ replicas in sync on CPU devices: TensorFlow has no XLA
  collectives for CPU ("Collectives are not yet implemented for CPU devices when compiling with
  XLA" under ``MultiWorkerMirroredStrategy`` with 2 workers, TF 2.21), and under
  ``MirroredStrategy`` on 2 logical CPUs the compiled step fails on variables placed on another
  device (plain Keras 3.15 too). Keras's ``jit_compile="auto"`` already resolves to False on a
  CPU-only machine and under a strategy; only an explicit True reaches this refusal.
"""

from __future__ import annotations

from kerasdist._compat._fakes import is_multi_worker
from kerasdist.errors import UnsupportedFeatureError


def _cpu_only(strategy) -> bool:
    devices = getattr(strategy.extended, "worker_devices", ()) or ()
    return bool(devices) and all("CPU" in str(device).upper() for device in devices)


def refuse_single_process_savers(callbacks, strategy: str) -> None:
    """Refuse a single-process saver among ``callbacks`` under the ``strategy`` kind (the rule of
    a recipe's ``callbacks``: :func:`kerasdist.config.training_configs.single_process_saver_error`).

    Raises:
        UnsupportedFeatureError: names the callback, the strategy and what to use instead.
    """
    from kerasdist.config.training_configs import single_process_saver_error

    for callback in getattr(callbacks, "callbacks", callbacks) or ():  # a list or a CallbackList
        for cls in type(callback).__mro__:
            error = single_process_saver_error(cls.__name__, strategy=strategy,
                                               field="model.fit(callbacks=...)")
            if error:
                raise UnsupportedFeatureError(error)


def check_model(model, callbacks=None) -> None:
    """Refuse, before the first step, what the model's synchronous strategy cannot run.

    Args:
        model: a compiled ``keras.Model`` (any strategy; models under none pass).
        callbacks: the ``callbacks`` argument of ``fit``/``evaluate``/``predict``, if any.

    Raises:
        UnsupportedFeatureError: ``jit_compile=True`` with 2+ replicas (or workers) in sync on
            CPU devices (names the strategy and what to do instead); a single-process saver
            (``OrbaxCheckpoint``) under ``MultiWorkerMirroredStrategy``.
    """
    import tensorflow as tf

    strategy = getattr(model, "distribute_strategy", None)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        refuse_single_process_savers(callbacks, "multi_worker")
    if strategy is None or getattr(model, "jit_compile", False) is not True:
        return
    if not isinstance(strategy, (tf.distribute.MirroredStrategy,
                                 tf.distribute.MultiWorkerMirroredStrategy)):
        return
    if not ((is_multi_worker(strategy) or strategy.num_replicas_in_sync > 1) and _cpu_only(strategy)):
        return
    raise UnsupportedFeatureError(
        f"`jit_compile=True` is not supported under {type(strategy).__name__} on CPU devices: "
        "TensorFlow has no XLA collectives for CPU (\"Collectives are not yet implemented for "
        "CPU devices when compiling with XLA\"), so the first step would fail. Compile with "
        "jit_compile=False (or \"auto\", which is False here), or train under "
        "ParameterServerStrategy, whose workers run XLA-compiled steps without collectives. "
        f"Received: jit_compile=True, replicas={strategy.num_replicas_in_sync}")
