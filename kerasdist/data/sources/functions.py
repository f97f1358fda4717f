"""What the function kinds (``python``, ``tfds``) share: a function returns a split's
``tf.data.Dataset``, and :class:`FunctionKind` streams it as the one stream's
:class:`~kerasdist.data.stream.Units` (no units: the function's dataset is the records). The
function is called, checked and counted here, and its errors named.

Contract (docs/own-model-and-data.md, "python"): ``function(split: str, input_context:
tf.distribute.InputContext | None = None) -> tf.data.Dataset`` of **unbatched** ``(features,
label)`` examples, the same examples in the same order every call; an endless dataset needs
``trainer.steps_per_epoch``, else at most :data:`MAX_COUNTED_EXAMPLES` examples are counted.
"""

from __future__ import annotations

import inspect
from typing import Callable

from kerasdist._log import get_logger
from kerasdist._signals import startup
from kerasdist.data import stream
from kerasdist.data.convert import shard_policy
from kerasdist.data.sources.base import SourceKind
from kerasdist.data.stream import Streaming, Units
from kerasdist.errors import DataError, RecipeError

log = get_logger("data")


def describe(config) -> str:
    """How messages name the function: the import path, or ``tfds:<name>``."""
    return getattr(config.source, "function", None) or f"tfds:{config.source.name}"


def takes_context(fn: Callable) -> bool:
    """Whether ``fn`` accepts an ``input_context`` argument (then it shards itself)."""
    try:
        return "input_context" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def call(fn: Callable, config, split: str, input_context=None):
    """``fn(split[, input_context=...])``, checked: a ``tf.data.Dataset`` of 2-tuples.

    Raises:
        DataError: the function raised, or returned something else (names the type received).
    """
    import tensorflow as tf

    try:
        ds = fn(split, input_context=input_context) if takes_context(fn) else fn(split)
    except Exception as err:  # noqa: BLE001 - the user's code
        raise DataError(f"data.source.function '{describe(config)}' raised {type(err).__name__} for split "
                        f"'{split}': {err}. Received: split='{split}'") from None
    if not isinstance(ds, tf.data.Dataset):
        raise DataError(f"data.source.function '{describe(config)}' must return a tf.data.Dataset of "
                        f"unbatched (features, label). Received: {type(ds).__name__} for split "
                        f"'{split}'")
    spec = ds.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        raise DataError(f"data.source.function '{describe(config)}' must return a dataset of (features, "
                        f"label) pairs. Received: element_spec {spec!r} for split '{split}'")
    return ds


MAX_COUNTED_EXAMPLES = 100_000
"""Examples the counting pass reads at most from a split whose length TensorFlow does not know
(``cardinality`` UNKNOWN, e.g. ``Dataset.from_generator``): without ``trainer.steps_per_epoch`` the
training split is counted once to set the epoch length, and the evaluation split is counted always
(evaluation reads it whole). A split longer than this, or endless, is refused (exit code 2) after
reading this many examples instead of counting for ever. The same number as the records the
bad-input checks read (:data:`kerasdist.training.checks.MAX_CHECKED_RECORDS`). With
``trainer.steps_per_epoch`` the training split is not counted: only its first batches are read
(:func:`count_first`)."""


def count(ds, config, *, split: str, field: str = "data.train_split",
          limit: int | None = None) -> int:
    """Examples in ``ds``, one split of ``data.source.function``: its cardinality when TensorFlow knows
    it, else one streaming pass of at most ``limit + 1`` examples.

    Args:
        ds: the split's unbatched dataset (:func:`call`).
        config: the ``DataConfig`` (names the function in messages).
        split: the split's name, for messages.
        field: ``data.train_split`` or ``data.eval_split``, for messages.
        limit: most examples counted (None: :data:`MAX_COUNTED_EXAMPLES`).

    Raises:
        DataError: the split is endless (cardinality INFINITE) or longer than ``limit``; the
            message names ``trainer.steps_per_epoch`` (training split) or ``data.eval_split``.
    """
    import tensorflow as tf

    limit = MAX_COUNTED_EXAMPLES if limit is None else limit
    known = int(ds.cardinality().numpy())
    if known >= 0:
        return known
    if known != tf.data.INFINITE_CARDINALITY:
        with startup(f"counting the examples of data.source.function '{describe(config)}' split "
                     f"'{split}' (at most {limit:,})"):
            counted = _reduce_count(ds.take(limit + 1), config, split)
        if counted <= limit:
            return counted
    raise _too_long(config, split=split, field=field, limit=limit,
                    endless=known == tf.data.INFINITE_CARDINALITY)


def raised(err, config, split: str) -> DataError:
    """A ``DataError`` for a TensorFlow error met while reading the user's dataset (e.g. an
    exception raised inside its ``from_generator`` generator): the function, the split and the
    user's error, without TensorFlow's traceback."""
    lines = [line.strip() for line in str(getattr(err, "message", err)).splitlines() if line.strip()]
    own = [line for line in lines if not line.startswith(("Traceback", "File ", "^"))
           and ("Error" in line or "Exception" in line)]
    detail = (own[-1] if own else (lines[0] if lines else type(err).__name__))[:300]
    return DataError(f"data.source.function '{describe(config)}' failed while its split '{split}' was "
                     f"read: {detail}. Received: split='{split}'")


PY_FUNC_NODES = ("PyFunc", "EagerPyFunc", "PyFuncStateless")
"""TensorFlow's ops that run Python inside a ``tf.data`` pipeline (``Dataset.from_generator``,
``tf.py_function``, ``tf.numpy_function``): an error from one of them, met while the input
iterator was read, is an exception of the user's data function."""


def from_user_code(err) -> bool:
    """Whether ``err`` (a TensorFlow ``OpError`` that ended training or evaluation) was raised by
    Python code of the data function while the input iterator was read: an ``UnknownError`` or
    ``InvalidArgumentError`` whose failing node is a Python-function op and that came through
    ``IteratorGetNext`` (TensorFlow names both in the error; a Python function in the model is not
    read through the iterator)."""
    import tensorflow as tf

    if not isinstance(err, (tf.errors.UnknownError, tf.errors.InvalidArgumentError)):
        return False
    text = str(getattr(err, "message", err))
    return "IteratorGetNext" in text and any(f"node {name}" in text for name in PY_FUNC_NODES)


def _reduce_count(ds, config, split: str) -> int:
    import numpy as np
    import tensorflow as tf

    try:
        return int(ds.reduce(np.int64(0), lambda n, _: n + 1).numpy())
    except tf.errors.OpError as err:
        raise raised(err, config, split) from None


def count_first(ds, wanted: int, config=None, split: str = "train") -> int:
    """Examples among the first ``wanted`` of ``ds`` (all of them when TensorFlow knows the
    length): the training split's check when ``trainer.steps_per_epoch`` is set, which may be
    endless. Reads at most ``wanted`` examples."""
    known = int(ds.cardinality().numpy())
    if known >= 0:
        return known
    with startup(f"reading the first {wanted} examples of data.source.function's training split"):
        return _reduce_count(ds.take(wanted), config, split)


def _too_long(config, *, split: str, field: str, limit: int, endless: bool) -> DataError:
    what = ("is endless (cardinality INFINITE)" if endless
            else f"has more than {limit:,} examples (endless?)")
    head = f"data.source.function '{describe(config)}': {field} '{split}' {what}"
    if field == "data.train_split":
        return DataError(f"{head}; without trainer.steps_per_epoch kerasdist counts one pass of it "
                         f"to set the epoch length (at most {limit:,} examples). Set "
                         "trainer.steps_per_epoch (then the split is not counted and may be "
                         "endless), or return one pass of the split. Received: "
                         f"trainer.steps_per_epoch=None, function='{describe(config)}'")
    return DataError(f"{head}; evaluation reads it whole. Return a finite split of at most "
                     f"{limit:,} examples, or set data.eval_split: null. Received: "
                     f"eval_split='{split}', function='{describe(config)}'")


def _shard_policy(own: bool, config, pipelines: int) -> str:
    """``data.auto_shard`` resolved for a function that shards itself (``own``: ``'file'``, one
    shard per pipeline) or is sharded by data."""
    policy = shard_policy(config, pipelines, units=pipelines if own else None)
    return "file" if policy == "data" and own else policy


def function_units(fn: Callable, config, split: str, policy: str) -> Units:
    """A function source's ``split`` as the stream's :class:`~kerasdist.data.stream.Units`: no
    units, the function's dataset is the records (called with ``input_context`` when it takes
    one, and then it shards itself)."""
    own = takes_context(fn)
    return Units(read=lambda _, ctx: call(fn, config, split, ctx), values=None,
                 shard="none" if own or policy == "off" else "records")


def build_function(fn: Callable, recipe, pipelines: int) -> Streaming:
    """The training stream and evaluation input of a function source for ``pipelines`` input
    pipelines: ``fn(split[, input_context])`` returns the split's unbatched dataset (see module
    docs).

    Raises:
        DataError: the function fails, returns something else, or a split is endless or longer
            than :data:`MAX_COUNTED_EXAMPLES` where it must be counted.
        RecipeError: ``data.auto_shard: file`` with a function that does not take
            ``input_context``.
    """
    config = recipe.data
    train = call(fn, config, config.train_split)
    bounded = recipe.trainer.steps_per_epoch is not None  # may be endless: read its start only
    if bounded:
        counted = count_first(train, config.batch_size * max(pipelines, 1), config,
                              config.train_split)
    else:
        counted = count(train, config, split=config.train_split)
    own = takes_context(fn)
    if config.auto_shard == "file" and not own and pipelines > 1:
        raise RecipeError(f"data.auto_shard 'file' needs a data.source.function that takes input_context "
                          f"(it shards itself). Received: function='{config.source.function}'")
    policy = _shard_policy(own, config, pipelines)
    eval_fn, num_eval = None, 0
    if config.eval_split:
        num_eval = count(call(fn, config, config.eval_split), config, split=config.eval_split,
                         field="data.eval_split")
        eval_fn = stream.eval_fn(function_units(fn, config, config.eval_split, policy), config,
                                 shard=policy != "off")
    size = (f"starts with at least {counted} training examples (not counted whole: "
            "trainer.steps_per_epoch is set)") if bounded else f"gives {counted} training examples"
    log.info(f"input: data.source.function '{describe(config)}' {size}; "
             + ("it shards itself (input_context)" if own else "sharded by data"))
    per_pipeline = counted if (own or policy == "off") else counted // max(pipelines, 1)
    if own and pipelines > 1:
        per_pipeline = counted // pipelines  # assumes the function's shards are about equal
    return Streaming(train_fn=stream.train_fn(function_units(fn, config, config.train_split, policy),
                                              config), eval_fn=eval_fn,
                     per_pipeline=per_pipeline, num_eval=num_eval, policy=policy)


class FunctionKind(SourceKind):
    """A source whose splits a function returns; subclasses give :meth:`function`."""

    def function(self, config) -> Callable:
        """The kind's ``function(split[, input_context])`` (see module docs).

        Raises:
            DataError: the function cannot be found or is not a function of a split.
        """
        raise NotImplementedError

    def shard_policy(self, config, pipelines):
        return _shard_policy(takes_context(self.function(config)), config, pipelines)

    def stream(self, recipe, pipelines):
        return build_function(self.function(recipe.data), recipe, pipelines)

    def _split(self, config, split) -> Units:
        return function_units(self.function(config), config, split, "off")

    def input_failure(self, config, err, split):
        return raised(err, config, split) if from_user_code(err) else None

    def eval_dataset(self, config, split, *, run_dir):
        return stream.global_batches(self._split(config, split), config)

    def sample(self, config, split, limit, *, run_dir=None):
        return stream.sample_records(config, split, self._split(config, split), limit,
                                     failure=lambda err: raised(err, config, split))
