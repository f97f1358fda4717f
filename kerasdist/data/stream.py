"""The one resumable stream every source kind rides: shard policy, per-pass order, skip to the exact
step, decode, batch. A kind (:mod:`kerasdist.data.sources`) describes what it reads as
:class:`Units`; this module turns that into ``train_fn(input_context, skip_batches)`` and
``eval_fn(input_context)``, whatever the source, and imports TensorFlow only when a dataset is built.

A split is a sequence of **units** read in order into raw records (files, in-memory example ids,
or none for a function source). Pipeline ``i`` of ``N`` keeps units (``units``) or records
(``records``) ``i, i+N, ...``, or everything (``none``). Order, sharding and resume:
docs/own-model-and-data.md, "What every streaming source guarantees".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

from kerasdist.data.convert import preprocess


@dataclass
class Streaming:
    """What a source kind's ``stream`` hands back to :func:`kerasdist.data.inputs.build_data`:
    ``train_fn(ctx, skip_batches)``, ``eval_fn(ctx)`` (or None), the examples one pipeline holds,
    the evaluation split's size, the shard policy and the files the chief writes (path -> text)."""

    train_fn: object
    eval_fn: object | None
    per_pipeline: int
    num_eval: int
    policy: str
    artifacts: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Units:
    """A split as the stream reads it (see module docs).

    Attributes:
        read: ``read(units, ctx) -> tf.data.Dataset`` of the raw records of ``units`` (a 1-D
            tensor: file names, int64 example ids; None for a function source) in order.
        values: the split's units: file names (``list[str]``), a number of examples ``n`` (ids
            ``0..n-1``), or None (a function source: one dataset, no units).
        shard: ``'units'``, ``'records'`` or ``'none'`` (see module docs).
        examples: the units are examples (in-memory ids): a permutation that covers them all is
            the whole shuffle.
        decoder: ``decoder() -> decode(record) -> (x, y)``, per record; None: the records are
            decoded examples already. Called inside each dataset function (lookup tables and
            constants belong to the graph that builds the dataset).
        batch_decoder: ``batch_decoder() -> decode(records) -> (x, y)`` on a batch of raw
            records (one vectorized op), or returning None: ``decoder`` per record.
    """

    read: Callable
    values: list | int | None
    shard: Literal["units", "records", "none"]
    examples: bool = False
    decoder: Callable | None = None
    batch_decoder: Callable | None = None

    def decoders(self):
        """``(batch_decode, decode)``, at most one of them not None (see attributes)."""
        batched = self.batch_decoder() if self.batch_decoder is not None else None
        if batched is not None:
            return batched, None
        return None, (self.decoder() if self.decoder is not None else None)


def _pass_seed(seed, pass_index):
    """int64 seed pair of pass ``pass_index`` of a stream seeded with ``seed`` (stateless)."""
    import tensorflow as tf

    return tf.stack([tf.cast(seed, tf.int64), tf.cast(pass_index, tf.int64)])


def all_units(units: Units):
    """Every unit of the split as a tensor (None for a function source)."""
    return None if units.values is None else _all_units(units)[0]


def _all_units(units: Units):
    import tensorflow as tf

    if isinstance(units.values, int):
        return tf.range(units.values, dtype=tf.int64), units.values
    return tf.constant(units.values), len(units.values)


def _my_units(units: Units, pipelines: int, pipeline_id):
    """``(tensor, count)``: the units pipeline ``pipeline_id`` reads and how many. The id may be a
    symbolic tensor (parameter-server workers build their datasets inside a ``tf.function``);
    ``count`` is then the largest share's size."""
    import tensorflow as tf

    everything, total = _all_units(units)
    if units.shard != "units":
        return everything, total
    if isinstance(pipeline_id, int):
        count = len(range(pipeline_id, total, pipelines))
    else:
        count = -(-total // pipelines)
    mine = tf.range(tf.cast(pipeline_id, tf.int64), total, pipelines, dtype=tf.int64)
    return (mine if isinstance(units.values, int) else tf.gather(everything, mine)), count


def decoded_batches(ds, units: Units, batch: int, *, drop_remainder: bool):
    """Raw records -> decoded batches of ``batch``: one vectorized decode per batch when the
    source has one, else a deterministic parallel map per record, then batch."""
    import tensorflow as tf

    batched, single = units.decoders()
    if batched is not None:
        return ds.batch(batch, drop_remainder=drop_remainder).map(
            batched, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if single is not None:
        ds = ds.map(single, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.batch(batch, drop_remainder=drop_remainder)


def train_fn(units: Units, config) -> Callable:
    """``train_fn(ctx, skip_batches) -> tf.data.Dataset``: pipeline ``ctx.input_pipeline_id``'s
    endless stream of per-replica batches (``ctx.get_per_replica_batch_size(data.batch_size)``,
    incomplete batches dropped), ``skip_batches`` batches in, converted as
    :func:`kerasdist.data.convert.preprocess` does and prefetched (``data.prefetch``)."""

    def make(ctx, skip_batches: int):
        import tensorflow as tf

        n, i = ctx.num_input_pipelines, ctx.input_pipeline_id
        buffer = config.shuffle_buffer
        mine, count = (None, None) if units.values is None else _my_units(units, n, i)
        unit_seed = config.shuffle_seed + (0 if units.shard == "records" else i)
        record_seed = config.shuffle_seed + i
        permute = bool(buffer) and mine is not None and (not units.examples or buffer >= count)
        record_buffer = buffer if buffer and not (units.examples and permute) else 0

        whole = units.read(None, ctx) if units.values is None else None  # a function: called once

        def one_pass(pass_index):
            if whole is not None:
                records = whole
            else:
                ordered = mine
                if permute:
                    order = tf.random.experimental.stateless_shuffle(
                        tf.range(tf.size(mine, out_type=tf.int64)),
                        seed=_pass_seed(unit_seed, pass_index))
                    ordered = tf.gather(mine, order)
                records = units.read(ordered, ctx)
            if units.shard == "records":
                records = records.shard(n, i)
            if record_buffer:
                records = records.shuffle(record_buffer, seed=record_seed * 1_000_003 + pass_index,
                                          reshuffle_each_iteration=False)
            return records

        per_replica = ctx.get_per_replica_batch_size(config.batch_size)
        ds = tf.data.Dataset.counter(dtype=tf.int64).flat_map(one_pass)
        if skip_batches:
            ds = ds.skip(skip_batches * per_replica)  # raw records: nothing decoded
        ds = decoded_batches(ds, units, per_replica, drop_remainder=True)
        ds = ds.map(preprocess(config.normalize))
        return ds.prefetch(tf.data.AUTOTUNE if config.prefetch < 0 else config.prefetch)

    return make


def eval_fn(units: Units, config, *, shard: bool) -> Callable:
    """``eval_fn(ctx) -> tf.data.Dataset``: the split once, in order, per-replica batches with the
    last partial one kept; records ``i, i+N, ...`` on pipeline ``i`` of ``N`` when ``shard`` and
    the units do not shard themselves (``shard: none`` with ``shard`` True: a function that
    takes ``input_context``)."""

    def make(ctx):
        import tensorflow as tf

        records = units.read(all_units(units), ctx)
        if shard and ctx.num_input_pipelines > 1 and units.shard != "none":
            records = records.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        ds = decoded_batches(records, units, ctx.get_per_replica_batch_size(config.batch_size),
                             drop_remainder=False)
        return ds.map(preprocess(config.normalize)).prefetch(tf.data.AUTOTUNE)

    return make


def global_batches(units: Units, config):
    """The split once as global batches (``data.batch_size``, the last partial one kept),
    decoded and converted as training sees them, read as it is iterated (the sidecar
    evaluator's input)."""
    import tensorflow as tf

    ds = decoded_batches(units.read(all_units(units), None), units, config.batch_size,
                         drop_remainder=False)
    return ds.map(preprocess(config.normalize)).prefetch(
        tf.data.AUTOTUNE if config.prefetch < 0 else config.prefetch)


def sample_records(config, split: str, units: Units, limit: int | None, *, preprocessed=True,
                   failure: Callable | None = None):
    """The first ``limit`` examples (None: all) of a split (``units`` read whole, in order) as
    NumPy ``(x, y)``, decoded as training sees them (bad-input checks, reference evaluations).

    Args:
        config: the ``DataConfig`` (``normalize``; ``kind`` for messages).
        split: the split's name, for messages.
        units: the split as :class:`Units`.
        limit: most examples read (None: all).
        preprocessed: converted as :func:`kerasdist.data.convert.preprocess` does; False: as
            decoded, before the uint8-to-float conversion.
        failure: ``failure(err) -> DataError`` for a TensorFlow error met while reading (a
            function source: the user's code raised); None: the split does not decode.

    Returns:
        ``(x, y)``; ``x`` is a dict of arrays for a tfrecord spec with several inputs.

    Raises:
        DataError: records that do not decode, a function that raises; a split with no examples.
    """
    import numpy as np
    import tensorflow as tf

    from kerasdist.errors import DataError

    ds = units.read(all_units(units), None)
    if units.decoder is not None:
        ds = ds.map(units.decoder())
    if limit is not None:
        ds = ds.take(limit)
    xs, ys = [], []
    ds = ds.batch(1024)
    try:
        for x, y in (ds.map(preprocess(config.normalize)) if preprocessed else ds):
            xs.append(tf.nest.map_structure(lambda t: t.numpy(), x))
            ys.append(y.numpy())
    except tf.errors.OpError as err:
        if failure is not None:
            raise failure(err) from None
        raise DataError(f"data.source '{config.kind}': split '{split}' does not decode: "
                        f"{err.message.splitlines()[0][:300]}. Received: split='{split}'") from None
    if not ys:
        raise DataError(f"data.source '{config.kind}': split '{split}' holds no examples. "
                        f"Received: split='{split}'")
    x = {k: np.concatenate([p[k] for p in xs]) for k in xs[0]} if isinstance(xs[0], dict) \
        else np.concatenate(xs)
    return x, np.concatenate(ys)
