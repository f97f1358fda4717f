"""Mend: Keras 3 ``BatchNormalization`` moving statistics drift apart across replicas.

Upstream: no Keras issue found; reproduction (Keras 3.15 / TF 2.21, CPU): a Sequential ``Dense ->
BatchNormalization -> Dense`` trained with ``model.fit`` under ``MultiWorkerMirroredStrategy`` with
2 workers ends with equal trainable weights on both workers but different
``moving_mean``/``moving_variance`` (each worker's running average of its half of every batch);
under ``MirroredStrategy`` the local copies differ the same way and a save keeps replica 0's.
Cause: ``BatchNormalization.build`` creates them with the default ``aggregation="none"``, so each
replica ``assign``s its own copy without communication.

Mend: while a ``MirroredStrategy`` or ``MultiWorkerMirroredStrategy`` scope is active, the moving
statistics (:data:`STATISTICS`) are created with ``aggregation="mean"``: an ``assign`` in replica
context writes the replicas' mean to every copy (one all-reduce per variable per step), as
tf_keras's ``BatchNormalization`` did. With equal per-replica batches the moving mean equals the
single-process one; the moving variance is the mean of the replicas' variances unless
``synchronized=True``. Probe: :func:`bug_present` reads ``BatchNormalization.build`` (its
``moving_mean`` ``add_weight`` still passes no ``aggregation``).
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap

from kerasdist._compat import _patch

NAME = "keras-bn-replica-stats"
ISSUE = "no upstream issue found; reproduction in this module's docstring"
STATISTICS = ("moving_mean", "moving_variance", "moving_stddev", "renorm_mean", "renorm_stddev")


def _layer_class():
    from keras.src.layers.normalization.batch_normalization import BatchNormalization

    return BatchNormalization


def bug_present() -> bool:
    """Whether ``BatchNormalization.build`` still creates ``moving_mean`` without an aggregation."""
    source = textwrap.dedent(inspect.getsource(_original_build()))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_weight":
            keywords = {k.arg: k.value for k in node.keywords}
            name = keywords.get("name")
            if isinstance(name, ast.Constant) and name.value == "moving_mean":
                return "aggregation" not in keywords
    return False


def _replicated() -> bool:
    import tensorflow as tf

    if not tf.distribute.has_strategy():
        return False
    return isinstance(tf.distribute.get_strategy(),
                      (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy))


def _mended(original):
    @functools.wraps(original)
    def add_weight(self, *args, **kwargs):
        if (kwargs.get("name") in STATISTICS and not kwargs.get("trainable", True)
                and kwargs.get("aggregation", "none") in ("none", None) and _replicated()):
            kwargs["aggregation"] = "mean"
        return original(self, *args, **kwargs)

    return add_weight


def _original_build():
    return _layer_class().build


def _patches():
    return [_patch.Patch(_layer_class(), "add_weight", _mended)]  # inherited: removed again


installed, install, uninstall = _patch.functions(__name__)  # see _patch.functions
