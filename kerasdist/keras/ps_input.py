"""Inputs for parameter-server training: one tf.data pipeline per worker, built on the worker
(``ClusterCoordinator.create_per_worker_dataset``). What ``model.fit(x=...)`` accepts
(``docs/python-api.md``, "Parameter server"): a dataset function ``fn(input_context)`` called on
each worker (``input_pipeline_id``: the worker index, a tensor); a ``tf.data.Dataset``, serialized
and rebuilt on each worker, where worker ``i`` of ``N`` keeps elements ``i, i+N, ...`` (every worker
runs the whole pipeline); NumPy arrays, sharded by example for training, while evaluation and
prediction deal out Keras's own batches (:func:`to_eval_input`). Training pipelines repeat forever.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

INFINITE = -1  # tf.data.INFINITE_CARDINALITY
UNKNOWN = -2  # tf.data.UNKNOWN_CARDINALITY


@dataclass(frozen=True)
class PSInput:
    """An input normalised for per-worker creation.

    Attributes:
        dataset_fn: ``fn(input_context) -> tf.data.Dataset`` to run on each worker.
        batches: batches in one pass summed over all workers; ``INFINITE``, or ``UNKNOWN`` for a
            dataset function (it is not built on the coordinator).
        kind: ``"dataset_fn"``, ``"dataset"`` or ``"arrays"`` (for messages).
    """

    dataset_fn: Callable[[Any], Any]
    batches: int
    kind: str


def _from_dataset(dataset, num_workers: int) -> PSInput:
    import tensorflow as tf

    try:
        graph_def = tf.raw_ops.DatasetToGraphV2(
            input_dataset=tf.data.experimental.to_variant(dataset),
            external_state_policy=0, strip_device_assignment=True)  # 0 = WARN
    except tf.errors.OpError as err:
        raise ValueError(
            "ParameterServerStrategy: this tf.data.Dataset cannot be serialized to run on the "
            f"workers ({err.message.splitlines()[0]}). Pass a dataset function "
            "`fn(input_context) -> tf.data.Dataset` instead. Received: x=<tf.data.Dataset>"
        ) from None
    _refuse_lookup_tables(graph_def)
    spec = dataset.element_spec

    def dataset_fn(input_context):
        rebuilt = tf.data.experimental.from_variant(
            tf.raw_ops.DatasetFromGraph(graph_def=graph_def), structure=spec)
        return rebuilt.shard(num_workers, input_context.input_pipeline_id)

    return PSInput(dataset_fn, int(dataset.cardinality().numpy()), "dataset")


def _refuse_lookup_tables(graph_def) -> None:
    """Refuse a dataset whose graph reads a lookup table (the workers cannot read it).

    Raises:
        UnsupportedFeatureError: naming the table ops found.
    """
    import tensorflow as tf

    from kerasdist.errors import UnsupportedFeatureError

    graph = tf.compat.v1.GraphDef.FromString(graph_def.numpy())
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    tables = sorted({n.op for n in nodes if "LookupTable" in n.op or "HashTable" in n.op})
    if tables:
        raise UnsupportedFeatureError(
            "a tf.data.Dataset that reads a lookup table (e.g. a Keras StringLookup or "
            "TextVectorization mapped over it) is not supported under ParameterServerStrategy: "
            "the table lives on the coordinator and the workers' copies of the pipeline cannot "
            "read it. Map strings to ids with ops that need no table (keras.layers.Hashing, "
            f"tf.strings.to_hash_bucket_fast). Received: ops {tables}")


def _from_arrays(data, *, batch_size: int, shuffle: bool, num_workers: int) -> PSInput:
    import tensorflow as tf

    num = len(tf.nest.flatten(data)[0])

    def dataset_fn(input_context):
        ds = tf.data.Dataset.from_tensor_slices(data)
        ds = ds.shard(num_workers, input_context.input_pipeline_id)
        if shuffle:
            ds = ds.shuffle(max(1, math.ceil(num / num_workers)), reshuffle_each_iteration=True)
        return ds.batch(batch_size)

    per_worker = [len(range(i, num, num_workers)) for i in range(num_workers)]
    return PSInput(dataset_fn, sum(math.ceil(n / batch_size) for n in per_worker), "arrays")


def is_arrays(x) -> bool:
    """Whether ``x`` is in-memory array data (NumPy arrays, lists/tuples/dicts of them)."""
    return isinstance(x, (np.ndarray, list, tuple, dict)) or hasattr(x, "__array__")


def pack_arrays(x, y=None, sample_weight=None) -> tuple:
    """``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)`` with lists made tuples, as Keras's array
    adapter packs them: a list or tuple ``x`` is several model inputs (``tf.data`` would stack a
    list into one tensor, and read a 2-tuple ``x`` alone as ``(x, y)``)."""
    import keras

    return keras.tree.lists_to_tuples(tuple(v for v in (x, y, sample_weight) if v is not None))


def to_eval_input(x, y=None, *, sample_weight=None, batch_size: int | None = None,
                  steps: int | None = None, num_workers: int, argument: str = "x") -> PSInput:
    """An evaluation/prediction input whose batches are Keras's own (arrays batched by
    ``batch_size``, default 32; the first ``steps`` only), worker ``i`` of ``N`` taking batches
    ``i, i+N, ...``, so batch-dependent metrics agree with a strategy-free ``evaluate``. A dataset
    function is passed through (:func:`to_ps_input`).

    Raises:
        ValueError: as :func:`to_ps_input`.
    """
    import tensorflow as tf

    if callable(x) and not isinstance(x, tf.data.Dataset):
        return to_ps_input(x, y, sample_weight=sample_weight, batch_size=batch_size,
                           num_workers=num_workers, argument=argument)
    if isinstance(x, tf.data.Dataset) or not is_arrays(x):
        to_ps_input(x, y, sample_weight=sample_weight, batch_size=batch_size,
                    num_workers=num_workers, argument=argument)  # the checks and messages
        dataset = x
    else:
        dataset = tf.data.Dataset.from_tensor_slices(pack_arrays(x, y, sample_weight))
        dataset = dataset.batch(batch_size or 32)
    return _from_dataset(dataset.take(steps) if steps else dataset, num_workers)


def to_ps_input(x, y=None, *, sample_weight=None, batch_size: int | None = None,
                shuffle: bool = False, num_workers: int, argument: str = "x") -> PSInput:
    """Normalise a ``model.fit``/``evaluate`` input for per-worker creation (see module docs).

    Args:
        x: dataset function, ``tf.data.Dataset`` or NumPy array(s) (array, tuple, dict).
        y, sample_weight: arrays matching ``x`` (arrays only).
        batch_size: examples per step for arrays (default 32); must be None otherwise.
        shuffle: shuffle arrays on each worker every pass.
        num_workers: number of workers (>= 1).
        argument: the name shown in errors (``x``, ``validation_data``).

    Returns:
        :class:`PSInput`.

    Raises:
        ValueError: ``y``/``sample_weight``/``batch_size`` given with a dataset or function;
            an input of another type; a dataset that cannot be serialized.
        UnsupportedFeatureError: a ``keras.utils.PyDataset``, or a dataset that reads a lookup
            table.
    """
    import keras
    import tensorflow as tf

    is_dataset = isinstance(x, tf.data.Dataset)
    if is_dataset or callable(x):
        given = {"y": y, "sample_weight": sample_weight, "batch_size": batch_size}
        extra = {k: v for k, v in given.items() if v is not None}
        if extra:
            raise ValueError(f"`{', '.join(extra)}` must be None when `{argument}` is a dataset or "
                             f"a dataset function (it yields batches of (x, y[, sample_weight])). "
                             f"Received: {', '.join(f'{k}={v!r}' for k, v in extra.items())}")
        if is_dataset:
            return _from_dataset(x, num_workers)
        return PSInput(x, UNKNOWN, "dataset_fn")
    if is_arrays(x):
        return _from_arrays(pack_arrays(x, y, sample_weight), batch_size=batch_size or 32,
                            shuffle=shuffle, num_workers=num_workers)
    if isinstance(x, keras.utils.PyDataset):
        from kerasdist.errors import UnsupportedFeatureError

        raise UnsupportedFeatureError(
            f"a keras.utils.PyDataset is not supported under ParameterServerStrategy: its Python "
            f"code runs in the coordinator's process, and the workers read `{argument}` "
            "themselves. Pass a dataset function `fn(input_context) -> tf.data.Dataset`, a "
            f"tf.data.Dataset or NumPy arrays. Received: {argument}={type(x).__name__}")
    raise ValueError(
        f"ParameterServerStrategy training reads `{argument}` on the workers: pass a dataset "
        "function `fn(input_context) -> tf.data.Dataset`, a tf.data.Dataset or NumPy arrays. "
        f"Received: {argument}={type(x).__name__}")


def resolve_steps(steps, ps_input: PSInput, *, argument: str, training: bool) -> int | None:
    """Steps per epoch (training) or per evaluation, summed over all workers.

    Args:
        steps: the user's value, or None.
        ps_input: the normalised input.
        argument: its name in messages (``steps_per_epoch``, ``validation_steps``, ``steps``).
        training: None then means one pass over a finite input of known size; in evaluation,
            every shard to its end.

    Returns:
        A positive int, or None (evaluation until the data ends).

    Raises:
        ValueError: ``steps`` is not a positive int, or it is None where it is required.
    """
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
            raise ValueError(f"`{argument}` must be a positive int. Received: {argument}={steps!r}")
        return int(steps)
    if ps_input.batches > 0 and training:
        return ps_input.batches
    if ps_input.batches == INFINITE or (training and ps_input.batches == UNKNOWN):
        what = ("an infinite dataset" if ps_input.batches == INFINITE
                else f"a {ps_input.kind.replace('_', ' ')} of unknown length")
        raise ValueError(
            f"`{argument}` is required with ParameterServerStrategy and {what}: each worker reads "
            f"its own repeated pipeline, so an epoch ends after `{argument}` scheduled steps, "
            f"summed over all workers. Received: {argument}=None")
    return None


def probe_infinite(ps_input: PSInput, *, num_workers: int, replicas: int) -> PSInput:
    """Mark a dataset function whose pipeline never ends as ``INFINITE`` (worker 0's pipeline is
    built on the coordinator), so evaluation without ``steps`` fails fast; other inputs unchanged.
    """
    import dataclasses

    import tensorflow as tf

    if ps_input.kind != "dataset_fn":
        return ps_input
    context = tf.distribute.InputContext(num_input_pipelines=num_workers, input_pipeline_id=0,
                                         num_replicas_in_sync=replicas)
    if int(ps_input.dataset_fn(context).cardinality().numpy()) == INFINITE:
        return dataclasses.replace(ps_input, batches=INFINITE)
    return ps_input


def worker_dataset(ps_input: PSInput, context, *, repeat: bool):
    """Call ``ps_input.dataset_fn(context)`` while tracing a per-worker dataset function.

    TensorFlow's ``random_seed.get_seed`` compares ``(graph_seed, op_seed) == (0, 0)`` in Python,
    so with global seed 0 a shuffle seeded by ``seed + input_pipeline_id`` (a tensor) cannot be
    traced: a graph seed of 0 becomes 1 in this function's graph only (still reproducible).
    """
    import tensorflow as tf

    graph = tf.compat.v1.get_default_graph()
    if graph.seed is not None and graph.seed % (2**31 - 1) == 0:
        tf.random.set_seed(1)
    ds = ps_input.dataset_fn(context)
    return ds.repeat() if repeat else ds


class SentBatches:
    """Evaluation batches the coordinator reads and sends with each call (synchronous mode: a
    worker lost for good holds none of them); every batch once, the N pipelines' shards in turn.

    Attributes:
        element_spec: the batches' ``tf.TypeSpec`` structure.
    """

    def __init__(self, ps_input: PSInput, *, num_workers: int, replicas: int):
        import tensorflow as tf

        shards = [ps_input.dataset_fn(tf.distribute.InputContext(num_workers, i, replicas))
                  for i in range(num_workers)]
        self._dataset = tf.data.Dataset.choose_from_datasets(
            shards, tf.data.Dataset.range(num_workers).repeat(), stop_on_empty_dataset=False)
        self.element_spec = self._dataset.element_spec

    def __iter__(self):
        return SentIterator(iter(self._dataset))


@dataclass
class SentIterator:
    """An iterator over :class:`SentBatches`."""

    iterator: Any

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.iterator)


def make_per_worker_dataset(coordinator, ps_input: PSInput, *, num_workers: int, repeat: bool):
    """The ``PerWorkerDataset`` of ``ps_input``, each worker's pipeline repeated forever with
    ``repeat``; ``iter()`` of it gives the iterators to pass to ``coordinator.schedule``."""
    import tensorflow as tf

    strategy = coordinator.strategy
    replicas = strategy.num_replicas_in_sync

    def per_worker_fn():
        index = tf.distribute.coordinator.experimental_get_current_worker_index()
        context = tf.distribute.InputContext(num_input_pipelines=num_workers,
                                             input_pipeline_id=index,
                                             num_replicas_in_sync=replicas)
        return strategy.distribute_datasets_from_function(
            lambda _: worker_dataset(ps_input, context, repeat=repeat))

    return coordinator.create_per_worker_dataset(per_worker_fn)
