"""Every patch of Keras/TensorFlow internals, one module per problem, each naming its upstream issue
(or giving a written reproduction), with a probe and a test that fails when upstream changes.

======================================  ===================================================
module                                  upstream issue / scope
======================================  ===================================================
``keras_20585_symbolic_build``          https://github.com/keras-team/keras/issues/20585
                                        (Keras 3 ``fit`` under MWMS with 2+ workers)
``tf_72388_scalar_reduce``              https://github.com/tensorflow/tensorflow/issues/72388
``keras_bn_replica_stats``              no issue; reproduction in the module (BatchNormalization
                                        moving statistics differ across replicas/workers)
``keras_replica_apply``                 no issue; reproduction in the module (clipping and
                                        EMA per replica, before the all-reduce)
``keras_replica_loss``                  no issue; reproduction in the module (custom steps see
                                        the loss divided by the replicas)
``keras_20582_grad_accum``              https://github.com/keras-team/keras/issues/20582
                                        (``gradient_accumulation_steps`` under any strategy)
``keras_sharded_variables``             no issue; reproduction in the module (a variable split
                                        over ps tasks by a partitioner fails in
                                        ``tape.gradient``)
``keras_19246_steps_per_execution``    https://github.com/keras-team/keras/issues/19246
                                        (``steps_per_execution`` with 2+ replicas)
``keras_metric_states``                 no issue; reproduction in the module (metrics built
                                        outside the scope report each worker's share)
``keras_replica_add_loss``              no issue; reproduction in the module (MirroredStrategy's
                                        replica threads share a layer's ``add_loss`` list)
``keras_chief_saves``                   ``Model.save``/``save_weights``/``export`` written by
                                        every worker; installed by ``kerasdist.enable()`` only
``keras_chief_callbacks``               ModelCheckpoint/BackupAndRestore written by every worker;
                                        installed by ``kerasdist.enable()`` only
``keras_chief_logs``                    TensorBoard/CSVLogger written by every worker;
                                        installed by ``kerasdist.enable()`` only
``keras_ps_atomic_assign``              no issue; reproduction in the module. Scoped to the
                                        variables of one model, inside a ``with`` block
``keras_ps_dispatch``                   Keras 3 has no PS ``fit``; installed by
                                        ``kerasdist.enable()`` only
``keras_allreduce_hook``                no public gradient-aggregation API; one optimizer
                                        instance (``strategy.gradient_compression``)
``keras_accumulation_step``            ``trainer.gradient_accumulation_steps``: a copy of
                                        Keras's TF ``train_step`` bound to one model instance;
                                        probe ``matches_keras()``
``tf_frozen_task``                      no issue; reproduction in the module (a
                                        parameter-server save or a freed function waits on
                                        every task, a frozen worker too). Scoped: the save in
                                        a ``with`` block; freed functions kept from a stop on
``internals``                           not a mend: the ``keras.src`` imports and private
                                        reads the rest of kerasdist needs (ruff TID251 bans
                                        them everywhere else)
======================================  ===================================================

The modules in :data:`MENDS` are installed by :func:`apply` (process-wide; each changes behaviour
only under a distribution strategy: multi-worker mode, 2+ replicas in sync, or variables sharded
by a parameter-server partitioner); the others are
used where needed, never by :func:`apply`. Most were found by the conformance matrix
(``kerasdist conformance``, ``docs/conformance.md``).

Each module has ``NAME``, ``ISSUE``, ``bug_present() -> bool`` (a cheap behavioural probe of the
installed Keras/TF that runs no TensorFlow op, so it is safe before a
``MultiWorkerMirroredStrategy`` is created) and ``install() -> bool``. A mend is installed only when
its probe shows the bug; ``tests/unit/test_compat.py`` fails with "upstream fixed ...: remove this
mend" once a release fixes it. Single-process training runs the unmodified Keras code.

Example::

    import kerasdist
    kerasdist._compat.apply()
    # on Keras 3.15 / TF 2.21: ['keras#20585', 'tensorflow#72388', 'keras-bn-replica-stats',
    #  'keras-optimizer-replica-apply', 'keras-replica-loss', 'keras#20582',
    #  'keras-sharded-variables', 'keras#19246', 'keras-metric-states', 'keras-replica-add-loss']
"""

from __future__ import annotations

import importlib

MENDS = (
    "kerasdist._compat.keras_20585_symbolic_build",
    "kerasdist._compat.tf_72388_scalar_reduce",
    "kerasdist._compat.keras_bn_replica_stats",
    "kerasdist._compat.keras_replica_apply",
    "kerasdist._compat.keras_replica_loss",
    "kerasdist._compat.keras_20582_grad_accum",
    "kerasdist._compat.keras_sharded_variables",
    "kerasdist._compat.keras_19246_steps_per_execution",
    "kerasdist._compat.keras_metric_states",
    "kerasdist._compat.keras_replica_add_loss",
)


def apply() -> list[str]:
    """Install every mend whose bug the installed Keras/TF have. Idempotent; runs no TF op.

    Returns:
        The names (``'keras#20585'``, ...) of the mends in effect after the call, in a fixed order;
        calling again returns the same list and patches nothing twice.
    """
    applied = []
    for module_name in MENDS:
        module = importlib.import_module(module_name)
        if module.install():
            applied.append(module.NAME)
    return applied


def status() -> dict[str, str]:
    """``{name: 'installed' | 'needed' | 'not needed'}`` for every known mend (for reports)."""
    result = {}
    for module_name in MENDS:
        module = importlib.import_module(module_name)
        if module.installed():
            result[module.NAME] = "installed"
        else:
            result[module.NAME] = "needed" if module.bug_present() else "not needed"
    return result


__all__ = ["MENDS", "apply", "status"]
