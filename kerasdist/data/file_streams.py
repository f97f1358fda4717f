"""Resumable training streams and evaluation inputs of the streaming sources (``tfrecord``: whole
splits and TFDS slices, as pieces of files; ``csv``, ``image_folder``, ``python``, ``tfds``), built
from a :class:`~kerasdist.data.formats.FileSource` (:func:`build_files`) or a split function
(:func:`build_function`) that a source kind (:mod:`kerasdist.data.sources`) hands in: this module
compares no ``data.source``.

A split is never read whole into memory: files are read record by record with ``tf.data``.

Order and resume. Pipeline ``i``'s stream is a pure function of the recipe, so a run resumed at
global step ``s`` restarts it ``s * local_replicas`` batches in (``Dataset.skip`` on the raw,
undecoded records: a skipped record is read but not decoded) and sees exactly the batches the
interrupted run had not trained on yet:

* pass ``p`` reads the pipeline's files in the order of a stateless permutation seeded with
  ``(shuffle_seed, p)`` (``tf.random.experimental.stateless_shuffle``), then shuffles their records
  in a ``shuffle_buffer`` seeded with ``shuffle_seed + i`` and ``p``
  (``reshuffle_each_iteration=False``), never with iterator state;
* decoding runs with ``deterministic=True``.

``python`` sources are exact when the user's function returns the same examples in the same order
on every call (skipping runs the user's pipeline for the skipped examples).

Sharding over ``N`` pipelines (``data.auto_shard``): ``file`` (``auto`` when the split has at least
``N`` files; ``image_folder``: every image is a file): pipeline ``i`` reads files ``i, i+N, ...``;
``data``: every pipeline reads every file and keeps records ``i, i+N, ...`` of the common order
(``Dataset.shard``); ``off``: every pipeline reads everything with its own seed. A ``python`` function
that takes ``input_context`` shards itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kerasdist._log import get_logger
from kerasdist.data.convert import preprocess, shard_policy
from kerasdist.errors import RecipeError

log = get_logger("data")


@dataclass
class Streaming:
    """What a source kind's ``stream`` hands back to :func:`kerasdist.data.streams.build_data`."""

    train_fn: object
    eval_fn: object | None
    per_pipeline: int
    num_eval: int
    policy: str
    artifacts: dict[str, str] = field(default_factory=dict)


def _pass_seed(seed, pass_index):
    import tensorflow as tf

    return tf.stack([tf.cast(seed, tf.int64), tf.cast(pass_index, tf.int64)])


def _decoded_batches(ds, source, batch: int, *, drop_remainder: bool):
    """Raw records -> decoded batches: one vectorized decode per batch when the source has one
    (tfrecord, csv), else a deterministic parallel map per record, then batch."""
    import tensorflow as tf

    batched = source.batch_decoder() if source is not None else None
    if batched is not None:
        return ds.batch(batch, drop_remainder=drop_remainder).map(
            batched, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if source is not None:
        ds = ds.map(source.decoder(), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.batch(batch, drop_remainder=drop_remainder)


def _finish(ds, config, per_replica: int, skip_batches: int, source):
    """Skip (on raw records), decode and batch (per-replica), convert, prefetch."""
    import tensorflow as tf

    if skip_batches:
        ds = ds.skip(skip_batches * per_replica)
    ds = _decoded_batches(ds, source, per_replica, drop_remainder=True)
    ds = ds.map(preprocess(config.normalize))
    return ds.prefetch(tf.data.AUTOTUNE if config.prefetch < 0 else config.prefetch)


def _file_train_fn(source, units: list[str], config, policy: str):
    import tensorflow as tf

    def train_fn(ctx, skip_batches: int):
        n, i = ctx.num_input_pipelines, ctx.input_pipeline_id
        everything = tf.constant(units)
        mine = tf.gather(everything, tf.range(i, len(units), n)) if policy == "file" else everything
        file_seed = config.shuffle_seed + (0 if policy == "data" else i)  # data: one common order
        record_seed = config.shuffle_seed + i
        buffer = config.shuffle_buffer

        def one_pass(pass_index):
            files = mine
            if buffer:
                order = tf.random.experimental.stateless_shuffle(
                    tf.range(tf.size(mine, out_type=tf.int64)), seed=_pass_seed(file_seed, pass_index))
                files = tf.gather(mine, order)
            records = source.records(files)
            if policy == "data":
                records = records.shard(n, i)
            if buffer:
                records = records.shuffle(buffer, seed=record_seed * 1_000_003 + pass_index,
                                          reshuffle_each_iteration=False)
            return records

        ds = tf.data.Dataset.counter(dtype=tf.int64).flat_map(one_pass)
        return _finish(ds, config, ctx.get_per_replica_batch_size(config.batch_size),
                       skip_batches, source)

    return train_fn


def _file_eval_fn(source, units: list[str], config, *, shard: bool):
    import tensorflow as tf

    def eval_fn(ctx):
        records = source.records(tf.constant(units))
        if shard and ctx.num_input_pipelines > 1:
            records = records.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        ds = _decoded_batches(records, source, ctx.get_per_replica_batch_size(config.batch_size),
                              drop_remainder=False)
        return ds.map(preprocess(config.normalize)).prefetch(tf.data.AUTOTUNE)

    return eval_fn


def _per_pipeline(counts: list[int], pipelines: int, policy: str) -> int:
    total = sum(counts)
    if policy == "file":
        return min(sum(counts[i::pipelines]) for i in range(pipelines))
    if policy == "data":
        return total // pipelines
    return total


def build_files(source, recipe, pipelines: int) -> Streaming:
    """The training stream and evaluation input of a :class:`~kerasdist.data.formats.FileSource`
    (see module docs)."""
    config = recipe.data
    train_units = source.open(recipe.output.run_dir)
    eval_units = source.check(config.eval_split) if config.eval_split else None
    policy = shard_policy(config, pipelines, units=len(train_units),
                          what=config.traits.shard_units)
    counts = source.count(train_units)
    eval_fn, num_eval = None, 0
    if eval_units is not None:
        eval_fn = _file_eval_fn(source, eval_units, config, shard=policy != "off")
        num_eval = sum(source.count(eval_units))
    log.info(f"input: source '{config.kind}' streams {len(train_units)} training file(s) "
             f"({sum(counts)} examples)")
    return Streaming(train_fn=_file_train_fn(source, train_units, config, policy),
                     eval_fn=eval_fn, per_pipeline=_per_pipeline(counts, pipelines, policy),
                     num_eval=num_eval, policy=policy, artifacts=dict(source.artifacts))


def _python_train_fn(fn, config, policy: str):
    import tensorflow as tf

    from kerasdist.data import python_source

    def train_fn(ctx, skip_batches: int):
        n, i = ctx.num_input_pipelines, ctx.input_pipeline_id
        base = python_source.call(fn, config, config.train_split, ctx)
        if policy == "data" and not python_source.takes_context(fn):
            base = base.shard(n, i)
        seed, buffer = config.shuffle_seed + i, config.shuffle_buffer

        def one_pass(pass_index):
            if not buffer:
                return base
            return base.shuffle(buffer, seed=seed * 1_000_003 + pass_index,
                                reshuffle_each_iteration=False)

        ds = tf.data.Dataset.counter(dtype=tf.int64).flat_map(one_pass)
        return _finish(ds, config, ctx.get_per_replica_batch_size(config.batch_size),
                       skip_batches, None)

    return train_fn


def _python_eval_fn(fn, config, *, shard: bool):
    import tensorflow as tf

    from kerasdist.data import python_source

    def eval_fn(ctx):
        ds = python_source.call(fn, config, config.eval_split, ctx)
        if shard and ctx.num_input_pipelines > 1 and not python_source.takes_context(fn):
            ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        ds = ds.batch(ctx.get_per_replica_batch_size(config.batch_size))
        return ds.map(preprocess(config.normalize)).prefetch(tf.data.AUTOTUNE)

    return eval_fn


def build_function(fn, recipe, pipelines: int) -> Streaming:
    """The training stream and evaluation input of a function source (``python``, ``tfds``):
    ``fn(split[, input_context])`` returns the split's unbatched dataset (see module docs)."""
    from kerasdist.data import python_source

    config = recipe.data
    train = python_source.call(fn, config, config.train_split)
    bounded = recipe.trainer.steps_per_epoch is not None  # may be endless: read its start only
    if bounded:
        counted = python_source.count_first(train, config.batch_size * max(pipelines, 1),
                                                 config, config.train_split)
    else:
        counted = python_source.count(train, config, split=config.train_split)
    own = python_source.takes_context(fn)
    if config.auto_shard == "file" and not own and pipelines > 1:
        raise RecipeError(f"data.auto_shard 'file' needs a data.source.function that takes input_context "
                          f"(it shards itself). Received: function='{config.source.function}'")
    policy = shard_policy(config, pipelines, units=pipelines if own else None)
    if policy == "data" and own:
        policy = "file"
    eval_fn, num_eval = None, 0
    if config.eval_split:
        num_eval = python_source.count(python_source.call(fn, config, config.eval_split), config,
                                       split=config.eval_split, field="data.eval_split")
        eval_fn = _python_eval_fn(fn, config, shard=policy != "off")
    size = (f"starts with at least {counted} training examples (not counted whole: "
            "trainer.steps_per_epoch is set)") if bounded else f"gives {counted} training examples"
    log.info(f"input: data.source.function '{python_source.describe(config)}' {size}; "
             + ("it shards itself (input_context)" if own else "sharded by data"))
    per_pipeline = counted if (own or policy == "off") else counted // max(pipelines, 1)
    if own and pipelines > 1:
        per_pipeline = counted // pipelines  # assumes the function's shards are about equal
    return Streaming(train_fn=_python_train_fn(fn, config, policy), eval_fn=eval_fn,
                     per_pipeline=per_pipeline, num_eval=num_eval, policy=policy)


def file_split(source, split: str, *, run_dir):
    """``(records, source)``: the unbatched, undecoded records of ``split`` of a file source,
    opened as training opened it (a csv source takes its vocabularies from
    ``<run_dir>/data/csv-schema.json`` when the run wrote one: the ids training used)."""
    import tensorflow as tf

    source.open(run_dir)
    return source.records(tf.constant(source.check(split))), source


def evaluation_dataset(config, records, source):
    """Records of a split (``source`` None: a function's decoded examples) as a dataset of
    global batches (``data.batch_size``, the last partial batch kept), decoded and converted as
    training sees them, read as it is iterated (never whole in memory): the sidecar evaluator's
    input."""
    import tensorflow as tf

    ds = _decoded_batches(records, source, config.batch_size, drop_remainder=False)
    return ds.map(preprocess(config.normalize)).prefetch(tf.data.AUTOTUNE)


def sample_records(config, split: str, ds, source, limit: int | None, *, preprocessed=True):
    """The first ``limit`` examples (None: all) of a split's records (``source`` None: a
    function's decoded examples) as NumPy ``(x, y)``, decoded as training sees them (for the
    bad-input checks and reference evaluations in one process); ``x`` is a dict of arrays for a
    tfrecord spec with several inputs; ``preprocessed=False``: as decoded, before the
    uint8-to-float conversion. Training never reads a split whole: it streams.

    Raises:
        DataError: records that do not decode, a function that raises; a split with no examples.
    """
    import numpy as np
    import tensorflow as tf

    from kerasdist.errors import DataError

    if source is not None:
        ds = ds.map(source.decoder())
    if limit is not None:
        ds = ds.take(limit)
    xs, ys = [], []
    ds = ds.batch(1024)
    try:
        for x, y in (ds.map(preprocess(config.normalize)) if preprocessed else ds):
            xs.append(tf.nest.map_structure(lambda t: t.numpy(), x))
            ys.append(y.numpy())
    except tf.errors.OpError as err:
        if source is None:  # the user's data.source.function raised while it was read
            from kerasdist.data.python_source import raised

            raise raised(err, config, split) from None
        raise DataError(f"data.source '{config.kind}': split '{split}' does not decode: "
                        f"{err.message.splitlines()[0][:300]}. Received: split='{split}'") from None
    if not ys:
        raise DataError(f"data.source '{config.kind}': split '{split}' holds no examples. "
                        f"Received: split='{split}'")
    x = {k: np.concatenate([p[k] for p in xs]) for k in xs[0]} if isinstance(xs[0], dict) \
        else np.concatenate(xs)
    return x, np.concatenate(ys)
