"""tf.data input pipelines, built per input pipeline so every strategy can shard them.

The central piece is :func:`make_dataset_fn`, which returns a ``dataset_fn(input_context=None)``
following TF's convention for ``strategy.distribute_datasets_from_function`` and
``ClusterCoordinator.create_per_worker_dataset``: called with an ``tf.distribute.InputContext`` it
shards by ``input_pipeline_id`` and batches with the **per-replica** batch size; called with no
context it batches with the **global** batch size (one pipeline, as plain ``model.fit`` expects).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from kerasdist.data.convert import check_batch_divisible, preprocess

__all__ = ["Datasets", "build_datasets", "check_batch_divisible", "make_dataset_fn", "preprocess"]


def make_dataset_fn(
    x: np.ndarray,
    y: np.ndarray,
    *,
    global_batch_size: int,
    training: bool,
    shuffle_buffer: int = 10_000,
    seed: int = 42,
    normalize: bool = True,
    prefetch: int = -1,
    repeat: bool = False,
    shard: bool = True,
) -> Callable:
    """Return ``dataset_fn(input_context=None) -> tf.data.Dataset`` over ``(x, y)``.

    Args:
        x, y: examples and targets (first axis = examples); uint8 images are cast to float32,
            scaled to [0, 1] when ``normalize``, and given a channel axis.
        global_batch_size: examples per optimizer step summed over all replicas.
        training: shuffle (seeded) and drop the last partial batch; otherwise keep order and
            every example.
        seed: shuffle seed; input pipeline ``i`` uses ``seed + i`` so pipelines that do not shard
            still see different orders.
        repeat: repeat forever (parameter-server per-worker datasets); then
            ``steps_per_epoch`` is required by the trainer.
        shard: with an input context of N pipelines, pipeline ``i`` keeps examples ``i, i+N, ...``
            (TF's ``Dataset.shard``); with ``shard=False`` every pipeline reads all examples.

    Returns:
        A function suitable for ``distribute_datasets_from_function`` and
        ``create_per_worker_dataset``; element shapes ``(b, 28, 28, 1)`` float32 and ``(b,)`` int64
        for MNIST, where ``b`` is the per-replica batch size (or the global one with no context).
    """
    import tensorflow as tf

    convert = preprocess(normalize)

    def dataset_fn(input_context=None):
        batch, pipeline_id, pipelines = global_batch_size, 0, 1
        if input_context is not None:
            batch = input_context.get_per_replica_batch_size(global_batch_size)
            pipeline_id = input_context.input_pipeline_id
            pipelines = input_context.num_input_pipelines
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        if shard and pipelines > 1:
            ds = ds.shard(pipelines, pipeline_id)
        if training and shuffle_buffer:
            ds = ds.shuffle(shuffle_buffer, seed=seed + pipeline_id, reshuffle_each_iteration=True)
        if repeat:
            ds = ds.repeat()
        ds = ds.batch(batch, drop_remainder=training)
        ds = ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds.prefetch(tf.data.AUTOTUNE if prefetch < 0 else prefetch)

    return dataset_fn


@dataclass(frozen=True)
class Datasets:
    """The train and (optional) evaluation pipelines of a recipe, with their example counts."""

    train_fn: Callable
    eval_fn: Callable | None
    num_train: int
    num_eval: int
    global_batch_size: int

    @property
    def steps_per_epoch(self) -> int:
        """Full global batches in one pass over the training split (remainder dropped)."""
        return self.num_train // self.global_batch_size


def build_datasets(data_config, *, repeat_train: bool = False, shard: bool = True) -> Datasets:
    """Load the recipe's splits and build their dataset functions.

    Raises:
        DataError: from the source; or a training split smaller than one global batch.
    """
    from kerasdist.data.sources import load_split
    from kerasdist.errors import DataError

    x, y = load_split(data_config, data_config.train_split)
    if len(x) < data_config.batch_size:
        raise DataError(f"data.train_split '{data_config.train_split}' has {len(x)} examples, fewer "
                        f"than one global batch. Received: batch_size={data_config.batch_size}")
    common = dict(global_batch_size=data_config.batch_size, normalize=data_config.normalize,
                  prefetch=data_config.prefetch, shard=shard)
    train_fn = make_dataset_fn(x, y, training=True, shuffle_buffer=data_config.shuffle_buffer,
                               seed=data_config.shuffle_seed, repeat=repeat_train, **common)
    eval_fn, num_eval = None, 0
    if data_config.eval_split:
        ex, ey = load_split(data_config, data_config.eval_split)
        eval_fn = make_dataset_fn(ex, ey, training=False, **common)
        num_eval = len(ex)
    return Datasets(train_fn=train_fn, eval_fn=eval_fn, num_train=len(x), num_eval=num_eval,
                    global_batch_size=data_config.batch_size)
