"""Keras ``fit``/``evaluate``/``predict`` for models built under
``tf.distribute.ParameterServerStrategy``, which Keras 3 does not support (what a user sees:
``docs/python-api.md``, "Parameter server"); after ``kerasdist.enable()`` plain ``model.fit``/
``evaluate`` come here for such models. Steps: :mod:`~kerasdist.keras.ps_steps`; the coordinator's
loop: :mod:`~kerasdist.keras.ps_loop`; inputs: :mod:`~kerasdist.keras.ps_input`. Validation and
``evaluate`` deal Keras's own batches out, each once, so every metric equals a strategy-free
``evaluate`` up to float summation order (``tests/integration/test_ps_vs_keras.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kerasdist._compat import internals, keras_ps_atomic_assign, tf_coordinator_copies
from kerasdist.keras import ps_input as ps_data
from kerasdist.keras import ps_loop, ps_steps, ps_stop, ps_sync, sync_checks
from kerasdist.keras.callbacks import MetricsProgbar
from kerasdist.keras.ps_class_weight import class_weighted

__all__ = ["cluster_spec", "evaluate", "fit", "refuse_unsupported"]


def cluster_spec(strategy):
    """The strategy's cluster spec (its public ``cluster_resolver`` is None for this strategy)."""
    return internals.cluster_resolver(strategy).cluster_spec()


def _atomic_updates(run: ps_loop.PSRun):
    """Scope kerasdist's mend of Keras's non-atomic ``assign_add`` to this model's variables."""
    model = run.model
    variables = list(model.variables) + list(getattr(model, "metrics_variables", []))
    if model.optimizer is not None:
        variables += list(model.optimizer.variables)
    return keras_ps_atomic_assign.atomic_updates(variables)


LOOKUP_LAYERS = ("IndexLookup", "StringLookup", "IntegerLookup", "TextVectorization")


def _refuse_sparse_adamax(model, inner, workers: int) -> None:
    """Refuse Adamax on a model with an ``Embedding`` when ``workers`` >= 2: its whole
    infinity-norm slot is rewritten by each worker (a read-modify-write), so with sparse gradients
    one worker puts back rows the other raised, and they step by ``lr * m / epsilon`` (diverges).

    Raises:
        UnsupportedFeatureError: naming the optimizer, the sparse layers and ``workers``.
    """
    import keras

    from kerasdist.errors import UnsupportedFeatureError

    if workers < 2 or not isinstance(inner, keras.optimizers.Adamax):
        return
    sparse = sorted({type(layer).__name__ for layer in internals.flatten_layers(model)
                     if any(base.__name__ == "Embedding" for base in type(layer).__mro__)})
    if sparse:
        raise UnsupportedFeatureError(
            "the Adamax optimizer with sparse gradients (an Embedding layer) is not supported "
            "under ParameterServerStrategy with 2 or more workers: its infinity-norm slot is "
            "rewritten whole by each worker, so concurrent workers put back each other's rows "
            "and those rows take steps of learning_rate / epsilon (training diverges). Use Adam "
            "(its slots are updated by atomic adds) or a synchronous strategy (multi_worker, "
            f"mirrored). Received: optimizer=Adamax, layers {sparse}, workers={workers}")


def refuse_unsupported(model, *, training: bool = True, workers: int = 2) -> None:
    """Refuse, before anything is scheduled, what asynchronous parameter-server training cannot
    run correctly.

    Raises:
        UnsupportedFeatureError: the optimizer's ``gradient_accumulation_steps`` or ``use_ema``
            (when ``training``), a Keras lookup layer in the model, sparse Adamax
            (:func:`_refuse_sparse_adamax`); the message says why.
    """
    from kerasdist.errors import UnsupportedFeatureError

    optimizer = getattr(model, "optimizer", None)
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    why = {"gradient_accumulation_steps": "every worker would add its micro-steps to the same "
           "accumulators on the ps, and a step re-run after a lost worker would count twice",
           "use_ema": "the moving average and its periodic overwrite of the weights are "
           "read-modify-writes of the ps variables that race with the other workers' updates"}
    for name, reason in why.items():
        value = getattr(inner, name, None) if training else None
        if value:
            raise UnsupportedFeatureError(
                f"optimizer `{name}` is not supported under ParameterServerStrategy: {reason}. "
                f"Use a synchronous strategy (multi_worker, mirrored) for it. "
                f"Received: {name}={value!r}")
    if training:
        _refuse_sparse_adamax(model, inner, workers)
    lookups = sorted({type(layer).__name__ for layer in internals.flatten_layers(model)
                      if any(base.__name__ in LOOKUP_LAYERS for base in type(layer).__mro__)})
    if lookups:
        raise UnsupportedFeatureError(
            f"Keras lookup layers ({', '.join(lookups)}) are not supported in a model under "
            "ParameterServerStrategy: their TensorFlow lookup table is created on the coordinator "
            "and Keras 3 does not make it a per-worker resource, so the workers cannot read it. "
            "Map strings to integer ids in the input pipeline on the workers (e.g. with "
            f"keras.layers.Hashing or tf.lookup inside a dataset_fn). Received: {lookups}")


def _start(model, *, training: bool = False, compiled: bool = True) -> ps_loop.PSRun:
    import tensorflow as tf

    strategy = model.distribute_strategy
    if not isinstance(strategy, tf.distribute.ParameterServerStrategy):
        raise ValueError("kerasdist.keras.ps_fit needs a model built and compiled inside "
                         "ParameterServerStrategy.scope(). Received: distribute_strategy="
                         f"{type(strategy).__name__}")
    if compiled and not getattr(model, "compiled", False):
        raise ValueError("You must call `compile()` before using the model "
                         "(ParameterServerStrategy fit/evaluate, as Keras). Received: a model "
                         "that was not compiled")
    num_workers = cluster_spec(strategy).num_tasks("worker")
    refuse_unsupported(model, training=training, workers=num_workers)
    # the closure threads copy results without TF's cluster function runtime, where they race
    tf_coordinator_copies.install()
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)  # one per strategy
    return ps_loop.PSRun(model=model, strategy=strategy, coordinator=coordinator,
                         num_workers=num_workers)


def _build(run: ps_loop.PSRun, per_worker_dataset) -> None:
    """Create model, metric and optimizer variables (on the ps) before tracing any step."""
    with run.strategy.scope():
        internals.symbolic_build(run.model, per_worker_dataset.element_spec)


@dataclass
class _Eval:
    dataset: Any
    steps: int | None
    batches: int


def _eval_input(run, data, *, steps, batch_size, argument: str, steps_argument: str) -> _Eval:
    """Evaluation input (``ps_input.to_eval_input``); for arrays and datasets the first ``steps``
    batches are taken before sharding (``_Eval.steps`` None: run them all), a dataset function's
    ``steps`` stay a count summed over workers."""
    x, y, weights = data, None, None
    if isinstance(data, (tuple, list)) and 2 <= len(data) <= 3 and not callable(data[0]):
        x, y, weights = (tuple(data) + (None,))[:3]
    if steps is not None:
        steps = ps_data.resolve_steps(steps, None, argument=steps_argument, training=False)
    ps_input = ps_data.to_eval_input(x, y, sample_weight=weights, batch_size=batch_size,
                                     steps=steps, num_workers=run.num_workers, argument=argument)
    if ps_input.kind != "dataset_fn":
        steps = None  # the first `steps` batches were taken: run them all
    elif steps is None:
        ps_input = ps_data.probe_infinite(ps_input, num_workers=run.num_workers,
                                          replicas=run.strategy.num_replicas_in_sync)
    steps = ps_data.resolve_steps(steps, ps_input, argument=steps_argument, training=False)
    if ps_sync.replicas_to_aggregate(run.model) is not None:
        dataset = ps_data.SentBatches(ps_input, num_workers=run.num_workers,
                                      replicas=run.strategy.num_replicas_in_sync)
    else:
        dataset = ps_data.make_per_worker_dataset(run.coordinator, ps_input,
                                                  num_workers=run.num_workers, repeat=False)
    return _Eval(dataset, steps, ps_input.batches)


def _should_validate(epoch: int, freq) -> bool:
    return (epoch + 1) % freq == 0 if isinstance(freq, int) else epoch + 1 in freq


def _split_validation(x, y, sample_weight, validation_split: float, validation_data):
    """Keras's ``validation_split`` for arrays: the last ``validation_split`` fraction of the
    examples (before any shuffling) is held out as ``validation_data``.

    Raises:
        ValueError: ``validation_split`` outside [0, 1), or given with inputs that are not
            NumPy arrays / tensors (as Keras refuses it for datasets).
    """
    import keras

    from kerasdist.keras.ps_input import is_arrays

    if not validation_split:
        return x, y, sample_weight, validation_data
    if not 0 < validation_split < 1:
        raise ValueError(f"`validation_split` must be in [0, 1). Received: "
                         f"validation_split={validation_split!r}")
    if not is_arrays(x):
        raise ValueError("`validation_split` is only supported for NumPy arrays or tensors "
                         f"(as in Keras). Received: x={type(x).__name__}")
    count = len(keras.tree.flatten(x)[0])
    cut = int(count * (1.0 - validation_split))
    head = lambda data: keras.tree.map_structure(lambda a: a[:cut], data)  # noqa: E731
    tail = lambda data: keras.tree.map_structure(lambda a: a[cut:], data)  # noqa: E731
    held = tuple(part for part in (tail(x), None if y is None else tail(y),
                                   None if sample_weight is None else tail(sample_weight))
                 if part is not None)
    if validation_data is None:
        validation_data = held
    return (head(x), None if y is None else head(y),
            None if sample_weight is None else head(sample_weight), validation_data)


def _epochs(run, iterator, callbacks, *, epochs, initial_epoch, steps, validation, freq):
    model, total, training_logs = run.model, ps_loop.PSStats(run.num_workers), None
    train_epoch = ps_loop.train_epoch if run.sync is None else ps_sync.train_epoch
    asked = ps_stop.stop_probe(callbacks)
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        callbacks.on_epoch_begin(epoch)
        last_logs, stats = train_epoch(run, iterator, steps=steps, callbacks=callbacks)
        total.merge(stats)
        if stats.steps < steps and asked():
            break  # cut by SIGTERM or SIGINT: no finished epoch (no validation, no epoch end)
        epoch_logs = ps_loop.metrics_logs(model, last_logs)
        epoch_logs.update(stats.logs(ps_loop.global_step(model)))
        if validation is not None and _should_validate(epoch, freq) and not run.stuck:
            val_logs = ps_loop.evaluate_loop(run, iter(validation.dataset), steps=validation.steps,
                                             callbacks=callbacks)
            epoch_logs.update({f"val_{k}": v for k, v in val_logs.items()})
        callbacks.on_epoch_end(epoch, epoch_logs)
        training_logs = epoch_logs
        if model.stop_training:
            break
    return training_logs, total


def _train_input(run, x, y, *, sample_weight, batch_size, shuffle, class_weight, steps_per_epoch):
    """``(steps per epoch, training input)``: per-worker datasets, or in synchronous mode the
    coordinator's slices (:func:`kerasdist.keras.ps_sync.train_input`)."""
    if ps_sync.replicas_to_aggregate(run.model) is not None:
        return ps_sync.train_input(x, y, sample_weight=sample_weight, batch_size=batch_size,
                                   shuffle=shuffle, class_weight=class_weight,
                                   steps_per_epoch=steps_per_epoch, num_workers=run.num_workers)
    if class_weight:
        train_in = class_weighted(x, y, sample_weight=sample_weight, class_weight=class_weight,
                                  batch_size=batch_size, shuffle=shuffle,
                                  num_workers=run.num_workers)
    else:
        train_in = ps_data.to_ps_input(x, y, sample_weight=sample_weight, batch_size=batch_size,
                                       shuffle=shuffle, num_workers=run.num_workers)
    steps = ps_data.resolve_steps(steps_per_epoch, train_in, argument="steps_per_epoch",
                                  training=True)
    return steps, ps_data.make_per_worker_dataset(run.coordinator, train_in,
                                                  num_workers=run.num_workers, repeat=True)


def fit(model, x=None, y=None, *, batch_size=None, epochs: int = 1, verbose="auto",
        callbacks=None, validation_split: float = 0.0, validation_data=None, shuffle: bool = True,
        class_weight=None, sample_weight=None, initial_epoch: int = 0, steps_per_epoch=None,
        validation_steps=None, validation_batch_size=None, validation_freq=1):
    """``model.fit`` under ``ParameterServerStrategy`` (arguments as Keras's; see module docs).

    Args:
        model: compiled inside ``ParameterServerStrategy.scope()``.
        x: dataset function ``fn(input_context)``, ``tf.data.Dataset`` or arrays.
        steps_per_epoch: scheduled steps per epoch, summed over workers.
        validation_data: like ``x``, or a tuple ``(x_val, y_val[, sample_weight])`` of arrays.
        validation_steps: batches per validation, summed over workers; None = the whole set
            (none for an epoch cut by a stop request).

    Returns:
        The ``keras.callbacks.History``; ``history.ps_stats``: ``PSStats.summary`` of the run,
        ``history.ps_totals``: the :class:`~kerasdist.keras.ps_loop.PSStats` themselves.

    Raises:
        ValueError: not a ParameterServerStrategy model, a missing ``steps_per_epoch``, bad inputs.
    """
    import keras

    x, y, sample_weight, validation_data = _split_validation(x, y, sample_weight, validation_split,
                                                             validation_data)
    sync_checks.refuse_single_process_savers(getattr(callbacks, "callbacks", callbacks),
                                             "parameter_server")
    run = _start(model, training=True)
    steps, train_ds = _train_input(run, x, y, sample_weight=sample_weight, batch_size=batch_size,
                                   shuffle=shuffle, class_weight=class_weight,
                                   steps_per_epoch=steps_per_epoch)
    _build(run, train_ds)
    with _atomic_updates(run):
        validation = None if validation_data is None else _eval_input(
            run, validation_data, steps=validation_steps, batch_size=validation_batch_size,
            argument="validation_data", steps_argument="validation_steps")
        run.counters = ps_steps.make_counters(model, run.strategy, run.num_workers)
        if ps_sync.replicas_to_aggregate(model) is None:
            run.train_function = ps_steps.make_train_function(
                model, run.strategy, counters=run.counters,
                steps_per_execution=int(model.steps_per_execution or 1))
        else:
            run.sync = ps_sync.start(run, ps_loop.global_step(model))
        run.test_function = ps_steps.make_test_function(model, run.strategy,
                                                        sent=run.sync is not None)
        if not isinstance(callbacks, keras.callbacks.CallbackList):
            callbacks = list(callbacks or [])
            if verbose != 0 and not any(isinstance(c, keras.callbacks.ProgbarLogger)
                                        for c in callbacks):
                callbacks.append(MetricsProgbar())  # ps_* figures in History, not on the bar
            callbacks = keras.callbacks.CallbackList(
                callbacks, add_history=True, add_progbar=False, verbose=verbose,
                epochs=epochs, steps=steps, model=model)
        model.stop_training = False
        callbacks.on_train_begin()
        initial_epoch = internals.backup_initial_epoch(model) or initial_epoch
        logs, total = _epochs(run, iter(train_ds), callbacks, epochs=epochs,
                              initial_epoch=initial_epoch, steps=steps, validation=validation,
                              freq=validation_freq)
    if model.optimizer is not None and epochs > initial_epoch:
        model.optimizer.finalize_variable_values(model.trainable_weights)
    callbacks.on_train_end(logs=logs)
    history = next((cb for cb in callbacks.callbacks if isinstance(cb, keras.callbacks.History)),
                   None) or keras.callbacks.History()
    history.ps_stats = total.summary(ps_loop.global_step(model))
    history.ps_totals = total  # the PSStats themselves, to merge over several fit calls
    history.left_in_flight = run.stuck  # a stop went on without calls of a silent worker
    return history


def evaluate(model, x=None, y=None, *, batch_size=None, verbose="auto", sample_weight=None,
             steps=None, callbacks=None, return_dict: bool = False):
    """``model.evaluate`` under ``ParameterServerStrategy`` (arguments as Keras's).

    ``steps`` counts batches summed over workers, None = every batch once.

    Returns:
        The scalar loss/metrics as Keras returns them (a list, a float, or a dict with
        ``return_dict``), read from the ps variables after the last step.

    Raises:
        ValueError: as :func:`fit`; ``steps`` is None for an infinite input.
    """
    run = _start(model)
    evaluation = _eval_input(run, (x, y, sample_weight) if y is not None else x, steps=steps,
                             batch_size=batch_size, argument="x", steps_argument="steps")
    _build(run, evaluation.dataset)
    with _atomic_updates(run):
        run.test_function = ps_steps.make_test_function(
            model, run.strategy, sent=ps_sync.replicas_to_aggregate(model) is not None)
        callbacks = ps_loop.callback_list(model, callbacks, verbose=verbose,
                                          steps=evaluation.steps, batches=evaluation.batches)
        logs = ps_loop.evaluate_loop(run, iter(evaluation.dataset), steps=evaluation.steps,
                                     callbacks=callbacks)
    if return_dict:
        return logs
    return internals.flatten_metrics_in_order(model, logs)  # Keras's order: metrics_names
