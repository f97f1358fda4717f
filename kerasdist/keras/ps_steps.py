"""The small ``tf.function`` steps that the coordinator schedules onto parameter-server workers.

Each call runs the model's own ``train_step``/``test_step`` inside ``strategy.run``; a training
call adds its figures to its worker's row of :func:`make_counters` (``scatter_nd_*``: atomic).

**Staleness** of one step, in optimizer updates: ``after - before - 1``, ``optimizer.iterations``
read before any weight and right after its own update (an upper bound: an update landing between
this step's apply and its second read counts too).
"""

from __future__ import annotations


def _version(model):
    import tensorflow as tf

    if model.optimizer is None:
        return tf.constant(0, tf.int64)
    return tf.cast(tf.convert_to_tensor(model.optimizer.iterations), tf.int64)


def _batch_examples(batch):
    import tensorflow as tf

    leaves = [t for t in tf.nest.flatten(batch) if tf.is_tensor(t)]
    return tf.cast(tf.shape(leaves[0])[0], tf.int64) if leaves else tf.constant(0, tf.int64)


def _one_train_step(model, strategy, iterator):
    """``strategy.run(train_step)`` on the next batch; returns (logs, staleness, examples)."""
    import tensorflow as tf

    def replica_step(batch):
        before = _version(model)
        with tf.control_dependencies([before]):  # read the version before any weight
            batch = tf.nest.map_structure(lambda t: tf.identity(t) if tf.is_tensor(t) else t,
                                          batch)
        logs = model.train_step(batch)
        with tf.control_dependencies([t for t in tf.nest.flatten(logs) if tf.is_tensor(t)]):
            after = _version(model)
        return logs, tf.maximum(after - before - 1, 0), _batch_examples(batch)

    logs, staleness, examples = strategy.run(replica_step, args=(next(iterator),))
    local = strategy.experimental_local_results
    return (local(logs)[0], tf.reduce_max(tf.stack(local(staleness))),
            tf.add_n(list(local(examples))))


COUNTER_COLUMNS = ("steps", "staleness_sum", "examples", "staleness_max")


def make_counters(model, strategy, num_workers: int):
    """The per-worker statistics variable: int64 ``[num_workers, 4]`` of zeros, columns
    :data:`COUNTER_COLUMNS`, on the ps that holds ``optimizer.iterations``; not tracked by the
    model (neither checkpointed nor digested).
    """
    import contextlib

    import tensorflow as tf

    anchor = getattr(getattr(model.optimizer, "iterations", None), "value", None)
    with strategy.scope():
        place = (strategy.extended.colocate_vars_with(anchor) if anchor is not None
                 else contextlib.nullcontext())
        with place:
            return tf.Variable(tf.zeros([num_workers, len(COUNTER_COLUMNS)], tf.int64),
                               trainable=False, name="kerasdist_ps_counters")


def _count(counters, steps, stale_sum, examples, stale_max):
    """Add one call's figures to the running worker's row of ``counters``."""
    import tensorflow as tf

    worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64)
    add = counters.scatter_nd_add(tf.stack([[worker, 0], [worker, 1], [worker, 2]]),
                                  tf.stack([steps, stale_sum, examples]))
    with tf.control_dependencies([add]):
        return counters.scatter_nd_max(tf.stack([[worker, 3]]), tf.reshape(stale_max, [1]))


def make_train_function(model, strategy, *, counters, steps_per_execution: int = 1):
    """A ``tf.function(iterator, num_steps) -> logs`` to pass to ``coordinator.schedule``.

    Args:
        model: a compiled Keras model whose variables were created under ``strategy.scope()``.
        strategy: the ``ParameterServerStrategy``.
        counters: the variable of :func:`make_counters` (each call adds to its worker's row).
        steps_per_execution: with 1, one step per call (``num_steps`` ignored); above 1, each
            call runs ``num_steps`` (an int32 scalar tensor, >= 1) steps in a ``tf.while_loop``.

    Returns:
        The function; ``logs`` is the last step's ``train_step`` output.
    """
    import tensorflow as tf

    def train_function(iterator, num_steps):
        logs, stale, examples = _one_train_step(model, strategy, iterator)
        steps = tf.constant(1, tf.int64)
        stale_sum, stale_max = stale, stale
        if steps_per_execution > 1:
            def body(i, logs, steps, s_sum, s_max, n_ex):
                new_logs, s, ex = _one_train_step(model, strategy, iterator)
                return i + 1, new_logs, steps + 1, s_sum + s, tf.maximum(s_max, s), n_ex + ex

            _, logs, steps, stale_sum, stale_max, examples = tf.while_loop(
                lambda i, *_: i < num_steps, body,
                (tf.constant(1), logs, steps, stale_sum, stale_max, examples))
        counted = _count(counters, steps, stale_sum, examples, stale_max)
        with tf.control_dependencies([counted]):
            return tf.nest.map_structure(tf.identity, logs)

    return tf.function(train_function)


def _zeros_like_spec(value):
    """A zero-filled tensor of ``value``'s dtype and shape (unknown dimensions as 0)."""
    import tensorflow as tf

    shape = [d if d is not None else 0 for d in value.shape]
    if value.dtype == tf.string:
        return tf.fill(shape, "")
    return tf.zeros(shape, value.dtype)


def run_if_present(optional, step):
    """``step()`` when ``optional`` holds an element, else zeros of ``step``'s output structure.

    ``step`` (reading ``optional.get_value()``) is traced once to learn its output structure, so
    the branch without data runs nothing (a ``test_step`` on an empty batch would give NaN).

    Returns:
        ``(present, outputs)``: ``present`` an int64 scalar (1 or 0).
    """
    import tensorflow as tf

    traced = tf.function(step).get_concrete_function()
    absent = tf.nest.map_structure(
        lambda t: _zeros_like_spec(t) if tf.is_tensor(t) else t, traced.structured_outputs)
    outputs = tf.cond(optional.has_value(), traced, lambda: absent)
    return tf.cast(optional.has_value(), tf.int64), outputs


def make_test_function(model, strategy, *, sent: bool = False):
    """A ``tf.function(iterator) -> (stats, logs)`` running ``test_step`` on the next batch
    (with ``sent``: ``tf.function(batch)``, the batch sent with the call:
    :class:`kerasdist.keras.ps_input.SentBatches`).

    ``stats`` is int64 ``[worker_index, batches_run (0 or 1), examples]``; ``logs`` the
    ``test_step`` output (zeros when the worker's shard is exhausted and nothing ran).
    """
    import tensorflow as tf

    def test_function(iterator):
        optional = None if sent else iterator.get_next_as_optional()

        def replica_step(batch):
            return model.test_step(batch), _batch_examples(batch)

        def step():
            batch = iterator if sent else optional.get_value()
            logs, examples = strategy.run(replica_step, args=(batch,))
            local = strategy.experimental_local_results
            logs = tf.nest.map_structure(lambda v: local(v)[0], logs)
            return logs, tf.add_n(list(local(examples)))

        ran, (logs, examples) = (tf.constant(1, tf.int64), step()) if sent else \
            run_if_present(optional, step)
        worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(),
                         tf.int64)
        return tf.stack([worker, ran, examples]), logs

    return tf.function(test_function)
