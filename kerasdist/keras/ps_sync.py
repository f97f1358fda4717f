"""Synchronous parameter-server training with backup workers: each step applies once the mean of
the first K of N gradients (``strategy.sync.replicas_to_aggregate``; :func:`sync_replicas`).

Global step ``s``: the coordinator cuts global batch ``s`` into N slices (:class:`SyncInput`); each
call runs ``train_step`` on one slice, its optimizer ``apply`` pushing the slice-weighted gradients
into per-shard ``ResourceConditionalAccumulator``s tagged ``local_step = s``; once K calls completed,
one function takes the means and applies them. The flow, its guarantees and limits:
``docs/parameter-server-sync.md``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from kerasdist.errors import RecipeError, UnsupportedFeatureError

_ATTR = "_kerasdist_replicas_to_aggregate"
POLL_S = 0.002  # how often the coordinator looks for the K-th completed call


def check_replicas(replicas_to_aggregate, workers: int) -> int:
    """K: ``replicas_to_aggregate`` checked against ``workers`` (None: all of them).

    Raises:
        RecipeError: not an int in ``[1, workers]``.
    """
    k = workers if replicas_to_aggregate is None else replicas_to_aggregate
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= workers:
        raise RecipeError("strategy.sync.replicas_to_aggregate must be between 1 and the number of "
                          f"workers ({workers}). Received: replicas_to_aggregate="
                          f"{replicas_to_aggregate!r}")
    return k


def sync_replicas(model, replicas_to_aggregate: int | None = None):
    """Make ``model.fit`` under ``ParameterServerStrategy`` synchronous (see module docs).

    Args:
        model: built under ``ParameterServerStrategy.scope()``.
        replicas_to_aggregate: K, gradients averaged per step (``1 <= K <=`` workers); None: all.

    Returns:
        ``model``; its ``fit`` (after ``kerasdist.enable()``) trains synchronously. With K below
        the workers, this process's ``ClusterCoordinator`` from then on stops without waiting
        for a worker lost for good (:func:`kerasdist._compat.tf_frozen_task.leave_lost_workers`).

    Raises:
        ValueError: not a parameter-server model. RecipeError: a bad ``replicas_to_aggregate``.
    """
    import tensorflow as tf

    from kerasdist._compat import internals

    strategy = model.distribute_strategy
    if not isinstance(strategy, tf.distribute.ParameterServerStrategy):
        raise ValueError("sync_replicas needs a model built inside ParameterServerStrategy.scope()."
                         f" Received: distribute_strategy={type(strategy).__name__}")
    workers = internals.cluster_resolver(strategy).cluster_spec().num_tasks("worker")
    k = check_replicas(replicas_to_aggregate, workers)
    if k < workers:  # backup workers: the run may end without one lost for good
        from kerasdist._compat import tf_frozen_task

        tf_frozen_task.leave_lost_workers()
    setattr(model, _ATTR, k)
    return model


def replicas_to_aggregate(model) -> int | None:
    """K set by :func:`sync_replicas`, or None (asynchronous training)."""
    return getattr(model, _ATTR, None)


class SyncInput:
    """An endless ``tf.data`` input; each element gives one step's ``[(slice, scale)]``: a zipped
    dataset function's N elements, or a global batch cut along axis 0 into N slices differing by at
    most one example (empty ones left out). ``element_spec`` is one slice's."""

    def __init__(self, dataset, *, parts: int, zipped: bool):
        self.dataset, self.parts, self.zipped = dataset, parts, zipped
        self.element_spec = dataset.element_spec[0] if zipped else dataset.element_spec

    def __iter__(self):
        import tensorflow as tf

        rows = lambda nest: int(tf.shape(tf.nest.flatten(nest)[0])[0])  # noqa: E731
        for element in self.dataset:
            if self.zipped:
                slices = list(element)
            else:
                n = rows(element)
                sizes = [n // self.parts + (i < n % self.parts) for i in range(self.parts)]
                pieces = [tf.split(t, sizes) for t in tf.nest.flatten(element)]
                slices = [tf.nest.pack_sequence_as(element, [p[i] for p in pieces])
                          for i, size in enumerate(sizes) if size]
            sizes = [rows(s) for s in slices]
            yield [(s, n * len(slices) / sum(sizes)) for s, n in zip(slices, sizes, strict=True)]


def train_input(x, y=None, *, sample_weight=None, batch_size=None, shuffle: bool = False,
                class_weight=None, steps_per_epoch=None, num_workers: int):
    """``(steps per epoch, SyncInput)`` of ``fit``'s training input (arguments as Keras's): a dataset
    function called once per slice (``InputContext`` ``i`` of ``num_workers``, per-replica
    batches), a ``tf.data.Dataset`` of global batches, or arrays batched by ``batch_size``.

    Raises:
        UnsupportedFeatureError: ``class_weight`` (pass ``sample_weight``).
        ValueError: as :func:`kerasdist.keras.ps_input.to_ps_input` and ``resolve_steps``.
    """
    import dataclasses
    import math

    import tensorflow as tf

    from kerasdist.keras import ps_input

    if class_weight:
        raise UnsupportedFeatureError("`class_weight` is not supported by synchronous "
                                      "parameter-server training (strategy.sync); pass per-example "
                                      f"`sample_weight`. Received: class_weight={class_weight!r}")
    checked = ps_input.to_ps_input(x, y, sample_weight=sample_weight, batch_size=batch_size,
                                   num_workers=num_workers)
    if checked.kind == "dataset_fn":
        dataset = tf.data.Dataset.zip(tuple(x(tf.distribute.InputContext(num_workers, i,
                                                                         num_workers))
                                            for i in range(num_workers)))
    elif checked.kind == "dataset":
        dataset = x
        checked = dataclasses.replace(checked, batches=int(x.cardinality().numpy()))
    else:
        data = ps_input.pack_arrays(x, y, sample_weight)
        count = len(tf.nest.flatten(data)[0])
        dataset = tf.data.Dataset.from_tensor_slices(data)
        dataset = dataset.shuffle(count, reshuffle_each_iteration=True) if shuffle else dataset
        dataset = dataset.batch(batch_size or 32)
        checked = dataclasses.replace(checked, batches=math.ceil(count / (batch_size or 32)))
    steps = ps_input.resolve_steps(steps_per_epoch, checked, argument="steps_per_epoch",
                                   training=True)
    return steps, SyncInput(dataset.repeat(), parts=num_workers,
                            zipped=checked.kind == "dataset_fn")


@dataclass
class SyncStep:
    """One synchronous ``fit``'s state: ``accumulators[i]`` holds ``(handle, rows)`` per shard of
    ``variables[i]``; ``mask`` is the ``[N]`` slot accumulator (counts aggregated calls); ``used``:
    the variables with a gradient (known once traced); ``step``: the next global step."""

    k: int
    parts: int
    variables: list
    accumulators: list
    mask: Any
    step: int = 0
    used: list = field(default_factory=list)
    pushes: int = 0
    refusal: str | None = None  # found while a call was traced (autograph would wrap an error)
    scheduled: int = 0
    aggregated: int = 0
    train_function: Any = None
    apply_function: Any = None

    def push(self, grads, variables, *, step, slot, scale):
        """Push ``grads`` (None skipped) into the accumulators tagged ``step``, then the one-hot
        of ``slot`` into ``mask``. Traced on the coordinator."""
        import tensorflow as tf

        index = {id(v): i for i, v in enumerate(self.variables)}
        pushed, self.used = [], []
        for grad, variable in zip(grads, self.variables if variables is None else variables,
                                  strict=True):
            if grad is None:
                continue
            if id(variable) not in index:
                self.refusal = ("strategy.sync: train_step applied a gradient to a variable that "
                                "is not one of the model's trainable variables. Received: "
                                f"{variable.path}")
                continue
            i = index[id(variable)]
            grad = tf.convert_to_tensor(grad)  # IndexedSlices made dense
            grad *= tf.cast(scale, grad.dtype)
            shards = self.accumulators[i]
            pieces = tf.split(grad, [rows for _, rows in shards]) if len(shards) > 1 else [grad]
            pushed += [tf.raw_ops.ResourceAccumulatorApplyGradient(
                handle=handle, local_step=step, gradient=piece)
                for (handle, _), piece in zip(shards, pieces, strict=True)]
            self.used.append(i)
        with tf.control_dependencies(pushed):
            tf.raw_ops.ResourceAccumulatorApplyGradient(
                handle=self.mask, local_step=step, gradient=tf.one_hot(slot, self.parts))
        self.pushes += 1

    def take(self, k):
        """``(mean gradients of the used variables, gradients aggregated)``, waiting for ``k``."""
        import tensorflow as tf

        grads = []
        for i in self.used:
            parts = [tf.raw_ops.ResourceAccumulatorTakeGradient(
                handle=handle, num_required=k, dtype=tf.as_dtype(self.variables[i].dtype))
                for handle, _ in self.accumulators[i]]
            grads.append(tf.reshape(tf.concat(parts, 0) if len(parts) > 1 else parts[0],
                                    self.variables[i].shape))
        mask = tf.raw_ops.ResourceAccumulatorTakeGradient(handle=self.mask, num_required=k,
                                                          dtype=tf.float32)
        return grads, tf.math.count_nonzero(mask)

    def set_step(self, step: int) -> None:
        """From now on, drop gradients tagged before ``step`` (every accumulator)."""
        import tensorflow as tf

        self.step = step
        for handle in [h for shards in self.accumulators for h, _ in shards] + [self.mask]:
            tf.raw_ops.ResourceAccumulatorSetGlobalStep(handle=handle,
                                                        new_global_step=tf.constant(step, tf.int64))


def start(run, step: int) -> SyncStep:
    """The accumulators of ``run.model`` (each on its variable's or shard's ps) at global ``step``.

    Raises:
        UnsupportedFeatureError: ``steps_per_execution > 1`` (a step is one round of N calls).
    """
    import tensorflow as tf

    from kerasdist._compat import internals

    model, tag = run.model, f"kerasdist_sync_{uuid.uuid4().hex[:12]}"
    if int(getattr(model, "steps_per_execution", 1) or 1) > 1:
        raise UnsupportedFeatureError(
            "steps_per_execution > 1 is not supported by synchronous parameter-server training "
            "(strategy.sync): each step is one round of calls and one update on the ps. "
            f"Received: steps_per_execution={model.steps_per_execution}")

    def accumulator(name, dtype, shape, device):
        with tf.device(device):
            return tf.raw_ops.ResourceConditionalAccumulator(
                dtype=dtype, shape=shape, shared_name=f"{tag}_{name}", reduction_type="MEAN")

    accumulators = []
    for i, variable in enumerate(model.trainable_variables):
        backing = internals.backing_variable(variable)
        accumulators.append([(accumulator(f"{i}_{j}", s.dtype, s.shape, s.device),
                              s.shape[0] if s.shape.rank else 0)
                             for j, s in enumerate(getattr(backing, "variables", None) or [backing])])
    mask = accumulator("mask", tf.float32, [run.num_workers],
                       internals.backing_variable(model.optimizer.iterations).device)
    state = SyncStep(k=replicas_to_aggregate(model), parts=run.num_workers,
                     variables=list(model.trainable_variables), accumulators=accumulators,
                     mask=mask)
    state.set_step(step)
    state.train_function = _train_function(model, run.strategy, state, run.counters)
    state.apply_function = _apply_function(model, run.strategy, state)
    return state


def _gradients(model, strategy, state, batch, step, slot, scale):
    """``train_step`` on ``batch`` with the optimizer's ``apply`` pushing (see module docs)."""
    import tensorflow as tf

    optimizer, pushes = model.optimizer, state.pushes
    optimizer.apply = lambda grads, trainable_variables=None: state.push(
        grads, trainable_variables, step=step, slot=slot, scale=scale)  # only while traced
    try:
        logs = strategy.run(model.train_step, args=(batch,))
    finally:
        del optimizer.apply
    if state.pushes != pushes + 1:
        state.refusal = ("strategy.sync needs a train_step that applies the model's optimizer "
                         "exactly once per step (its gradients are what the workers aggregate). "
                         f"Received: {state.pushes - pushes} applies in "
                         f"{type(model).__name__}.train_step")
    return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], logs)


def _train_function(model, strategy, state, counters):
    """``fn(batch, step, slot, scale) -> logs``, one slice's call: zeros once ``step`` was applied,
    else counts its step and examples in its worker's row of ``counters``."""
    import tensorflow as tf

    def call(batch, step, slot, scale):
        fresh = tf.cast(tf.convert_to_tensor(model.optimizer.iterations), tf.int64) <= step
        compute = tf.function(lambda: _gradients(model, strategy, state, batch, step, slot,
                                                  scale)).get_concrete_function()
        logs = tf.cond(fresh, compute, lambda: tf.nest.map_structure(
            lambda t: tf.zeros([d or 0 for d in t.shape], t.dtype), compute.structured_outputs))
        worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(),
                         tf.int64)
        ran = tf.cast(fresh, tf.int64)
        rows = tf.cast(tf.shape(tf.nest.flatten(batch)[0])[0], tf.int64)
        counted = counters.scatter_nd_add([[worker, 0], [worker, 2]], tf.stack([ran, ran * rows]))
        with tf.control_dependencies([counted]):
            return tf.nest.map_structure(tf.identity, logs)

    return tf.function(call, reduce_retracing=True)


def _apply_function(model, strategy, state):
    """``fn(k) -> gradients aggregated``: take the means (waiting for ``k``), apply them once in
    cross-replica context (each update on its variable's ps)."""
    import tensorflow as tf

    from kerasdist._compat import internals

    optimizer = model.optimizer

    def apply(k):
        grads, count = state.take(k)
        with strategy.scope(), internals.direct_merge_calls():
            type(optimizer).apply(optimizer, grads, [state.variables[i] for i in state.used])
        return count

    return tf.function(apply)


def _completed(values, k: int, asked):
    """The logs of the first completed of ``values`` once ``k`` have (a failed call's error raised;
    ``{}`` when every such worker was lost before its logs were copied), or None when a stop was
    asked and they did not complete within :data:`kerasdist.keras.ps_stop.STOP_JOIN_S` s."""
    import tensorflow as tf

    from kerasdist._compat import internals
    from kerasdist.keras.ps_stop import STOP_JOIN_S

    events = [internals.remote_value_event(v) for v in values]
    deadline, order = None, []
    while len(order) < k:
        if deadline is None and asked():
            deadline = time.monotonic() + STOP_JOIN_S
        if deadline is not None and time.monotonic() > deadline:
            return None
        next(e for i, e in enumerate(events) if i not in order).wait(POLL_S)
        order += [i for i, e in enumerate(events) if i not in order and e.is_set()]
    for i in order:
        try:
            return values[i].fetch()  # raises a failed call's error
        except tf.errors.UnavailableError:
            continue  # its worker was lost after the call completed
    return {}


def train_epoch(run, iterator, *, steps: int, callbacks):
    """Run ``steps`` synchronous steps; return ``(last logs, PSStats)`` as
    :func:`kerasdist.keras.ps_loop.train_epoch`; the stats' ``sync`` holds K, N and this epoch's
    calls (``gradients``), ``aggregated`` and ``dropped``.

    Raises:
        UnsupportedFeatureError: a ``train_step`` that does not apply the optimizer once.
    """
    import tensorflow as tf

    from kerasdist.keras import ps_loop, ps_stop

    state, model = run.sync, run.model
    run.counters.assign(tf.zeros_like(run.counters))
    saver, asked = ps_loop._step_saver(callbacks), ps_stop.stop_probe(callbacks)
    started, done, logs = time.perf_counter(), 0, {}
    scheduled, aggregated = state.scheduled, state.aggregated
    while done < steps and not model.stop_training:
        callbacks.on_train_batch_begin(done)
        step = tf.constant(state.step, tf.int64)
        values = [run.coordinator.schedule(state.train_function, args=(
            batch, step, tf.constant(slot, tf.int32), tf.constant(scale, tf.float32)))
            for slot, (batch, scale) in enumerate(next(iterator))]
        state.scheduled += len(values)
        if state.refusal:
            raise UnsupportedFeatureError(state.refusal)
        k = min(state.k, len(values))
        logs = _completed(values, k, asked)
        if logs is None:
            ps_stop.go_on_without(run, values)
            break
        state.aggregated += int(state.apply_function(tf.constant(k)))
        state.step += 1
        callbacks.on_train_batch_end(done, logs)
        done += 1
        if saver is not None and done < steps and state.step % saver.every_steps == 0:
            saver.save_step(state.step)
    if run.stuck or ps_stop.left_in_flight(run, asked):
        ps_stop.go_on_without(run, [])
    stats = ps_loop.PSStats.from_counters(run.counters.numpy())
    stats.completed_steps = done
    stats.epoch_seconds.append(time.perf_counter() - started)
    stats.epoch_examples.append(stats.examples)
    calls, taken = state.scheduled - scheduled, state.aggregated - aggregated
    stats.sync = {"replicas_to_aggregate": state.k, "num_workers": state.parts,
                  "gradients": calls, "aggregated": taken, "dropped": calls - taken}
    return logs or {}, stats
