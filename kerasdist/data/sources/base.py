"""The protocol every source kind implements (:class:`SourceKind`), and its three families:

* :class:`MemoryKind`: a split is read whole into NumPy arrays (``embedded``, ``idx``, ``npz``,
  ``synthetic_*``); its units are example ids, gathered from the arrays a batch at a time;
* :class:`FileKind`: a :class:`~kerasdist.data.formats.FileSource` (``tfrecord``, ``csv``,
  ``image_folder``) whose units are files (:mod:`kerasdist.data.file_streams`);
* :class:`FunctionKind`: a function returns a split's ``tf.data.Dataset`` (``python``, ``tfds``).

All three describe a split as :class:`~kerasdist.data.stream.Units` and ride the one resumable
stream of :mod:`kerasdist.data.stream` (shard policy, per-pass order, skip to the exact step,
decode, batch).

Every family gives the same four things, which the entry points of :mod:`kerasdist.data.inputs`
call and nothing else does: the resumable training stream and evaluation input
(:meth:`SourceKind.stream`), the sidecar evaluator's input (:meth:`SourceKind.eval_dataset`), a
sample of decoded examples (:meth:`SourceKind.sample`, :meth:`SourceKind.check_sample`) and the
whole split as arrays (:meth:`SourceKind.load`). Adding a source is one module here with one
class, one line in the registry (:mod:`kerasdist.data.sources`) and one config class in
:mod:`kerasdist.config.source_configs`. A kind reads its own fields as ``config.source.<field>``
and the common ones (splits, batch size, seed) as ``config.<field>``.
"""

from __future__ import annotations

import re
import types

import numpy as np

from kerasdist.data import file_streams, stream
from kerasdist.data.convert import shard_policy
from kerasdist.data.stream import Streaming, Units
from kerasdist.errors import DataError

Split = tuple[np.ndarray, np.ndarray]


class SourceKind:
    """One ``data.source`` kind (see module docs)."""

    kind: str = ""

    def stream(self, recipe, pipelines: int) -> Streaming:
        """The training stream (``train_fn(ctx, skip_batches)``), the evaluation input, the
        examples per pipeline and the shard policy, for ``pipelines`` input pipelines.

        Raises:
            DataError, RecipeError: unreadable data, or a sharding that cannot be done.
        """
        raise NotImplementedError

    def shard_policy(self, config, pipelines: int) -> str:
        """``data.auto_shard`` resolved for this kind (:func:`kerasdist.data.convert.shard_policy`)."""
        raise NotImplementedError

    def eval_dataset(self, config, split: str, *, run_dir):
        """``split`` as one dataset of global batches, decoded and converted as training sees
        them (the sidecar evaluator's input; a csv source uses the vocabularies in ``run_dir``)."""
        raise NotImplementedError

    def sample(self, config, split: str, limit: int | None, *, run_dir=None) -> Split:
        """The first ``limit`` examples (None: all) of ``split`` as converted NumPy arrays."""
        raise NotImplementedError

    def check_sample(self, config, split: str, limit: int | None) -> Split:
        """What the bad-input checks read of ``split`` (:mod:`kerasdist.training.checks`)."""
        return self.sample(config, split, limit)

    def load(self, config, split: str) -> Split:
        """The whole of ``split`` as NumPy arrays (reference evaluations, the bench)."""
        return self.sample(config, split, None)

    def input_failure(self, config, err: BaseException, split: str):
        """The ``DataError`` to report for ``err``, raised while training read ``split``, when it
        is the source's own failure; None (the default) reports ``err`` as it is."""
        return None

    def serving_model(self, config, model, run_dir):
        """``model`` with the source's preprocessing in front, which predicts on the source's
        raw examples (saved as ``inference_model.keras``), or None when the model's own input
        is the raw example (every source but ``csv``)."""
        return None


def slice_split(split: str, whole) -> Split:
    """``split`` (TFDS slicing: ``test[:80%]``, ``train[10:200]+test[-5:]``) of in-memory splits
    ``whole(name) -> (x, y)``, resolved with ``tfds.core.ReadInstruction``.

    Raises:
        DataError: a bad split string, an out-of-range slice, or one that selects nothing.
    """
    plain = re.fullmatch(r"\s*([\w-]+)\s*", split)
    if plain:  # a whole split: no TFDS (it imports TensorFlow: seconds before a cluster starts)
        x, y = whole(plain.group(1))
        if len(x) == 0:
            raise DataError(f"split {split!r} selects no examples")
        return x, y
    import tensorflow_datasets as tfds

    try:
        instruction = tfds.core.ReadInstruction.from_spec(split)
    except (ValueError, AssertionError) as err:
        raise DataError(f"bad split string {split!r}: {err}") from None
    cache = {name: whole(name)
             for name in {re.match(r"\s*([\w-]+)", part).group(1) for part in split.split("+")}}
    infos = {name: types.SimpleNamespace(num_examples=len(arr[0]), shard_lengths=[len(arr[0])])
             for name, arr in cache.items()}
    try:
        absolute = instruction.to_absolute(infos)
    except (ValueError, AssertionError) as err:
        raise DataError(f"split {split!r}: {err}") from None
    parts = [(cache[p.splitname][0][p.from_:p.to], cache[p.splitname][1][p.from_:p.to])
             for p in absolute]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    if len(x) == 0:
        raise DataError(f"split {split!r} selects no examples")
    return x, y


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


class FileKind(SourceKind):
    """A source of files; subclasses name their :class:`~kerasdist.data.formats.FileSource`."""

    source_class: type = None

    def source(self, config):
        return self.source_class(config)

    def shard_policy(self, config, pipelines):
        units = self.source(config).units(config.train_split)
        return shard_policy(config, pipelines, units=len(units), what=config.traits.shard_units)

    def stream(self, recipe, pipelines):
        return file_streams.build_files(self.source(recipe.data), recipe, pipelines)

    def serving_model(self, config, model, run_dir):
        return self.source(config).serving_model(model, run_dir)

    def eval_dataset(self, config, split, *, run_dir):
        units = file_streams.file_split(self.source(config), split, run_dir=run_dir)
        return stream.global_batches(units, config)

    def sample(self, config, split, limit, *, run_dir=None, preprocessed=True):
        units = file_streams.file_split(self.source(config), split, run_dir=run_dir)
        return file_streams.sample_records(config, split, units, limit, preprocessed=preprocessed)


class FunctionKind(SourceKind):
    """A source whose splits a function returns; subclasses give :meth:`function`."""

    def function(self, config):
        raise NotImplementedError

    def shard_policy(self, config, pipelines):
        from kerasdist.data import python_source

        own = python_source.takes_context(self.function(config))
        policy = shard_policy(config, pipelines, units=pipelines if own else None)
        return "file" if policy == "data" and own else policy

    def stream(self, recipe, pipelines):
        return file_streams.build_function(self.function(recipe.data), recipe, pipelines)

    def _split(self, config, split) -> Units:
        return file_streams.function_units(self.function(config), config, split, "off")

    def input_failure(self, config, err, split):
        from kerasdist.data import python_source

        return python_source.raised(err, config, split) if python_source.from_user_code(err) \
            else None

    def eval_dataset(self, config, split, *, run_dir):
        return stream.global_batches(self._split(config, split), config)

    def sample(self, config, split, limit, *, run_dir=None):
        return file_streams.sample_records(config, split, self._split(config, split), limit)
