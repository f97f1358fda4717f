"""Source ``python``: the user's ``data.function`` returns the ``tf.data.Dataset`` of a split.

Contract: ``function(split: str, input_context: tf.distribute.InputContext | None = None)
-> tf.data.Dataset`` of **unbatched** ``(features, label)`` examples, the same examples in the same
order every time it is called (for exact resume). kerasdist shuffles, batches (``data.batch_size`` is
the global batch), repeats and resumes it. A function that takes ``input_context`` receives the
pipeline's context and returns that worker's shard itself (e.g. by file); one that does not is
sharded by data (``Dataset.shard``).

Security: the import path is imported and called, like any Python file you run; a recipe naming
it is as trusted as that code.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Callable

from kerasdist.errors import DataError


def load_function(config) -> Callable:
    """Import ``data.function``.

    Raises:
        DataError: the module does not import, or has no callable of that name.
    """
    path = config.function
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise DataError(f"data.function: cannot import module '{module_name}' ({err}). "
                        f"Received: function='{path}'") from None
    except Exception as err:  # noqa: BLE001 - the module's own code failed while imported
        raise DataError(f"data.function: importing module '{module_name}' raised "
                        f"{type(err).__name__}: {err}. Received: function='{path}'") from None
    fn = getattr(module, attr, None)
    if not callable(fn) or inspect.isbuiltin(fn):
        raise DataError(f"data.function: '{module_name}' has no Python function '{attr}'. "
                        f"Received: function='{path}'")
    return fn


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
        raise DataError(f"data.function '{config.function}' raised {type(err).__name__} for split "
                        f"'{split}': {err}. Received: split='{split}'") from None
    if not isinstance(ds, tf.data.Dataset):
        raise DataError(f"data.function '{config.function}' must return a tf.data.Dataset of "
                        f"unbatched (features, label). Received: {type(ds).__name__} for split "
                        f"'{split}'")
    spec = ds.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        raise DataError(f"data.function '{config.function}' must return a dataset of (features, "
                        f"label) pairs. Received: element_spec {spec!r} for split '{split}'")
    return ds


def count(ds) -> int:
    """Examples in ``ds``: its cardinality when known, else one streaming pass."""
    import numpy as np
    import tensorflow as tf

    known = int(ds.cardinality().numpy())
    if known >= 0:
        return known
    if known == tf.data.INFINITE_CARDINALITY:
        raise DataError("data.function returned an endless dataset; return one pass over the "
                        "split (kerasdist repeats it). Received: cardinality INFINITE")
    return int(ds.reduce(np.int64(0), lambda n, _: n + 1).numpy())
