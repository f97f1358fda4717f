"""The resumable stream of an in-memory split (``x``, ``y`` NumPy arrays; the source's units are
example ids): pass ``p`` over a pipeline's shard is the stateless permutation seeded with
``(shuffle_seed + pipeline, p)``, and a resumed run skips batches of example ids before any gather
(see :mod:`kerasdist.data.streams` for the guarantees). A leaf of the data package: it imports
only :mod:`kerasdist.data.convert`."""

from __future__ import annotations

from kerasdist.data.convert import preprocess as _to_inputs


def _pass_seed(seed, pass_index):
    """int64 seed pair of pass ``pass_index`` of a stream seeded with ``seed`` (stateless)."""
    import tensorflow as tf

    return tf.stack([tf.cast(seed, tf.int64), tf.cast(pass_index, tf.int64)])


def _shard_ids(num_examples: int, pipelines: int, pipeline_id, *, shard: bool):
    """``(ids, count)``: int64 example indices ``pipeline_id, pipeline_id + pipelines, ...``
    (all of them when not ``shard``) and their number. ``pipeline_id`` may be a symbolic tensor
    (parameter-server workers build their datasets inside a ``tf.function``); ``count`` is then
    the largest shard's size."""
    import tensorflow as tf

    if not shard:
        return tf.range(num_examples, dtype=tf.int64), num_examples
    if isinstance(pipeline_id, int):
        count = len(range(pipeline_id, num_examples, pipelines))
    else:
        count = -(-num_examples // pipelines)
    return tf.range(tf.cast(pipeline_id, tf.int64), num_examples, pipelines,
                    dtype=tf.int64), count


def _index_stream(ids, count: int, *, seed, buffer: int):
    """Endless dataset of example indices ``ids`` (int64 tensor of ``count`` elements), pass
    ``p`` shuffled with seeds derived from ``(seed, p)`` so that the stream never depends on
    iterator history (``seed`` an int or int64 scalar tensor). ``buffer`` is a shuffle-buffer
    size (``data.shuffle_buffer``) as in ``tf.data.Dataset.shuffle``: 0 keeps the order; a buffer
    at least as large as the shard is a full permutation (drawn statelessly); a smaller one
    shuffles within a sliding buffer of that many examples."""
    import tensorflow as tf

    def one_pass(pass_index):
        if buffer >= count:
            order = tf.random.experimental.stateless_shuffle(ids, seed=_pass_seed(seed, pass_index))
            return tf.data.Dataset.from_tensor_slices(order)
        ds = tf.data.Dataset.from_tensor_slices(ids)
        if buffer:
            ds = ds.shuffle(buffer, seed=seed * 1_000_003 + pass_index, reshuffle_each_iteration=False)
        return ds

    return tf.data.Dataset.counter(dtype=tf.int64).flat_map(one_pass)


def memory_train_fn(x, y, data_config, *, shard: bool, normalize: bool):
    def train_fn(ctx, skip_batches: int):  # TensorFlow imported here: a launcher's count needs none
        import tensorflow as tf

        pipelines, pipeline_id = ctx.num_input_pipelines, ctx.input_pipeline_id
        ids, count = _shard_ids(len(x), pipelines, pipeline_id, shard=shard)
        ds = _index_stream(ids, count, seed=data_config.shuffle_seed + pipeline_id,
                           buffer=data_config.shuffle_buffer)
        ds = ds.batch(ctx.get_per_replica_batch_size(data_config.batch_size), drop_remainder=True)
        if skip_batches:
            ds = ds.skip(skip_batches)  # indices only: skipping costs nothing
        xs, ys, convert = tf.constant(x), tf.constant(y), _to_inputs(normalize)
        ds = ds.map(lambda ids: convert(tf.gather(xs, ids), tf.gather(ys, ids)),
                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds.prefetch(tf.data.AUTOTUNE if data_config.prefetch < 0 else data_config.prefetch)

    return train_fn


def memory_eval_fn(x, y, data_config, *, shard: bool):
    def eval_fn(ctx):
        import tensorflow as tf

        batch = ctx.get_per_replica_batch_size(data_config.batch_size)
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        if shard and ctx.num_input_pipelines > 1:
            ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        ds = ds.batch(batch).map(_to_inputs(data_config.normalize))
        return ds.prefetch(tf.data.AUTOTUNE)

    return eval_fn


def memory_eval_dataset(x, y, data_config):
    """``(x, y)`` as one dataset of global batches (``data.batch_size``, the last partial batch
    kept), converted as training converts them (the sidecar evaluator's input)."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(data_config.batch_size)
    ds = ds.map(_to_inputs(data_config.normalize), num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE if data_config.prefetch < 0 else data_config.prefetch)


_memory_train_fn = memory_train_fn  # the names tests and tools used
_eval_fn = memory_eval_fn
