"""Bad-input checks that need the built model or the loaded data, run before anything is written.

* :func:`check_inputs`: every split's examples against the model: labels within the model's
  classes, example shapes against its input, no NaN/inf values. Keras itself only fails on these
  inside the graph (an ``InvalidArgumentError`` at the first step, after ``run.json`` exists), or
  not at all (NaN images train silently to an all-NaN model; a label of 255 for 10 classes gives a
  NaN loss on CPU).
* :func:`check_run_dir_path`: ``output.run_dir`` can be a directory this process may write (not a
  file, a writable parent, names within the filesystem's limits) -- before an ``OSError`` from
  deep inside TensorFlow or ``os.makedirs`` would say so with a traceback.

Both raise :mod:`kerasdist.errors` bad-input errors (exit code 2), naming the field, file or split
and the value received.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import numpy as np

from kerasdist.errors import DataError

if TYPE_CHECKING:
    from kerasdist.config import Recipe

MAX_CHECKED_RECORDS = 100_000
"""Records per split read by :func:`check_inputs` from a ``tfrecord`` source given as a whole split
name (the only source not held in memory whole): a bounded sample, so a bad record further in the
files is still met only during training."""

FIRST_CHECKED_BATCHES = 4
"""Global batches of the training split checked by :func:`check_inputs` for a ``python`` (or
``tfds`` with ``data.source.input``) source when ``trainer.steps_per_epoch`` is set: such a split may be
endless, so only its first batches are read."""

Split = tuple[np.ndarray, np.ndarray]


def check_inputs(recipe: Recipe, model, *, splits: Mapping[str, Split] | None = None) -> None:
    """Check the recipe's train and eval splits against the (built) model.

    Args:
        recipe: the validated recipe (``data`` and ``model`` are read).
        model: the built ``keras.Model`` (compiled or not) of the recipe.
        splits: ``{split string: (x, y)}`` already loaded by the caller; splits not given are
            loaded here (:func:`kerasdist.data.inputs.check_sample`; for a ``tfrecord`` source with
            a whole split name, the first :data:`MAX_CHECKED_RECORDS` records only; for a
            ``python`` source's training split under ``trainer.steps_per_epoch``, the first
            :data:`FIRST_CHECKED_BATCHES` global batches).

    Raises:
        DataError: labels outside ``[0, classes)`` for a sparse-categorical loss (including NaN
            labels that became ``int64`` minimum), examples whose shape does not fit the model's
            input, integer ids the model cannot look up, or NaN/inf values; the message names
            the split, the field and the value.
        RecipeError: unknown builder (from the registry).
    """
    splits = dict(splits or {})
    names = [("data.train_split", recipe.data.train_split)]
    if recipe.data.eval_split:
        names.append(("data.eval_split", recipe.data.eval_split))
    sparse = "sparsecategorical" in _loss_name(recipe).replace("_", "")
    for field, split in names:
        x, y = splits[split] if split in splits else _load(recipe.data, split,
                                                           limit=_limit(recipe, field))
        path = getattr(recipe.data.source, "path", None)
        where = f"{field} '{split}' of data.source '{recipe.data.kind}'" + (
            f" (data.source.path '{path}')" if path else "")
        _check_dtypes(x, y, model, where)
        _check_finite(y, f"{where}: labels")
        if not isinstance(x, dict):  # several named inputs (a tfrecord spec): labels only
            _check_finite(x, f"{where}: examples")
            _check_shape(x, model, where)
            _check_ids(x, model, where)
        if sparse:
            _check_labels(y, model, where)


def check_recipe_here(recipe: Recipe) -> None:
    """What ``kerasdist validate --check-data`` adds: build the model in this process (no
    strategy; imports its builder), check its loss and metrics, the data against it
    (:func:`check_inputs`) and ``output.run_dir`` (:func:`check_run_dir_path`). Writes nothing.

    Raises:
        RecipeError, DataError, RunDirError: the first problem found.
    """
    from kerasdist.training.keras_objects import check_training_config
    from kerasdist.training.model import build_model

    check_run_dir_path(recipe.output.run_dir)
    _size_thread_pools_as_training_will(recipe)
    model, _ = build_model(recipe)
    check_training_config(recipe)  # optimizer, schedule, loss, metrics, callbacks
    check_inputs(recipe, model)


def _size_thread_pools_as_training_will(recipe: Recipe) -> None:
    """Give TensorFlow the intra-op threads training will set in this process
    (``cluster.threads_per_task`` resolved) before the model built here starts its runtime: a
    parameter-server coordinator of an exposed local run trains in the process that checked, and
    TensorFlow refuses a different number once its runtime runs ("Intra op parallelism cannot be
    modified after initialization"); the same number is accepted."""
    import tensorflow as tf

    threads = recipe.intra_op_threads()
    if threads:
        with contextlib.suppress(RuntimeError):  # TensorFlow already runs here (a notebook)
            tf.config.threading.set_intra_op_parallelism_threads(threads)


def _loss_name(recipe: Recipe) -> str:
    from kerasdist.models import registry
    from kerasdist.training.keras_objects import loss_label

    return loss_label(registry.check(recipe.model).loss)


def _limit(recipe: Recipe, field: str) -> int:
    """Examples checked from a streaming split: :data:`MAX_CHECKED_RECORDS`, or the first
    :data:`FIRST_CHECKED_BATCHES` global batches of a function source's training split under
    ``trainer.steps_per_epoch`` (it may be endless)."""
    if recipe.data.traits.function and field == "data.train_split" and recipe.trainer.steps_per_epoch:
        return FIRST_CHECKED_BATCHES * recipe.data.batch_size
    return MAX_CHECKED_RECORDS


def _load(data_config, split: str, *, limit: int = MAX_CHECKED_RECORDS) -> Split:
    from kerasdist.data.inputs import check_sample

    return check_sample(data_config, split, limit)


def _is_text(values) -> bool:
    return np.asarray(values).dtype.kind in "SUO"  # bytes, str, object (tf.string as NumPy)


def _model_input_dtypes(model) -> dict:
    """``{input name: dtype name}`` of the model's inputs (empty when it is not built)."""
    try:
        inputs = list(model.inputs or [])
    except (AttributeError, ValueError):
        return {}
    out = {}
    for tensor in inputs:
        name = getattr(tensor, "name", "") or ""
        out[name.split(":")[0]] = str(getattr(tensor, "dtype", ""))
    return out


def _check_dtypes(x, y, model, where: str) -> None:
    """Strings where the model takes numbers (a feature or the labels) fail only inside the first
    training step, after the run directory was written: refused here, naming the field."""
    if _is_text(y):
        raise DataError(f"{where}: labels are strings ({np.asarray(y).dtype}); the model's loss "
                        "takes numbers (class ids or targets). Received: label "
                        f"{np.asarray(y).reshape(-1)[0]!r}")
    wanted = _model_input_dtypes(model)
    items = x.items() if isinstance(x, dict) else [("", x)]
    for name, values in items:
        if not _is_text(values):
            continue
        dtype = wanted.get(name, "") if name else \
            (next(iter(wanted.values())) if len(wanted) == 1 else "")
        if "string" in dtype:
            continue
        field = f"input '{name}'" if name else "examples"
        dtypes = ", ".join(sorted(set(wanted.values()))) or "numbers"
        raise DataError(f"{where}: {field} are strings ({np.asarray(values).dtype}), the model "
                        f"'{getattr(model, 'name', 'model')}' takes {dtypes} (turn text into "
                        "numbers in the data function, or give the model a string input). "
                        f"Received: {np.asarray(values).reshape(-1)[0]!r}")


def _check_finite(values: np.ndarray, what: str) -> None:
    values = np.asarray(values)
    if not np.issubdtype(values.dtype, np.floating):
        return
    bad = ~np.isfinite(values)
    if bad.any():
        first = int(np.argmax(bad.reshape(len(values), -1).any(axis=1))) if values.ndim else 0
        raise DataError(f"{what} hold {int(bad.sum())} NaN/inf value(s) (first in example {first}); "
                        "training on them gives a NaN model. Received: "
                        f"{values.reshape(-1)[np.argmax(bad.reshape(-1))].item()!r}")


def _model_input_shape(model) -> tuple | None:
    try:
        shape = model.input_shape
    except (AttributeError, ValueError):  # a subclassed model not built yet
        return None
    if not isinstance(shape, tuple) or any(isinstance(s, (tuple, list)) for s in shape):
        return None  # several inputs: not one array of examples
    return tuple(shape[1:])


def _check_shape(x: np.ndarray, model, where: str) -> None:
    expected = _model_input_shape(model)
    if expected is None:
        return
    example = tuple(np.asarray(x).shape[1:])
    fed = example + (1,) if x.dtype == np.uint8 and len(example) == 2 else example
    fits = len(fed) == len(expected) and all(e is None or e == f for e, f in zip(expected, fed, strict=True))
    if not fits:
        model_name = getattr(model, "name", "model")
        raise DataError(f"{where}: examples of shape {example} (fed as {fed}) do not fit the "
                        f"input {expected} of model '{model_name}'. Received: example shape "
                        f"{example}")


def _check_ids(x: np.ndarray, model, where: str) -> None:
    """Integer examples (ids for ``Embedding`` tables) must be in range for the model: the model
    runs once on the rows holding each column's smallest and largest id (a handful of rows; an
    id outside a table fails that lookup). Out-of-range ids would otherwise fail only inside the
    first training step, after the run directory was written."""
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.integer) or x.dtype == np.uint8 or not len(x):
        return
    flat = x.reshape(len(x), -1)
    rows = sorted({int(i) for i in (*flat.argmax(axis=0), *flat.argmin(axis=0))})
    try:
        model(x[rows], training=False)
    except Exception as err:  # noqa: BLE001 - TF raises InvalidArgumentError, Keras others
        import re

        text = re.sub(r"\x1b\[[0-9;]*m", "", str(err))  # Keras colours its messages
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        lookup = [line for line in lines if "is not in [" in line]  # TF's gather message
        detail = (lookup or lines or [type(err).__name__])[0][:300]
        raise DataError(f"{where}: integer examples do not fit model "
                        f"'{getattr(model, 'name', 'model')}' (an id outside an Embedding "
                        f"table?): {detail}. Received: largest id per column "
                        f"{[int(v) for v in flat.max(axis=0)]}") from None


def _num_classes(model) -> int | None:
    try:
        units = model.output_shape[-1]
    except (AttributeError, ValueError, TypeError, IndexError):
        return None
    return units if isinstance(units, int) and units > 1 else None


def _check_labels(y: np.ndarray, model, where: str) -> None:
    classes = _num_classes(model)
    labels = np.asarray(y).reshape(len(y), -1)
    if labels.shape[1] != 1:
        raise DataError(f"{where}: a sparse-categorical loss takes one integer label per example. "
                        f"Received: labels of shape {np.asarray(y).shape}")
    labels = labels[:, 0]
    if np.issubdtype(labels.dtype, np.floating) and (labels != np.round(labels)).any():
        bad = int(np.argmax(labels != np.round(labels)))
        raise DataError(f"{where}: labels must be whole class numbers. Received: label "
                        f"{labels[bad].item()!r} at example {bad}")
    if classes is None or not len(labels):
        return
    out = (labels < 0) | (labels >= classes)
    if out.any():
        first = int(np.argmax(out))
        hint = " (a NaN label cast to int64?)" if labels[first] == np.iinfo(np.int64).min else ""
        raise DataError(f"{where}: labels must be in [0, {classes}) for a model with {classes} "
                        f"output units; {int(out.sum())} of {len(labels)} are not (first at "
                        f"example {first}). Received: label {labels[first].item()!r}{hint}")


def check_run_dir_path(path: str | Path) -> None:
    """Refuse an ``output.run_dir`` that cannot be created or written, before anything starts;
    no file is created (the checks: :func:`kerasdist.training.rundir_checks.check_path`).

    Raises:
        RunDirError: naming ``output.run_dir``, the path and what is wrong.
    """
    from kerasdist.training.rundir import RunDir

    RunDir(path).check_path()

