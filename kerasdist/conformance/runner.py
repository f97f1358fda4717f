"""Run conformance cases in one process under one strategy (or none) and save what they produce.

:func:`run_case` builds the case's model inside the strategy's scope, sets the reference's initial
weights, fits, evaluates and predicts, and returns a :class:`dict` result:

* ``weights`` / ``optimizer``: every model weight (trainable and not) and optimizer variable
  (iterations, learning rate, slots, accumulators, EMA), in model order, as NumPy arrays;
* ``replicas_identical``: whether every local replica's copy of every variable is bit-for-bit equal;
* ``history``, ``evaluation`` (``evaluate(return_dict=True)``), ``predict`` (flattened leaves),
  ``record`` (what the case's callbacks recorded), ``initial_weights``.

Results are saved as ``<case>.<task>.npz`` (arrays) + ``.json`` (everything else), so the driver
process reads them back without pickle.
"""

from __future__ import annotations

import contextlib
import json
import traceback
from pathlib import Path

import numpy as np

from kerasdist.conformance import data as cdata
from kerasdist.conformance.cases import Case, compile_model
from kerasdist.keras.precision import policy_scope

SEED = 1234
ARRAY_KEYS = ("weights", "optimizer", "predict", "initial_weights")


def plain(array) -> np.ndarray:
    """A NumPy array that ``np.savez`` keeps (bfloat16 and other extension dtypes as float32)."""
    array = np.asarray(array)
    return array.astype(np.float32) if array.dtype.name in ("bfloat16", "float8_e4m3fn") else array


def _components(variable):
    import tensorflow as tf

    value = getattr(variable, "value", variable)
    if isinstance(value, tf.distribute.DistributedValues):
        return [plain(v) for v in value.values]
    return [plain(variable)]


def snapshot(variables) -> tuple[list[np.ndarray], bool]:
    """The first replica's value of each variable, and whether all replicas hold the same bits."""
    values, identical = [], True
    for variable in variables:
        parts = _components(variable)
        identical &= all(np.array_equal(parts[0], p, equal_nan=True) for p in parts[1:])
        values.append(parts[0])
    return values, identical


def build_model(case: Case, data: dict, strategy=None):
    """The case's compiled model, built (inside ``strategy.scope()`` when given)."""
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    metrics = case.compile().get("metrics") if case.metrics_outside_scope else None
    with scope:
        model = compile_model(case.model(data), case, metrics=metrics)
    return model


def _sync_inputs(case: Case, data: dict, strategy, *, training: bool):
    fn = cdata.dataset_fn(data, weighted=case.weighted, repeat=training,
                          shuffle_seed=case.shuffle_seed)
    if case.pipeline is not None:
        pre = case.pipeline(data)
        inner = fn

        def fn(ctx=None):
            return inner(ctx).map(lambda x, *rest: (pre(x), *rest))
    if strategy is None:
        return fn(None)
    return strategy.distribute_datasets_from_function(fn)


def train_input(case: Case, data: dict, strategy, *, parameter_server: bool) -> tuple:
    """``(fit positional args, fit keyword args)`` for the case's input kind
    (:mod:`kerasdist.conformance.data`)."""
    kwargs = {"epochs": cdata.EPOCHS, "shuffle": False, **case.fit_kwargs}
    if case.input == "numpy":
        args = (data["x"], data["y"])
        kwargs.update(batch_size=cdata.GLOBAL_BATCH, shuffle=False, validation_split=0.25)
        if case.weighted:
            kwargs["sample_weight"] = data["sample_weight"]
        return args, kwargs
    if case.input == "pydataset":
        return (cdata.py_dataset(data, weighted=case.weighted),), kwargs
    if case.input == "dataset_fn":
        if parameter_server:
            fn = cdata.dataset_fn(data, weighted=case.weighted, repeat=True,
                                  shuffle_seed=case.shuffle_seed)
            return (fn,), {**kwargs, "steps_per_epoch": cdata.STEPS_PER_EPOCH * 2}
        return (_sync_inputs(case, data, strategy, training=True),), {
            **kwargs, "steps_per_epoch": cdata.STEPS_PER_EPOCH}
    ds = _case_dataset(case, data, batch=cdata.GLOBAL_BATCH)
    if case.steps_per_epoch:
        return (ds.repeat(),), {**kwargs, "steps_per_epoch": case.steps_per_epoch}
    return (ds,), kwargs


def _case_dataset(case: Case, data: dict, *, batch: int):
    ds = cdata.dataset(data, weighted=case.weighted, batch=batch, shuffle_seed=case.shuffle_seed,
                       drop_remainder=bool(case.drop_remainder))
    if case.pipeline is not None:
        pre = case.pipeline(data)
        ds = ds.map(lambda x, *rest: (pre(x), *rest))
    return ds


def eval_input(case: Case, data: dict):
    """The held-out input: the whole set (the first ``case.eval_examples``), shuffled as for
    training, in global batches of ``EVAL_BATCH`` (NumPy for numpy)."""
    if case.eval_examples:
        import keras

        data = keras.tree.map_structure(lambda a: a[:case.eval_examples], data)
    if case.input == "numpy":
        return (data["x"], data["y"]), {"batch_size": cdata.EVAL_BATCH}
    return (_case_dataset(case, data, batch=cdata.EVAL_BATCH),), {}


def predict_input(case: Case, data: dict):
    """The whole set's inputs, unshuffled (so predictions line up), in batches of ``EVAL_BATCH``."""
    import tensorflow as tf

    if case.input == "numpy":
        return (data["x"],), {"batch_size": cdata.EVAL_BATCH}
    ds = tf.data.Dataset.from_tensor_slices(data["x"]).batch(cdata.EVAL_BATCH)
    if case.pipeline is not None:
        ds = ds.map(case.pipeline(data))
    return (ds,), {}


def _flatten_predictions(predictions) -> list[np.ndarray]:
    import keras

    return [plain(p) for p in keras.tree.flatten(predictions)]


def run_case(case: Case, strategy=None, *, workdir: Path, initial=None, is_chief=True,
             parameter_server=False) -> dict:
    """Build, fit, evaluate and predict one case (see module docs). ``initial``: the reference's
    initial weights (None: this run *is* the reference and records its own)."""
    import keras

    keras.utils.set_random_seed(SEED)
    data = cdata.make(case.data, examples=case.examples)
    workdir.mkdir(parents=True, exist_ok=True)
    record: dict = {}
    with policy_scope(case.precision):
        model = build_model(case, data, strategy)
        if initial is not None:
            model.set_weights(initial)
        initial_weights = [np.asarray(w) for w in model.get_weights()]
        callbacks = case.callbacks(workdir, record) if case.callbacks else []
        args, kwargs = train_input(case, data, strategy, parameter_server=parameter_server)
        if case.validation:
            kwargs["validation_data"] = eval_input(case, data)[0][0] if case.input != "numpy" \
                else (data["x"], data["y"])
        history = model.fit(*args, callbacks=callbacks, verbose=0, **kwargs)
        e_args, e_kwargs = eval_input(case, data)
        evaluation = model.evaluate(*e_args, verbose=0, return_dict=True, **e_kwargs)
        p_args, p_kwargs = predict_input(case, data)
        predictions = model.predict(*p_args, verbose=0, **p_kwargs)
        if case.after is not None:
            case.after(model, workdir, is_chief)
    weights, weights_same = snapshot(model.weights)
    optimizer, optimizer_same = snapshot(model.optimizer.variables)
    return {"status": "ok", "weights": weights, "optimizer": optimizer,
            "replicas_identical": bool(weights_same and optimizer_same),
            "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
            "evaluation": {k: float(v) for k, v in evaluation.items()},
            "predict": _flatten_predictions(predictions), "record": record,
            "initial_weights": initial_weights}


def failure(err: BaseException) -> dict:
    """The result of a case that raised: its class, message and traceback."""
    from kerasdist.errors import UnsupportedFeatureError

    refused = isinstance(err, UnsupportedFeatureError)
    return {"status": "error", "refused": refused, "error_class": type(err).__name__,
            "error": str(err).strip()[:2000],
            "traceback": "".join(traceback.format_exception(err))[-6000:]}


def save(result: dict, folder: Path, case: str, task: str) -> None:
    arrays, meta = {}, {}
    for key, value in result.items():
        if key in ARRAY_KEYS:
            meta[f"{key}_count"] = len(value)
            for i, array in enumerate(value):
                arrays[f"{key}_{i}"] = array
        else:
            meta[key] = value
    folder.mkdir(parents=True, exist_ok=True)
    if arrays:
        np.savez(folder / f"{case}.{task}.npz", **arrays)
    (folder / f"{case}.{task}.json").write_text(json.dumps(meta, default=str))


def load(folder: Path, case: str, task: str) -> dict | None:
    meta_path = folder / f"{case}.{task}.json"
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    npz = folder / f"{case}.{task}.npz"
    if npz.is_file():
        with np.load(npz, allow_pickle=False) as arrays:
            for key in ARRAY_KEYS:
                count = meta.pop(f"{key}_count", 0)
                meta[key] = [arrays[f"{key}_{i}"] for i in range(count)]
    return meta
