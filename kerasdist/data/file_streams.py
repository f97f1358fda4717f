"""The streaming sources as the one stream's :class:`~kerasdist.data.stream.Units`: files of a
:class:`~kerasdist.data.formats.FileSource` (``tfrecord``: whole splits and TFDS slices, as pieces
of files; ``csv``, ``image_folder``; :func:`build_files`) or a split function (``python``,
``tfds``; :func:`build_function`) that a source kind (:mod:`kerasdist.data.sources`) hands in; the
counting, the checks and the samples of those splits. This module compares no ``data.source``;
order, sharding and resume are :mod:`kerasdist.data.stream`'s.

A split is never read whole into memory: files are read record by record with ``tf.data``.

``python`` sources are exact on resume when the user's function returns the same examples in the
same order on every call (skipping runs the user's pipeline for the skipped examples). A ``python``
function that takes ``input_context`` shards itself.
"""

from __future__ import annotations

from kerasdist._log import get_logger
from kerasdist.data import stream
from kerasdist.data.convert import preprocess, shard_policy
from kerasdist.data.stream import Streaming, Units
from kerasdist.errors import RecipeError

log = get_logger("data")


def file_units(source, units: list[str], policy: str):
    """A :class:`~kerasdist.data.formats.FileSource`'s files as the stream's
    :class:`~kerasdist.data.stream.Units` under shard ``policy``."""
    return Units(read=lambda files, ctx: source.records(files), values=list(units),
                 shard={"file": "units", "data": "records"}.get(policy, "none"),
                 decoder=source.decoder, batch_decoder=source.batch_decoder)


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
        eval_fn = stream.eval_fn(file_units(source, eval_units, policy), config,
                                 shard=policy != "off")
        num_eval = sum(source.count(eval_units))
    log.info(f"input: source '{config.kind}' streams {len(train_units)} training file(s) "
             f"({sum(counts)} examples)")
    return Streaming(train_fn=stream.train_fn(file_units(source, train_units, policy), config),
                     eval_fn=eval_fn, per_pipeline=_per_pipeline(counts, pipelines, policy),
                     num_eval=num_eval, policy=policy, artifacts=dict(source.artifacts))


def function_units(fn, config, split: str, policy: str):
    """A function source's ``split`` as the stream's :class:`~kerasdist.data.stream.Units`: no
    units, the function's dataset is the records (called with ``input_context`` when it takes
    one, and then it shards itself)."""
    from kerasdist.data import python_source

    own = python_source.takes_context(fn)
    return Units(read=lambda _, ctx: python_source.call(fn, config, split, ctx), values=None,
                 shard="none" if own or policy == "off" else "records")


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
        eval_fn = stream.eval_fn(function_units(fn, config, config.eval_split, policy), config,
                                 shard=policy != "off")
    size = (f"starts with at least {counted} training examples (not counted whole: "
            "trainer.steps_per_epoch is set)") if bounded else f"gives {counted} training examples"
    log.info(f"input: data.source.function '{python_source.describe(config)}' {size}; "
             + ("it shards itself (input_context)" if own else "sharded by data"))
    per_pipeline = counted if (own or policy == "off") else counted // max(pipelines, 1)
    if own and pipelines > 1:
        per_pipeline = counted // pipelines  # assumes the function's shards are about equal
    return Streaming(train_fn=stream.train_fn(function_units(fn, config, config.train_split, policy),
                                              config), eval_fn=eval_fn,
                     per_pipeline=per_pipeline, num_eval=num_eval, policy=policy)


def file_split(source, split: str, *, run_dir) -> Units:
    """``split`` of a file source as :class:`~kerasdist.data.stream.Units` read whole and in
    order, opened as training opened it (a csv source takes its vocabularies from
    ``<run_dir>/data/csv-schema.json`` when the run wrote one: the ids training used)."""
    source.open(run_dir)
    return file_units(source, source.check(split), "off")


def sample_records(config, split: str, units: Units, limit: int | None, *, preprocessed=True):
    """The first ``limit`` examples (None: all) of a split (:class:`~kerasdist.data.stream.Units`
    read whole, in order) as NumPy ``(x, y)``, decoded as training sees them (for the
    bad-input checks and reference evaluations in one process); ``x`` is a dict of arrays for a
    tfrecord spec with several inputs; ``preprocessed=False``: as decoded, before the
    uint8-to-float conversion. Training never reads a split whole: it streams.

    Raises:
        DataError: records that do not decode, a function that raises; a split with no examples.
    """
    import numpy as np
    import tensorflow as tf

    from kerasdist.errors import DataError

    ds = units.read(stream.all_units(units), None)
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
        if units.decoder is None:  # the user's data.source.function raised while it was read
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
