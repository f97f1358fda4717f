"""The in-memory family (:class:`MemoryKind`): a split is read whole into NumPy arrays
(``embedded``, ``idx``, ``npz``, ``synthetic_*``; the readers are in :mod:`kerasdist.data.readers`);
its units are example ids, gathered from the arrays a batch at a time."""

from __future__ import annotations

from kerasdist.data import stream
from kerasdist.data.convert import shard_policy
from kerasdist.data.sources.base import SourceKind, Split, slice_split
from kerasdist.data.stream import Streaming, Units


class MemoryKind(SourceKind):
    """A source read whole into arrays; subclasses give :meth:`whole` (one split name)."""

    def whole(self, config, name: str) -> Split:
        raise NotImplementedError

    def load(self, config, split: str) -> Split:
        return slice_split(split, lambda name: self.whole(config, name))

    def sample(self, config, split, limit, *, run_dir=None):
        x, y = self.load(config, split)
        return (x, y) if limit is None else (x[:limit], y[:limit])

    def check_sample(self, config, split, limit):
        return self.load(config, split)  # held in memory anyway: every example is checked

    def shard_policy(self, config, pipelines):
        return shard_policy(config, pipelines, units=None,
                            why_not=f"source '{config.kind}' is held in memory (no files to "
                            "shard)")

    def stream(self, recipe, pipelines):
        config = recipe.data
        policy = self.shard_policy(config, pipelines)
        x, y = self.load(config, config.train_split)
        train_fn = stream.train_fn(memory_units(x, y, policy), config)
        eval_fn, num_eval = None, 0
        if config.eval_split:
            ex, ey = self.load(config, config.eval_split)
            eval_fn = stream.eval_fn(memory_units(ex, ey, policy), config, shard=policy != "off")
            num_eval = len(ex)
        per_pipeline = len(x) // pipelines if policy == "data" else len(x)
        return Streaming(train_fn=train_fn, eval_fn=eval_fn, per_pipeline=per_pipeline,
                         num_eval=num_eval, policy=policy)

    def eval_dataset(self, config, split, *, run_dir):
        x, y = self.load(config, split)
        return stream.global_batches(memory_units(x, y, "off"), config)


def memory_units(x, y, policy: str) -> Units:
    """An in-memory split (``x``, ``y``: NumPy arrays of equal length) as the stream's
    :class:`~kerasdist.data.stream.Units`: the units are example ids (``data`` sharding keeps ids
    ``i, i+N, ...``), a batch of ids is gathered from the arrays, as graph constants built inside
    each dataset function."""

    def read(ids, ctx):
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices(ids)

    def batch_decoder():
        import tensorflow as tf

        xs, ys = tf.constant(x), tf.constant(y)
        return lambda ids: (tf.gather(xs, ids), tf.gather(ys, ids))

    return Units(read=read, values=len(x), shard="units" if policy == "data" else "none",
                 examples=True, batch_decoder=batch_decoder)
