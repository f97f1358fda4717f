"""Source ``python``: the user's ``data.source.function`` returns the ``tf.data.Dataset`` of a split.

Contract: ``function(split: str, input_context: tf.distribute.InputContext | None = None)
-> tf.data.Dataset`` of **unbatched** ``(features, label)`` examples, the same examples in the same
order every time it is called (for exact resume). kerasdist shuffles, batches (``data.batch_size`` is
the global batch), repeats and resumes it. An endless dataset (``from_generator`` over
``while True``, ``repeat()``) needs ``trainer.steps_per_epoch``: without it the training split is
counted once, at most :data:`MAX_COUNTED_EXAMPLES` examples. A function that takes
``input_context`` receives the pipeline's context and returns that worker's shard itself (e.g.
by file); one that does not is sharded by data (``Dataset.shard``).

Security: the import path is imported and called, like any Python file you run; a recipe naming
it is as trusted as that code.
"""

from __future__ import annotations

import inspect
from typing import Callable

from kerasdist._signals import startup
from kerasdist.errors import DataError
from kerasdist.importpath import import_attribute, is_builtin, require_kind


def load_function(config) -> Callable:
    """Import ``data.source.function`` and check it is a function taking ``split`` (nothing is called).

    Raises:
        DataError: the module does not import, has no callable of that name, or it is not a
            function of one positional argument (a class, a built-in, the standard library).
    """
    path = config.source.function
    fn = import_attribute(path, field="data.source.function", error=DataError,
                          received=f"function='{path}'", what="Python function")
    if is_builtin(fn):
        module_name, _, attr = path.partition(":")
        raise DataError(f"data.source.function: '{module_name}' has no Python function '{attr}'. "
                        f"Received: function='{path}'")
    # checked before it is ever called: a function of (split) (not a class, not the stdlib)
    return require_kind(fn, path, field="data.source.function", error=DataError,
                        what="a function (split, input_context=None) -> tf.data.Dataset",
                        function_args=(1,))


def tfds_function(config) -> Callable:
    """Source ``tfds`` as a data function: ``split -> (data.source.input, data.source.label)`` pairs of the
    prepared TFDS dataset ``data.source.name`` in ``data.source.data_dir`` (``tfds.builder(...).as_dataset``,
    files in order, ``shuffle_files=False``; TFDS slicing such as ``train[:80%]`` works). Nothing is
    downloaded here: a dataset not prepared in ``data_dir`` is refused.

    Raises:
        DataError: (when called) the dataset is not prepared, or lacks a named feature.
    """
    feature_in, feature_label = config.source.input or "image", config.source.label_name

    def load(split):
        import tensorflow_datasets as tfds

        try:
            builder = tfds.builder(config.source.name, data_dir=str(config.source.data_dir)
                                   if config.source.data_dir else None)
            ds = builder.as_dataset(split=split, shuffle_files=False)
        except Exception as err:  # noqa: BLE001 - TFDS raises many types
            first = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
            raise DataError(f"data.source 'tfds': cannot read '{config.source.name}' split "
                            f"'{split}' from data.source.data_dir '{config.source.data_dir}': "
                            f"{first}. Prepare it there first "
                            f"(tfds build / builder.download_and_prepare()). Received: "
                            f"name='{config.source.name}'") from None
        for field, name in (("data.source.input", feature_in), ("data.source.label", feature_label)):
            if name not in ds.element_spec:
                raise DataError(f"{field}: '{config.source.name}' has no feature '{name}' (features: "
                                f"{', '.join(ds.element_spec)}). Received: '{name}'")
        return ds.map(lambda f: (f[feature_in], f[feature_label]))

    return load


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
reading this many examples instead of counting for ever (about 20 s for a ``from_generator``
split at 5,000 examples/s). The same number as the records the bad-input checks read
(:data:`kerasdist.training.checks.MAX_CHECKED_RECORDS`). With ``trainer.steps_per_epoch`` the
training split is not counted: only its first batches are read (:func:`count_first`)."""


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
