"""Mend for keras-team/keras#20585: ``_maybe_symbolic_build`` reduces a tuple batch across workers.

Upstream: https://github.com/keras-team/keras/issues/20585. Before training,
``TensorFlowTrainer._maybe_symbolic_build`` passes the first distributed batch ``(x, y[,
sample_weight])`` whole to ``strategy.reduce("MEAN", batch, axis=None)`` only to learn its shapes:
under ``MultiWorkerMirroredStrategy`` with 2+ workers that collective accepts one tensor and
``model.fit`` fails ("Attempt to convert a value (PerReplica...) ... to a Tensor"); under
``MirroredStrategy`` it fails for a batch with a string tensor. Under every strategy, drawing that
batch from a new iterator also gives a seeded, reshuffled ``shuffle``'s first epoch its *second*
permutation, and makes ``repeat()`` + ``steps_per_epoch`` training start at the second batch.

Mend: under any distribution strategy, the unmodified method gets the per-replica batch's
``TypeSpec`` (all the symbolic build reads) from the epoch iterator's distributed dataset's
``element_spec``: no iterator, no reduce, no batch drawn; without a distributed dataset, this
worker's first local replica value of each element (no communication).
"""

from __future__ import annotations

import functools

from kerasdist._compat import _patch
from kerasdist._compat._fakes import fake_multi_worker_strategy, fake_per_replica

NAME = "keras#20585"
ISSUE = "https://github.com/keras-team/keras/issues/20585"


def _trainer_class():
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    return TensorFlowTrainer


def _local_batch(strategy, batch):
    import tensorflow as tf

    def first_local(value):
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    return tf.nest.map_structure(first_local, batch)


def _batch_spec(iterator):
    """The per-replica batch's ``TypeSpec`` structure, read from the distributed dataset without
    creating an iterator (None when the epoch iterator has no distributed dataset)."""
    import tensorflow as tf

    dataset = getattr(iterator, "_distributed_dataset", None)
    spec = getattr(dataset, "element_spec", None)
    if spec is None:
        return None

    def one_replica(value_spec):
        per_replica = getattr(value_spec, "_value_specs", None)  # PerReplicaSpec
        return per_replica[0] if per_replica else value_spec

    return tf.nest.map_structure(one_replica, spec)


def _mended(original):
    @functools.wraps(original)
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if iterator is None or strategy is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        spec = _batch_spec(iterator)
        if spec is not None:  # shapes and dtypes are all the symbolic build reads
            return original(self, iterator=None, data_batch=spec)
        for _, _, step_iterator in iterator:
            data_batch = _local_batch(strategy, next(step_iterator))
            break
        return original(self, iterator=None, data_batch=data_batch)

    return _maybe_symbolic_build


def _patches():
    return [_patch.Patch(_trainer_class(), "_maybe_symbolic_build", _mended)]


installed, install, uninstall = _patch.functions(__name__)  # see _patch.functions


def bug_present() -> bool:
    """Probe: does the unmodified method hand a *structure* to ``strategy.reduce``?

    Calls it on a stand-in trainer whose strategy is a fake multi-worker
    ``MultiWorkerMirroredStrategy`` that records reduce calls (no cluster, no TF op). Returns False
    when the method no longer exists or no longer reduces the batch, i.e. upstream changed it.
    """
    import types

    import tensorflow as tf

    strategy = fake_multi_worker_strategy()
    batch = (fake_per_replica([[0.0]]), fake_per_replica([0]))
    built = []
    trainer = types.SimpleNamespace(_distribute_strategy=strategy, distribute_strategy=strategy,
                                    _symbolic_build=lambda data_batch: built.append(data_batch))
    try:
        _patch.original(_trainer_class(), "_maybe_symbolic_build")(trainer, iterator=[(0, 0, iter([batch]))])
    except (AttributeError, TypeError):
        return False
    return any(tf.nest.is_nested(call.value) for call in strategy.calls)
