"""``model.predict`` under ``tf.distribute.ParameterServerStrategy``.

The workers run ``predict_step`` over disjoint shards, each batch once; the outputs are joined
with Keras's own ``potentially_ragged_concat``. Rows come in input order for NumPy arrays and a
``tf.data.Dataset`` (batches tagged with their index, sorted back); for a dataset function by
worker index, then batch order.
"""

from __future__ import annotations

from kerasdist.keras import ps_input as ps_data
from kerasdist.keras import ps_loop


def _predict_function(model, strategy):
    """``tf.function(iterator) -> (stats, outputs)`` of one scheduled call: ``stats`` int64
    ``[worker, ran (0/1), batch index]``; ``outputs`` the ``predict_step`` output (zeros, and
    nothing run, when the worker's shard is exhausted)."""
    import tensorflow as tf

    from kerasdist.keras.ps_steps import run_if_present

    def predict_function(iterator):
        optional = iterator.get_next_as_optional()

        def step():
            index, batch = optional.get_value()
            outputs = strategy.run(model.predict_step, args=(batch,))
            local = strategy.experimental_local_results
            return index, tf.nest.map_structure(lambda v: local(v)[0], outputs)

        ran, (index, outputs) = run_if_present(optional, step)
        worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(),
                         tf.int64)
        return tf.stack([worker, ran, tf.cast(index, tf.int64)]), outputs

    return tf.function(predict_function)


def _tagged_input(x, *, batch_size, steps, num_workers) -> ps_data.PSInput:
    """A :class:`~kerasdist.keras.ps_input.PSInput` of ``(batch index, batch)`` elements."""
    import tensorflow as tf

    if callable(x) and not isinstance(x, tf.data.Dataset):
        if batch_size is not None:
            raise ValueError("`batch_size` must be None when `x` is a dataset function "
                             f"(ParameterServerStrategy predict). Received: batch_size={batch_size!r}")
        return ps_data.PSInput(lambda ctx: x(ctx).enumerate(), ps_data.UNKNOWN, "dataset_fn")
    if isinstance(x, tf.data.Dataset):
        if batch_size is not None:
            raise ValueError("`batch_size` must be None when `x` is a tf.data.Dataset (it yields "
                             "batches; ParameterServerStrategy predict). Received: "
                             f"batch_size={batch_size!r}")
        dataset = x
    elif ps_data.is_arrays(x):
        dataset = tf.data.Dataset.from_tensor_slices(ps_data.pack_arrays(x))
        dataset = dataset.batch(batch_size or 32)
    else:
        raise ValueError("ParameterServerStrategy predict reads `x` on the workers: pass NumPy "
                         "arrays, a tf.data.Dataset or a dataset function "
                         f"`fn(input_context) -> tf.data.Dataset`. Received: x={type(x).__name__}")
    if steps is not None:
        dataset = dataset.take(steps)
    return ps_data.to_ps_input(dataset.enumerate(), num_workers=num_workers)


def _build(run, tagged) -> None:
    """Build an unbuilt model on the coordinator (variables on the ps), as Keras would on the
    first batch; a scheduled call cannot create variables."""
    import keras
    import tensorflow as tf

    from kerasdist._compat import internals

    model = run.model
    if all(layer.built for layer in internals.flatten_layers(model)):
        return
    context = tf.distribute.InputContext(num_input_pipelines=run.num_workers,
                                         input_pipeline_id=0, num_replicas_in_sync=1)
    _, batch_spec = tagged.dataset_fn(context).element_spec
    x_spec, _, _ = keras.utils.unpack_x_y_sample_weight(batch_spec)
    x = tf.nest.map_structure(
        lambda s: keras.KerasTensor(s.shape, keras.backend.standardize_dtype(s.dtype)), x_spec)
    with run.strategy.scope():
        internals.compute_output_spec(model, x, training=False)


def _concat(results: list, *, ordered_by_index: bool):
    """Keras's own concatenation of the batches' outputs, in the module docs' order."""
    import keras
    import tensorflow as tf

    from kerasdist._compat import internals

    def concat(*parts):
        return internals.potentially_ragged_concat([tf.convert_to_tensor(p) for p in parts])

    key = (lambda r: r[1]) if ordered_by_index else (lambda r: (r[0], r[1]))
    outputs = [r[2] for r in sorted(results, key=key)]
    outputs = keras.tree.map_structure_up_to(outputs[0], concat, *outputs)
    return keras.tree.map_structure(internals.convert_to_np_if_not_ragged, outputs)


def predict(model, x, *, batch_size=None, verbose="auto", steps=None, callbacks=None):
    """``model.predict`` under ``ParameterServerStrategy`` (arguments as Keras's; module docs).

    Args:
        model: built inside ``ParameterServerStrategy.scope()`` (compiling is not needed; an
            unbuilt model is built on the coordinator from the input's spec).
        x: NumPy array(s) (batched by ``batch_size``, default 32), a ``tf.data.Dataset`` of
            batches (of ``x`` or ``(x, ...)``), or a dataset function ``fn(input_context)``.
        steps: batches to predict (the first ``steps`` of arrays and datasets; summed over
            workers for a dataset function); None = every batch once.
        callbacks: ``on_predict_batch_end`` gets ``{"outputs": ...}`` as each call completes
            (completion order); ``model.stop_predicting = True`` stops scheduling.

    Returns:
        NumPy arrays in the structure of the model's outputs, rows in the module docs' order.

    Raises:
        ValueError: ``batch_size`` with a dataset or function; an input of another type; no
            batch to predict (the message names ``x`` and ``steps``).
        UnsupportedFeatureError: the model holds a Keras lookup layer.
    """
    from kerasdist.keras import ps_fit

    if steps is not None:
        steps = ps_data.resolve_steps(steps, None, argument="steps", training=False)
    run = ps_fit._start(model, compiled=False)
    tagged = _tagged_input(x, batch_size=batch_size, steps=steps, num_workers=run.num_workers)
    _build(run, tagged)
    dataset = ps_data.make_per_worker_dataset(run.coordinator, tagged,
                                              num_workers=run.num_workers, repeat=False)
    function = _predict_function(model, run.strategy)
    limit = None if tagged.kind != "dataset_fn" else steps  # arrays/datasets: already taken
    callbacks = ps_loop.callback_list(model, callbacks, verbose=verbose, steps=steps,
                                      batches=tagged.batches)
    model.stop_predicting = False
    callbacks.on_predict_begin()
    results, exhausted, iterator = [], set(), iter(dataset)
    while ((limit is None or len(results) < limit) and len(exhausted) < run.num_workers
           and not model.stop_predicting):
        size = run.max_pending if limit is None else min(run.max_pending, limit - len(results))
        calls = [run.coordinator.schedule(function, args=(iterator,)) for _ in range(size)]
        for call in calls:
            (worker, ran, index), outputs = call.fetch()
            if not ran:
                exhausted.add(int(worker))
                continue
            callbacks.on_predict_batch_begin(len(results))
            results.append((int(worker), int(index), outputs))
            callbacks.on_predict_batch_end(len(results) - 1, {"outputs": outputs})
    run.coordinator.join()
    callbacks.on_predict_end()
    if not results:
        raise ValueError("ParameterServerStrategy predict found no batch to predict in `x` "
                         f"(empty input or `steps`=0). Received: x={type(x).__name__}, "
                         f"steps={steps!r}")
    return _concat(results, ordered_by_index=tagged.kind != "dataset_fn")
