"""``model.predict`` under ``tf.distribute.ParameterServerStrategy`` (tf_keras refused it).

The workers run the model's own ``predict_step`` as scheduled calls over disjoint shards of the
input, each batch once; the coordinator fetches every call's outputs and reassembles them.

Order of the returned rows: **input order** for NumPy arrays and a ``tf.data.Dataset`` (each
batch is tagged with its index before the batches are sharded over the workers, and the
coordinator sorts by it); for a dataset function ``fn(input_context)``, which builds each worker's
own pipeline, by worker index, then batch order within that worker's pipeline.
"""

from __future__ import annotations

import numpy as np

from kerasdist.keras import ps_input as ps_data


def _empty_like(spec):
    """A zero-row batch matching ``spec`` (what a call runs on once its shard is exhausted)."""
    import tensorflow as tf

    def empty(s):
        shape = [0] + [d if d is not None else 0 for d in s.shape[1:]]
        return tf.fill(shape, "") if s.dtype == tf.string else tf.zeros(shape, s.dtype)

    return tf.nest.map_structure(empty, spec)


def _predict_function(model, strategy, spec):
    """``tf.function(iterator) -> (worker, ran, batch index, outputs)`` of one scheduled call."""
    import tensorflow as tf

    def predict_function(iterator):
        optional = iterator.get_next_as_optional()
        index, batch = tf.cond(optional.has_value(), optional.get_value,
                               lambda: (tf.constant(-1, tf.int64), _empty_like(spec[1])))
        outputs = strategy.run(model.predict_step, args=(batch,))
        outputs = tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0],
                                        outputs)
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        return worker, tf.cast(optional.has_value(), tf.int64), index, outputs

    return tf.function(predict_function)


def _tagged_input(x, *, batch_size, num_workers):
    """A :class:`~kerasdist.keras.ps_input.PSInput` of ``(batch index, batch)`` elements."""
    import tensorflow as tf

    if callable(x) and not isinstance(x, tf.data.Dataset):
        return ps_data.PSInput(lambda ctx: x(ctx).enumerate(), ps_data.UNKNOWN, "dataset_fn")
    if isinstance(x, tf.data.Dataset):
        dataset = x
    else:
        dataset = tf.data.Dataset.from_tensor_slices(x).batch(batch_size or 32)
    return ps_data.to_ps_input(dataset.enumerate(), num_workers=num_workers)


def _concat(results: list, *, ordered_by_index: bool):
    import keras

    key = (lambda r: r[2]) if ordered_by_index else (lambda r: (r[0], r[2]))
    outputs = [r[3] for r in sorted(results, key=key)]
    if not outputs:
        return None
    return keras.tree.map_structure(lambda *parts: np.concatenate(parts, axis=0), *outputs)


def predict(model, x, *, batch_size=None, verbose="auto", steps=None, callbacks=None):
    """``model.predict`` under ``ParameterServerStrategy`` (arguments as Keras's; module docs).

    Args:
        model: compiled or not, built inside ``ParameterServerStrategy.scope()``.
        x: NumPy array(s) (batched by ``batch_size``, default 32), a ``tf.data.Dataset`` of
            batches (of ``x`` or ``(x, ...)``), or a dataset function ``fn(input_context)``.
        steps: batches to predict, summed over workers; None = every batch once.

    Returns:
        NumPy arrays in the structure of the model's outputs, rows in the order the module
        docs give.

    Raises:
        ValueError: ``batch_size`` with a dataset; an input of another type.
        UnsupportedFeatureError: the model holds a Keras lookup layer.
    """
    import keras

    from kerasdist.keras import ps_fit

    run = ps_fit._start(model)
    tagged = _tagged_input(x, batch_size=batch_size, num_workers=run.num_workers)
    dataset = ps_data.make_per_worker_dataset(run.coordinator, tagged,
                                              num_workers=run.num_workers, repeat=False)
    function = _predict_function(model, run.strategy, _spec_of(tagged, run))
    if not isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = keras.callbacks.CallbackList(
            callbacks, add_progbar=verbose != 0, verbose=verbose, epochs=1,
            steps=steps or (tagged.batches if tagged.batches > 0 else None), model=model)
    callbacks.on_predict_begin()
    results, exhausted, iterator = [], set(), iter(dataset)
    while (steps is None or len(results) < steps) and len(exhausted) < run.num_workers:
        size = (steps - len(results)) if steps is not None else run.max_pending
        calls = [run.coordinator.schedule(function, args=(iterator,)) for _ in range(size)]
        for call in calls:
            worker, ran, index, outputs = call.fetch()
            if ran:
                callbacks.on_predict_batch_begin(len(results))
                results.append((int(worker), 1, int(index), outputs))
                callbacks.on_predict_batch_end(len(results) - 1, {"outputs": outputs})
            else:
                exhausted.add(int(worker))
    run.coordinator.join()
    callbacks.on_predict_end()
    return _concat(results, ordered_by_index=tagged.kind != "dataset_fn")


def _spec_of(tagged, run):
    import tensorflow as tf

    context = tf.distribute.InputContext(num_input_pipelines=run.num_workers,
                                         input_pipeline_id=0, num_replicas_in_sync=1)
    return tagged.dataset_fn(context).element_spec
